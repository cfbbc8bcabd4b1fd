// Shared by every GPU kernel module (prepended by the compiler, so no #include of it).
// Written so that it compiles as CUDA (NVRTC) and as HIP (hipRTC, and hipcc: CI compiles
// every module for gfx90a with scripts/hip_compile.sh): no inline PTX outside guarded fast
// paths, warp width from WARP_SIZE, shuffles through the wrappers below.
//
// Conventions of every kernel:
// - activations and weights are bf16 (`bf16`); reductions accumulate in f32;
// - every element or byte offset is 64-bit (`long long` / `size_t`): block ids may be
//   stored as int, but they are widened before any multiplication by a stride;
// - a kernel only touches the rows its launcher names; there is no padded tail.

#if defined(__HIPCC__) || defined(__HIPCC_RTC__)
// hipRTC has the runtime's declarations built in; hipcc (scripts/hip_compile.sh) needs them
// included.
#ifndef __HIPCC_RTC__
#include <hip/hip_runtime.h>
#endif
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
typedef __hip_bfloat16 bf16;
#else
// ROCm without <hip/hip_bf16.h> (Debian's 5.2, say): a bf16 of our own, with the CUDA
// names of the conversions the kernels use (round to nearest even; NaN to the canonical
// quiet NaN, as CUDA's __float2bfloat16 does).
struct bf16 {
    unsigned short x;
};
__device__ __forceinline__ float __bfloat162float(bf16 h) { return __uint_as_float((unsigned int)h.x << 16); }
__device__ __forceinline__ bf16 __float2bfloat16(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{0x7fff};
    return bf16{(unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
__device__ __forceinline__ unsigned short __bfloat16_as_ushort(bf16 h) { return h.x; }
__device__ __forceinline__ bf16 __ushort_as_bfloat16(unsigned short x) { return bf16{x}; }
#endif
#define WARP_SIZE warpSize
#define FULL_MASK 0xffffffffffffffffull
#define SHFL_XOR(v, m) __shfl_xor((v), (m))
// CUDA spellings that not every ROCm has, as macros so that they take precedence over any
// declaration of a newer ROCm: __syncwarp orders the wavefront's memory accesses (its
// lanes run in lockstep), __trap ends the kernel with an error.
#define __syncwarp()                                           \
    do {                                                       \
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"); \
        __builtin_amdgcn_wave_barrier();                       \
        __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront"); \
    } while (0)
#define __trap() __builtin_trap()
#else
#include <cuda_bf16.h>
typedef __nv_bfloat16 bf16;
#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
#define SHFL_XOR(v, m) __shfl_xor_sync(FULL_MASK, (v), (m))
#endif

typedef long long i64;

// Programmatic dependent launch (kernels/src/cuda/launch.rs): every kernel is launched so
// that it may start while the kernel ahead of it in the stream is still running. Until
// pdl_wait() returns, a kernel writes nothing and reads only what no kernel of the step
// writes: weights (which nothing writes once the model is loaded), what the host staged for
// the step (copied before the step's first kernel, which a copy does not let start early),
// and, in a decode step whose KV write is fused into attention, the keys and values of
// tokens that earlier steps wrote. After it, every earlier kernel of the stream has
// finished and its writes are visible. pdl_launch_dependents() lets the next kernel start
// (it still waits for this one to finish). Both are no-ops where the device lacks them
// (before sm_90, HIP) or the kernel was launched the ordinary way.
__device__ __forceinline__ void pdl_wait() {
#if !defined(__HIPCC__) && !defined(__HIPCC_RTC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if !defined(__HIPCC__) && !defined(__HIPCC_RTC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The opening of a kernel that loads no weights ahead: let the next kernel start, then
// wait for the one before.
__device__ __forceinline__ void pdl_begin() {
    pdl_launch_dependents();
    pdl_wait();
}

// -infinity without <math.h> (NVRTC has no standard headers).
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ bf16 to_bf16(float x) { return __float2bfloat16(x); }

// A product's result stored as its output type: bf16 activations (rounded) or f32 logits.
__device__ __forceinline__ void store_out(bf16* out, i64 at, float v) { out[at] = to_bf16(v); }
__device__ __forceinline__ void store_out(float* out, i64 at, float v) { out[at] = v; }

// Eight consecutive bf16 in one 16-byte load (the address must be 16-byte aligned).
__device__ __forceinline__ uint4 load_bf16x8(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }

// Streamed weights: read once per step, so they should not push out of L2 what a step reads
// again (the KV cache of every layer, the activations, the logits). l2_stream_policy() is an
// L2 policy that evicts the lines it loads first; load_streamed_bf16x8 loads 16 bytes that
// no kernel writes under it, past L1. Plain loads where the device lacks them (before sm_80,
// HIP).
#if !defined(__HIPCC__) && !defined(__HIPCC_RTC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define STREAM_POLICY 1
#endif

__device__ __forceinline__ unsigned long long l2_stream_policy() {
    unsigned long long policy = 0;
#ifdef STREAM_POLICY
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
    return policy;
}

__device__ __forceinline__ uint4 load_streamed_bf16x8(const bf16* p, unsigned long long policy) {
#ifdef STREAM_POLICY
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
    return v;
#else
    (void)policy;
    return load_bf16x8(p);
#endif
}

// The two bf16 packed in a 32-bit word, widened exactly (a bf16 is the top half of an f32).
// The element at the lower address is the low half.
__device__ __forceinline__ float bf16_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

// Widens eight packed bf16 (a 16-byte load) to f32 with bit operations only: taking the
// address of the vector instead would push it to local memory.
__device__ __forceinline__ void unpack_bf16x8(const uint4 v, float out[8]) {
    const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        out[2 * j] = bf16_lo(words[j]);
        out[2 * j + 1] = bf16_hi(words[j]);
    }
}

// Sum over the warp; every lane gets the total. The butterfly order is fixed, so the result
// depends only on the lanes' values.
__device__ __forceinline__ float warp_sum(float v) {
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v = fmaxf(v, SHFL_XOR(v, m));
    return v;
}

// Sum over the block (blockDim.x a multiple of WARP_SIZE, at most 1024 threads); every
// thread gets the total. `scratch` holds at least 32 floats of shared memory. The order
// is fixed by the block size alone.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : NEG_INF;
    return warp_max(v);
}

// Tensor-core products (mma.sync, bf16 in, f32 sums): sm_80 and up. Kernels that use them
// are chosen by their launchers only there (CudaKernels::tensor_cores); elsewhere (before
// sm_80, HIP) their bodies compile to a trap.
#if !defined(__HIPCC__) && !defined(__HIPCC_RTC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TENSOR_CORES 1
#endif

// d += a (16 x 16, row-major fragment) * b (16 x 8, column-major fragment), f32 sums.
__device__ __forceinline__ void mma_bf16_16816(float d[4], unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
#ifdef TENSOR_CORES
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
    __trap();
#endif
}

#ifdef TENSOR_CORES
// Asynchronous copies into shared memory (cp.async, sm_80 and up), for the tensor-core
// kernels' tiles.

// The shared-memory address of p, as cp.async and ldmatrix take it.
__device__ __forceinline__ unsigned shared_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// Copies 16 bytes from global src to shared dst without waiting; zeros where !valid (src is
// then not read).
__device__ __forceinline__ void copy16_async(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;"); }

// Waits until at most N committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void copy_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Four 8 x 8 bf16 matrices from shared memory, lane l giving row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_t(unsigned addr, unsigned r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// lo and hi rounded to bf16 and packed, lo at the lower address.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    return (unsigned)__bfloat16_as_ushort(to_bf16(lo)) |
           ((unsigned)__bfloat16_as_ushort(to_bf16(hi)) << 16);
}

// The online softmax of one key tile held in a warp's mma fragments (flash attention 2):
// the scores s of the thread's rows g (elements 0, 1) and g + 8 (elements 2, 3), of keys
// k0 + 8n + 2 quad (and + 1), masked past each row's last key (pos_lo, pos_hi) where
// `mask`, become the rows' probabilities: the maxima over raw scores, the exponents in
// log2 units with the scale folded into one fma (the four lanes holding a row combine by a
// two-step butterfly). The rows' running max m (raw scores) and this thread's share of
// their sums l are updated and the output acc rescaled. Every row must see key 0 in its
// first tile, so the maxima are finite from then on; a tile wholly past a row's last key
// leaves it exactly as it was.
template <int KEY_TILES, int DIM_TILES>
__device__ __forceinline__ void flash_tile_softmax(float (&s)[KEY_TILES][4], float (&acc)[DIM_TILES][4],
                                                   bool mask, int k0, int quad, int pos_lo,
                                                   int pos_hi, float scale_log2, float& m_lo,
                                                   float& m_hi, float& l_lo, float& l_hi) {
    if (mask) {
#pragma unroll
        for (int n = 0; n < KEY_TILES; ++n) {
            const int key = k0 + n * 8 + 2 * quad;
            if (key > pos_lo) s[n][0] = NEG_INF;
            if (key + 1 > pos_lo) s[n][1] = NEG_INF;
            if (key > pos_hi) s[n][2] = NEG_INF;
            if (key + 1 > pos_hi) s[n][3] = NEG_INF;
        }
    }
    float max_lo = NEG_INF, max_hi = NEG_INF;
#pragma unroll
    for (int n = 0; n < KEY_TILES; ++n) {
        max_lo = fmaxf(max_lo, fmaxf(s[n][0], s[n][1]));
        max_hi = fmaxf(max_hi, fmaxf(s[n][2], s[n][3]));
    }
    max_lo = fmaxf(max_lo, SHFL_XOR(max_lo, 1));
    max_lo = fmaxf(max_lo, SHFL_XOR(max_lo, 2));
    max_hi = fmaxf(max_hi, SHFL_XOR(max_hi, 1));
    max_hi = fmaxf(max_hi, SHFL_XOR(max_hi, 2));
    const float new_lo = fmaxf(m_lo, max_lo), new_hi = fmaxf(m_hi, max_hi);
    // The guard keeps -inf - -inf out of the arithmetic before the first key. The old and
    // new maxima are scaled by the same rounded product (__fmul_rn is never fused into an
    // fma), so a tile that leaves a row's max as it was rescales it by exactly 1: fused,
    // m * scale - use would be the product's rounding error, and the row's bits would
    // depend on whether its step held rows reaching into a later key tile.
    const float use_lo = new_lo == NEG_INF ? 0.0f : __fmul_rn(new_lo, scale_log2);
    const float use_hi = new_hi == NEG_INF ? 0.0f : __fmul_rn(new_hi, scale_log2);
    const float alpha_lo = exp2f(__fmul_rn(m_lo, scale_log2) - use_lo);
    const float alpha_hi = exp2f(__fmul_rn(m_hi, scale_log2) - use_hi);
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int n = 0; n < KEY_TILES; ++n) {
        s[n][0] = exp2f(fmaf(s[n][0], scale_log2, -use_lo));
        s[n][1] = exp2f(fmaf(s[n][1], scale_log2, -use_lo));
        s[n][2] = exp2f(fmaf(s[n][2], scale_log2, -use_hi));
        s[n][3] = exp2f(fmaf(s[n][3], scale_log2, -use_hi));
        sum_lo += s[n][0] + s[n][1];
        sum_hi += s[n][2] + s[n][3];
    }
    l_lo = l_lo * alpha_lo + sum_lo;
    l_hi = l_hi * alpha_hi + sum_hi;
    m_lo = new_lo;
    m_hi = new_hi;
#pragma unroll
    for (int n = 0; n < DIM_TILES; ++n) {
        acc[n][0] *= alpha_lo;
        acc[n][1] *= alpha_lo;
        acc[n][2] *= alpha_hi;
        acc[n][3] *= alpha_hi;
    }
}
#endif

// silu(g) * u, the arithmetic of the MLP's activation wherever a kernel computes it.
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// The rotary embedding of element e of one head x (head_dim = 2 * half elements) by the
// angles `table` (half cosines, then half sines), rounded to bf16 as a rotated value is
// stored: rotary == 1 pairs element i with i + half, rotary == 2 pairs 2i with 2i + 1.
// Every kernel that rotates goes through here, with the products and sums spelled out, so
// they agree to the bit. rope_load reads what rope_apply rotates, so that a kernel can
// issue those loads beside others before it waits on any (rope_element does both).
struct RopeInputs {
    float x0, x1, c, s;
    bool first;  // e is the pair's first element
};

__device__ __forceinline__ RopeInputs rope_load(const bf16* x, int e, int half, int rotary, const float* table) {
    const int p = rotary == 2 ? e / 2 : (e < half ? e : e - half);
    const int a = rotary == 2 ? 2 * p : p;
    const int b = rotary == 2 ? 2 * p + 1 : p + half;
    return RopeInputs{to_f32(x[a]), to_f32(x[b]), table[p], table[half + p], e == a};
}

__device__ __forceinline__ bf16 rope_apply(RopeInputs r) {
    return to_bf16(r.first ? __fmaf_rn(r.x0, r.c, -__fmul_rn(r.x1, r.s)) : __fmaf_rn(r.x1, r.c, __fmul_rn(r.x0, r.s)));
}

__device__ __forceinline__ bf16 rope_element(const bf16* x, int e, int half, int rotary,
                                             const float* table) {
    return rope_apply(rope_load(x, e, half, rotary, table));
}

// A prototype (scripts/decode_chain_bench.cu times it): a chain of one-row products (the
// decode step of one sequence) run by one persistent grid of one block per multiprocessor,
// so that the weights stream from memory without a gap at the products' boundaries.
//
// Each of a block's PROGRAM_WARPS warps owns every PROGRAM_WARPS-th of the block's columns
// of every step (the block's columns being blockIdx.x, blockIdx.x + grid, ...) and streams
// them, one stretch of `k / slices` elements at a time (the GEMV kernel's slices), into a
// private ring of PROGRAM_DEPTH shared-memory slots with asynchronous copies (cp.async). It
// keeps PROGRAM_DEPTH - 1 stretches in flight while it sums the oldest, across the steps'
// boundaries too: weights depend on nothing, so the next product's weights stream while
// the grid waits at the barrier that lets step s + 1 read what step s wrote. The first step
// waits on the kernel ahead (pdl_wait) with its first stretches already loading.
//
// The arithmetic is the GEMV kernel's (kernels/cuda/gemm.cu) to the bit: lane l sums the
// 8-element pieces at 8 * (32 * j + l) of a stretch in ascending order, the warp sums its
// lanes by the same butterfly, and the stretches are added in order; a normed step sums
// (x * gamma) * w and scales by rsqrt(mean(x^2) + eps), x^2 summed in the kernel's order;
// a gated step stores silu(bf16(gate)) * bf16(up); an adding step adds bf16(sum) into the
// f32 residual stream.
//
// Needs sm_90 and every block resident at once (the grid barrier): one block per
// multiprocessor, its shared memory keeping a second from fitting.
//
// Measured on one H200 (scripts/gpu_run.sh chain, 2026-11-30): the Llama-3.2-1B chain of 16
// layers takes 775 us a step this way against 678 us for the fused kernel chain; the
// gate/up product alone streams at 3.32 TB/s (kernels: 3.36), the down product at 2.68
// (kernels: 3.03); on the SmolLM2-135M shape, whose products are small, 626 against 322 us.
// A step boundary here (the grid barrier, then x from L2) costs about 2.5 us, more than a
// kernel boundary under programmatic dependent launch. So the engine keeps the kernels.

#ifndef PROGRAM_WARPS
#define PROGRAM_WARPS 8
#endif
#ifndef PROGRAM_DEPTH
#define PROGRAM_DEPTH 2
#endif
#define PROGRAM_STEPS 8

// One product of a program, `mode` a GemvMode of gemm.cu (which the including file
// includes first): plain, normed, normed gated or adding. w holds n rows of k (2n for a
// gated step: gate rows, then up).
struct ProgramStep {
    const void* x;
    const bf16* gamma;
    const bf16* w;
    void* out;
    int mode, n, k, slices;
};

// A program: its steps; the grid barrier's two counters (barrier[0] and barrier[32], zero
// before the first launch; every launch leaves them so); the bytes of a ring slot; the bytes
// of the longest x as it is kept (bf16 as bf16, the f32 residual as f32), and the longest
// normed x (kept times gamma as f32).
struct Program {
    ProgramStep steps[PROGRAM_STEPS];
    unsigned* barrier;
    int count, slot_bytes, x_bytes, normed_elems;
    float eps;
};

__device__ __forceinline__ unsigned smem_address(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// A barrier of every block: barrier[0] counts the blocks that arrived, barrier[32] (a cache
// line of its own) the barriers passed. The last block to arrive resets the count and opens
// the next generation; the others spin on it. Each block's first thread arrives with a
// release (after the block's barrier, so it publishes the whole block's writes) and leaves
// with an acquire: every write before the barrier is visible after it.
__device__ __forceinline__ void program_grid_barrier(unsigned* barrier) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* generation = barrier + 32;
        unsigned passed, arrived;
        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(passed) : "l"(generation) : "memory");
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(arrived) : "l"(barrier) : "memory");
        if (arrived == gridDim.x - 1) {
            asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(barrier) : "memory");
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(generation) : "memory");
        } else {
            unsigned now;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(generation) : "memory");
            } while (now == passed);
        }
    }
    __syncthreads();
}

__device__ __forceinline__ int program_halves(const ProgramStep& st) { return st.mode == GEMV_NORMED_GATED ? 2 : 1; }

__device__ __forceinline__ bool program_normed(const ProgramStep& st) {
    return st.mode == GEMV_NORMED || st.mode == GEMV_NORMED_GATED;
}

// Where a warp is in its walk over its stretches: step, the warp's i-th column of the step,
// the column's slice.
struct ProgramCursor {
    int step, i, slice;

    // The column, or -1 past the warp's columns of the step.
    __device__ __forceinline__ int column(const Program& p, int warp) const {
        const ProgramStep& st = p.steps[step];
        const i64 j = (i64)warp + (i64)i * PROGRAM_WARPS;  // the block's j-th column
        const i64 col = blockIdx.x + j * gridDim.x;
        return col < st.n ? (int)col : -1;
    }

    // To the first stretch at or after here that is the warp's; false past the last step.
    __device__ __forceinline__ bool settle(const Program& p, int warp) {
        while (step < p.count && column(p, warp) < 0) {
            step++;
            i = 0;
            slice = 0;
        }
        return step < p.count;
    }

    __device__ __forceinline__ bool advance(const Program& p, int warp) {
        if (++slice == p.steps[step].slices) {
            slice = 0;
            i++;
        }
        return settle(p, warp);
    }
};

// Copies the stretch at `at` (each half) into `slot` with 16-byte asynchronous copies, one
// copy group, and moves `at` to the next; false when the walk has ended.
__device__ __forceinline__ bool program_copy(const Program& p, ProgramCursor& at, int warp, unsigned char* slot,
                                             int lane) {
    const ProgramStep& st = p.steps[at.step];
    const int col = at.column(p, warp);
    const int k_slice = st.k / st.slices;
    for (int h = 0; h < program_halves(st); h++) {
        const bf16* src = st.w + ((i64)h * st.n + col) * st.k + (i64)at.slice * k_slice;
        const unsigned dst = smem_address(slot + (size_t)h * k_slice * 2);
        for (int e = lane * 8; e < k_slice; e += 32 * 8)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + e * 2), "l"(src + e) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    return at.advance(p, warp);
}

// x of the step into xs as it is (bf16, or the f32 residual), and for a normed step x * gamma
// into xg as f32; every thread of the block takes part.
__device__ __forceinline__ void program_load_x(const ProgramStep& st, unsigned char* xs, float* xg) {
    const bool normed = program_normed(st);
    for (int e = threadIdx.x * 8; e < st.k; e += blockDim.x * 8) {
        if (normed) {
            const float* x = (const float*)st.x + e;
            const float4 a = __ldcg(reinterpret_cast<const float4*>(x));
            const float4 b = __ldcg(reinterpret_cast<const float4*>(x + 4));
            reinterpret_cast<float4*>(xs)[e / 4] = a;
            reinterpret_cast<float4*>(xs)[e / 4 + 1] = b;
            const float xf[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float gf[8];
            unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(st.gamma + e)), gf);
#pragma unroll
            for (int j = 0; j < 8; j++) xg[e + j] = xf[j] * gf[j];
        } else {
            reinterpret_cast<uint4*>(xs)[e / 8] = __ldcg(reinterpret_cast<const uint4*>((const bf16*)st.x + e));
        }
    }
}

// Eight elements of x from e on, widened to f32.
__device__ __forceinline__ void program_x8(const float* x, int e, float (&xf)[8]) {
    const float4 a = *reinterpret_cast<const float4*>(x + e);
    const float4 b = *reinterpret_cast<const float4*>(x + e + 4);
    xf[0] = a.x, xf[1] = a.y, xf[2] = a.z, xf[3] = a.w;
    xf[4] = b.x, xf[5] = b.y, xf[6] = b.z, xf[7] = b.w;
}

__device__ __forceinline__ void program_x8(const bf16* x, int e, float (&xf)[8]) {
    unpack_bf16x8(*reinterpret_cast<const uint4*>(x + e), xf);
}

// The sum of x * x in the order the normed GEMV kernel sums it: thread t of its block of
// GEMV_WARPS warps the 4-element pieces t, t + 256, ... in order, each warp by the
// butterfly, then the warps in order.
__device__ __forceinline__ float program_sum_squares(const float* xs, int k, int lane) {
    const int threads = GEMV_WARPS * 32;
    float total = 0.0f;
    for (int w = 0; w < GEMV_WARPS; w++) {
        float acc = 0.0f;
        for (int i = w * 32 + lane; i < k / 4; i += threads)
#pragma unroll
            for (int j = 0; j < 4; j++) acc = fmaf(xs[4 * i + j], xs[4 * i + j], acc);
        const float part = warp_sum(acc);
        total = w == 0 ? part : total + part;
    }
    return total;
}

// Sums of one stretch (each half) of `slot` against x (from kb0 on), the warp's total.
template <int HALVES, typename X>
__device__ __forceinline__ void program_stretch(const unsigned char* slot, const X* x, int k_slice, int lane,
                                                float (&part)[2]) {
    const bf16* w = (const bf16*)slot;
    float acc[HALVES];
#pragma unroll
    for (int h = 0; h < HALVES; h++) acc[h] = 0.0f;
#pragma unroll 4
    for (int e = lane * 8; e < k_slice; e += 32 * 8) {
        float xf[8];
        program_x8(x, e, xf);
#pragma unroll
        for (int h = 0; h < HALVES; h++) {
            float wf[8];
            unpack_bf16x8(*reinterpret_cast<const uint4*>(w + (size_t)h * k_slice + e), wf);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[h] = fmaf(xf[j], wf[j], acc[h]);
        }
    }
#pragma unroll
    for (int h = 0; h < HALVES; h++) part[h] = warp_sum(acc[h]);
}

extern "C" __global__ void __launch_bounds__(PROGRAM_WARPS * 32, 1) gemv_program(const Program p) {
    extern __shared__ __align__(128) unsigned char program_smem[];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned char* ring = program_smem + (size_t)warp * PROGRAM_DEPTH * p.slot_bytes;
    unsigned char* xs = program_smem + (size_t)PROGRAM_WARPS * PROGRAM_DEPTH * p.slot_bytes;
    float* xg = (float*)(xs + p.x_bytes);
    pdl_launch_dependents();
    // The first PROGRAM_DEPTH - 1 stretches, before the kernel ahead has finished. Stretch
    // number q (of the warp's) sits in slot q % PROGRAM_DEPTH; every stretch is one copy
    // group (an empty one past the last), so that wait_group counts stretches.
    ProgramCursor issue{0, 0, 0};
    bool more = issue.settle(p, warp);
    int issued = 0;
    for (; issued < PROGRAM_DEPTH - 1; issued++) {
        if (more) {
            more = program_copy(p, issue, warp, ring + (size_t)(issued % PROGRAM_DEPTH) * p.slot_bytes, lane);
        } else {
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
    }
    ProgramCursor use{0, 0, 0};
    bool have = use.settle(p, warp);
    int used = 0;
    for (int s = 0; s < p.count; s++) {
        const ProgramStep& st = p.steps[s];
        if (s == 0) {
            pdl_wait();
        } else {
            program_grid_barrier(p.barrier);
        }
        program_load_x(st, xs, xg);
        __syncthreads();
        const bool normed = program_normed(st);
        const float inv =
            normed ? rsqrtf(program_sum_squares((const float*)xs, st.k, lane) / st.k + p.eps) : 1.0f;
        const int k_slice = st.k / st.slices;
        float total[2] = {0.0f, 0.0f};
        for (; have && use.step == s; used++) {
            if (more) {
                more = program_copy(p, issue, warp, ring + (size_t)(issued % PROGRAM_DEPTH) * p.slot_bytes, lane);
            } else {
                asm volatile("cp.async.commit_group;" ::: "memory");
            }
            issued++;
            // Every group but the PROGRAM_DEPTH - 1 newest has landed, stretch `used` among
            // them; the warp's other lanes copied parts of it.
            asm volatile("cp.async.wait_group %0;" ::"n"(PROGRAM_DEPTH - 1) : "memory");
            __syncwarp();
            const unsigned char* slot = ring + (size_t)(used % PROGRAM_DEPTH) * p.slot_bytes;
            float part[2];
            const int at = use.slice * k_slice;
            if (st.mode == GEMV_NORMED_GATED) {
                program_stretch<2>(slot, xg + at, k_slice, lane, part);
            } else if (normed) {
                program_stretch<1>(slot, xg + at, k_slice, lane, part);
            } else {
                program_stretch<1>(slot, (const bf16*)xs + at, k_slice, lane, part);
            }
            total[0] = use.slice == 0 ? part[0] : total[0] + part[0];
            total[1] = use.slice == 0 ? part[1] : total[1] + part[1];
            if (use.slice == st.slices - 1 && lane == 0) {
                const int col = use.column(p, warp);
                const float v = total[0] * inv;
                if (st.mode == GEMV_NORMED_GATED) {
                    const float up = total[1] * inv;
                    ((bf16*)st.out)[col] = to_bf16(silu_times(to_f32(to_bf16(v)), to_f32(to_bf16(up))));
                } else if (st.mode == GEMV_ADD) {
                    float* out = (float*)st.out;
                    out[col] = __ldcg(out + col) + to_f32(to_bf16(total[0]));
                } else {
                    ((bf16*)st.out)[col] = to_bf16(v);
                }
            }
            // The slot is read before a later copy refills it.
            __syncwarp();
            have = use.advance(p, warp);
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// Batch-invariant products on tensor cores (sm_80 and up): out[m, n] = sum_k x[m, k] * w[n, k]
// (x and w bf16, row-major, w in PyTorch's [n, k] layout), f32 sums, out bf16 or f32. Every
// product of --deterministic mode whose depth k is a multiple of 32 (the others take the
// fixed-order GEMV, gemm.cu).
//
// The sum of one output element is a single chain of mma.sync.m16n8k16 products over k, in
// chunks of GBI_CHUNK = 32 from k = 0 up, two products a chunk, starting from zero: k is
// never split. A lane takes its fragments of a chunk as 16-byte pieces: elements 8q .. 8q + 7
// of a row of x and of a row of w (q = lane % 4, the row from lane / 4). The first product of
// a chunk sums elements 8q .. 8q + 3 of every q, the second 8q + 4 .. 8q + 7: an mma's 16
// positions of k are paired the same way in its x and w fragments, so each product sums
// matching elements, in an order chosen so that a fragment is one load. The tensor core
// computes each element of its 16 x 8 result from that element's row and column alone, so
// an element's bits depend on its row of x, its row of w and k only: not on m, on where its
// row or column falls in a tile, or on the tile shape. Launchers pick a shape for the rows
// and columns (kernels/src/cuda/gemm/fixed_mma.rs); every shape gives the same bits.
//
// A block computes a BM x BN tile of out with (BM / WM) x (BN / WN) warps of WM x WN each.
// Its rows of w, and of x where X_SHARED, are copied into dynamic shared memory SC chunks (a
// stage) at a time (cp.async, zeros past row m and column n), STAGES - 1 stages ahead of the
// one being summed. A stage is laid out chunk by chunk, each chunk's rows of 64 bytes
// unpadded: the 16-byte pieces a quarter warp reads (two rows, four pieces each) fall in
// distinct banks. Without X_SHARED (a tile of 16 rows) a warp reads its fragments of x from
// global memory, a stage's worth before its products.
//
// Requires k % 32 == 0 and 16-byte aligned x and w (the launcher checks), and the shared
// bytes STAGES * SC * (BM + BN) * 64 (BN for BM + BN without X_SHARED) granted by the
// launcher. Where tensor-core products are missing (before sm_80, HIP) the kernels trap;
// the launcher does not choose them there.

#define GBI_CHUNK 32  // elements of k a chunk holds (two mma products)

__device__ __forceinline__ void gbi_store(bf16* out, i64 at, float v) { out[at] = to_bf16(v); }
__device__ __forceinline__ void gbi_store(float* out, i64 at, float v) { out[at] = v; }

template <int BM, int BN, int WM, int WN, int STAGES, int SC, bool X_SHARED, typename OUT>
__device__ __forceinline__ void gemm_fixed_mma(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                               OUT* __restrict__ out, int m, int n, int k) {
#ifdef TENSOR_CORES
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int MT = WM / 16, NT = WN / 8;
    constexpr int XROWS = X_SHARED ? BM : 0;     // shared rows of a chunk: x's, then w's
    constexpr int ROWS = XROWS + BN;
    constexpr int STAGE = SC * ROWS * GBI_CHUNK;  // bf16 of a stage
    extern __shared__ __align__(128) unsigned char gbi_shared[];
    bf16* const ring = reinterpret_cast<bf16*>(gbi_shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, q = lane % 4;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int wrow = (warp / WARPS_N) * WM, wcol = (warp % WARPS_N) * WN;
    const int chunks = k / GBI_CHUNK;
    const int stages = (chunks + SC - 1) / SC;
    pdl_begin();

    // Copies stage t of the tile's rows into ring slot `slot`: a row's SC * 4 pieces of 16
    // bytes are contiguous in memory, so consecutive threads take them.
    auto load = [&](int t, int slot) {
        for (int p = threadIdx.x; p < ROWS * SC * 4; p += THREADS) {
            const int r = p / (SC * 4), j = p % (SC * 4);
            const int chunk = t * SC + j / 4;
            const bool of_x = r < XROWS;
            const int row = of_x ? row0 + r : col0 + (r - XROWS);
            const bool valid = row < (of_x ? m : n) && chunk < chunks;
            const bf16* src = (of_x ? x : w) + (valid ? (i64)row * k + (i64)chunk * GBI_CHUNK + (j % 4) * 8 : 0);
            bf16* dst = ring + slot * STAGE + ((j / 4) * ROWS + r) * GBI_CHUNK + (j % 4) * 8;
            copy16_async(shared_addr(dst), src, valid);
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int t = 0; t < STAGES - 1; t++) {
        if (t < stages) load(t, t);
        copy_async_commit();
    }
    for (int t = 0; t < stages; t++) {
        copy_async_wait<STAGES - 2>();  // stage t is in
        __syncthreads();                // and every warp is done with stage t - 1's slot
        const int ahead = t + STAGES - 1;
        if (ahead < stages) load(ahead, ahead % STAGES);
        copy_async_commit();
        const bf16* const stage = ring + (t % STAGES) * STAGE;
        // Without x in shared memory, the fragments of x (one tile of 16 rows) for the whole
        // stage are loaded first, so that their latencies overlap.
        uint4 x_lo[X_SHARED ? 1 : SC], x_hi[X_SHARED ? 1 : SC];
        if (!X_SHARED) {
#pragma unroll
            for (int c = 0; c < SC; c++) {
                const int chunk = t * SC + c, r = row0 + g;
                const bf16* a = x + (i64)r * k + (i64)chunk * GBI_CHUNK + 8 * q;
                x_lo[c] = x_hi[c] = make_uint4(0, 0, 0, 0);
                if (chunk < chunks && r < m) x_lo[c] = load_bf16x8(a);
                if (chunk < chunks && r + 8 < m) x_hi[c] = load_bf16x8(a + 8 * (i64)k);
            }
        }
        // Chunk c of the stage into the sums.
        auto sum_chunk = [&](int c) {
            const bf16* tile = stage + c * ROWS * GBI_CHUNK;
            uint4 b[NT];
#pragma unroll
            for (int j = 0; j < NT; j++)
                b[j] = *reinterpret_cast<const uint4*>(tile + (XROWS + wcol + 8 * j + g) * GBI_CHUNK + 8 * q);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                uint4 lo, hi;
                if (X_SHARED) {
                    const bf16* a = tile + (wrow + 16 * i + g) * GBI_CHUNK + 8 * q;
                    lo = *reinterpret_cast<const uint4*>(a);
                    hi = *reinterpret_cast<const uint4*>(a + 8 * GBI_CHUNK);
                } else {
                    lo = x_lo[X_SHARED ? 0 : c];
                    hi = x_hi[X_SHARED ? 0 : c];
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    mma_bf16_16816(acc[i][j], lo.x, hi.x, lo.y, hi.y, b[j].x, b[j].y);
                    mma_bf16_16816(acc[i][j], lo.z, hi.z, lo.w, hi.w, b[j].z, b[j].w);
                }
            }
        };
        // A whole stage without a branch, so that its shared loads can all be issued ahead
        // of the products; the last stage of a depth that is not a multiple of SC chunks
        // stops at k.
        if ((t + 1) * SC <= chunks) {
#pragma unroll
            for (int c = 0; c < SC; c++) sum_chunk(c);
        } else {
#pragma unroll
            for (int c = 0; c < SC; c++)
                if (t * SC + c < chunks) sum_chunk(c);
        }
    }

    // Element e of a lane's result fragment is row g + 8 (e / 2), column 2q + e % 2.
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = row0 + wrow + 16 * i + g + 8 * (e / 2);
                const int col = col0 + wcol + 8 * j + 2 * q + e % 2;
                if (row < m && col < n) gbi_store(out, (i64)row * n + col, acc[i][j][e]);
            }
#else
    (void)x, (void)w, (void)out, (void)m, (void)n, (void)k;
    __trap();
#endif
}

// One kernel per tile shape and output type: gemm_fixed_mma_m{BM}n{BN}_{bf16,f32}, launched
// with (BM / WM) * (BN / WN) * 32 threads, a grid of (ceil(n / BN), ceil(m / BM)) and the
// shared bytes of its STAGES and SC (kernels/src/cuda/gemm/fixed_mma.rs, which checks that
// it agrees with these lines): <BM, BN, WM, WN, STAGES, SC, x in shared memory>.
#define GBI_PARAMS(OUT) const bf16 *__restrict__ x, const bf16 *__restrict__ w, OUT *__restrict__ out, int m, int n, int k

// Few rows (decode, verification): one 16-row tile, column tiles narrow enough for a grid
// that fills the device, 8 KiB of w a stage (the narrowest tile reads x in place: measured
// faster there than with x in shared memory, slower for the wider tile).
extern "C" __global__ void __launch_bounds__(64) gemm_fixed_mma_m16n16_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma<16, 16, 16, 8, 8, 8, false>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(64) gemm_fixed_mma_m16n16_f32(GBI_PARAMS(float)) { gemm_fixed_mma<16, 16, 16, 8, 8, 8, false>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m16n32_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma<16, 32, 16, 8, 4, 8, true>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m16n32_f32(GBI_PARAMS(float)) { gemm_fixed_mma<16, 32, 16, 8, 4, 8, true>(x, w, out, m, n, k); }

// Up to 64 rows (batched decode).
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m64n16_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma<64, 16, 16, 16, 4, 4, true>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m64n16_f32(GBI_PARAMS(float)) { gemm_fixed_mma<64, 16, 16, 16, 4, 4, true>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m64n32_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma<64, 32, 32, 16, 3, 4, true>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m64n32_f32(GBI_PARAMS(float)) { gemm_fixed_mma<64, 32, 32, 16, 3, 4, true>(x, w, out, m, n, k); }

// Prefill.
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m64n64_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma<64, 64, 32, 32, 4, 1, true>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m64n64_f32(GBI_PARAMS(float)) { gemm_fixed_mma<64, 64, 32, 32, 4, 1, true>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(256) gemm_fixed_mma_m128n128_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma<128, 128, 64, 32, 3, 1, true>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(256) gemm_fixed_mma_m128n128_f32(GBI_PARAMS(float)) { gemm_fixed_mma<128, 128, 64, 32, 3, 1, true>(x, w, out, m, n, k); }

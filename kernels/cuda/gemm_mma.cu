// Batch-invariant products on tensor cores (sm_80 and up): out[m, n] = sum_k x[m, k] * w[n, k]
// (x and w bf16, row-major, w in PyTorch's [n, k] layout), f32 sums, out bf16 or f32. Every
// product of --deterministic mode whose depth k is a multiple of 32 (the others take the
// fixed-order GEMV, gemm.cu).
//
// The sum of one output element is fixed by k alone. k is cut into stretches of
// GBI_STRETCH chunks of GBI_CHUNK = 32 (the last stretch may be shorter); each stretch is
// one chain of mma.sync.m16n8k16 products over its chunks in order, two products a chunk,
// starting from zero; the element is the first stretch's chain, plus the second's, and so
// on in order. A lane takes its fragments of a chunk as 16-byte pieces: elements
// 8q .. 8q + 7 of a row of x and of a row of w (q = lane % 4, the row from lane / 4). The
// first product of a chunk sums elements 8q .. 8q + 3 of every q, the second 8q + 4 ..
// 8q + 7: an mma's 16 positions of k are paired the same way in its x and w fragments, so
// each product sums matching elements, in an order chosen so that a fragment is one load.
// The tensor core computes each element of its 16 x 8 result from that element's row and
// column alone, so an element's bits depend on its row of x, its row of w and k only: not
// on m, on where its row or column falls in a tile, or on the kernel. Launchers pick a
// kernel and a tile shape for the rows and columns (kernels/src/cuda/gemm/fixed_mma.rs);
// every choice gives the same bits.
//
// Up to 64 rows (decode, verification), gemm_fixed_mma_split: a block of WARPS warps owns
// BN columns and a group of 16 rows (blockIdx.x; blockIdx.y the columns, so that the groups
// of one column tile run side by side and all but the first read its rows of w from L2),
// warp w takes stretches w, w + WARPS, ... and streams their rows of w and x into
// registers, PREFETCH chunks ahead; the stretches' sums meet in shared memory, where the
// block adds them in order. So the chains of one product run side by side, several to a
// multiprocessor, and the weights stream at the pace of memory rather than of one chain (a
// tile whose one warp summed all of k ran at a third of it).
//
// More rows, gemm_fixed_mma: a block computes a BM x BN tile of out with (BM / WM) x
// (BN / WN) warps of WM x WN each, the stretches one after another (each warp keeps the sum
// of the stretches before beside the running chain). Its rows of x and w are copied into
// dynamic shared memory SC chunks (a stage) at a time (cp.async, zeros past row m and
// column n), STAGES - 1 stages ahead of the one being summed. A stage is laid out chunk by
// chunk, each chunk's rows of 64 bytes unpadded: the 16-byte pieces a quarter warp reads
// (two rows, four pieces each) fall in distinct banks.
//
// Requires k % 32 == 0, at most GBI_MAX_STRETCHES stretches and 16-byte aligned x and w
// (the launcher checks), and the dynamic shared memory the launcher grants: STAGES * SC *
// (BM + BN) * 64 bytes for gemm_fixed_mma, stretches * 16 * BN * 4 for the split kernel.
// Where tensor-core products are missing (before sm_80, HIP) the kernels trap; the launcher
// does not choose them there.

#define GBI_CHUNK 32         // elements of k a chunk holds (two mma products)
#define GBI_STRETCH 16       // chunks of a stretch: one chain of products
#define GBI_MAX_STRETCHES 64  // k up to 32,768

template <int BM, int BN, int WM, int WN, int STAGES, int SC, typename OUT>
__device__ __forceinline__ void gemm_fixed_mma(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                               OUT* __restrict__ out, int m, int n, int k) {
#ifdef TENSOR_CORES
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int MT = WM / 16, NT = WN / 8;
    constexpr int ROWS = BM + BN;                 // shared rows of a chunk: x's, then w's
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
            const bool of_x = r < BM;
            const int row = of_x ? row0 + r : col0 + (r - BM);
            const bool valid = row < (of_x ? m : n) && chunk < chunks;
            const bf16* src = (of_x ? x : w) + (valid ? (i64)row * k + (i64)chunk * GBI_CHUNK + (j % 4) * 8 : 0);
            bf16* dst = ring + slot * STAGE + ((j / 4) * ROWS + r) * GBI_CHUNK + (j % 4) * 8;
            copy16_async(shared_addr(dst), src, valid);
        }
    };

    float acc[MT][NT][4];    // the running stretch's chain
    float total[MT][NT][4];  // the stretches before it, added in order
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = total[i][j][e] = 0.0f;

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
        // Chunk c of the stage into the chain; at the end of a stretch (or of k) the chain
        // joins the total and starts again from zero.
        auto sum_chunk = [&](int c) {
            const int chunk = t * SC + c;
            const bf16* tile = stage + c * ROWS * GBI_CHUNK;
            uint4 b[NT];
#pragma unroll
            for (int j = 0; j < NT; j++)
                b[j] = *reinterpret_cast<const uint4*>(tile + (BM + wcol + 8 * j + g) * GBI_CHUNK + 8 * q);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const bf16* a = tile + (wrow + 16 * i + g) * GBI_CHUNK + 8 * q;
                const uint4 lo = *reinterpret_cast<const uint4*>(a);
                const uint4 hi = *reinterpret_cast<const uint4*>(a + 8 * GBI_CHUNK);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    mma_bf16_16816(acc[i][j], lo.x, hi.x, lo.y, hi.y, b[j].x, b[j].y);
                    mma_bf16_16816(acc[i][j], lo.z, hi.z, lo.w, hi.w, b[j].z, b[j].w);
                }
            }
            if ((chunk + 1) % GBI_STRETCH == 0 || chunk + 1 == chunks) {
                const bool first = chunk < GBI_STRETCH;
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            total[i][j][e] = first ? acc[i][j][e] : total[i][j][e] + acc[i][j][e];
                            acc[i][j][e] = 0.0f;
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
                if (row < m && col < n) store_out(out, (i64)row * n + col, total[i][j][e]);
            }
#else
    (void)x, (void)w, (void)out, (void)m, (void)n, (void)k;
    __trap();
#endif
}

template <int BN, int WARPS, int PREFETCH, typename OUT>
__device__ __forceinline__ void gemm_fixed_mma_split(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                     OUT* __restrict__ out, int m, int n, int k) {
#ifdef TENSOR_CORES
    constexpr int NT = BN / 8;
    extern __shared__ __align__(16) unsigned char gbi_parts[];
    float* const parts = reinterpret_cast<float*>(gbi_parts);  // [stretch][16 rows][BN]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, q = lane % 4;
    const int col0 = blockIdx.y * BN;
    x += (i64)blockIdx.x * 16 * k;  // the block's group of rows
    out += (i64)blockIdx.x * 16 * n;
    m -= blockIdx.x * 16;
    const int chunks = k / GBI_CHUNK;
    const int stretches = (chunks + GBI_STRETCH - 1) / GBI_STRETCH;
    const unsigned long long policy = l2_stream_policy();
    pdl_begin();
    for (int s = warp; s < stretches; s += WARPS) {
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        const int end = min(chunks, (s + 1) * GBI_STRETCH);
        for (int c0 = s * GBI_STRETCH; c0 < end; c0 += PREFETCH) {
            uint4 b[PREFETCH][NT], lo[PREFETCH], hi[PREFETCH];
#pragma unroll
            for (int u = 0; u < PREFETCH; u++) {
                const int chunk = c0 + u;
                const i64 at = (i64)chunk * GBI_CHUNK + 8 * q;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int col = col0 + 8 * j + g;
                    b[u][j] = make_uint4(0, 0, 0, 0);
                    if (chunk < end && col < n) b[u][j] = load_streamed_bf16x8(w + (i64)col * k + at, policy);
                }
                lo[u] = hi[u] = make_uint4(0, 0, 0, 0);
                if (chunk < end && g < m) lo[u] = load_bf16x8(x + (i64)g * k + at);
                if (chunk < end && g + 8 < m) hi[u] = load_bf16x8(x + (i64)(g + 8) * k + at);
            }
#pragma unroll
            for (int u = 0; u < PREFETCH; u++) {
                if (c0 + u < end) {
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        mma_bf16_16816(acc[j], lo[u].x, hi[u].x, lo[u].y, hi[u].y, b[u][j].x, b[u][j].y);
                        mma_bf16_16816(acc[j], lo[u].z, hi[u].z, lo[u].w, hi[u].w, b[u][j].z, b[u][j].w);
                    }
                }
            }
        }
        // Element e of a lane's result fragment is row g + 8 (e / 2), column 2q + e % 2.
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                parts[(s * 16 + g + 8 * (e / 2)) * BN + 8 * j + 2 * q + e % 2] = acc[j][e];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < 16 * BN; idx += WARPS * 32) {
        const int row = idx / BN, col = col0 + idx % BN;
        if (row >= m || col >= n) continue;
        float sum = parts[idx];
        for (int s = 1; s < stretches; s++) sum += parts[s * 16 * BN + idx];
        store_out(out, (i64)row * n + col, sum);
    }
#else
    (void)x, (void)w, (void)out, (void)m, (void)n, (void)k;
    __trap();
#endif
}

// The kernels: gemm_fixed_mma_split_n{BN}w{WARPS}_{bf16,f32} <BN, WARPS, PREFETCH>, launched
// with WARPS * 32 threads and a grid of (ceil(m / 16), ceil(n / BN)); gemm_fixed_mma_m{BM}n{BN}_{bf16,f32}
// <BM, BN, WM, WN, STAGES, SC>, launched with (BM / WM) * (BN / WN) * 32 threads and a grid
// of (ceil(n / BN), ceil(m / BM)); both with the shared bytes the header gives
// (kernels/src/cuda/gemm/fixed_mma.rs, whose test checks that it agrees with these lines).
#define GBI_PARAMS(OUT) const bf16 *__restrict__ x, const bf16 *__restrict__ w, OUT *__restrict__ out, int m, int n, int k

// Up to 64 rows: column tiles of 8, 16 or 32, 4 warps (up to 4 stretches, k <= 2,048) or 8.
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_split_n8w4_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma_split<8, 4, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_split_n8w4_f32(GBI_PARAMS(float)) { gemm_fixed_mma_split<8, 4, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(256) gemm_fixed_mma_split_n8w8_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma_split<8, 8, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(256) gemm_fixed_mma_split_n8w8_f32(GBI_PARAMS(float)) { gemm_fixed_mma_split<8, 8, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_split_n16w4_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma_split<16, 4, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_split_n16w4_f32(GBI_PARAMS(float)) { gemm_fixed_mma_split<16, 4, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(256) gemm_fixed_mma_split_n16w8_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma_split<16, 8, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(256) gemm_fixed_mma_split_n16w8_f32(GBI_PARAMS(float)) { gemm_fixed_mma_split<16, 8, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_split_n32w4_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma_split<32, 4, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_split_n32w4_f32(GBI_PARAMS(float)) { gemm_fixed_mma_split<32, 4, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(256) gemm_fixed_mma_split_n32w8_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma_split<32, 8, 4>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(256) gemm_fixed_mma_split_n32w8_f32(GBI_PARAMS(float)) { gemm_fixed_mma_split<32, 8, 4>(x, w, out, m, n, k); }

// Prefill.
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m64n64_bf16(GBI_PARAMS(bf16)) { gemm_fixed_mma<64, 64, 32, 32, 4, 1>(x, w, out, m, n, k); }
extern "C" __global__ void __launch_bounds__(128) gemm_fixed_mma_m64n64_f32(GBI_PARAMS(float)) { gemm_fixed_mma<64, 64, 32, 32, 4, 1>(x, w, out, m, n, k); }

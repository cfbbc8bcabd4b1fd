// Matrix-vector style products out[m, n] = sum_k x[m, k] * w[n, k] (x and w bf16, f32
// accumulation) for few rows: the decode steps of small batches, and every product of
// --deterministic mode.
//
// Each block owns GEMV_COLS output columns (rows of w); its GEMV_WARPS warps split k in
// 16-byte pieces of 8 elements: lane l of warp q takes the pieces at
// k = 8 * (32 * (GEMV_WARPS * j + q) + l) for j = 0, 1, 2, ..., accumulating them in
// ascending order (loads run GEMV_UNROLL pieces ahead); each warp sums its lanes by a fixed
// butterfly and the block sums its warps in order 0, 1, 2, 3. That order depends on k
// alone, never on m, on the row chunk or on the block a column falls in, so a row's result
// is bit-identical whatever else is in the batch (cuBLAS picks its algorithm by shape, and
// its split-k reductions change with m). Rows are taken GEMV_ROWS at a time; the weight rows
// of a block are re-read for every chunk, from L1/L2 rather than memory.
//
// Requires k % 8 == 0 and 16-byte aligned rows (checked by the launcher).

#define GEMV_ROWS 8
#define GEMV_COLS 2
#define GEMV_WARPS 4
#define GEMV_UNROLL 4

template <typename OUT>
__device__ __forceinline__ void store_out(OUT* out, i64 at, float v);

template <>
__device__ __forceinline__ void store_out<bf16>(bf16* out, i64 at, float v) { out[at] = to_bf16(v); }

template <>
__device__ __forceinline__ void store_out<float>(float* out, i64 at, float v) { out[at] = v; }

// Eight elements of row r of the product's input at column kb: x itself, or with GATED the
// gated MLP activation silu(x[r, kb]) * x[r, k + kb] of a [m, 2k] gate/up matrix, rounded to
// bf16 as the separate silu_and_mul kernel would store it.
template <bool GATED>
__device__ __forceinline__ void load_x(const bf16* __restrict__ x, int r, int kb, int k, float out[8]) {
    if (GATED) {
        float g[8], u[8];
        unpack_bf16x8(load_bf16x8(x + (i64)r * 2 * k + kb), g);
        unpack_bf16x8(load_bf16x8(x + (i64)r * 2 * k + k + kb), u);
#pragma unroll
        for (int j = 0; j < 8; j++) out[j] = to_f32(to_bf16(g[j] / (1.0f + __expf(-g[j])) * u[j]));
    } else {
        unpack_bf16x8(load_bf16x8(x + (i64)r * k + kb), out);
    }
}

template <typename OUT, bool GATED>
__device__ __forceinline__ void gemv_body(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                          OUT* __restrict__ out, int m, int n, int k) {
    __shared__ float partial[GEMV_WARPS][GEMV_ROWS][GEMV_COLS];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const i64 col0 = (i64)blockIdx.x * GEMV_COLS;
    // Elements one round of the block covers: each warp takes every GEMV_WARPS-th piece.
    const int round = WARP_SIZE * 8 * GEMV_WARPS;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int r0 = 0; r0 < m; r0 += GEMV_ROWS) {
        float acc[GEMV_ROWS][GEMV_COLS];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
            for (int c = 0; c < GEMV_COLS; c++) acc[r][c] = 0.0f;
        for (int base = (warp * WARP_SIZE + lane) * 8; base < k; base += round * GEMV_UNROLL) {
            // Every weight load of the stretch is issued before the first is used, so that
            // GEMV_UNROLL * GEMV_COLS 16-byte loads per lane are in flight at once.
            uint4 wv[GEMV_UNROLL][GEMV_COLS];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                const int kb = base + u * round;
#pragma unroll
                for (int c = 0; c < GEMV_COLS; c++)
                    wv[u][c] = kb < k && col0 + c < n
                        ? load_bf16x8(w + (col0 + c) * k + kb)
                        : zero;
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                const int kb = base + u * round;
                if (kb >= k) break;
                float wf[GEMV_COLS][8];
#pragma unroll
                for (int c = 0; c < GEMV_COLS; c++) unpack_bf16x8(wv[u][c], wf[c]);
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++) {
                    if (r0 + r < m) {
                        float xf[8];
                        load_x<GATED>(x, r0 + r, kb, k, xf);
#pragma unroll
                        for (int c = 0; c < GEMV_COLS; c++)
#pragma unroll
                            for (int j = 0; j < 8; j++) acc[r][c] = fmaf(xf[j], wf[c][j], acc[r][c]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            if (r0 + r >= m) break;
#pragma unroll
            for (int c = 0; c < GEMV_COLS; c++) {
                const float v = warp_sum(acc[r][c]);
                if (lane == 0) partial[warp][r][c] = v;
            }
        }
        __syncthreads();
        if (threadIdx.x < GEMV_ROWS * GEMV_COLS) {
            const int r = threadIdx.x / GEMV_COLS, c = threadIdx.x % GEMV_COLS;
            if (r0 + r < m && col0 + c < n) {
                float v = partial[0][r][c];
#pragma unroll
                for (int q = 1; q < GEMV_WARPS; q++) v += partial[q][r][c];
                store_out(out, (i64)(r0 + r) * n + col0 + c, v);
            }
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(128) gemv_fixed_order_bf16(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k) {
    gemv_body<bf16, false>(x, w, out, m, n, k);
}

extern "C" __global__ void __launch_bounds__(128) gemv_fixed_order_f32(
    const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int m, int n,
    int k) {
    gemv_body<float, false>(x, w, out, m, n, k);
}

// The MLP's down projection fused with its activation: x is the [m, 2k] gate/up matrix.
extern "C" __global__ void __launch_bounds__(128) gemv_gated_fixed_order_bf16(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k) {
    gemv_body<bf16, true>(x, w, out, m, n, k);
}

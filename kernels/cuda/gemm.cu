// Matrix-vector style products out[m, n] = sum_k x[m, k] * w[n, k] (x and w bf16, f32
// accumulation) for few rows: the decode steps of small batches, and every product of
// --deterministic mode.
//
// Each column (a row of w) is streamed by `slices` warps (1, 2, 4 or 8, chosen from k alone
// by the launcher: long rows are split so that a warp streams at most 2048 elements),
// warp s taking the s-th of `slices` equal stretches of k, once per ROWS rows of x: lane l
// takes the 16-byte pieces of 8 elements at 8 * (32 * j + l) into its stretch for j = 0, 1,
// 2, ..., accumulating them in ascending order (GEMV_UNROLL loads in flight per lane); the
// warp sums its lanes by a fixed butterfly, and the column's first warp adds the stretches
// in order. A block is GEMV_WARPS / slices columns. That order depends on k alone, never on
// m, on the row chunk or on the block a column falls in, so a row's result is
// bit-identical whatever else is in the batch (cuBLAS picks its algorithm by shape, and its split-k reductions change
// with m). A kernel takes ROWS = 1, 2, 4 or 8 rows of x per pass over the column (the
// launcher picks the smallest that holds m, up to 8, so that one row costs the registers
// of one accumulator and more blocks fit a multiprocessor); past ROWS rows the column is
// streamed again, from L2 rather than memory.
//
// As soon as it starts, while the kernel ahead may still run (programmatic dependent
// launch, common.cuh), a warp of the one-row kernels loads the first stretch of its
// column's weights into registers; it reads x only after pdl_wait(). So the weights of a product stream from
// memory while the kernels it depends on finish.
//
// Requires k % 8 == 0 and 16-byte aligned rows (checked by the launcher).

#define GEMV_WARPS 8
#define GEMV_UNROLL 8

template <typename OUT>
__device__ __forceinline__ void store_out(OUT* out, i64 at, float v);

template <>
__device__ __forceinline__ void store_out<bf16>(bf16* out, i64 at, float v) { out[at] = to_bf16(v); }

template <>
__device__ __forceinline__ void store_out<float>(float* out, i64 at, float v) { out[at] = v; }

// Elements one step of a warp covers.
#define GEMV_PIECE (WARP_SIZE * 8)

// One stretch of a lane's weights from `base`: every load is issued before the first is
// used (zeros past `end`).
template <int HALVES>
__device__ __forceinline__ void gemv_load_weights(uint4 (&wv)[HALVES][GEMV_UNROLL],
                                                  const bf16* const (&w_rows)[HALVES], int base,
                                                  int end) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        const int kb = base + u * GEMV_PIECE;
#pragma unroll
        for (int h = 0; h < HALVES; h++) wv[h][u] = kb < end ? load_bf16x8(w_rows[h] + kb) : zero;
    }
}

// GATED: the launcher's n is the MLP's intermediate size and w holds 2n rows, gate rows
// then up rows; column j streams rows j and n + j side by side, rounds both sums to bf16 as
// the product would, and stores silu(gate) * up (the arithmetic of silu_and_mul_bf16), so
// the gate/up activation never goes through memory.
template <typename OUT, int ROWS, bool GATED>
__device__ __forceinline__ void gemv_body(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                          OUT* __restrict__ out, int m, int n, int k,
                                          int slices) {
    constexpr int HALVES = GATED ? 2 : 1;
    __shared__ float partial[GEMV_WARPS][HALVES][ROWS];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int slice = warp % slices;
    const i64 col = (i64)blockIdx.x * (GEMV_WARPS / slices) + warp / slices;
    // A warp past the last column still reaches every barrier below.
    const bool active = col < n;
    const int k_slice = k / slices;
    const bf16* w_rows[HALVES];
#pragma unroll
    for (int h = 0; h < HALVES; h++) w_rows[h] = w + ((active ? col : 0) + (i64)h * n) * k;
    const int first = slice * k_slice, end = first + k_slice;
    // One row (decode): the first stretch of weights is loaded while the kernel ahead
    // finishes, x only after. More rows load every stretch in the loop: registers held
    // across the passes would cost the accumulators theirs.
    constexpr bool AHEAD = ROWS == 1;
    const int start = first + lane * 8;
    uint4 wv[HALVES][GEMV_UNROLL];
    pdl_launch_dependents();
    if (AHEAD && active) gemv_load_weights<HALVES>(wv, w_rows, start, end);
    pdl_wait();
    for (int r0 = 0; r0 < m; r0 += ROWS) {
        float acc[HALVES][ROWS];
#pragma unroll
        for (int h = 0; h < HALVES; h++)
#pragma unroll
            for (int r = 0; r < ROWS; r++) acc[h][r] = 0.0f;
        for (int base = start; active && base < end; base += GEMV_PIECE * GEMV_UNROLL) {
            if (!AHEAD || r0 > 0 || base != start) gemv_load_weights<HALVES>(wv, w_rows, base, end);
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                const int kb = base + u * GEMV_PIECE;
                if (kb >= end) break;
                // Each weight piece is unpacked once, for every row of the pass.
                float wf[HALVES][8];
#pragma unroll
                for (int h = 0; h < HALVES; h++) unpack_bf16x8(wv[h][u], wf[h]);
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    if (r0 + r < m) {
                        float xf[8];
                        unpack_bf16x8(load_bf16x8(x + (i64)(r0 + r) * k + kb), xf);
#pragma unroll
                        for (int h = 0; h < HALVES; h++)
#pragma unroll
                            for (int j = 0; j < 8; j++)
                                acc[h][r] = fmaf(xf[j], wf[h][j], acc[h][r]);
                    }
                }
            }
        }
        // The column's slices, summed in order 0, 1, 2, ... by its first warp (a warp alone
        // when slices == 1).
#pragma unroll
        for (int h = 0; h < HALVES; h++)
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const float v = warp_sum(acc[h][r]);
                if (lane == 0) partial[warp][h][r] = v;
            }
        if (slices > 1) {
            __syncthreads();
        } else {
            __syncwarp();
        }
        if (active && slice == 0 && lane < ROWS && r0 + lane < m) {
            float v[HALVES];
#pragma unroll
            for (int h = 0; h < HALVES; h++) {
                v[h] = partial[warp][h][lane];
                for (int s = 1; s < slices; s++) v[h] += partial[warp + s][h][lane];
            }
            const i64 at = (i64)(r0 + lane) * n + col;
            if (GATED) {
                store_out(out, at, silu_times(to_f32(to_bf16(v[0])), to_f32(to_bf16(v[HALVES - 1]))));
            } else {
                store_out(out, at, v[0]);
            }
        }
        // The partials are read before the next pass writes them.
        if (slices > 1) {
            __syncthreads();
        } else {
            __syncwarp();
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r1(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<bf16, 1, false>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r1(
    const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<float, 1, false>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r1(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<bf16, 1, true>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r2(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<bf16, 2, false>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r2(
    const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<float, 2, false>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r2(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<bf16, 2, true>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r4(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<bf16, 4, false>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r4(
    const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<float, 4, false>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r4(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<bf16, 4, true>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r8(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<bf16, 8, false>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r8(
    const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<float, 8, false>(x, w, out, m, n, k, slices);
}

extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r8(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ out, int m, int n,
    int k, int slices) {
    gemv_body<bf16, 8, true>(x, w, out, m, n, k, slices);
}

// Matrix-vector style products out[m, n] = sum_k x[m, k] * w[n, k] (x and w bf16, f32
// accumulation) for few rows: the decode steps of small batches, and the products of
// --deterministic mode that do not take the tensor-core kernels of gemm_mma.cu (a device
// without them, or a depth k that is not a multiple of 32).
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
// launch, common.cuh), a warp of the staged kernels loads the first stretch of its
// column's weights into registers; it reads x only after pdl_wait(). So the weights of a product stream from
// memory while the kernels it depends on finish.
//
// Two fusions serve the decode steps of one row (gemv_normed_*, gemv_add_*): a normed
// product reads the f32 residual stream x and the norm's weight gamma instead of a normed
// activation, sums w * (x * gamma), and scales the sum by rsqrt(mean(x^2) + eps) at the
// end, so the RMSNorm costs no kernel of its own; an adding product (the o and down
// projections) adds its bf16-rounded result into the f32 residual stream, as add_rms_norm
// would. Each column is one warp's, so the add needs no atomics. A normed kernel takes its
// rows in one pass (m <= ROWS; the launcher fuses at most 8 rows) and sums each row's
// squares once, before its columns: thread t the 4-element pieces t, t + 256, ... in
// order, then each warp by the butterfly, and the warps in order where a column is
// scaled, so a row's scale, and its results, have the same bits in every kernel.
//
// The one-row kernels (_r1, decode) stage x in dynamic shared memory of the launcher's
// size: after pdl_wait() a block copies the row there (a normed product x * gamma, in f32,
// taking the squares on the way), loading several pieces per thread before storing any
// so that the row comes in one round trip, and each column's pass reads it from shared
// memory rather than from L1 and L2 again. The products are the same: a row gives the
// same bits staged or not.
//
// The staged kernels of more rows (_r2_staged .. _r8_staged: verification steps, the
// decode of a few sequences) do the same for all m <= ROWS rows of one pass; the launcher
// takes them where the rows fit its shared memory. Their sums are those of the kernels
// that read x in place (_r2 .. _r8), bit for bit.
//
// Requires k % 8 == 0 and 16-byte aligned rows (32-byte for an f32 x; checked by the
// launcher).

#define GEMV_WARPS 8
#define GEMV_UNROLL 8

// Eight consecutive elements of x, widened to f32: a bf16 activation or the f32 residual.
__device__ __forceinline__ void load_x8(const bf16* p, float out[8]) { unpack_bf16x8(load_bf16x8(p), out); }

__device__ __forceinline__ void load_x8(const float* p, float out[8]) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// What a GEMV does with its input and its result.
enum GemvMode {
    GEMV_PLAIN,   // out = x . w
    GEMV_GATED,   // out = silu(x . w_gate) * (x . w_up), see gemv_body
    GEMV_NORMED,  // out = rms_norm(x) * gamma . w, x the f32 residual stream
    GEMV_NORMED_GATED,  // both
    GEMV_ADD,     // out (f32) += bf16(x . w)
};

// Elements one step of a warp covers.
#define GEMV_PIECE (WARP_SIZE * 8)

// One stretch of a lane's weights from `base`: every load is issued before the first is
// used (zeros past `end`), streamed so that the weights do not push the step's KV cache and
// activations out of L2 (load_streamed_bf16x8, common.cuh).
template <int HALVES>
__device__ __forceinline__ void gemv_load_weights(uint4 (&wv)[HALVES][GEMV_UNROLL],
                                                  const bf16* const (&w_rows)[HALVES], int base,
                                                  int end) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const unsigned long long policy = l2_stream_policy();
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        const int kb = base + u * GEMV_PIECE;
#pragma unroll
        for (int h = 0; h < HALVES; h++) wv[h][u] = kb < end ? load_streamed_bf16x8(w_rows[h] + kb, policy) : zero;
    }
}

// The one-row kernels stage their row (scripts/decode_chain_bench.cu sizes its launches by
// whether this is defined).
#define GEMV_STAGES_ONE_ROW 1

// Pieces of the row a thread of a one-row kernel loads before it stores the first into
// shared memory, so that the row arrives in one round trip to L2 rather than one per
// piece: four of 8 bf16 (a row of up to 8192 in a block of 256 threads), or for a normed
// product two of 4 f32 with their gamma (2048; more registers would cost the kernel a
// block per multiprocessor).
#define GEMV_COPY_AHEAD 4
#define GEMV_NORMED_AHEAD 2

// Copies the bf16 row x (k elements) into `staged`, 16 bytes per thread in turn, and
// points x there.
__device__ __forceinline__ void gemv_stage(const bf16*& x, unsigned char* staged, int k) {
    uint4* to = reinterpret_cast<uint4*>(staged);
    const uint4* from = reinterpret_cast<const uint4*>(x);
    const int pieces = k / 8, step = blockDim.x;
    for (int i = threadIdx.x; i < pieces; i += GEMV_COPY_AHEAD * step) {
        uint4 v[GEMV_COPY_AHEAD];
#pragma unroll
        for (int u = 0; u < GEMV_COPY_AHEAD; u++)
            if (i + u * step < pieces) v[u] = from[i + u * step];
#pragma unroll
        for (int u = 0; u < GEMV_COPY_AHEAD; u++)
            if (i + u * step < pieces) to[i + u * step] = v[u];
    }
    __syncthreads();
    x = reinterpret_cast<const bf16*>(staged);
}

// A thread's part of the sum of squares of the f32 row x (k elements) in a normed product:
// the 4-element pieces at 4 * (threadIdx.x + blockDim.x * i), in ascending order. The
// one-row kernels take it while they stage the row, the others in a pass of their own, in
// the same order, so that a row's scale has the same bits in every kernel.
__device__ __forceinline__ float gemv_square_piece(float4 v, float s) {
    s = fmaf(v.x, v.x, s);
    s = fmaf(v.y, v.y, s);
    s = fmaf(v.z, v.z, s);
    return fmaf(v.w, v.w, s);
}

// Stages the products x * gamma of the first `rows` f32 rows of x and the norm's weight
// (k elements each) in `staged` as f32, row after row, and points x there; leaves in s
// this thread's part of each row's sum of squares (gemv_square_piece's order). A one-row
// kernel loads GEMV_NORMED_AHEAD pieces before it stores any, a kernel of more rows one
// piece of each row. The caller publishes the parts before the barrier that ends the
// staging.
template <int ROWS>
__device__ __forceinline__ void gemv_stage_normed(const float*& x, const bf16* gamma, unsigned char* staged,
                                                  int rows, int k, float (&s)[ROWS]) {
    constexpr int AHEAD = ROWS == 1 ? GEMV_NORMED_AHEAD : 1;
    float4* to = reinterpret_cast<float4*>(staged);
    const float4* from = reinterpret_cast<const float4*>(x);
    const uint2* g = reinterpret_cast<const uint2*>(gamma);
    const int pieces = k / 4, step = blockDim.x;
#pragma unroll
    for (int r = 0; r < ROWS; r++) s[r] = 0.0f;
    for (int i = threadIdx.x; i < pieces; i += AHEAD * step) {
        float4 v[AHEAD][ROWS];
        uint2 gw[AHEAD];
#pragma unroll
        for (int u = 0; u < AHEAD; u++) {
            const bool in = i + u * step < pieces;
            gw[u] = in ? g[i + u * step] : make_uint2(0, 0);
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                v[u][r] = in && r < rows ? from[(i64)r * pieces + i + u * step] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < AHEAD; u++) {
            if (i + u * step >= pieces) continue;
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                if (r >= rows) continue;
                s[r] = gemv_square_piece(v[u][r], s[r]);
                to[(i64)r * pieces + i + u * step] =
                    make_float4(v[u][r].x * bf16_lo(gw[u].x), v[u][r].y * bf16_hi(gw[u].x),
                                v[u][r].z * bf16_lo(gw[u].y), v[u][r].w * bf16_hi(gw[u].y));
            }
        }
    }
    x = reinterpret_cast<const float*>(staged);
}

// A thread's part of the sum of squares of each of the first `rows` rows of x (k each),
// for the normed kernels that read x in place.
template <int ROWS>
__device__ __forceinline__ void gemv_sum_squares(const float* x, int rows, int k, float (&s)[ROWS]) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        s[r] = 0.0f;
        if (r >= rows) continue;
        const float4* row = reinterpret_cast<const float4*>(x + (i64)r * k);
        for (int i = threadIdx.x; i < k / 4; i += blockDim.x) s[r] = gemv_square_piece(row[i], s[r]);
    }
}

// GATED: the launcher's n is the MLP's intermediate size and w holds 2n rows, gate rows
// then up rows; column j streams rows j and n + j side by side, rounds both sums to bf16 as
// the product would, and stores silu(gate) * up (the arithmetic of silu_and_mul_bf16), so
// the gate/up activation never goes through memory.
//
// STAGED: the m <= ROWS rows of x are staged in dynamic shared memory (the launcher's
// m * k elements of X; the one-row kernels always are).
template <typename X, typename OUT, int ROWS, int MODE, bool STAGED>
__device__ __forceinline__ void gemv_body(const X* x, const bf16* gamma, const bf16* __restrict__ w,
                                          OUT* __restrict__ out, int m, int n, int k, int slices, float eps) {
    extern __shared__ uint4 gemv_shared[];
    constexpr bool GATED = MODE == GEMV_GATED || MODE == GEMV_NORMED_GATED;
    constexpr bool NORMED = MODE == GEMV_NORMED || MODE == GEMV_NORMED_GATED;
    constexpr int HALVES = GATED ? 2 : 1;
    // A staged normed kernel stages x * gamma, so its loop reads x alone.
    constexpr bool STAGED_GAMMA = NORMED && STAGED;
    __shared__ float partial[GEMV_WARPS][HALVES][ROWS];
    // NORMED: each warp's part of each row's sum of squares.
    __shared__ float squares[GEMV_WARPS][ROWS];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int slice = warp % slices;
    // Blocks take groups of GEMV_WARPS / slices columns, group blockIdx.x first and then
    // every gridDim.x-th: a grid of fewer blocks than groups stays resident and streams
    // without waves of blocks starting together. Which block computes a column never
    // changes its arithmetic.
    const int per_group = GEMV_WARPS / slices;
    const i64 groups = ((i64)n + per_group - 1) / per_group;
    const int k_slice = k / slices;
    const int first = slice * k_slice, end = first + k_slice;
    const int start = first + lane * 8;
    // Staged (one pass): the first stretch of a column's weights is loaded before the
    // column's turn: the first column's while the kernel ahead finishes (x is read only
    // after pdl_wait), each next one's while the column before is summed and stored. The
    // kernels that read x in place may take several passes and load every stretch in the
    // loop (loading ahead measured slower there: 4.06 against 3.83 ms a decode step of 8
    // sequences of the Llama-3.2-1B shape).
    constexpr bool AHEAD = STAGED;
    uint4 wv[HALVES][GEMV_UNROLL];
    const bf16* w_rows[HALVES];
    // Points w_rows at the column of group g this warp serves; whether it is a column.
    auto select = [&](i64 g) {
        const i64 col = g * per_group + warp / slices;
        const bool active = col < n;
#pragma unroll
        for (int h = 0; h < HALVES; h++) w_rows[h] = w + ((active ? col : 0) + (i64)h * n) * k;
        return active;
    };
    bool active = select(blockIdx.x);
    pdl_launch_dependents();
    if (AHEAD && active) gemv_load_weights<HALVES>(wv, w_rows, start, end);
    pdl_wait();
    if constexpr (NORMED) {
        // The rows' sums of squares (a normed kernel takes one pass, m <= ROWS), published
        // by the barrier that ends the staging or by one of their own.
        float s[ROWS];
        if constexpr (STAGED_GAMMA) {
            gemv_stage_normed<ROWS>(x, gamma, reinterpret_cast<unsigned char*>(gemv_shared), m, k, s);
        } else {
            gemv_sum_squares<ROWS>(x, m, k, s);
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const float v = warp_sum(s[r]);
            if (lane == 0) squares[warp][r] = v;
        }
        __syncthreads();
    } else if constexpr (STAGED) {
        // The m rows are contiguous: staged as one of m * k.
        gemv_stage(x, reinterpret_cast<unsigned char*>(gemv_shared), m * k);
    }
    for (i64 g = blockIdx.x; g < groups; g += gridDim.x) {
        // A warp past the last column still reaches every barrier below.
        const i64 col = g * per_group + warp / slices;
        const bf16* rows_now[HALVES];
#pragma unroll
        for (int h = 0; h < HALVES; h++) rows_now[h] = w_rows[h];
        for (int r0 = 0; r0 < m; r0 += ROWS) {
            float acc[HALVES][ROWS];
#pragma unroll
            for (int h = 0; h < HALVES; h++)
#pragma unroll
                for (int r = 0; r < ROWS; r++) acc[h][r] = 0.0f;
            for (int base = start; active && base < end; base += GEMV_PIECE * GEMV_UNROLL) {
                if (!AHEAD || r0 > 0 || base != start) gemv_load_weights<HALVES>(wv, rows_now, base, end);
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    const int kb = base + u * GEMV_PIECE;
                    if (kb >= end) break;
                    // Each weight piece is unpacked once, for every row of the pass.
                    float wf[HALVES][8];
#pragma unroll
                    for (int h = 0; h < HALVES; h++) unpack_bf16x8(wv[h][u], wf[h]);
                    float gf[8];
                    if (NORMED && !STAGED_GAMMA) load_x8(gamma + kb, gf);
#pragma unroll
                    for (int r = 0; r < ROWS; r++) {
                        if (r0 + r < m) {
                            float xf[8];
                            load_x8(x + (i64)(r0 + r) * k + kb, xf);
                            if (NORMED && !STAGED_GAMMA) {
#pragma unroll
                                for (int j = 0; j < 8; j++) xf[j] *= gf[j];
                            }
#pragma unroll
                            for (int h = 0; h < HALVES; h++)
#pragma unroll
                                for (int j = 0; j < 8; j++)
                                    acc[h][r] = fmaf(xf[j], wf[h][j], acc[h][r]);
                        }
                    }
                }
            }
            // The next group's first stretch, in flight while this column is summed.
            const bool was_active = active;
            if (AHEAD && r0 + ROWS >= m) {
                active = select(g + gridDim.x) && g + gridDim.x < groups;
                if (AHEAD && active) gemv_load_weights<HALVES>(wv, w_rows, start, end);
            }
            // The column's slices, summed in order 0, 1, 2, ... by its first warp (a warp
            // alone when slices == 1).
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
            if (was_active && slice == 0 && lane < ROWS && r0 + lane < m) {
                float v[HALVES];
#pragma unroll
                for (int h = 0; h < HALVES; h++) {
                    v[h] = partial[warp][h][lane];
                    for (int s = 1; s < slices; s++) v[h] += partial[warp + s][h][lane];
                }
                if (NORMED) {
                    float sq = squares[0][lane];
#pragma unroll
                    for (int w = 1; w < GEMV_WARPS; w++) sq += squares[w][lane];
                    const float inv = rsqrtf(sq / k + eps);
#pragma unroll
                    for (int h = 0; h < HALVES; h++) v[h] *= inv;
                }
                const i64 at = (i64)(r0 + lane) * n + col;
                if (GATED) {
                    store_out(out, at, silu_times(to_f32(to_bf16(v[0])), to_f32(to_bf16(v[HALVES - 1]))));
                } else if (MODE == GEMV_ADD) {
                    store_out(out, at, to_f32(out[at]) + to_f32(to_bf16(v[0])));
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
        if (!AHEAD) active = select(g + gridDim.x);
    }
}

// The kernels of each pass size ROWS (_r1 .. _r8): plain products into bf16 or f32, the
// gated MLP activation, and the two fusions of the decode steps (see the top of this file).
//
// gemv_add_f32_r1_packed is the one-row adding kernel held to 64 registers (no spills), so
// that four blocks of 256 threads fit a multiprocessor where the 75 of gemv_add_f32_r1 fit
// three. The launcher takes it for a product of more column groups than the device has
// multiprocessors, whose blocks share them. On Llama-3.2-1B the down projection (1024
// groups) then keeps four blocks' loads in flight per multiprocessor, its groups falling
// two to a block rather than two or three, and the o projection's blocks (256 groups, two
// a multiprocessor) leave room for a block of the gate/up product, which starts streaming
// its weights while o runs. SmolLM2-135M's products (72 groups, a multiprocessor each)
// measured 5% slower a step through the packed kernel, so they keep the other.
#define GEMV_PARAMS(OUT) \
    const bf16 *__restrict__ x, const bf16 *__restrict__ w, OUT *__restrict__ out, int m, int n, int k, int slices
#define GEMV_NORMED_PARAMS                                                                      \
    const float *__restrict__ x, const bf16 *__restrict__ gamma, const bf16 *__restrict__ w,    \
        bf16 *__restrict__ out, int m, int n, int k, int slices, float eps
#define GEMV_ARGS(GAMMA, EPS) x, GAMMA, w, out, m, n, k, slices, EPS

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r1(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 1, GEMV_PLAIN, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r1(GEMV_PARAMS(float)) { gemv_body<bf16, float, 1, GEMV_PLAIN, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r1(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 1, GEMV_GATED, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_bf16_r1(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 1, GEMV_NORMED, true>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_gated_bf16_r1(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 1, GEMV_NORMED_GATED, true>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_add_f32_r1(GEMV_PARAMS(float)) { gemv_body<bf16, float, 1, GEMV_ADD, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256, 4) gemv_add_f32_r1_packed(GEMV_PARAMS(float)) { gemv_body<bf16, float, 1, GEMV_ADD, true>(GEMV_ARGS(nullptr, 0.0f)); }

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r2(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 2, GEMV_PLAIN, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r2(GEMV_PARAMS(float)) { gemv_body<bf16, float, 2, GEMV_PLAIN, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r2(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 2, GEMV_GATED, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_bf16_r2(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 2, GEMV_NORMED, false>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_gated_bf16_r2(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 2, GEMV_NORMED_GATED, false>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_add_f32_r2(GEMV_PARAMS(float)) { gemv_body<bf16, float, 2, GEMV_ADD, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r2_staged(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 2, GEMV_PLAIN, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r2_staged(GEMV_PARAMS(float)) { gemv_body<bf16, float, 2, GEMV_PLAIN, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r2_staged(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 2, GEMV_GATED, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_bf16_r2_staged(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 2, GEMV_NORMED, true>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_gated_bf16_r2_staged(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 2, GEMV_NORMED_GATED, true>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_add_f32_r2_staged(GEMV_PARAMS(float)) { gemv_body<bf16, float, 2, GEMV_ADD, true>(GEMV_ARGS(nullptr, 0.0f)); }

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r4(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 4, GEMV_PLAIN, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r4(GEMV_PARAMS(float)) { gemv_body<bf16, float, 4, GEMV_PLAIN, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r4(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 4, GEMV_GATED, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_bf16_r4(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 4, GEMV_NORMED, false>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_gated_bf16_r4(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 4, GEMV_NORMED_GATED, false>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_add_f32_r4(GEMV_PARAMS(float)) { gemv_body<bf16, float, 4, GEMV_ADD, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r4_staged(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 4, GEMV_PLAIN, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r4_staged(GEMV_PARAMS(float)) { gemv_body<bf16, float, 4, GEMV_PLAIN, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r4_staged(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 4, GEMV_GATED, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_bf16_r4_staged(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 4, GEMV_NORMED, true>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_gated_bf16_r4_staged(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 4, GEMV_NORMED_GATED, true>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_add_f32_r4_staged(GEMV_PARAMS(float)) { gemv_body<bf16, float, 4, GEMV_ADD, true>(GEMV_ARGS(nullptr, 0.0f)); }

extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r8(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 8, GEMV_PLAIN, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r8(GEMV_PARAMS(float)) { gemv_body<bf16, float, 8, GEMV_PLAIN, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r8(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 8, GEMV_GATED, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_bf16_r8(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 8, GEMV_NORMED, false>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_gated_bf16_r8(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 8, GEMV_NORMED_GATED, false>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_add_f32_r8(GEMV_PARAMS(float)) { gemv_body<bf16, float, 8, GEMV_ADD, false>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_bf16_r8_staged(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 8, GEMV_PLAIN, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_fixed_order_f32_r8_staged(GEMV_PARAMS(float)) { gemv_body<bf16, float, 8, GEMV_PLAIN, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_gated_bf16_r8_staged(GEMV_PARAMS(bf16)) { gemv_body<bf16, bf16, 8, GEMV_GATED, true>(GEMV_ARGS(nullptr, 0.0f)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_bf16_r8_staged(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 8, GEMV_NORMED, true>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_normed_gated_bf16_r8_staged(GEMV_NORMED_PARAMS) { gemv_body<float, bf16, 8, GEMV_NORMED_GATED, true>(GEMV_ARGS(gamma, eps)); }
extern "C" __global__ void __launch_bounds__(256) gemv_add_f32_r8_staged(GEMV_PARAMS(float)) { gemv_body<bf16, float, 8, GEMV_ADD, true>(GEMV_ARGS(nullptr, 0.0f)); }

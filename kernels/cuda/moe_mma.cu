// The mixture-of-experts products on tensor cores (sm_80 and up): the same contract as
// moe_gate_up_act_* and moe_down_* of moe.cu (same parameters, same sorted pairs, same
// stores), for depths that are multiples of 32. Block b serves expert b / tiles and its
// tile b % tiles of output columns, and returns at once where the expert has no pairs.
//
// MOE_MMA_SPLIT warps share one 16-row tile of the expert's weight rows, the M side of
// mma.sync.m16n8k16 (bf16 in, f32 sums), warp s taking stretch s of the depth's 32-deep
// chunks (ceil(chunks / SPLIT) each), so that a step of few rows still has warps enough
// to keep loads in flight. Tile rows: gate_up, 8 columns of inter (their 8 gate rows, then
// their 8 up rows), so a thread ends with the gate and the up sum of one column for two
// pairs; down, 16 columns of h. The stretches' sums meet in shared memory and are added
// in stretch order. The expert's pairs are the N side, 8 a tile, NT tiles (the launcher
// picks NT = 1, 2 or 4 from n) a pass over the weights; an expert with more pairs than a
// pass takes more passes.
//
// Fragments from 16-byte loads: for each 32-deep chunk at k0, thread t (group g = t / 4,
// q = t % 4) loads elements k0 + 8q .. k0 + 8q + 7 of weight rows g and g + 8 and of its
// pair g's input row, and feeds words 0, 1 of each to one product and words 2, 3 to the
// next. That permutes the depth the same way for the weights and the inputs, so the sums
// are the dot products; a stretch's chunks are taken in increasing order, each a product's
// accumulate, and the stretches are added in order. A pair's sums are therefore fixed by
// the depth alone: they do not depend on NT, on the other pairs of a pass, or on the
// batch.
//
// gate_up rounds the gate and up sums to bf16 as the gate/up product would and stores
// bf16(silu(g) * u); down stores its f32 sums. Weights of an expert of one pass are loaded
// past L1 with L2's evict-first policy (read once). Requires depth % 32 == 0 and 16-byte
// aligned x and w (the launcher checks). Where tensor-core products are missing (before
// sm_80, HIP) the kernels trap; the launcher does not choose them there.

#define MOE_MMA_WARPS 8 // warps of a block
#define MOE_MMA_SPLIT 4 // warps that share a 16-row tile, a stretch of the depth each
#define MOE_MMA_UNROLL 4 // 32-deep chunks a thread has in flight (of two weight rows)

// gate_up's store: the activation of the gate sum g and the up sum u, each rounded to bf16
// first (the arithmetic of gemv_gated and silu_and_mul_bf16).
__device__ __forceinline__ bf16 moe_mma_activation(float g, float u) {
    return to_bf16(silu_times(to_f32(to_bf16(g)), to_f32(to_bf16(u))));
}

template <int NT, typename OUT>
__device__ __forceinline__ void moe_mma_body(const bf16* __restrict__ x, const int* __restrict__ gather,
                                             int x_rows, const bf16* __restrict__ w,
                                             const int* __restrict__ offsets, int pairs,
                                             OUT* __restrict__ out, int depth, int ncols) {
#ifdef TENSOR_CORES  // the fragment layout below is mma.sync's, over 32 lanes
    constexpr bool GATED = sizeof(OUT) == 2;
    constexpr int COLS = GATED ? 8 : 16;  // output columns per tile
    constexpr int BLOCK_COLS = MOE_MMA_WARPS / MOE_MMA_SPLIT * COLS;
    constexpr int PASS = 8 * NT;
    __shared__ float partial[MOE_MMA_WARPS][NT][4][WARP_SIZE];
    pdl_begin();
    const int tiles = (ncols + BLOCK_COLS - 1) / BLOCK_COLS;
    const int e = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    int begin = offsets[e], end = offsets[e + 1];
    begin = begin < 0 ? 0 : begin;
    end = end < pairs ? end : pairs;
    if (begin >= end) return;  // no pairs (the whole block): the weights are not read

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int stretch = warp % MOE_MMA_SPLIT, group = warp / MOE_MMA_SPLIT;
    const int g = lane / 4, q = lane % 4;
    const int c0 = tile * BLOCK_COLS + group * COLS;
    const int chunks = depth / 32, per = (chunks + MOE_MMA_SPLIT - 1) / MOE_MMA_SPLIT;
    const int k_begin = 32 * (stretch * per < chunks ? stretch * per : chunks);
    const int k_end = 32 * ((stretch + 1) * per < chunks ? (stretch + 1) * per : chunks);
    const i64 expert_rows = GATED ? 2 * (i64)ncols : (i64)ncols;
    const bf16* we = w + (i64)e * expert_rows * depth;
    // This thread's weight rows: g and g + 8 of its tile (past the last column: loaded,
    // not stored; every warp stays for the barriers).
    int ca = c0 + g, cb = GATED ? c0 + g : c0 + 8 + g;
    const bool store_a = ca < ncols, store_b = cb < ncols;
    ca = store_a ? ca : ncols - 1;
    cb = store_b ? cb : ncols - 1;
    const bf16* wa = we + (i64)ca * depth + 8 * q;
    const bf16* wb = we + ((GATED ? (i64)ncols : 0) + cb) * depth + 8 * q;
    const unsigned long long policy = l2_stream_policy();
    const bool once = end - begin <= PASS;

    for (int p0 = begin; p0 < end; p0 += PASS) {
        // This thread's input rows: pair g of each tile of the pass.
        const bf16* xr[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int pos = p0 + 8 * t + g;
            pos = pos < end ? pos : p0;  // past the pass's pairs: loaded, not stored
            int src = gather != nullptr ? gather[pos] : pos;
            src = src < 0 ? 0 : (src < x_rows ? src : x_rows - 1);
            xr[t] = x + (i64)src * depth + 8 * q;
        }
        float acc[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
        for (int k0 = k_begin; k0 < k_end; k0 += 32 * MOE_MMA_UNROLL) {
            uint4 va[MOE_MMA_UNROLL], vb[MOE_MMA_UNROLL];
#pragma unroll
            for (int u = 0; u < MOE_MMA_UNROLL; u++) {
                const int k = k0 + 32 * u;
                const uint4 zero = make_uint4(0, 0, 0, 0);
                va[u] = k < k_end ? (once ? load_streamed_bf16x8(wa + k, policy) : load_bf16x8(wa + k)) : zero;
                vb[u] = k < k_end ? (once ? load_streamed_bf16x8(wb + k, policy) : load_bf16x8(wb + k)) : zero;
            }
#pragma unroll
            for (int u = 0; u < MOE_MMA_UNROLL; u++) {
                const int k = k0 + 32 * u;
                if (k >= k_end) break;
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const uint4 xv = load_bf16x8(xr[t] + k);
                    mma_bf16_16816(acc[t], va[u].x, vb[u].x, va[u].y, vb[u].y, xv.x, xv.y);
                    mma_bf16_16816(acc[t], va[u].z, vb[u].z, va[u].w, vb[u].w, xv.z, xv.w);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) partial[warp][t][i][lane] = acc[t][i];
        __syncthreads();
        // The tile's first warp adds the stretches in order. acc[t]: rows g (0, 1) and
        // g + 8 (2, 3) of the tile for pairs 2q and 2q + 1 of tile t; gate_up: column ca's
        // gate (row g) and up (row g + 8) sums.
        if (stretch == 0) {
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float sum = partial[warp][t][i][lane];
                    for (int s = 1; s < MOE_MMA_SPLIT; s++) sum = __fadd_rn(sum, partial[warp + s][t][i][lane]);
                    acc[t][i] = sum;
                }
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int pos = p0 + 8 * t + 2 * q + j;
                    if (pos >= end) continue;
                    const i64 row = (i64)pos * ncols;
                    if constexpr (GATED) {
                        if (store_a) out[row + ca] = moe_mma_activation(acc[t][j], acc[t][2 + j]);
                    } else {
                        if (store_a) out[row + ca] = acc[t][j];
                        if (store_b) out[row + cb] = acc[t][2 + j];
                    }
                }
        }
        __syncthreads();  // the next pass writes the partial sums again
    }
#else
    (void)x, (void)gather, (void)x_rows, (void)w, (void)offsets, (void)pairs, (void)out;
    (void)depth, (void)ncols;
    __trap();
#endif
}

#define MOE_MMA_GATE_UP_PARAMS                                                                  \
    const bf16 *__restrict__ x, const bf16 *__restrict__ w, const int *__restrict__ offsets,    \
        const int *__restrict__ pair_rows, bf16 *__restrict__ act, int x_rows, int pairs, int h, \
        int inter
#define MOE_MMA_GATE_UP_ARGS x, pair_rows, x_rows, w, offsets, pairs, act, h, inter
#define MOE_MMA_DOWN_PARAMS                                                                  \
    const bf16 *__restrict__ act, const bf16 *__restrict__ w, const int *__restrict__ offsets, \
        float *__restrict__ out, int pairs, int h, int inter
#define MOE_MMA_DOWN_ARGS act, nullptr, pairs, w, offsets, pairs, out, inter, h

extern "C" __global__ void __launch_bounds__(MOE_MMA_WARPS * 32) moe_gate_up_act_mma1(MOE_MMA_GATE_UP_PARAMS) { moe_mma_body<1, bf16>(MOE_MMA_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_MMA_WARPS * 32) moe_gate_up_act_mma2(MOE_MMA_GATE_UP_PARAMS) { moe_mma_body<2, bf16>(MOE_MMA_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_MMA_WARPS * 32) moe_gate_up_act_mma4(MOE_MMA_GATE_UP_PARAMS) { moe_mma_body<4, bf16>(MOE_MMA_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_MMA_WARPS * 32) moe_down_mma1(MOE_MMA_DOWN_PARAMS) { moe_mma_body<1, float>(MOE_MMA_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_MMA_WARPS * 32) moe_down_mma2(MOE_MMA_DOWN_PARAMS) { moe_mma_body<2, float>(MOE_MMA_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_MMA_WARPS * 32) moe_down_mma4(MOE_MMA_DOWN_PARAMS) { moe_mma_body<4, float>(MOE_MMA_DOWN_ARGS); }

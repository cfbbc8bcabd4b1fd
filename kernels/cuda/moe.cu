// The mixture-of-experts MLP (DeepSeek-V2/V3, Qwen3-MoE) with no host round trip, so that a
// step captures into a graph: every grid below depends on the layer's shape (experts,
// hidden, inter) and on the step's row count n alone, never on where the rows go. The
// semantics are those of the CPU (models/src/llama/moe.rs, route() and record()):
//
// 1. moe_route: each row's router logits [n, E] f32 -> its K experts, best first, and their
//    weights (experts [n, K] i32, weights [n, K] f32).
// 2. moe_sort: the n * K (row, slot) pairs sorted by expert, stable: offsets [E + 1],
//    pair_rows [n * K] (the row of each sorted pair), slot_pos [n * K] (the sorted position
//    of each (row, slot)).
// 3. moe_gate_up_act_*: for each sorted pair of expert e, act[pos] = silu(g) * u of the
//    row's x through e's gate and up rows (w [E, 2 * inter, h]), into bf16 [n * K, inter].
// 4. moe_down_*: out[pos] = act[pos] through e's down rows (w [E, h, inter]), f32
//    [n * K, h].
// 5. moe_combine: delta[row] = bf16(shared[row] + the routed sum in increasing order of
//    expert index), [n, h].
//
// A row's results depend on its own logits and x alone: every dot product is summed in an
// order fixed by its depth (h or inter), whatever else the batch holds, however many pairs
// a pass of the weights takes and whether its rows are staged.

#define MOE_MAX_EXPERTS 512     // E at most (MAX_EXPERTS on the host)
#define MOE_MAX_K 16            // experts per token at most (MAX_EXPERTS_PER_TOKEN)
#define MOE_ROUTE_WARPS 4       // rows (a warp each) per block of moe_route
#define MOE_ROUTE_SLOTS 16      // experts a lane of moe_route holds: MOE_MAX_EXPERTS / 32
#define MOE_SORT_WARPS 16       // warps of the one block of moe_sort
#define MOE_WARPS 8             // warps of a block of the expert products
#define MOE_WARP_ROWS 4         // weight rows a warp of the expert products streams at once
#define MOE_COMBINE_THREADS 256 // threads of a block (a row) of moe_combine

static_assert(MOE_ROUTE_SLOTS * 32 >= MOE_MAX_EXPERTS, "a route lane holds its experts");
static_assert(MOE_MAX_K <= 32, "a route lane holds one chosen expert");

// Broadcasts and votes over the warp (common.cuh has the butterfly shuffle only).
#if defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define MOE_SHFL(v, src) __shfl((v), (src))
#define MOE_BALLOT(p) ((unsigned long long)__ballot((p)))
#else
#define MOE_SHFL(v, src) __shfl_sync(FULL_MASK, (v), (src))
#define MOE_BALLOT(p) ((unsigned long long)__ballot_sync(FULL_MASK, (p)))
#endif

// ------------------------------------------------------------------------------------------
// Routing.
//
// One warp per row; lane l holds experts l, l + WARP_SIZE, l + 2 * WARP_SIZE, ... Scores are
// softmax(logits) (max subtracted) or sigmoid(logits) in f32; the choice scores add the
// bias where there is one. With groups > 1 each group (E / groups consecutive experts) is
// scored by its best choice score or by the sum of its best two, and only the experts of
// the best top_groups groups stay candidates (the others score -inf, as on the CPU). The
// best K candidates are taken one at a time, largest first. Every comparison is that of
// Rust's f32::total_cmp (moe_key), ties to the lower index, as route() sorts. The weights
// are the chosen experts' scores without the bias, divided by their sum (+1e-20) where
// normalize is set, times routed_scaling.

// A float's order as f32::total_cmp has it, as a signed int.
__device__ __forceinline__ int moe_key(float x) {
    const int i = __float_as_int(x);
    return i ^ ((i >> 31) & 0x7fffffff);
}

#define MOE_KEY_NONE (-2147483647 - 1)

// A candidate: its order key, its index and the value it carries.
struct MoePick {
    int key;
    int index;
    float value;
};

// Keeps in p the better of p and (key, index, value): the larger key, ties to the lower
// index.
__device__ __forceinline__ void moe_better(MoePick& p, int key, int index, float value) {
    if (key > p.key || (key == p.key && index < p.index)) {
        p.key = key;
        p.index = index;
        p.value = value;
    }
}

// The best of the first `count` lane-strided entries (entry lane + j * WARP_SIZE is slot j of
// that lane) not marked in `taken` (bit j: slot j); every lane gets it. Distinct indices
// make the best unique, so the butterfly's lanes agree.
template <int S>
__device__ __forceinline__ MoePick moe_warp_best(const int (&keys)[S], const float (&values)[S],
                                                 unsigned taken, int count, int lane) {
    MoePick p{MOE_KEY_NONE, 0x7fffffff, 0.0f};
#pragma unroll
    for (int j = 0; j < S; j++) {
        const int i = lane + j * WARP_SIZE;
        if (i < count && !((taken >> j) & 1u)) moe_better(p, keys[j], i, values[j]);
    }
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) {
        const int key = SHFL_XOR(p.key, m);
        const int index = SHFL_XOR(p.index, m);
        const float value = SHFL_XOR(p.value, m);
        moe_better(p, key, index, value);
    }
    return p;
}

// Marks in `taken` the slot of this lane that holds entry `index`, if one does.
template <int S>
__device__ __forceinline__ void moe_take(unsigned& taken, int index, int lane) {
#pragma unroll
    for (int j = 0; j < S; j++)
        if (lane + j * WARP_SIZE == index) taken |= 1u << j;
}

extern "C" __global__ void __launch_bounds__(MOE_ROUTE_WARPS * 32) moe_route(
    const float* __restrict__ logits, const float* __restrict__ bias, int n, int num_experts,
    int k, int sigmoid, int groups, int top_groups, int group_top_two, int normalize,
    float scaling, int* __restrict__ experts, float* __restrict__ weights) {
    pdl_begin();
    __shared__ float choice_s[MOE_ROUTE_WARPS][MOE_MAX_EXPERTS];
    __shared__ int picked_e[MOE_ROUTE_WARPS][MOE_MAX_K];
    __shared__ float picked_w[MOE_ROUTE_WARPS][MOE_MAX_K];
    constexpr int S = MOE_ROUTE_SLOTS;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    const i64 first = (i64)blockIdx.x * MOE_ROUTE_WARPS;
    const i64 last = first + MOE_ROUTE_WARPS < (i64)n ? first + MOE_ROUTE_WARPS : (i64)n;
    for (i64 row = first + warp; row < last; row += warps) {
        const float* lg = logits + row * num_experts;
        float score[S], choice[S];
        float top = NEG_INF;
#pragma unroll
        for (int j = 0; j < S; j++) {
            const int e = lane + j * WARP_SIZE;
            score[j] = e < num_experts ? lg[e] : NEG_INF;
            top = fmaxf(top, score[j]);
        }
        if (sigmoid) {
#pragma unroll
            for (int j = 0; j < S; j++) score[j] = 1.0f / (1.0f + expf(-score[j]));
        } else {
            top = warp_max(top);
            float total = 0.0f;
#pragma unroll
            for (int j = 0; j < S; j++) {
                const int e = lane + j * WARP_SIZE;
                score[j] = e < num_experts ? expf(score[j] - top) : 0.0f;
                total += score[j];
            }
            total = warp_sum(total);
#pragma unroll
            for (int j = 0; j < S; j++) score[j] = score[j] / total;
        }
#pragma unroll
        for (int j = 0; j < S; j++) {
            const int e = lane + j * WARP_SIZE;
            choice[j] = bias != nullptr && e < num_experts ? score[j] + bias[e] : score[j];
        }

        // The candidates (bit j: slot j): every expert, or those of the best groups.
        unsigned allowed = ~0u;
        if (groups > 1) {
            allowed = 0u;
#pragma unroll
            for (int j = 0; j < S; j++) {
                const int e = lane + j * WARP_SIZE;
                if (e < num_experts) choice_s[warp][e] = choice[j];
            }
            __syncwarp();
            const int per = num_experts / groups;
            int gkey[S];
            float gval[S];
#pragma unroll
            for (int j = 0; j < S; j++) {
                const int g = lane + j * WARP_SIZE;
                float v = NEG_INF;
                if (g < groups) {
                    const float* c = choice_s[warp] + g * per;
                    if (group_top_two) {
                        // The best two by total_cmp, ties to the lower index; their sum.
                        float v1 = NEG_INF, v2 = NEG_INF;
                        int k1 = MOE_KEY_NONE, k2 = MOE_KEY_NONE;
                        for (int i = 0; i < per; i++) {
                            const float x = c[i];
                            const int kx = moe_key(x);
                            if (i == 0 || kx > k1) {
                                v2 = v1, k2 = k1;
                                v1 = x, k1 = kx;
                            } else if (i == 1 || kx > k2) {
                                v2 = x, k2 = kx;
                            }
                        }
                        v = per >= 2 ? v1 + v2 : v1;
                    } else {
                        for (int i = 0; i < per; i++) v = fmaxf(v, c[i]);
                    }
                }
                gval[j] = v;
                gkey[j] = moe_key(v);
            }
            unsigned gtaken = 0u;
            for (int t = 0; t < top_groups; t++) {
                const MoePick g = moe_warp_best<S>(gkey, gval, gtaken, groups, lane);
                moe_take<S>(gtaken, g.index, lane);
                const int lo = g.index * per, hi = lo + per;
#pragma unroll
                for (int j = 0; j < S; j++) {
                    const int e = lane + j * WARP_SIZE;
                    if (e >= lo && e < hi) allowed |= 1u << j;
                }
            }
            __syncwarp();  // choice_s is read before the warp's next row writes it
        }

        // The best K candidates, largest first; the others score -inf as on the CPU.
        int key[S];
#pragma unroll
        for (int j = 0; j < S; j++) key[j] = moe_key((allowed >> j) & 1u ? choice[j] : NEG_INF);
        unsigned taken = 0u;
        for (int t = 0; t < k; t++) {
            const MoePick p = moe_warp_best<S>(key, score, taken, num_experts, lane);
            moe_take<S>(taken, p.index, lane);
            if (lane == 0) {
                picked_e[warp][t] = p.index;
                picked_w[warp][t] = p.value;
            }
        }
        __syncwarp();
        if (lane < k) {
            float w = picked_w[warp][lane];
            if (normalize) {
                float total = 0.0f;
                for (int t = 0; t < k; t++) total += picked_w[warp][t];
                w = w / (total + 1e-20f);
            }
            experts[row * k + lane] = picked_e[warp][lane];
            weights[row * k + lane] = w * scaling;
        }
        __syncwarp();  // picked_* are read before the warp's next row writes them
    }
}

// ------------------------------------------------------------------------------------------
// The sort: one block of MOE_SORT_WARPS warps, integer counts only, so its result is fixed.
//
// Warp w takes the w-th of equal consecutive segments of the n * K pairs, 32 (a warp) at a
// time: a lane's pair is ranked among the warp's lanes of the same expert by votes on its
// expert's bits (moe_match). Pass 1 counts each segment's pairs per expert; then expert e's
// pairs start at offsets[e] (an exclusive scan over experts) and segment w's pairs of e
// after those of segments 0 .. w-1; pass 2 places every pair there, in pair order within
// its segment. So an expert's pairs keep the order of their rows. A pair naming no expert
// (outside 0 .. E-1: only a bad input) is placed nowhere and gets slot_pos -1.

// The lanes whose expert equals this lane's e (e < 0: no expert, matching the other such
// lanes), before and after this one.
__device__ __forceinline__ void moe_match(int e, int num_experts, int lane, int& before, int& after) {
    const unsigned long long lanes = WARP_SIZE >= 64 ? ~0ull : (1ull << WARP_SIZE) - 1ull;
    const unsigned long long valid = MOE_BALLOT(e >= 0);
    unsigned long long same = (e >= 0 ? valid : ~valid) & lanes;
    for (int b = 0; (1 << b) < num_experts; b++) {
        const bool bit = (e >> b) & 1;
        const unsigned long long votes = MOE_BALLOT(bit);
        same &= bit ? votes : ~votes;
    }
    before = __popcll(same & ((1ull << lane) - 1ull));
    after = __popcll((same >> lane) >> 1);
}

extern "C" __global__ void __launch_bounds__(MOE_SORT_WARPS * 32) moe_sort(
    const int* __restrict__ experts, int pairs, int num_experts, int k,
    int* __restrict__ offsets, int* __restrict__ pair_rows, int* __restrict__ slot_pos) {
    pdl_begin();
    // Segment w's pairs per expert, then where they start within the expert's.
    __shared__ int counts[MOE_SORT_WARPS][MOE_MAX_EXPERTS];
    __shared__ int totals[MOE_MAX_EXPERTS];
    __shared__ int starts[MOE_MAX_EXPERTS + 1];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    for (int i = threadIdx.x; i < MOE_SORT_WARPS * MOE_MAX_EXPERTS; i += blockDim.x)
        counts[i / MOE_MAX_EXPERTS][i % MOE_MAX_EXPERTS] = 0;
    __syncthreads();
    const int per = (int)(((i64)pairs + warps - 1) / warps);
    const int begin = warp * per;
    const int end = begin + per < pairs ? begin + per : pairs;

    for (int c = begin; c < end; c += WARP_SIZE) {
        const int p = c + lane;
        int e = p < end ? experts[p] : -1;
        if (e < 0 || e >= num_experts) e = -1;
        int before, after;
        moe_match(e, num_experts, lane, before, after);
        if (e >= 0 && after == 0) counts[warp][e] += before + 1;
        __syncwarp();
    }
    __syncthreads();

    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
        int run = 0;
        for (int w = 0; w < warps; w++) {
            const int here = counts[w][e];
            counts[w][e] = run;
            run += here;
        }
        totals[e] = run;
    }
    __syncthreads();
    if (warp == 0) {
        // Lane l scans experts l * span .. l * span + span - 1 in order; the lanes by a
        // warp scan.
        const int span = (num_experts + WARP_SIZE - 1) / WARP_SIZE;
        const int lo = lane * span;
        const int hi = lo + span < num_experts ? lo + span : num_experts;
        int sum = 0;
        for (int e = lo; e < hi; e++) sum += totals[e];
        int inclusive = sum;
        for (int d = 1; d < WARP_SIZE; d <<= 1) {
            const int t = MOE_SHFL(inclusive, lane >= d ? lane - d : lane);
            if (lane >= d) inclusive += t;
        }
        int run = inclusive - sum;
        for (int e = lo; e < hi; e++) {
            starts[e] = run;
            run += totals[e];
        }
        if (lane == WARP_SIZE - 1) starts[num_experts] = inclusive;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) offsets[e] = starts[e];

    for (int c = begin; c < end; c += WARP_SIZE) {
        const int p = c + lane;
        int e = p < end ? experts[p] : -1;
        if (e < 0 || e >= num_experts) e = -1;
        int before, after;
        moe_match(e, num_experts, lane, before, after);
        if (e >= 0) {
            const int pos = starts[e] + counts[warp][e] + before;
            pair_rows[pos] = p / k;
            slot_pos[p] = pos;
        } else if (p < end) {
            slot_pos[p] = -1;
        }
        __syncwarp();
        if (e >= 0 && after == 0) counts[warp][e] += before + 1;
        __syncwarp();
    }
}

// ------------------------------------------------------------------------------------------
// The expert products: block b serves expert b / tiles and its tile b % tiles of output
// columns, and returns at once where the expert has no pairs (offsets[e] == offsets[e+1]),
// so an expert no row chose costs a block that reads two ints and none of its weights.
//
// A warp streams MOE_WARP_ROWS weight rows side by side: gate_up, two columns (each one's
// gate and up rows), so a block covers 2 * MOE_WARPS columns of inter; down, four columns,
// 4 * MOE_WARPS of h. The expert's pairs go P at a time (the launcher picks P = 1, 2, 4 or 8
// from n): each pass streams the warp's rows once for P pairs, lane l taking the 16-byte
// pieces of 8 elements at 8 * (l + WARP_SIZE * j) for j = 0, 1, ... and each pair
// accumulating its own f32 sums in that order; the lanes are summed by the fixed butterfly.
// That order depends on the depth alone, so a pair's sums are the same bits whatever P is,
// whatever else the expert serves, and staged or not. gate_up rounds the gate and up sums
// to bf16 as the gate/up product would and stores bf16(silu(g) * u) (the arithmetic of
// gemv_gated and silu_and_mul_bf16); down stores its f32 sums.
//
// _staged: a pass's P rows of x are first copied to dynamic shared memory (P * depth
// bf16, the launcher's size) and read from there; otherwise they are read in place.
// gate_up gathers its rows (row pair_rows[pos] of x), down reads act[pos]. The weights of
// an expert of one pass are loaded past L1 with L2's evict-first policy (read once); an
// expert of more passes reads them again, so they are loaded the ordinary way.
//
// Requires the depth % 8 == 0 and 16-byte aligned x and w (the launcher checks).

#define MOE_PIECE (WARP_SIZE * 8)

__device__ __forceinline__ uint4 moe_load_w(const bf16* p, bool once, unsigned long long policy) {
    return once ? load_streamed_bf16x8(p, policy) : load_bf16x8(p);
}

// gate_up: the activation of the gate sum g and the up sum u.
__device__ __forceinline__ void moe_store(bf16* out, i64 at, float g, float u) {
    out[at] = to_bf16(silu_times(to_f32(to_bf16(g)), to_f32(to_bf16(u))));
}

// down: the sum.
__device__ __forceinline__ void moe_store(float* out, i64 at, float v, float) { out[at] = v; }

template <int P, typename OUT, bool STAGED>
__device__ __forceinline__ void moe_expert_body(const bf16* __restrict__ x, const int* __restrict__ gather,
                                                int x_rows, const bf16* __restrict__ w,
                                                const int* __restrict__ offsets, int pairs,
                                                OUT* __restrict__ out, int depth, int ncols) {
    extern __shared__ uint4 moe_staged[];
    constexpr bool GATED = sizeof(OUT) == 2;
    constexpr int COLS = GATED ? MOE_WARP_ROWS / 2 : MOE_WARP_ROWS;  // columns per warp
    constexpr int BLOCK_COLS = MOE_WARPS * COLS;
    constexpr int UNROLL = P >= 8 ? 2 : 4;  // pieces per weight row a lane has in flight
    pdl_begin();
    const int tiles = (ncols + BLOCK_COLS - 1) / BLOCK_COLS;
    const int b = blockIdx.x;
    const int e = b / tiles, tile = b % tiles;
    int begin = offsets[e], end = offsets[e + 1];
    begin = begin < 0 ? 0 : begin;
    end = end < pairs ? end : pairs;
    if (begin >= end) return;  // no pairs: the expert's weights are not read

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    const i64 expert_rows = GATED ? 2 * (i64)ncols : (i64)ncols;
    const bf16* we = w + (i64)e * expert_rows * depth;
    const unsigned long long policy = l2_stream_policy();
    const bool once = end - begin <= P;
    const uint4 zero = make_uint4(0, 0, 0, 0);

    for (int p0 = begin; p0 < end; p0 += P) {
        const int rows = end - p0 < P ? end - p0 : P;
        const bf16* xr[P];
        if constexpr (STAGED) {
            __syncthreads();  // the pass before has read the staged rows
            const int pieces = depth / 8;
            for (int r = 0; r < rows; r++) {
                int src = gather != nullptr ? gather[p0 + r] : p0 + r;
                src = src < 0 ? 0 : (src < x_rows ? src : x_rows - 1);
                const uint4* from = reinterpret_cast<const uint4*>(x + (i64)src * depth);
                for (int i = threadIdx.x; i < pieces; i += blockDim.x) moe_staged[(i64)r * pieces + i] = from[i];
            }
            __syncthreads();
#pragma unroll
            for (int r = 0; r < P; r++) xr[r] = reinterpret_cast<const bf16*>(moe_staged) + (i64)r * depth;
        } else {
#pragma unroll
            for (int r = 0; r < P; r++) {
                int src = r < rows ? (gather != nullptr ? gather[p0 + r] : p0 + r) : 0;
                src = src < 0 ? 0 : (src < x_rows ? src : x_rows - 1);
                xr[r] = x + (i64)src * depth;
            }
        }

        for (int cg = warp; cg < MOE_WARPS; cg += warps) {
            const int c0 = tile * BLOCK_COLS + cg * COLS;
            if (c0 >= ncols) break;  // no barrier below: the warp may leave the tile
            const bf16* wr[MOE_WARP_ROWS];
#pragma unroll
            for (int i = 0; i < MOE_WARP_ROWS; i++) {
                int c = c0 + (GATED ? i / 2 : i);
                c = c < ncols ? c : ncols - 1;  // past the last column: loaded, not stored
                const i64 row = GATED ? (i64)(i % 2) * ncols + c : (i64)c;
                wr[i] = we + row * depth;
            }
            float acc[MOE_WARP_ROWS][P];
#pragma unroll
            for (int i = 0; i < MOE_WARP_ROWS; i++)
#pragma unroll
                for (int r = 0; r < P; r++) acc[i][r] = 0.0f;
            for (int base = lane * 8; base < depth; base += MOE_PIECE * UNROLL) {
                uint4 wv[MOE_WARP_ROWS][UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const int kb = base + u * MOE_PIECE;
#pragma unroll
                    for (int i = 0; i < MOE_WARP_ROWS; i++) wv[i][u] = kb < depth ? moe_load_w(wr[i] + kb, once, policy) : zero;
                }
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const int kb = base + u * MOE_PIECE;
                    if (kb >= depth) break;
                    float wf[MOE_WARP_ROWS][8];
#pragma unroll
                    for (int i = 0; i < MOE_WARP_ROWS; i++) unpack_bf16x8(wv[i][u], wf[i]);
#pragma unroll
                    for (int r = 0; r < P; r++) {
                        if (r < rows) {
                            float xf[8];
                            unpack_bf16x8(load_bf16x8(xr[r] + kb), xf);
#pragma unroll
                            for (int i = 0; i < MOE_WARP_ROWS; i++)
#pragma unroll
                                for (int j = 0; j < 8; j++) acc[i][r] = fmaf(xf[j], wf[i][j], acc[i][r]);
                        }
                    }
                }
            }
            // Lane (column q, pair r) = q * P + r gets its sums: the gate then the up one
            // (gate_up), or the one (down).
            float first = 0.0f, second = 0.0f;
#pragma unroll
            for (int i = 0; i < MOE_WARP_ROWS; i++)
#pragma unroll
                for (int r = 0; r < P; r++) {
                    const float v = warp_sum(acc[i][r]);
                    const int owner = (GATED ? i / 2 : i) * P + r;
                    if (lane == owner) {
                        if (GATED && (i % 2) == 1) {
                            second = v;
                        } else {
                            first = v;
                        }
                    }
                }
            const int q = lane / P, r = lane % P;
            if (lane < COLS * P && r < rows && c0 + q < ncols)
                moe_store(out, (i64)(p0 + r) * ncols + c0 + q, first, second);
        }
    }
}

#define MOE_GATE_UP_PARAMS                                                                      \
    const bf16 *__restrict__ x, const bf16 *__restrict__ w, const int *__restrict__ offsets,    \
        const int *__restrict__ pair_rows, bf16 *__restrict__ act, int x_rows, int pairs, int h, \
        int inter
#define MOE_GATE_UP_ARGS x, pair_rows, x_rows, w, offsets, pairs, act, h, inter
#define MOE_DOWN_PARAMS                                                                      \
    const bf16 *__restrict__ act, const bf16 *__restrict__ w, const int *__restrict__ offsets, \
        float *__restrict__ out, int pairs, int h, int inter
#define MOE_DOWN_ARGS act, nullptr, pairs, w, offsets, pairs, out, inter, h

extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_gate_up_act_p1(MOE_GATE_UP_PARAMS) { moe_expert_body<1, bf16, false>(MOE_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_gate_up_act_p2(MOE_GATE_UP_PARAMS) { moe_expert_body<2, bf16, false>(MOE_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_gate_up_act_p4(MOE_GATE_UP_PARAMS) { moe_expert_body<4, bf16, false>(MOE_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_gate_up_act_p8(MOE_GATE_UP_PARAMS) { moe_expert_body<8, bf16, false>(MOE_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_gate_up_act_p1_staged(MOE_GATE_UP_PARAMS) { moe_expert_body<1, bf16, true>(MOE_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_gate_up_act_p2_staged(MOE_GATE_UP_PARAMS) { moe_expert_body<2, bf16, true>(MOE_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_gate_up_act_p4_staged(MOE_GATE_UP_PARAMS) { moe_expert_body<4, bf16, true>(MOE_GATE_UP_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_gate_up_act_p8_staged(MOE_GATE_UP_PARAMS) { moe_expert_body<8, bf16, true>(MOE_GATE_UP_ARGS); }

extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_down_p1(MOE_DOWN_PARAMS) { moe_expert_body<1, float, false>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_down_p2(MOE_DOWN_PARAMS) { moe_expert_body<2, float, false>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_down_p4(MOE_DOWN_PARAMS) { moe_expert_body<4, float, false>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_down_p8(MOE_DOWN_PARAMS) { moe_expert_body<8, float, false>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_down_p1_staged(MOE_DOWN_PARAMS) { moe_expert_body<1, float, true>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_down_p2_staged(MOE_DOWN_PARAMS) { moe_expert_body<2, float, true>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_down_p4_staged(MOE_DOWN_PARAMS) { moe_expert_body<4, float, true>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32) moe_down_p8_staged(MOE_DOWN_PARAMS) { moe_expert_body<8, float, true>(MOE_DOWN_ARGS); }

// ------------------------------------------------------------------------------------------
// The combine: one block per (row, stretch of blockDim.x columns), so that a row's columns
// load in parallel over several blocks. Its K slots are ranked by expert index (ties, which
// a route never makes, by slot), and each thread sums its column over them in that order, starting from 0, each term weight * out unfused (as record() adds them), then
// adds the shared experts' bf16 output where there is one and rounds to bf16. A slot
// naming no expert or no sorted position adds nothing.

extern "C" __global__ void __launch_bounds__(MOE_COMBINE_THREADS) moe_combine(
    const float* __restrict__ out, const int* __restrict__ experts, const float* __restrict__ weights,
    const int* __restrict__ slot_pos, const bf16* __restrict__ shared, int n, int k, int num_experts,
    int h, int pairs, bf16* __restrict__ delta) {
    pdl_begin();
    __shared__ int order_pos[MOE_MAX_K];
    __shared__ float order_w[MOE_MAX_K];
    const int stretches = (h + blockDim.x - 1) / blockDim.x;
    const i64 row = blockIdx.x / stretches;
    const int c = (blockIdx.x % stretches) * blockDim.x + threadIdx.x;
    if (row >= n) return;
    if ((int)threadIdx.x < k) {
        const int s = threadIdx.x;
        const int* mine = experts + row * k;
        const int e = mine[s];
        int rank = 0;
        for (int t = 0; t < k; t++) rank += mine[t] < e || (mine[t] == e && t < s);
        const int pos = slot_pos[row * k + s];
        const bool ok = e >= 0 && e < num_experts && pos >= 0 && pos < pairs;
        order_pos[rank] = ok ? pos : -1;
        order_w[rank] = weights[row * k + s];
    }
    __syncthreads();
    if (c >= h) return;
    float acc = 0.0f;
    for (int t = 0; t < k; t++) {
        const int pos = order_pos[t];
        if (pos >= 0) acc = __fadd_rn(acc, __fmul_rn(order_w[t], out[(i64)pos * h + c]));
    }
    const i64 at = row * h + c;
    delta[at] = to_bf16(shared != nullptr ? __fadd_rn(to_f32(shared[at]), acc) : acc);
}

// ------------------------------------------------------------------------------------------
// The router's logits in f32: logits[r, e] = x[r] . w[e] for a bf16 x [n, h] and f32
// weights w [E, h] (a router kept in f32, as DeepSeek's routing is sensitive to it). Block
// b takes experts MOE_ROUTER_WARPS * (b % tiles) .. (a warp each) for rows
// MOE_ROUTER_ROWS * (b / tiles) ..: lane l the 4-element pieces at 4 * (l + WARP_SIZE * j),
// accumulated in ascending order by fused multiply-adds, then the fixed butterfly. A row's
// logits do not depend on the other rows. Requires h % 4 == 0 and 16-byte aligned rows.

#define MOE_ROUTER_WARPS 8  // experts (a warp each) per block of moe_router_logits
#define MOE_ROUTER_ROWS 8   // rows per block of moe_router_logits

extern "C" __global__ void __launch_bounds__(MOE_ROUTER_WARPS * 32) moe_router_logits(
    const bf16* __restrict__ x, const float* __restrict__ w, int n, int h, int num_experts,
    float* __restrict__ logits) {
    pdl_begin();
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int tiles = (num_experts + MOE_ROUTER_WARPS - 1) / MOE_ROUTER_WARPS;
    const int e = (blockIdx.x % tiles) * MOE_ROUTER_WARPS + warp;
    const i64 first = (i64)(blockIdx.x / tiles) * MOE_ROUTER_ROWS;
    if (e >= num_experts) return;
    const float* we = w + (i64)e * h;
    float acc[MOE_ROUTER_ROWS];
#pragma unroll
    for (int j = 0; j < MOE_ROUTER_ROWS; j++) acc[j] = 0.0f;
    for (int i = 4 * lane; i < h; i += 4 * WARP_SIZE) {
        const float4 wv = *reinterpret_cast<const float4*>(we + i);
#pragma unroll
        for (int j = 0; j < MOE_ROUTER_ROWS; j++) {
            if (first + j >= n) break;
            const uint2 xv = *reinterpret_cast<const uint2*>(x + (first + j) * h + i);
            float a = acc[j];
            a = fmaf(wv.x, bf16_lo(xv.x), a);
            a = fmaf(wv.y, bf16_hi(xv.x), a);
            a = fmaf(wv.z, bf16_lo(xv.y), a);
            a = fmaf(wv.w, bf16_hi(xv.y), a);
            acc[j] = a;
        }
    }
#pragma unroll
    for (int j = 0; j < MOE_ROUTER_ROWS; j++) {
        const float total = warp_sum(acc[j]);
        if (lane == 0 && first + j < n) logits[(first + j) * num_experts + e] = total;
    }
}

// Token sampling over f32 logits `[rows, vocab]`, one block per row, as the CPU sampler
// (ops/src/sampling) does it: grammar masks and penalties in place, then greedy argmax, or
// temperature, top-k, top-p, min-p and one inverse-CDF draw with a uniform given by the host.
//
// Order. Tokens are ranked by their logit, descending, ties to the lower id, NaN as -inf:
// the CPU's "most likely first" order (dividing by the temperature keeps it). Every token
// gets a 64-bit key that is unique and increases with that rank:
//     key = orderable(logit) << 32 | (0xffffffff - id)
// so "the first n tokens" is "every key >= the n-th largest key".
//
// Filters without a sort. Each filter keeps a prefix of that order; its last token is found
// by a selection: the first token, in that order, at which a running weight passes a
// target. Top-k weighs each token 1; top-p and the draw weigh it by its probability mass
// as a fixed-point integer, exp((logit - max) / T) * 2^40, so every sum is exact and
// independent of thread scheduling: the token is a deterministic function of (logits,
// params, uniform). A selection takes a few passes over the row:
//   1. a histogram over 2048 bins linear in the logit (so that tokens spread over many bins
//      and the shared-memory atomics rarely collide), and the bin where the target falls;
//   2. usually (at most 1024 tokens in that bin): one pass copies the bin's tokens to
//      shared memory, where each is ranked against the others exactly;
//   2'. otherwise: the smallest and largest key in that bin (block reductions), then a
//      radix select over the keys of that bin, 8 bits a pass, from the highest bit where
//      those two keys differ, until the chosen bin holds one token; one pass finds it.
// After pass 1 a token outside the chosen bin is rejected by its logit or key alone,
// before any exp. min-p and the CPU's "probability > 0" rule (f64 exp underflow) are
// per-token tests.
//
// The draw walks the kept tokens in the order above (most likely first, ties to the lower
// id), as the CPU does: with the same uniform it picks the CPU's token unless the uniform
// lies within rounding (about 1e-6) of a boundary of the cumulative distribution.

typedef unsigned long long u64;

// Threads per block of the row kernels (multiple of WARP_SIZE, at most 1024).
#define SAMPLE_THREADS 1024
#define SAMPLE_PENALTY_THREADS 256
// Bins of the first pass of a selection (linear in the logit), and of the radix passes.
#define SAMPLE_VALUE_BINS 2048
#define SAMPLE_RADIX_BITS 8
#define SAMPLE_RADIX_BINS 256
// A chosen value bin of at most this many tokens is ranked in shared memory.
#define SAMPLE_COMPACT_MAX (SAMPLE_VALUE_BINS / 2)
// Fixed-point unit of probability mass: exp(d) * 2^40 (at most 2^40 a token, so a row of
// up to 2^24 tokens sums below 2^64).
#define SAMPLE_MASS_ONE 1099511627776.0f
// exp(d) in f64 is zero below this: the CPU drops such tokens ("probability > 0").
#define SAMPLE_F64_EXP_UNDERFLOW (-745.1332f)
// Tokens whose logit is more than this many temperatures below the maximum surely have
// zero fixed-point mass (exp(-27.8) < 2^-40), with a wide margin for rounding.
#define SAMPLE_ZERO_MASS_SPAN 64.0f
// The span (in temperatures below the maximum) the value bins of a mass selection cover:
// tokens of nonzero mass lie within 27.8 of the maximum.
#define SAMPLE_MASS_BIN_SPAN 28.0f
#define SAMPLE_POS_INF (__int_as_float(0x7f800000))

// What a selection ranks (see sample_select).
#define SAMPLE_BY_COUNT 0  // top-k: every token weighs 1
#define SAMPLE_BY_MASS 1   // top-p: tokens with key >= lo weigh their mass
#define SAMPLE_DRAW 2      // the draw: the kept tokens weigh their mass

// Per-row parameters; the same layout as `SampleRow` in kernels/src/cuda/sampling.rs.
struct SampleRow {
    double uniform;            // the draw, in [0, 1)
    float temperature;         // > 0 unless greedy
    float top_p;               // 1 = off
    float min_p;               // 0 = off
    int top_k;                 // <= 0 or >= vocab = off
    float repetition_penalty;  // 1 = off
    float presence_penalty;    // 0 = off
    float frequency_penalty;   // 0 = off
    int greedy;                // nonzero: argmax, nothing else
};

// ---------------------------------------------------------------------------------------
// Grammar masks

// Threads per block of the mask kernel, and the tokens each thread covers (SAMPLE_MASK_THREADS
// apart, so that a warp's loads and stores fall on consecutive tokens: one mask word a warp).
#define SAMPLE_MASK_THREADS 256
#define SAMPLE_MASK_PER_THREAD 8
#define SAMPLE_MASK_CHUNK (SAMPLE_MASK_THREADS * SAMPLE_MASK_PER_THREAD)

// Forbids the tokens each masked row's grammar mask leaves out, as `TokenMask::apply` on the
// CPU. Masked row m is row rows[m] of `logits` ([total_rows, vocab]); its mask is words
// m * W .. (m + 1) * W, W = ceil(vocab / 32), bit id % 32 of word id / 32 set when token id
// is allowed (the host pads a mask over a smaller vocabulary with zero words, so a padded
// row's tail is forbidden). Every token whose bit is 0 gets -inf; allowed logits are neither
// read nor written, nor are rows not listed. Block b covers tokens
// (b % chunks) * SAMPLE_MASK_CHUNK .. + SAMPLE_MASK_CHUNK of masked row b / chunks. A listed
// row past total_rows is skipped, so no input writes out of bounds; a row listed twice only
// writes -inf twice.
extern "C" __global__ void __launch_bounds__(SAMPLE_MASK_THREADS)
    sample_mask(float* __restrict__ logits, int vocab, int total_rows, int chunks,
                const unsigned int* __restrict__ rows, const unsigned int* __restrict__ words) {
    pdl_begin();
    const i64 masked = blockIdx.x / chunks;
    const int chunk = blockIdx.x % chunks;
    const unsigned int row = rows[masked];
    if (row >= (unsigned int)total_rows) return;
    const i64 width = ((i64)vocab + 31) / 32;
    const unsigned int* __restrict__ w = words + masked * width;
    float* lg = logits + (i64)row * (i64)vocab;
    const int first = chunk * SAMPLE_MASK_CHUNK + threadIdx.x;
    unsigned int bits[SAMPLE_MASK_PER_THREAD];
#pragma unroll
    for (int j = 0; j < SAMPLE_MASK_PER_THREAD; ++j) {
        const int i = first + j * SAMPLE_MASK_THREADS;
        bits[j] = i < vocab ? w[i >> 5] : 0xffffffffu;
    }
#pragma unroll
    for (int j = 0; j < SAMPLE_MASK_PER_THREAD; ++j) {
        const int i = first + j * SAMPLE_MASK_THREADS;
        if (!((bits[j] >> (i & 31)) & 1u)) lg[i] = NEG_INF;
    }
}

// ---------------------------------------------------------------------------------------
// Logit biases

// Adds each entry's value to one logit: entry e is three u32s, (row, token, bits of the f32
// to add), as `logit_adjustments` lists them on the host (one entry per row and token, so
// no two threads write one logit); -inf bans a token. An entry past total_rows or vocab is
// skipped, so no input writes out of bounds.
extern "C" __global__ void __launch_bounds__(256)
    sample_bias(float* __restrict__ logits, int vocab, int total_rows, int entries,
                const unsigned int* __restrict__ adds) {
    pdl_begin();
    const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= entries) return;
    const unsigned int row = adds[3 * e], token = adds[3 * e + 1];
    if (row >= (unsigned int)total_rows || token >= (unsigned int)vocab) return;
    logits[(i64)row * (i64)vocab + token] += __uint_as_float(adds[3 * e + 2]);
}

// ---------------------------------------------------------------------------------------
// Penalties

// Applies each row's penalties to its logits in place, as `apply_penalties` on the CPU.
// Row r's history is entries offsets[r] .. offsets[r + 1] of `history`, each two u32s:
// (token, times it occurs in the output); every token of the prompt or the output appears
// once, prompt-only tokens with count 0. The repetition penalty applies to every entry;
// frequency (times the count) and presence (once) to entries with a count > 0. Entries past
// `entries` or tokens past the vocabulary are ignored, so no input can write out of bounds.
// Tokens are unique within a row, so each logit is written by one thread.
extern "C" __global__ void __launch_bounds__(SAMPLE_PENALTY_THREADS)
    sample_penalties(float* __restrict__ logits, int vocab, const SampleRow* __restrict__ rows,
                     const i64* __restrict__ offsets, const unsigned int* __restrict__ history,
                     i64 entries) {
    pdl_begin();
    const i64 row = blockIdx.x;
    const SampleRow p = rows[row];
    i64 begin = offsets[row];
    i64 end = offsets[row + 1];
    if (begin < 0) begin = 0;
    if (end > entries) end = entries;
    float* lg = logits + row * (i64)vocab;
    for (i64 e = begin + threadIdx.x; e < end; e += blockDim.x) {
        const unsigned int token = history[2 * e];
        const unsigned int count = history[2 * e + 1];
        if (token >= (unsigned int)vocab) continue;
        float l = lg[token];
        // Explicit roundings: no contraction into an fma, so the result is the CPU's f32.
        if (p.repetition_penalty != 1.0f)
            l = l > 0.0f ? __fdiv_rn(l, p.repetition_penalty) : __fmul_rn(l, p.repetition_penalty);
        if (count > 0 && (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)) {
            l = __fsub_rn(l, __fmul_rn(p.frequency_penalty, (float)count));
            l = __fsub_rn(l, p.presence_penalty);
        }
        lg[token] = l;
    }
}

// ---------------------------------------------------------------------------------------
// Keys and block reductions

// The token's key: larger is more likely. NaN counts as -inf. With `merge_zeros`, -0 ties
// with +0 (the greedy argmax compares as IEEE floats); without it -0 ranks below +0 (the
// CPU's total order of the sampled path).
__device__ __forceinline__ u64 sample_key(float logit, unsigned int id, bool merge_zeros) {
    unsigned int bits = __float_as_uint(logit);
    if (logit != logit) bits = 0xff800000u;
    else if (merge_zeros && logit == 0.0f) bits = 0u;
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return ((u64)bits << 32) | (u64)(0xffffffffu - id);
}

__device__ __forceinline__ unsigned int sample_key_id(u64 key) {
    return 0xffffffffu - (unsigned int)key;
}

__device__ __forceinline__ float sample_key_logit(u64 key) {
    const unsigned int bits = (unsigned int)(key >> 32);
    return __uint_as_float((bits & 0x80000000u) ? (bits & 0x7fffffffu) : ~bits);
}

__device__ __forceinline__ u64 sample_shfl_xor_u64(u64 v, int m) {
    unsigned int lo = (unsigned int)v;
    unsigned int hi = (unsigned int)(v >> 32);
    lo = SHFL_XOR(lo, m);
    hi = SHFL_XOR(hi, m);
    return ((u64)hi << 32) | (u64)lo;
}

__device__ __forceinline__ u64 sample_warp_max_u64(u64 v) {
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) {
        const u64 o = sample_shfl_xor_u64(v, m);
        v = o > v ? o : v;
    }
    return v;
}

// Maximum over the block; every thread gets it. `scratch`: 32 u64 of shared memory.
__device__ u64 sample_block_max_u64(u64 v, u64* scratch) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    v = sample_warp_max_u64(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0ull;
    return sample_warp_max_u64(v);
}

// Sum over the block (exact: integers); every thread gets it.
__device__ u64 sample_block_sum_u64(u64 v, u64* scratch) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v += sample_shfl_xor_u64(v, m);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0ull;
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v += sample_shfl_xor_u64(v, m);
    return v;
}

// The argmax of one row (ties: lowest id; NaN never wins unless every logit is NaN or
// -inf, then id 0), as the CPU's greedy path.
__device__ unsigned int sample_argmax_row(const float* __restrict__ lg, int vocab, u64* scratch) {
    u64 best = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const u64 key = sample_key(lg[i], (unsigned int)i, true);
        best = key > best ? key : best;
    }
    return sample_key_id(sample_block_max_u64(best, scratch));
}

// Greedy decoding, in two kernels so that a row is read by many multiprocessors at once
// (one block reading a 128k-token row waits on its loads one after another).
// sample_argmax_partial: block (row, c) writes partial[row * chunks + c], the largest key of
// tokens c * ARGMAX_CHUNK .. (c + 1) * ARGMAX_CHUNK of the row (0 past the end), each
// thread keeping ARGMAX_PER_THREAD loads in flight. sample_argmax_finish: one warp per row
// takes the largest partial key. Keys are unique, so the maximum, and the token, do not
// depend on the order of either reduction. The finish kernel also writes each row's token
// to `fed` (the token ids of the step after, as i32) and `published` (page-locked host
// memory, mapped into the device's address space) where they are not null: a decode graph
// hands its tokens on to the next step and to the host without a copy after it.
#define ARGMAX_THREADS 256
#define ARGMAX_PER_THREAD 16
#define ARGMAX_CHUNK (ARGMAX_THREADS * ARGMAX_PER_THREAD)

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
    sample_argmax_partial(const float* __restrict__ logits, int vocab, int chunks,
                          u64* __restrict__ partial) {
    pdl_begin();
    __shared__ u64 scratch[32];
    const i64 row = blockIdx.x / chunks;
    const int chunk = blockIdx.x % chunks;
    const float* lg = logits + row * (i64)vocab;
    const int first = chunk * ARGMAX_CHUNK + threadIdx.x;
    float v[ARGMAX_PER_THREAD];
#pragma unroll
    for (int j = 0; j < ARGMAX_PER_THREAD; ++j) {
        const int i = first + j * ARGMAX_THREADS;
        v[j] = i < vocab ? lg[i] : 0.0f;
    }
    u64 best = 0;
#pragma unroll
    for (int j = 0; j < ARGMAX_PER_THREAD; ++j) {
        const int i = first + j * ARGMAX_THREADS;
        const u64 key = i < vocab ? sample_key(v[j], (unsigned int)i, true) : 0ull;
        best = key > best ? key : best;
    }
    best = sample_block_max_u64(best, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = best;
}

extern "C" __global__ void __launch_bounds__(WARP_SIZE)
    sample_argmax_finish(const u64* __restrict__ partial, int chunks,
                         unsigned int* __restrict__ tokens, int* __restrict__ fed,
                         unsigned int* __restrict__ published) {
    pdl_begin();
    const i64 row = blockIdx.x;
    u64 best = 0;
    for (int c = threadIdx.x; c < chunks; c += WARP_SIZE) {
        const u64 key = partial[row * chunks + c];
        best = key > best ? key : best;
    }
    best = sample_warp_max_u64(best);
    if (threadIdx.x == 0) {
        const unsigned int token = sample_key_id(best);
        tokens[row] = token;
        if (fed != nullptr) fed[row] = (int)token;
        if (published != nullptr) published[row] = token;
    }
}

// Greedy verdicts of a verification step: out[s] = the drafts sequence s accepts (its rows
// are starts[s] .. starts[s + 1]: the last token, then the drafts; a draft is accepted while
// the argmax of the row before it, ids[r - 1], is the draft itself, tokens[r]), and
// out[n + r] = ids[r] for the `rows` rows, so that one read-back carries both.
extern "C" __global__ void greedy_verdicts(const unsigned int* __restrict__ ids,
                                           const int* __restrict__ tokens,
                                           const int* __restrict__ starts,
                                           int* __restrict__ out, int n, int rows) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows) out[n + i] = (int)ids[i];
    if (i < n) {
        const int start = starts[i], end = starts[i + 1];
        int a = 0;
        while (start + a + 1 < end && ids[start + a] == (unsigned int)tokens[start + a + 1]) ++a;
        out[i] = a;
    }
}

// ---------------------------------------------------------------------------------------
// Selection

struct SampleShared {
    u64 weight[SAMPLE_VALUE_BINS];          // weight of each bin of the current pass
    unsigned int count[SAMPLE_VALUE_BINS];  // tokens in each bin
    u64 lane_weight[64];                    // per-lane sums while picking (WARP_SIZE <= 64)
    u64 scratch[32];                        // block reductions
    float fscratch[32];                     // block reductions of floats
    u64 remaining;                          // weight still to pass inside the chosen bin
    u64 found;                              // the key found by a final search pass
    unsigned int digit;                     // the chosen bin (none: >= the bin count)
    unsigned int digit_count;               // tokens in it
    unsigned int compacted;                 // tokens copied to shared memory
};

// One row as the sampled path sees it.
struct SampleCtx {
    const float* logits;
    int vocab;
    float max_logit;   // the largest logit: finite or +inf
    float min_finite;  // the smallest finite logit (+inf if none)
    float temperature;
    float min_p;
    float mass_floor;  // logits below this surely have zero fixed-point mass
};

// (logit - max) / T, the log of the token's unnormalised probability (<= 0). +inf logits
// share the whole mass, as the CPU's cap at f64::MAX makes them do.
__device__ __forceinline__ float sample_delta(const SampleCtx& c, float logit) {
    if (logit != logit) return NEG_INF;
    if (c.max_logit == SAMPLE_POS_INF) return logit == SAMPLE_POS_INF ? 0.0f : NEG_INF;
    return __fdiv_rn(__fsub_rn(logit, c.max_logit), c.temperature);
}

// Whether the token with this logit and key takes part in a selection of `mode` above `lo`,
// and its weight. With `skip_massless`, tokens that surely weigh 0 are left out early
// (only the first pass of the draw counts them, to report how many tokens are kept).
__device__ __forceinline__ bool sample_member(const SampleCtx& c, int mode, u64 lo, float logit,
                                              u64 key, bool skip_massless, u64* weight) {
    if (mode == SAMPLE_BY_COUNT) {
        *weight = 1;
        return true;
    }
    if (key < lo) return false;
    if (skip_massless && logit < c.mass_floor) return false;
    const float d = sample_delta(c, logit);
    const float e = expf(d);
    if (mode == SAMPLE_DRAW) {
        if (!(d > SAMPLE_F64_EXP_UNDERFLOW)) return false;
        if (c.min_p > 0.0f && !(e >= c.min_p)) return false;
    }
    *weight = (u64)(e * SAMPLE_MASS_ONE);
    return true;
}

// The value bin of a logit: SAMPLE_VALUE_BINS - 1 for the maximum, falling linearly with
// the logit at `scale` bins per unit, 0 for anything further down, NaN and -inf included.
// Correctly rounded steps keep it monotone in the logit, so a bin holds a key range.
__device__ __forceinline__ int sample_value_bin(float top, float scale, float logit) {
    const float t = __fmul_rn(__fsub_rn(top, logit), scale);
    if (!(t < (float)(SAMPLE_VALUE_BINS - 1))) return 0;
    return SAMPLE_VALUE_BINS - 1 - (int)t;
}

// The `r` that the total weight M of the members gives: top-p keeps the first members whose
// running mass reaches top_p * M, i.e. exceeds ceil(top_p * M) - 1; the draw takes the
// first member whose running mass exceeds floor(u * M). Always < M.
__device__ __forceinline__ u64 sample_threshold(int mode, double fraction, u64 total) {
    const double t = fraction * (double)total;
    if (mode == SAMPLE_BY_MASS) {
        const double target = ceil(t);
        if (!(target >= 1.0)) return 0;
        if (target >= (double)total) return total - 1;
        return (u64)target - 1;
    }
    if (!(t >= 0.0)) return 0;
    if (t >= (double)total) return total - 1;
    return (u64)t;
}

// Warp 0 finds the bin, from the top (`bins - 1`) down, inside which the running weight
// first exceeds r, and leaves it in s->digit (`bins` if none), the weight still to pass
// inside it in s->remaining and its token count in s->digit_count. A bin's weight is its
// count when `by_count`. Called by every thread; ends with a barrier.
__device__ void sample_pick_bin(SampleShared* s, int bins, bool by_count, u64 r) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int per_lane = bins / WARP_SIZE;
    if (threadIdx.x < WARP_SIZE) {
        u64 sum = 0;
        for (int j = 0; j < per_lane; ++j) {
            const int bin = bins - 1 - (lane * per_lane + j);
            sum += by_count ? (u64)s->count[bin] : s->weight[bin];
        }
        s->lane_weight[lane] = sum;
    }
    if (threadIdx.x == 0) s->digit = (unsigned int)bins;
    __syncthreads();
    if (threadIdx.x < WARP_SIZE) {
        u64 before = 0;
        for (int l = 0; l < lane; ++l) before += s->lane_weight[l];
        const u64 mine = s->lane_weight[lane];
        // Exactly one lane's range [before, before + mine) holds r.
        if (before <= r && r - before < mine) {
            u64 passed = before;
            for (int j = 0; j < per_lane; ++j) {
                const int bin = bins - 1 - (lane * per_lane + j);
                const u64 w = by_count ? (u64)s->count[bin] : s->weight[bin];
                if (r - passed < w) {
                    s->digit = (unsigned int)bin;
                    s->remaining = r - passed;
                    s->digit_count = s->count[bin];
                    break;
                }
                passed += w;
            }
        }
    }
    __syncthreads();
}

// The member of value bin `value_bin` (holding `group` <= SAMPLE_COMPACT_MAX members) at
// which the running weight, from the bin's top, first exceeds r: the bin's members are
// copied to shared memory (in any order) and each is ranked against all the others, an
// exact integer sum, so the result does not depend on the copy order. 0 if none (a bug).
__device__ u64 sample_rank_group(const SampleCtx& c, int mode, u64 lo, float scale, int value_bin,
                                 u64 r, SampleShared* s) {
    u64* keys = s->weight;
    u64* weights = s->weight + SAMPLE_COMPACT_MAX;
    if (threadIdx.x == 0) {
        s->compacted = 0;
        s->found = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < c.vocab; i += blockDim.x) {
        const float logit = c.logits[i];
        if (sample_value_bin(c.max_logit, scale, logit) != value_bin) continue;
        const u64 key = sample_key(logit, (unsigned int)i, false);
        u64 weight;
        if (!sample_member(c, mode, lo, logit, key, true, &weight) || weight == 0) continue;
        const unsigned int slot = atomicAdd(&s->compacted, 1u);
        if (slot < SAMPLE_COMPACT_MAX) {
            keys[slot] = key;
            weights[slot] = weight;
        }
    }
    __syncthreads();
    const int n = s->compacted < SAMPLE_COMPACT_MAX ? (int)s->compacted : SAMPLE_COMPACT_MAX;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const u64 key = keys[t];
        u64 before = 0;  // weight of the bin's members ranked above this one
        for (int j = 0; j < n; ++j)
            if (keys[j] > key) before += weights[j];
        if (before <= r && r - before < weights[t]) s->found = key;
    }
    __syncthreads();
    return s->found;
}

// Among the members of `mode` above `lo` (see sample_member), in descending key order, the
// key of the first member at which the running weight exceeds r: r = r_fixed for
// SAMPLE_BY_COUNT, else from the members' total weight (see sample_threshold). *members
// gets the number of members (massless ones included). Returns 0 (no token's key) if no
// member qualifies, which the callers' arguments rule out. Called by every thread; all get
// the same result.
__device__ u64 sample_select(const SampleCtx& c, int mode, u64 lo, u64 r_fixed, double fraction,
                             SampleShared* s, unsigned int* members) {
    const bool by_count = mode == SAMPLE_BY_COUNT;
    // Pass 1: value bins over [lowest, max], where the members of nonzero weight lie.
    float lowest = c.min_finite;
    if (!by_count) lowest = fmaxf(lowest, c.max_logit - SAMPLE_MASS_BIN_SPAN * c.temperature);
    float scale = (float)SAMPLE_VALUE_BINS / (c.max_logit - lowest);
    if (!(scale < SAMPLE_POS_INF)) scale = 0.0f;  // one bin for all: span 0, inf or NaN
    for (int b = threadIdx.x; b < SAMPLE_VALUE_BINS; b += blockDim.x) {
        s->weight[b] = 0;
        s->count[b] = 0;
    }
    __syncthreads();
    // Bin 0 (the bottom: -inf, NaN, masked tokens) is summed per thread, not with atomics.
    u64 my_weight = 0, my_count = 0, my_bottom_weight = 0, my_bottom_count = 0;
    for (int i = threadIdx.x; i < c.vocab; i += blockDim.x) {
        const float logit = c.logits[i];
        const u64 key = sample_key(logit, (unsigned int)i, false);
        u64 weight;
        if (!sample_member(c, mode, lo, logit, key, mode != SAMPLE_DRAW, &weight)) continue;
        my_weight += weight;
        my_count += 1;
        if (weight == 0) continue;
        const int bin = sample_value_bin(c.max_logit, scale, logit);
        if (bin == 0) {
            my_bottom_weight += weight;
            my_bottom_count += 1;
            continue;
        }
        if (!by_count) atomicAdd(&s->weight[bin], weight);
        atomicAdd(&s->count[bin], 1u);
    }
    const u64 total = sample_block_sum_u64(my_weight, s->scratch);
    *members = (unsigned int)sample_block_sum_u64(my_count, s->scratch);
    const u64 bottom_weight = sample_block_sum_u64(my_bottom_weight, s->scratch);
    const u64 bottom_count = sample_block_sum_u64(my_bottom_count, s->scratch);
    if (threadIdx.x == 0) {
        s->weight[0] = bottom_weight;
        s->count[0] = (unsigned int)bottom_count;
    }
    u64 r = by_count ? r_fixed : sample_threshold(mode, fraction, total);
    __syncthreads();
    sample_pick_bin(s, SAMPLE_VALUE_BINS, by_count, r);
    if (s->digit >= SAMPLE_VALUE_BINS) return 0;
    const int value_bin = (int)s->digit;
    const unsigned int group = s->digit_count;
    r = s->remaining;
    if (group <= SAMPLE_COMPACT_MAX)
        return sample_rank_group(c, mode, lo, scale, value_bin, r, s);

    // Pass 2: the smallest and largest key of the chosen bin's members.
    u64 kmax = 0, knot_min = 0;  // knot_min: the largest complement, i.e. ~(smallest key)
    for (int i = threadIdx.x; i < c.vocab; i += blockDim.x) {
        const float logit = c.logits[i];
        if (sample_value_bin(c.max_logit, scale, logit) != value_bin) continue;
        const u64 key = sample_key(logit, (unsigned int)i, false);
        u64 weight;
        if (!sample_member(c, mode, lo, logit, key, true, &weight) || weight == 0) continue;
        kmax = key > kmax ? key : kmax;
        knot_min = ~key > knot_min ? ~key : knot_min;
    }
    kmax = sample_block_max_u64(kmax, s->scratch);
    const u64 kmin = ~sample_block_max_u64(knot_min, s->scratch);
    if (kmin >= kmax) return kmax;  // one member (not reached: the bin holds many)

    // Passes 3+: radix select over the keys in [kmin, kmax], from their highest differing bit.
    const int high = 63 - __clzll(kmin ^ kmax);
    u64 known = high == 63 ? 0ull : (~0ull << (high + 1));  // bits fixed so far
    u64 prefix = kmax & known;
    int shift = high >= SAMPLE_RADIX_BITS - 1 ? high - (SAMPLE_RADIX_BITS - 1) : 0;
    for (;;) {
        for (int b = threadIdx.x; b < SAMPLE_RADIX_BINS; b += blockDim.x) {
            s->weight[b] = 0;
            s->count[b] = 0;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < c.vocab; i += blockDim.x) {
            const float logit = c.logits[i];
            const u64 key = sample_key(logit, (unsigned int)i, false);
            if (key < kmin || key > kmax || (key & known) != prefix) continue;
            u64 weight;
            if (!sample_member(c, mode, lo, logit, key, true, &weight) || weight == 0) continue;
            const unsigned int bin = (unsigned int)(key >> shift) & (SAMPLE_RADIX_BINS - 1);
            if (!by_count) atomicAdd(&s->weight[bin], weight);
            atomicAdd(&s->count[bin], 1u);
        }
        __syncthreads();
        sample_pick_bin(s, SAMPLE_RADIX_BINS, by_count, r);
        if (s->digit >= SAMPLE_RADIX_BINS) return 0;
        r = s->remaining;
        // Bits of this digit already in `known` are equal for every candidate, so OR-ing
        // the digit in keeps them.
        prefix |= (u64)s->digit << shift;
        known |= (u64)(SAMPLE_RADIX_BINS - 1) << shift;
        if (shift == 0) return prefix;
        if (s->digit_count == 1) {
            // One member in the chosen bin: it is the answer; one more pass finds it.
            if (threadIdx.x == 0) s->found = 0;
            __syncthreads();
            for (int i = threadIdx.x; i < c.vocab; i += blockDim.x) {
                const float logit = c.logits[i];
                const u64 key = sample_key(logit, (unsigned int)i, false);
                if (key < kmin || key > kmax || (key & known) != prefix) continue;
                u64 weight;
                if (sample_member(c, mode, lo, logit, key, true, &weight) && weight != 0)
                    s->found = key;
            }
            __syncthreads();
            return s->found;
        }
        shift = shift >= SAMPLE_RADIX_BITS ? shift - SAMPLE_RADIX_BITS : 0;
    }
}

// Samples one token per row: greedy rows take the argmax; the others apply temperature,
// top-k, top-p and min-p as the CPU's `distribution`, then draw with rows[r].uniform by
// inverse CDF over the kept tokens, most likely first. tokens[r] gets the token (0xffffffff
// only if a selection failed, which is a bug) and kept[r] how many tokens were kept (1 when
// greedy).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(const float* __restrict__ logits, int vocab, const SampleRow* __restrict__ rows,
                unsigned int* __restrict__ tokens, unsigned int* __restrict__ kept) {
    pdl_begin();
    __shared__ SampleShared s;
    const i64 row = blockIdx.x;
    const SampleRow p = rows[row];
    const float* lg = logits + row * (i64)vocab;
    if (p.greedy) {
        const unsigned int token = sample_argmax_row(lg, vocab, s.scratch);
        if (threadIdx.x == 0) {
            tokens[row] = token;
            kept[row] = 1;
        }
        return;
    }
    u64 top = 0;
    float neg_min = NEG_INF;  // -(smallest finite logit)
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float logit = lg[i];
        const u64 key = sample_key(logit, (unsigned int)i, false);
        top = key > top ? key : top;
        if (fabsf(logit) < SAMPLE_POS_INF) neg_min = fmaxf(neg_min, -logit);  // finite
    }
    top = sample_block_max_u64(top, s.scratch);
    neg_min = block_max(neg_min, s.fscratch);
    const float max_logit = sample_key_logit(top);
    if (max_logit == NEG_INF) {
        // Every logit is -inf or NaN: the lowest id, as the CPU.
        if (threadIdx.x == 0) {
            tokens[row] = sample_key_id(top);
            kept[row] = 1;
        }
        return;
    }
    SampleCtx c;
    c.logits = lg;
    c.vocab = vocab;
    c.max_logit = max_logit;
    c.min_finite = -neg_min;
    c.temperature = p.temperature;
    c.min_p = p.min_p;
    c.mass_floor = max_logit - SAMPLE_ZERO_MASS_SPAN * p.temperature;
    unsigned int members = 0;
    // Each filter raises `lo`, the key of the last token it keeps; 0 means a selection
    // failed (a bug), reported as token 0xffffffff.
    u64 lo = 1;
    if (p.top_k > 0 && p.top_k < vocab)
        lo = sample_select(c, SAMPLE_BY_COUNT, 0, (u64)(p.top_k - 1), 0.0, &s, &members);
    if (lo != 0 && p.top_p < 1.0f)
        lo = sample_select(c, SAMPLE_BY_MASS, lo, 0, (double)p.top_p, &s, &members);
    const u64 chosen = lo == 0 ? 0 : sample_select(c, SAMPLE_DRAW, lo, 0, p.uniform, &s, &members);
    if (threadIdx.x == 0) {
        tokens[row] = chosen == 0 ? 0xffffffffu : sample_key_id(chosen);
        kept[row] = members;
    }
}

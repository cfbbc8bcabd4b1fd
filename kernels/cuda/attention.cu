// Paged attention over the KV cache: causal, grouped-query, bf16 in and out, f32 inside.
//
// Semantics are those of the CPU kernel (kernels/src/cpu/attention.rs): sequence s owns query
// rows q_start[s] .. q_start[s] + q_len[s]; its query i sits at position
// context_len[s] - q_len[s] + i and sees keys 0 ..= that position. Query head h reads KV head
// h / (num_heads / num_kv_heads). q is read with a row stride (it lives inside the fused qkv
// activation); o is dense [rows, num_heads * head_dim]; rows no sequence owns are untouched.
//
// Two paths, chosen per sequence by its own q_len alone (the host builds the work lists):
// - q_len == 1 (decode): the context is split in partitions of PA_PARTITION tokens, a fixed
//   constant. paged_attention_split_* writes one (max, sum, unnormalised output) record per
//   (partition, head) into a scratch buffer; paged_attention_combine merges a row's records
//   in an order fixed by its number of partitions. A row whose context fits one partition
//   is finished by the split kernel itself, with the combine's arithmetic for one record
//   (so the same bits), and has no combine work. So a row's result depends on its own
//   context only, never on what else is in the batch.
// - q_len > 1 (prefill, chunked prefill): a flash-attention loop over tiles of PA_TILE
//   queries against tiles of keys read through the block table, online softmax in f32:
//   paged_attention_prefill_mma_* on tensor cores (attention_mma.cu, sm_80 and up), else
//   paged_attention_prefill_* on CUDA cores (below). Key tiles always start at key 0 and are
//   walked in order, so a row's reduction order over keys is fixed by the kernel alone.
//   (The host cuts a sequence of a few rows, a verification step's, into one-row sequences
//   for the split kernel where it is the decode kernel: SPLIT_MAX_ROWS in
//   kernels/src/cuda/attention.rs.)
//
// Cache layout: [num_blocks, block_size, num_kv_heads, head_dim] bf16, one token's K (or V) of
// all KV heads in a slot of num_kv_heads * head_dim elements. Block ids are int in the table
// and widened to 64 bits before any multiplication; every element offset is a long long.
// The cache base comes from the allocator (256-byte aligned) and head_dim is a multiple of 8,
// so a row of K or V can be read with 16-byte loads.
//
// Work lists (int pairs, built on the host, see kernels/src/cuda/attention.rs):
//   split_work[2w], split_work[2w+1]     = sequence, partition       (split kernel item w)
//   decode_work[2i], decode_work[2i+1]   = sequence, first split item (combine item i; only
//                                          sequences of more than one partition)
//   prefill_work[2w], prefill_work[2w+1] = sequence, query tile      (prefill item w)
// live[PA_LIVE_SPLIT], live[PA_LIVE_DECODE], live[PA_LIVE_PREFILL] (device memory) are the
// items of this step in each list. An eager launch has exactly that many items in its grid;
// a captured graph launches the grid of its capacity and the blocks past the live items
// return at once, so the graph serves every step whose items fit. Work-list lengths, as
// passed by value (num_work), are the capacities that lay out the scratch records.
// Grids are flattened, the item slowest: the split kernel runs one block per (item, KV head,
// chunk of the query heads sharing it), the combine and prefill kernels one per (item, head),
// the head fastest, so the heads that share a KV head run side by side.

#define PA_LIVE_SPLIT 0         // index of each list's live count in `live`
#define PA_LIVE_DECODE 1
#define PA_LIVE_PREFILL 2
#define PA_PARTITION 512        // tokens per split partition: a constant, never per batch
// The split kernel's shape and register budget, which sets its occupancy: its threads, the
// 16-byte loads each lane keeps in flight (PA_UNROLL), and the blocks a multiprocessor must
// hold at once (PA_SPLIT_MIN_BLOCKS, its launch bounds: 4 blocks of 256 threads leave 64
// registers a thread, and with the query slices packed as bf16 pairs nothing spills). The
// unroll changes no result: a lane visits its tokens in the same order whatever it is.
// scripts/split_attention_bench.cu times other values, defined on its compiler's command
// line (hence the guards); on an H100 these run the 1B shape's batch-64 decode attention
// in 22 us a layer against 49 with 8 loads in flight and no bound (142 registers).
#ifndef PA_SPLIT_THREADS
#define PA_SPLIT_THREADS 256    // threads of the split kernel
#endif
#ifndef PA_UNROLL
#define PA_UNROLL 4
#endif
#ifndef PA_SPLIT_MIN_BLOCKS
#define PA_SPLIT_MIN_BLOCKS 4
#endif
#define PA_STEP_ROWS 32         // step tokens a sequence, steps kernels (SPLIT_MAX_ROWS)
#define PA_COMBINE_THREADS 512  // threads of the combine kernel
#define PA_COMBINE_CHUNK 1024   // partition weights the combine kernel stages at a time
#define PA_TILE 64              // query rows of a prefill work item
#define PA_BQ 32                // queries per pass of the CUDA-core prefill kernel
#define PA_BK 32                // keys per prefill tile
#define PA_TPR 4                // prefill threads per query row
#define PA_PREFILL_THREADS 128  // PA_BQ * PA_TPR

// The KV write of a step whose rows all go to the split kernel, fused into it (fuse != 0):
// each sequence's last token takes its key (rotated by `rotary` as in kv_write_bf16, at
// positions[row]) and value from qkv's K and V columns, and the KV head's first block
// writes them to slot slot_mapping[row] (skipped when negative or past num_slots). The
// step_tokens[seq] tokens at the end of its context are this step's, carried by the rows
// ending at its own (a verification step's rows cut into sequences: the rows before it of
// its sequence, which other blocks write): every block reads them from qkv, never from
// the cache. With fuse == 0 the caches already hold the step's keys and q is already
// rotated; the other fields are not read.
struct PaNewKv {
    const int* positions;
    const float* cos_sin;
    int rotary;
    const i64* slot_mapping;
    const int* step_tokens;
    i64 num_slots;
    int fuse;
};

// Element offset of the slot holding token t of a sequence whose block ids are `table`.
// The block id is widened before it is multiplied.
__device__ __forceinline__ i64 pa_slot_offset(const int* table, int t, int block_size, i64 slot_elems) {
    const i64 block = (i64)table[t / block_size];
    return (block * block_size + (t % block_size)) * slot_elems;
}

// ---------------------------------------------------------------------------------------
// Decode: one block per (split item, KV head, chunk of up to MAXG query heads of its group),
// so that each K and V row is read once for all the query heads that share it. STEPS is the
// most tokens of the step a sequence's context ends with (1: a decode step; PA_STEP_ROWS:
// a verification step's rows cut into sequences, whose earlier rows go through shared
// memory). A lane group
// of D / 8 lanes reads one token's K (or V) row with one 16-byte load per lane; a warp reads
// WARP_SIZE / (D / 8) tokens at once and every lane keeps PA_UNROLL loads in flight. The
// partition's slot offsets are looked up once, into shared memory. Each
// query head's scores, softmax and output are computed exactly as if it were alone: the
// order of every sum depends on the partition's tokens only.
template <int D, int MAXG, int STEPS>
__device__ __forceinline__ void pa_split(const bf16* __restrict__ q, i64 q_stride,
                                         bf16* k_cache, bf16* v_cache,
                                         const int* __restrict__ q_start,
                                         const int* __restrict__ context_len,
                                         const i64* __restrict__ table_start,
                                         const int* __restrict__ block_table,
                                         const int* __restrict__ split_work, int num_work,
                                         const int* __restrict__ live,
                                         float* __restrict__ scratch, bf16* __restrict__ o,
                                         int num_heads, int num_kv_heads, int block_size,
                                         float scale, PaNewKv nk) {
    constexpr int VEC = 8;           // bf16 per 16-byte load
    constexpr int LANES = D / VEC;   // lanes per token row: 8 (D = 64) or 16 (D = 128)
    constexpr int WARPS = PA_SPLIT_THREADS / WARP_SIZE;
    __shared__ float logits[MAXG][PA_PARTITION];
    __shared__ float red_max[MAXG][WARPS], red_sum[MAXG][WARPS];
    __shared__ float warp_out[WARPS][MAXG][D];
    __shared__ i64 slot_at[PA_PARTITION];  // element offset of each token's row of this KV head

    // Which item, KV head and query heads this block serves.
    const int group = num_heads / num_kv_heads;        // query heads per KV head
    const int chunks = (group + MAXG - 1) / MAXG;      // blocks per KV head
    const int per_item = num_kv_heads * chunks;
    const int w = blockIdx.x / per_item;
    const int kv_head = (blockIdx.x % per_item) / chunks;
    const int g0 = (blockIdx.x % chunks) * MAXG;
    if (w >= live[PA_LIVE_SPLIT]) return;  // past this step's items (a graph's fixed grid)
    const int heads_here = min(MAXG, group - g0);      // >= 1
    const int h0 = kv_head * group + g0;               // first query head

    const int seq = split_work[2 * w];
    const int first = split_work[2 * w + 1] * PA_PARTITION;  // first token of the partition
    const int ctx = context_len[seq];
    const int n = min(PA_PARTITION, ctx - first);  // >= 1: the host lists partitions < ctx
    const i64 slot_elems = (i64)num_kv_heads * D;
    const int* table = block_table + table_start[seq];

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    const int per_warp = WARP_SIZE / LANES;   // tokens a warp reads at once
    const int group_lane = lane / LANES;      // which of them this lane reads
    const int gl = lane % LANES;              // which 8 elements of the row
    const int step = warps * per_warp;        // tokens the block reads at once

    // The partition's rows, looked up in the block table once (64-bit offsets).
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        slot_at[i] = pa_slot_offset(table, first + i, block_size, slot_elems) + (i64)kv_head * D;
    // With the KV write fused in, this step's token (the sequence's last) comes from qkv,
    // its key rotated here as kv_write_bf16 would, and never from the cache, as do the
    // step's earlier tokens of the sequence: no block reads a slot that another block of
    // the launch writes.
    __shared__ __align__(16) bf16 new_k[D];
    __shared__ __align__(16) bf16 new_v[D];
    const i64 row = q_start[seq];
    const int last = nk.fuse ? ctx - 1 - first : -1;  // its index in the partition
    const bool has_new = last >= 0 && last < n;
    const int new_at = has_new ? last : -1;           // -1: no token of the loops
    const float* angles = nk.fuse && nk.rotary ? nk.cos_sin + (i64)nk.positions[row] * D : nullptr;
    // The step's earlier tokens of the sequence (STEPS > 1), from index `step_at` of the
    // partition to `last` (none here when step_at >= n): token i is qkv's row
    // `row - (last - i)`, staged below into step_k and step_v at i - step_at.
    constexpr int EARLIER = STEPS > 1 ? STEPS - 1 : 1;
    __shared__ __align__(16) bf16 step_k[EARLIER][D];
    __shared__ __align__(16) bf16 step_v[EARLIER][D];
    const int step_at = !nk.fuse ? n : STEPS > 1 ? last + 1 - min(nk.step_tokens[seq], STEPS) : last;

    // Everything above reads only what the host staged for the step. With the KV write
    // fused in, every token before the step's was written by an earlier step too, so
    // the one-head kernels (chosen when few sequences run, and latency-bound then) load
    // their first pass of keys and values here, while the kernel ahead finishes. Kernels
    // of more heads keep those registers for their heads.
    constexpr bool PRELOAD = MAXG == 1;
    const bool preload = PRELOAD && nk.fuse;
    uint4 k_pre[PRELOAD ? PA_UNROLL : 1], v_pre[PRELOAD ? PA_UNROLL : 1];
    if (PRELOAD) {
        __syncthreads();  // slot_at is read across threads
#pragma unroll
        for (int u = 0; u < (PRELOAD ? PA_UNROLL : 1); ++u) {
            const int i = u * step + warp * per_warp + group_lane;
            const bool cached = preload && i < n && i < step_at;
            k_pre[u] = cached ? load_bf16x8(k_cache + slot_at[i] + gl * VEC) : make_uint4(0u, 0u, 0u, 0u);
            v_pre[u] = cached ? load_bf16x8(v_cache + slot_at[i] + gl * VEC) : make_uint4(0u, 0u, 0u, 0u);
        }
    }
    // The step's slot for that token, which the host staged.
    const i64 new_slot = has_new && g0 == 0 ? nk.slot_mapping[row] : -1;
    pdl_wait();
    // The new token's key (rotated here as kv_write_bf16 would) and value, one element per
    // thread of the first D, and this lane's 8 elements of each query head (scalar loads:
    // q's stride need not be aligned), rotated here when the KV write is fused in
    // (kv_write_bf16 rotates them in place otherwise): every load is issued before any is
    // used, so all come in one round trip. Loops over heads run to MAXG so the arrays stay
    // in registers.
    static_assert(D <= PA_SPLIT_THREADS, "a thread per element of the new key");
    const bool loads_new = has_new && (int)threadIdx.x < D;
    RopeInputs k_rope = {};
    bf16 k_in = {}, v_in = {};
    if (loads_new) {
        const bf16* k_new = q + row * q_stride + ((i64)num_heads + kv_head) * D;
        const bf16* v_new = q + row * q_stride + ((i64)num_heads + num_kv_heads + kv_head) * D;
        const int e = threadIdx.x;
        if (angles) {
            k_rope = rope_load(k_new, e, D / 2, nk.rotary, angles);
        } else {
            k_in = k_new[e];
        }
        v_in = v_new[e];
    }
    const bf16* q_row = q + row * q_stride;
    // Every element is a bf16 (rotated or not), so packing two to a register (half the
    // registers of f32) loses nothing.
    unsigned int qv[MAXG][VEC / 2];
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        const bf16* head = q_row + (i64)(h0 + g) * D;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const int e = gl * VEC + j;
            const float x = g >= heads_here ? 0.0f
                            : angles        ? to_f32(rope_element(head, e, D / 2, nk.rotary, angles))
                                            : to_f32(head[e]);
            const unsigned int bits = __float_as_uint(x);
            if (j % 2 == 0) qv[g][j / 2] = bits >> 16;
            else qv[g][j / 2] |= bits & 0xffff0000u;
        }
    }
    // Element j of query head g's slice, as f32.
    auto q_at = [&](int g, int j) -> float { return j % 2 == 0 ? bf16_lo(qv[g][j / 2]) : bf16_hi(qv[g][j / 2]); };
    if (loads_new) {
        new_k[threadIdx.x] = angles ? rope_apply(k_rope) : k_in;
        new_v[threadIdx.x] = v_in;
    }
    if (STEPS > 1) {
        // This partition's earlier tokens of the step, as the new token's: key rotated at
        // its row's position, value as it is.
        const int lo = max(step_at, 0), hi = min(last, n);
        for (int x = threadIdx.x; x < (hi - lo) * D; x += blockDim.x) {
            const int i = lo + x / D, e = x % D;
            const i64 r = row - (last - i);
            const bf16* k_row = q + r * q_stride + ((i64)num_heads + kv_head) * D;
            const bf16* v_row = q + r * q_stride + ((i64)num_heads + num_kv_heads + kv_head) * D;
            const float* a = nk.rotary ? nk.cos_sin + (i64)nk.positions[r] * D : nullptr;
            step_k[i - step_at][e] = a ? rope_element(k_row, e, D / 2, nk.rotary, a) : k_row[e];
            step_v[i - step_at][e] = v_row[e];
        }
    }
    __syncthreads();
    // The first block of the KV head stores the token's key and value in its slot.
    if (new_slot >= 0 && new_slot < nk.num_slots) {
        const i64 dst = (new_slot * num_kv_heads + kv_head) * D;
        for (int e = threadIdx.x; e < D; e += blockDim.x) {
            k_cache[dst + e] = new_k[e];
            v_cache[dst + e] = new_v[e];
        }
    }

    // Scores of the partition's tokens. The loop bounds are the same for the whole block,
    // so every lane reaches every shuffle.
    for (int base = 0; base < n; base += step * PA_UNROLL) {
        uint4 raw[PA_UNROLL];
#pragma unroll
        for (int u = 0; u < PA_UNROLL; ++u) {
            const int i = base + u * step + warp * per_warp + group_lane;
            raw[u] = make_uint4(0u, 0u, 0u, 0u);
            if (i == new_at) raw[u] = *reinterpret_cast<const uint4*>(new_k + gl * VEC);
            else if (STEPS > 1 && i >= step_at && i < n) raw[u] = *reinterpret_cast<const uint4*>(&step_k[i - step_at][gl * VEC]);
            else if (preload && base == 0) raw[u] = k_pre[PRELOAD ? u : 0];
            else if (i < n) raw[u] = load_bf16x8(k_cache + slot_at[i] + gl * VEC);
        }
#pragma unroll
        for (int u = 0; u < PA_UNROLL; ++u) {
            float kf[VEC];
            unpack_bf16x8(raw[u], kf);
            const int i = base + u * step + warp * per_warp + group_lane;
#pragma unroll
            for (int g = 0; g < MAXG; ++g) {
                if (g < heads_here) {
                    float dot = 0.0f;
#pragma unroll
                    for (int j = 0; j < VEC; ++j) dot += q_at(g, j) * kf[j];
                    // Butterfly over the lane group: fixed order, the same sum on every lane.
                    for (int m = LANES / 2; m > 0; m >>= 1) dot += SHFL_XOR(dot, m);
                    if (i < n && gl == 0) logits[g][i] = dot * scale;
                }
            }
        }
    }
    __syncthreads();

    // Softmax of each head over the partition, relative to its own max: every head's max,
    // then every head's sum, each in one block reduction (per warp, then the warps in
    // order 0, 1, 2, ...).
    float maxes[MAXG], sums[MAXG];
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        float m = NEG_INF;
        if (g < heads_here)
            for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, logits[g][i]);
        m = warp_max(m);
        if (lane == 0) red_max[g][warp] = m;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        float m = NEG_INF;
        for (int wp = 0; wp < warps; ++wp) m = fmaxf(m, red_max[g][wp]);
        maxes[g] = m;
    }
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        float t = 0.0f;
        if (g < heads_here) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const float p = expf(logits[g][i] - maxes[g]);
                logits[g][i] = p;
                t += p;
            }
        }
        t = warp_sum(t);
        if (lane == 0) red_sum[g][warp] = t;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        float t = 0.0f;
        for (int wp = 0; wp < warps; ++wp) t += red_sum[g][wp];
        sums[g] = t;
    }

    // Unnormalised outputs: sum of p_i * v_i over the partition, 8 dims per lane and head.
    float acc[MAXG][VEC];
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[g][j] = 0.0f;
    }
    for (int base = 0; base < n; base += step * PA_UNROLL) {
        uint4 raw[PA_UNROLL];
#pragma unroll
        for (int u = 0; u < PA_UNROLL; ++u) {
            const int i = base + u * step + warp * per_warp + group_lane;
            raw[u] = make_uint4(0u, 0u, 0u, 0u);
            if (i == new_at) raw[u] = *reinterpret_cast<const uint4*>(new_v + gl * VEC);
            else if (STEPS > 1 && i >= step_at && i < n) raw[u] = *reinterpret_cast<const uint4*>(&step_v[i - step_at][gl * VEC]);
            else if (preload && base == 0) raw[u] = v_pre[PRELOAD ? u : 0];
            else if (i < n) raw[u] = load_bf16x8(v_cache + slot_at[i] + gl * VEC);
        }
#pragma unroll
        for (int u = 0; u < PA_UNROLL; ++u) {
            float vf[VEC];
            unpack_bf16x8(raw[u], vf);
            const int i = base + u * step + warp * per_warp + group_lane;
#pragma unroll
            for (int g = 0; g < MAXG; ++g) {
                if (g < heads_here) {
                    const float p = i < n ? logits[g][i] : 0.0f;
#pragma unroll
                    for (int j = 0; j < VEC; ++j) acc[g][j] += p * vf[j];
                }
            }
        }
    }
    // Sum the lane groups of a warp (butterfly), each warp's sums to shared memory, then
    // the warps in order 0, 1, 2, ... per output element.
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        if (g < heads_here) {
            for (int mask = LANES; mask < WARP_SIZE; mask <<= 1) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) acc[g][j] += SHFL_XOR(acc[g][j], mask);
            }
            if (group_lane == 0) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) warp_out[warp][g][gl * VEC + j] = acc[g][j];
            }
        }
    }
    __syncthreads();
    // Each output element is the warps' sums added in order 0, 1, 2, ...; with a context of
    // one partition it is the row's result (the combine would weigh this record by
    // e^0 = 1, add it to 0 and scale it by 1 / (1 * sum): the same operations here give the
    // same bits), else the partition's record in scratch: [num_work * num_heads records of
    // D floats][maxes][sums], record item * num_heads + head.
    const bool alone = ctx <= PA_PARTITION;
    const i64 records = (i64)num_work * num_heads;
    bf16* o_row = o + (i64)q_start[seq] * ((i64)num_heads * D);
    for (int e = threadIdx.x; e < heads_here * D; e += blockDim.x) {
        const int g = e / D, d = e % D;
        float t = warp_out[0][g][d];
        for (int wp = 1; wp < warps; ++wp) t += warp_out[wp][g][d];
        if (alone) {
            float sum = 0.0f;  // sums[g], added again in its order (g is not a constant here)
            for (int wp = 0; wp < warps; ++wp) sum += red_sum[g][wp];
            o_row[(i64)(h0 + g) * D + d] = to_bf16((0.0f + t) * (1.0f / sum));
        } else {
            scratch[((i64)w * num_heads + h0 + g) * D + d] = t;
        }
    }
    if (alone || threadIdx.x != 0) return;
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        if (g < heads_here) {
            const i64 rec = (i64)w * num_heads + h0 + g;
            scratch[records * D + rec] = maxes[g];
            scratch[records * D + records + rec] = sums[g];
        }
    }
}

#define PA_SPLIT_PARAMS                                                                      \
    const bf16 *__restrict__ q, i64 q_stride, bf16 *k_cache, bf16 *v_cache,                  \
        const int *__restrict__ q_start,                                                     \
        const int *__restrict__ context_len, const i64 *__restrict__ table_start,            \
        const int *__restrict__ block_table, const int *__restrict__ split_work, int num_work, \
        const int *__restrict__ live, float *__restrict__ scratch, bf16 *__restrict__ o,      \
        int num_heads, int num_kv_heads, int block_size, float scale, PaNewKv nk
#define PA_SPLIT_ARGS                                                                       \
    q, q_stride, k_cache, v_cache, q_start, context_len, table_start, block_table, split_work, \
        num_work, live, scratch, o, num_heads, num_kv_heads, block_size, scale, nk

// One kernel per head size and bucket of query heads per KV head. A head's result does not
// depend on the bucket, so the launcher picks it for occupancy: the largest bucket (up to
// the one that holds the group) that still fills the GPU, several blocks per KV head when
// the bucket is smaller than the group.
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_d64_g1(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<64, 1, 1>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_d64_g2(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<64, 2, 1>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_d64_g4(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<64, 4, 1>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_d128_g1(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<128, 1, 1>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_d128_g2(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<128, 2, 1>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_d128_g4(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<128, 4, 1>(PA_SPLIT_ARGS); }
// The kernels of a verification step's rows cut into sequences (up to PA_STEP_ROWS tokens
// of the step a sequence).
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_steps_d64_g1(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<64, 1, PA_STEP_ROWS>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_steps_d64_g2(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<64, 2, PA_STEP_ROWS>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_steps_d64_g4(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<64, 4, PA_STEP_ROWS>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_steps_d128_g1(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<128, 1, PA_STEP_ROWS>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_steps_d128_g2(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<128, 2, PA_STEP_ROWS>(PA_SPLIT_ARGS); }
extern "C" __global__ void __launch_bounds__(PA_SPLIT_THREADS, PA_SPLIT_MIN_BLOCKS) paged_attention_split_steps_d128_g4(PA_SPLIT_PARAMS) { pdl_launch_dependents(); pa_split<128, 4, PA_STEP_ROWS>(PA_SPLIT_ARGS); }

// One block per (decode sequence, head): merges the sequence's partition records and writes
// its output row: out = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) s_p. The max and the
// denominator are block reductions over the partitions (an order fixed by the partition
// count and the block size). Output element d is summed by blockDim / head_dim slices of
// threads, slice k taking partitions k, k + slices, ... in order, and the slices are then
// added in order 0, 1, 2, ...; partition weights are staged in shared memory,
// PA_COMBINE_CHUNK at a time. head_dim divides the block size.
extern "C" __global__ void __launch_bounds__(PA_COMBINE_THREADS) paged_attention_combine(
    const float* __restrict__ scratch, int num_work, int num_heads, int head_dim,
    const int* __restrict__ decode_work, const int* __restrict__ live, const int* __restrict__ q_start,
    const int* __restrict__ context_len, bf16* __restrict__ o) {
    pdl_begin();
    __shared__ float weights[PA_COMBINE_CHUNK];
    __shared__ float slice_sum[PA_COMBINE_THREADS];
    __shared__ float red[32];
    const int h = blockIdx.x % num_heads;
    const int i = blockIdx.x / num_heads;
    if (i >= live[PA_LIVE_DECODE]) return;  // past this step's sequences (a graph's fixed grid)
    const int seq = decode_work[2 * i];
    const int first = decode_work[2 * i + 1];
    const int parts = (context_len[seq] + PA_PARTITION - 1) / PA_PARTITION;
    const i64 records = (i64)num_work * num_heads;
    const float* maxes = scratch + records * head_dim;
    const float* sums = maxes + records;
    const i64 rec0 = (i64)first * num_heads + h;  // partition p's record: rec0 + p * num_heads

    float m = NEG_INF;
    for (int p = threadIdx.x; p < parts; p += blockDim.x) m = fmaxf(m, maxes[rec0 + (i64)p * num_heads]);
    m = block_max(m, red);
    float t = 0.0f;
    for (int p = threadIdx.x; p < parts; p += blockDim.x) {
        const i64 rec = rec0 + (i64)p * num_heads;
        t += expf(maxes[rec] - m) * sums[rec];
    }
    const float inv = 1.0f / block_sum(t, red);

    const int slices = blockDim.x / head_dim;
    const int d = threadIdx.x % head_dim, slice = threadIdx.x / head_dim;
    const i64 stride = (i64)num_heads * head_dim;  // from one partition's record to the next
    float v = 0.0f;
    for (int c0 = 0; c0 < parts; c0 += PA_COMBINE_CHUNK) {
        const int cn = min(PA_COMBINE_CHUNK, parts - c0);
        __syncthreads();  // the previous chunk's weights are no longer read
        for (int p = threadIdx.x; p < cn; p += blockDim.x)
            weights[p] = expf(maxes[rec0 + (i64)(c0 + p) * num_heads] - m);
        __syncthreads();
        const float* acc = scratch + (rec0 + (i64)c0 * num_heads) * head_dim + d;
#pragma unroll 4
        for (int p = slice; p < cn; p += slices) v += weights[p] * acc[p * stride];
    }
    slice_sum[threadIdx.x] = v;
    __syncthreads();
    if (slice == 0) {
        float total = 0.0f;
        for (int k = 0; k < slices; ++k) total += slice_sum[k * head_dim + d];
        o[(i64)q_start[seq] * stride + (i64)h * head_dim + d] = to_bf16(total * inv);
    }
}

// ---------------------------------------------------------------------------------------
// Prefill: one block per (query tile of PA_TILE rows, head), on CUDA cores (the portable
// path; attention_mma.cu is the tensor-core one). The block takes the tile in passes of
// PA_BQ rows, PA_TPR threads per query row, rows row0 .. row0 + PA_BQ - 1 of sequence seq
// a pass. Thread (r, c)
// scores keys c, c + PA_TPR, ... of each key tile for row r, and accumulates output dims
// (2 (c + PA_TPR j), 2 (c + PA_TPR j) + 1). Tiles sit in shared memory as packed bf16 pairs,
// rows padded by 4 words so that rows are 16-byte aligned and the reads below are free of
// bank conflicts.
template <int D>
__device__ __forceinline__ void pa_prefill(const bf16* __restrict__ q, i64 q_stride,
                                           const bf16* __restrict__ k_cache,
                                           const bf16* __restrict__ v_cache,
                                           const int* __restrict__ q_start,
                                           const int* __restrict__ q_len,
                                           const int* __restrict__ context_len,
                                           const i64* __restrict__ table_start,
                                           const int* __restrict__ block_table, int seq, int row0,
                                           bf16* __restrict__ o, int num_heads, int num_kv_heads,
                                           int block_size, float scale) {
    constexpr int WORDS = D / 2;             // bf16 pairs in a row
    constexpr int STRIDE = WORDS + 4;        // padded row, in words
    constexpr int KPT = PA_BK / PA_TPR;      // keys per thread per tile
    constexpr int PPT = WORDS / PA_TPR;      // output pairs per thread
    constexpr int CHUNKS = D / 8;            // 16-byte chunks in a row
    // uint4 arrays, so that 16-byte stores into them are aligned.
    __shared__ uint4 q_tile4[PA_BQ * STRIDE / 4];
    __shared__ uint4 k_tile4[PA_BK * STRIDE / 4];
    __shared__ uint4 v_tile4[PA_BK * STRIDE / 4];
    __shared__ float p_tile[PA_BQ][PA_BK + 1];
    unsigned int* q_tile = reinterpret_cast<unsigned int*>(q_tile4);
    unsigned int* k_tile = reinterpret_cast<unsigned int*>(k_tile4);
    unsigned int* v_tile = reinterpret_cast<unsigned int*>(v_tile4);

    const int h = blockIdx.x % num_heads;
    const int qlen = q_len[seq];
    const int rows_here = min(PA_BQ, qlen - row0);     // >= 1: the caller passes row0 < q_len
    const int past = context_len[seq] - qlen;          // query i sits at position past + i
    const int kv_head = h / (num_heads / num_kv_heads);
    const i64 slot_elems = (i64)num_kv_heads * D;
    const i64 head_col = (i64)kv_head * D;
    const int* table = block_table + table_start[seq];
    const i64 first_row = (i64)q_start[seq] + row0;

    // The query tile, as packed pairs; rows past the tile's end are zeros.
    const unsigned short* q_bits = reinterpret_cast<const unsigned short*>(q);
    for (int idx = threadIdx.x; idx < PA_BQ * WORDS; idx += blockDim.x) {
        const int r = idx / WORDS, c = idx % WORDS;
        unsigned int word = 0u;
        if (r < rows_here) {
            const i64 at = (first_row + r) * q_stride + (i64)h * D + 2 * c;
            word = (unsigned int)q_bits[at] | ((unsigned int)q_bits[at + 1] << 16);
        }
        q_tile[r * STRIDE + c] = word;
    }

    const int r = threadIdx.x / PA_TPR, c = threadIdx.x % PA_TPR;
    // A row past the tile's end (a zero query) takes the last row's mask and writes nothing.
    const int pos = past + row0 + min(r, rows_here - 1);  // the last key this row sees
    const int last_key = past + row0 + rows_here - 1;      // the last key any row sees
    float m_run = NEG_INF, l_run = 0.0f;
    float acc[2 * PPT];
#pragma unroll
    for (int j = 0; j < 2 * PPT; ++j) acc[j] = 0.0f;

    for (int k0 = 0; k0 <= last_key; k0 += PA_BK) {
        __syncthreads();  // the previous tile is no longer read
        for (int idx = threadIdx.x; idx < PA_BK * CHUNKS; idx += blockDim.x) {
            const int kr = idx / CHUNKS, kc = idx % CHUNKS;
            const int t = k0 + kr;
            uint4 kraw = make_uint4(0u, 0u, 0u, 0u), vraw = make_uint4(0u, 0u, 0u, 0u);
            if (t <= last_key) {
                const i64 at = pa_slot_offset(table, t, block_size, slot_elems) + head_col + kc * 8;
                kraw = load_bf16x8(k_cache + at);
                vraw = load_bf16x8(v_cache + at);
            }
            k_tile4[(kr * STRIDE) / 4 + kc] = kraw;
            v_tile4[(kr * STRIDE) / 4 + kc] = vraw;
        }
        __syncthreads();

        // Scores of this thread's keys.
        float s[KPT];
#pragma unroll
        for (int j = 0; j < KPT; ++j) s[j] = 0.0f;
#pragma unroll 4
        for (int dp = 0; dp < WORDS; ++dp) {
            const unsigned int qw = q_tile[r * STRIDE + dp];
            const float q0 = bf16_lo(qw), q1 = bf16_hi(qw);
#pragma unroll
            for (int j = 0; j < KPT; ++j) {
                const unsigned int kw = k_tile[(c + PA_TPR * j) * STRIDE + dp];
                s[j] += q0 * bf16_lo(kw);
                s[j] += q1 * bf16_hi(kw);
            }
        }
        // Causal mask, then the online softmax update of the row (its PA_TPR threads are
        // adjacent lanes of one warp: a two-step butterfly gives all of them the same values).
        float tile_max = NEG_INF;
#pragma unroll
        for (int j = 0; j < KPT; ++j) {
            const int t = k0 + c + PA_TPR * j;
            s[j] = t <= pos ? s[j] * scale : NEG_INF;
            tile_max = fmaxf(tile_max, s[j]);
        }
        tile_max = fmaxf(tile_max, SHFL_XOR(tile_max, 1));
        tile_max = fmaxf(tile_max, SHFL_XOR(tile_max, 2));
        const float m_new = fmaxf(m_run, tile_max);
        // Key 0 is in the first tile and every row sees it, so m_new is finite; the guard
        // only keeps -inf - -inf out of the arithmetic.
        const float m_use = m_new == NEG_INF ? 0.0f : m_new;
        const float alpha = expf(m_run - m_use);
        float row_sum = 0.0f;
#pragma unroll
        for (int j = 0; j < KPT; ++j) {
            const float p = expf(s[j] - m_use);
            p_tile[r][c + PA_TPR * j] = p;
            row_sum += p;
        }
        row_sum += SHFL_XOR(row_sum, 1);
        row_sum += SHFL_XOR(row_sum, 2);
        l_run = l_run * alpha + row_sum;
        m_run = m_new;
#pragma unroll
        for (int j = 0; j < 2 * PPT; ++j) acc[j] *= alpha;
        __syncthreads();  // p_tile is complete

        for (int kk = 0; kk < PA_BK; ++kk) {
            const float p = p_tile[r][kk];
#pragma unroll
            for (int j = 0; j < PPT; ++j) {
                const unsigned int vw = v_tile[kk * STRIDE + c + PA_TPR * j];
                acc[2 * j] += p * bf16_lo(vw);
                acc[2 * j + 1] += p * bf16_hi(vw);
            }
        }
    }

    if (r < rows_here) {
        const float inv = 1.0f / l_run;
        bf16* out = o + (first_row + r) * ((i64)num_heads * D) + (i64)h * D;
#pragma unroll
        for (int j = 0; j < PPT; ++j) {
            const int d = 2 * (c + PA_TPR * j);
            out[d] = to_bf16(acc[2 * j] * inv);
            out[d + 1] = to_bf16(acc[2 * j + 1] * inv);
        }
    }
}

// The parameters of every prefill kernel (this file's and attention_mma.cu's).
#define PA_PREFILL_PARAMS                                                                        \
    const bf16 *__restrict__ q, i64 q_stride, const bf16 *__restrict__ k_cache,                  \
        const bf16 *__restrict__ v_cache, const int *__restrict__ q_start,                       \
        const int *__restrict__ q_len, const int *__restrict__ context_len,                      \
        const i64 *__restrict__ table_start, const int *__restrict__ block_table,                \
        const int *__restrict__ prefill_work, const int *__restrict__ live, bf16 *__restrict__ o, \
        int num_heads, int num_kv_heads, int block_size, float scale
#define PA_PREFILL_ARGS                                                                          \
    q, q_stride, k_cache, v_cache, q_start, q_len, context_len, table_start, block_table,        \
        prefill_work, live, o, num_heads, num_kv_heads, block_size, scale

// A work item's tile in passes of PA_BQ rows.
template <int D>
__device__ __forceinline__ void pa_prefill_tile(PA_PREFILL_PARAMS) {
    const int w = blockIdx.x / num_heads;
    if (w >= live[PA_LIVE_PREFILL]) return;  // past this step's tiles (a graph's fixed grid)
    const int seq = prefill_work[2 * w];
    const int tile0 = prefill_work[2 * w + 1] * PA_TILE;  // < q_len: the host lists no other
    for (int row0 = tile0; row0 < min(tile0 + PA_TILE, q_len[seq]); row0 += PA_BQ) {
        if (row0 > tile0) __syncthreads();  // the last pass no longer reads the shared tiles
        pa_prefill<D>(q, q_stride, k_cache, v_cache, q_start, q_len, context_len, table_start,
                      block_table, seq, row0, o, num_heads, num_kv_heads, block_size, scale);
    }
}

extern "C" __global__ void __launch_bounds__(PA_PREFILL_THREADS) paged_attention_prefill_d64(PA_PREFILL_PARAMS) {
    pdl_begin();
    pa_prefill_tile<64>(PA_PREFILL_ARGS);
}

extern "C" __global__ void __launch_bounds__(PA_PREFILL_THREADS) paged_attention_prefill_d128(PA_PREFILL_PARAMS) {
    pdl_begin();
    pa_prefill_tile<128>(PA_PREFILL_ARGS);
}

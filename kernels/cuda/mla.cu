// Multi-head latent attention, decode (DeepSeek's MLA with absorbed weights): every head of
// a query row scores the one cache row each token keeps, [latent | rotary key] (576 values
// in DeepSeek's models), and sums the latent parts of those rows as its values. Semantics
// are those of the CPU kernel (kernels/src/cpu/mla_attention.rs) for one-row sequences:
// sequence s's row q_start[s] sits at position context_len[s] - 1 and sees tokens
// 0 ..= that position.
//
// It runs from the split work list of the paged-attention planner (AttentionWork, built on
// the host over the real tokens): one block per (split item, head); each item is a
// partition of MLA_PARTITION tokens of one sequence. A sequence of one partition is
// finished here; the others leave one (max, sum, unnormalised output) record per
// (item, head) in scratch, laid out as the paged-attention split kernel lays out its
// records, and paged_attention_combine (attention.cu, head_dim = latent) merges them in an
// order fixed by the partition count. A row's result depends on its own context only.
//
// Layouts: q [rows, num_heads, width] bf16 (width = latent + rope), o [rows, num_heads,
// latent] bf16, the cache [num_blocks, block_size, width] bf16. Block ids are int in the
// table and widened to 64 bits before any multiplication by the row's width; every element
// offset is a long long, so rows past 2^31 / 576 (3,728,270) are addressed exactly.

#define MLA_LIVE_SPLIT 0     // index of the split list's live count in `live` (PA_LIVE_SPLIT)
#define MLA_PARTITION 512    // tokens per split item: PA_PARTITION, PARTITION_TOKENS on the host
#define MLA_THREADS 256      // threads of the split kernel
#define MLA_MAX_WIDTH 1024   // the widest cache row (latent + rope) the kernel holds

extern "C" __global__ void __launch_bounds__(MLA_THREADS) mla_decode_split(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ q_start, const int* __restrict__ context_len,
    const i64* __restrict__ table_start, const int* __restrict__ block_table,
    const int* __restrict__ split_work, int num_work, const int* __restrict__ live,
    float* __restrict__ scratch, bf16* __restrict__ o, int num_heads, int width, int latent,
    int block_size, float scale) {
    pdl_begin();
    __shared__ float logits[MLA_PARTITION];
    __shared__ i64 slot_at[MLA_PARTITION];  // element offset of each token's row
    __shared__ float qs[MLA_MAX_WIDTH];
    __shared__ float red[32];
    const int h = blockIdx.x % num_heads;
    const int w = blockIdx.x / num_heads;
    if (w >= live[MLA_LIVE_SPLIT]) return;  // past this step's items (a graph's fixed grid)
    const int seq = split_work[2 * w];
    const int first = split_work[2 * w + 1] * MLA_PARTITION;
    const int ctx = context_len[seq];
    const int n = min(MLA_PARTITION, ctx - first);  // >= 1: the host lists partitions < ctx
    const int* table = block_table + table_start[seq];
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int t = first + i;
        const i64 block = (i64)table[t / block_size];
        slot_at[i] = (block * block_size + (t % block_size)) * (i64)width;
    }
    const i64 row = (i64)q_start[seq];
    const bf16* qh = q + (row * num_heads + h) * (i64)width;
    for (int e = threadIdx.x; e < width; e += blockDim.x) qs[e] = to_f32(qh[e]);
    __syncthreads();

    // Scores: a warp per token, its lanes striding over the row, summed by a fixed butterfly.
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    for (int i = warp; i < n; i += warps) {
        const bf16* k = cache + slot_at[i];
        float dot = 0.0f;
        for (int e = lane; e < width; e += WARP_SIZE) dot += qs[e] * to_f32(k[e]);
        dot = warp_sum(dot);
        if (lane == 0) logits[i] = dot * scale;
    }
    __syncthreads();

    float m = NEG_INF;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, logits[i]);
    m = block_max(m, red);
    float t = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float p = expf(logits[i] - m);
        logits[i] = p;
        t += p;
    }
    const float sum = block_sum(t, red);  // its syncs also publish the weights

    // Values: thread d sums element d of the tokens' latents in token order.
    const bool alone = ctx <= MLA_PARTITION;
    const i64 records = (i64)num_work * num_heads;
    const i64 rec = (i64)w * num_heads + h;
    for (int d = threadIdx.x; d < latent; d += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < n; ++i) acc += logits[i] * to_f32(cache[slot_at[i] + d]);
        if (alone) {
            // The combine's arithmetic for one record: the same bits.
            o[(row * num_heads + h) * (i64)latent + d] = to_bf16((0.0f + acc) * (1.0f / sum));
        } else {
            scratch[rec * latent + d] = acc;
        }
    }
    if (alone || threadIdx.x != 0) return;
    scratch[records * latent + rec] = m;
    scratch[records * latent + records + rec] = sum;
}

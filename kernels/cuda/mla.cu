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
    __shared__ float parts[MLA_THREADS * 8];  // the value groups' sums: groups * latent
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

    // Scores: a warp per token, lane l taking the 8-element pieces l, l + 32, ... of the
    // row (16-byte loads), summed by a fixed butterfly.
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    const int pieces = width / 8;
    for (int i = warp; i < n; i += warps) {
        const bf16* k = cache + slot_at[i];
        float dot = 0.0f;
        for (int p = lane; p < pieces; p += WARP_SIZE) {
            float v[8];
            unpack_bf16x8(load_bf16x8(k + 8 * p), v);
#pragma unroll
            for (int j = 0; j < 8; ++j) dot += qs[8 * p + j] * v[j];
        }
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

    // Values: the block's threads in groups of latent / 8, thread t of a group taking the
    // latent's elements 8t .. 8t + 7 (a 16-byte load a token) over the group's tokens
    // g, g + groups, ... in order; then the groups' sums are added in group order. The
    // order depends on the partition's length alone.
    const int per_group = latent / 8, groups = blockDim.x / per_group;
    const int g = threadIdx.x / per_group, t8 = 8 * (threadIdx.x % per_group);
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (g < groups) {
        for (int i = g; i < n; i += groups) {
            float v[8];
            unpack_bf16x8(load_bf16x8(cache + slot_at[i] + t8), v);
            const float p = logits[i];
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] += p * v[j];
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) parts[g * latent + t8 + j] = acc[j];
    }
    __syncthreads();
    const bool alone = ctx <= MLA_PARTITION;
    const i64 records = (i64)num_work * num_heads;
    const i64 rec = (i64)w * num_heads + h;
    for (int d = threadIdx.x; d < latent; d += blockDim.x) {
        float total = 0.0f;
        for (int q = 0; q < groups; ++q) total += parts[q * latent + d];
        if (alone) {
            // The combine's arithmetic for one record: the same bits.
            o[(row * num_heads + h) * (i64)latent + d] = to_bf16((0.0f + total) * (1.0f / sum));
        } else {
            scratch[rec * latent + d] = total;
        }
    }
    if (alone || threadIdx.x != 0) return;
    scratch[records * latent + rec] = m;
    scratch[records * latent + records + rec] = sum;
}

// The rows a step of latent attention writes and reads, from the layer's projections: for
// each row r (at position positions[r]) and query head h, the rotary part of the head's
// query q[r, h, nope ..] rotated into q_lat[r, h, latent ..] (the absorbed part,
// q_lat[r, h, .. latent], is the product ahead's); and the row's cache row at slot
// slot_mapping[r]: its latent kv_a[r, .. latent] through the RMSNorm of weight kv_norm,
// then its rotary key kv_a[r, latent ..] rotated. cos_sin holds, per position, rope/2
// cosines then rope/2 sines; rotary == 2 pairs element 2i with 2i+1, rotary == 1 element i
// with i + rope/2. A negative slot, or one past the pool, is not written.
//
// One block per (row, head) and one more per row for the cache row: blocks
// r * (num_heads + 1) + h. The latent's sum of squares is reduced in an order fixed by the
// block size, so a row's cache row does not depend on the batch.

#define MLA_PREPARE_THREADS 128  // threads of mla_prepare

extern "C" __global__ void __launch_bounds__(MLA_PREPARE_THREADS) mla_prepare(
    const bf16* __restrict__ q, i64 q_stride, int nope, const bf16* __restrict__ kv_a,
    i64 kv_stride, const bf16* __restrict__ kv_norm, float eps, const int* __restrict__ positions,
    const float* __restrict__ cos_sin, int rotary, const i64* __restrict__ slot_mapping,
    int rows, i64 num_slots, bf16* __restrict__ q_lat, bf16* __restrict__ cache, int num_heads,
    int latent, int rope) {
    pdl_begin();
    __shared__ float red[32];
    const i64 row = blockIdx.x / (num_heads + 1);
    const int h = blockIdx.x % (num_heads + 1);
    if (row >= rows) return;
    const int half = rope / 2;
    const float* table = cos_sin + (i64)positions[row] * rope;
    const i64 width = (i64)latent + rope;
    if (h < num_heads) {
        const bf16* x = q + row * q_stride + (i64)h * (nope + rope) + nope;
        bf16* out = q_lat + (row * num_heads + h) * width + latent;
        for (int e = threadIdx.x; e < rope; e += blockDim.x) out[e] = rope_element(x, e, half, rotary, table);
        return;
    }
    const i64 slot = slot_mapping[row];
    if (slot < 0 || slot >= num_slots) return;
    const bf16* c = kv_a + row * kv_stride;
    float sq = 0.0f;
    for (int i = threadIdx.x; i < latent; i += blockDim.x) {
        const float v = to_f32(c[i]);
        sq += v * v;
    }
    const float inv = rsqrtf(block_sum(sq, red) / latent + eps);
    bf16* dst = cache + slot * width;
    for (int i = threadIdx.x; i < latent; i += blockDim.x)
        dst[i] = to_bf16(to_f32(c[i]) * inv * to_f32(kv_norm[i]));
    for (int e = threadIdx.x; e < rope; e += blockDim.x)
        dst[latent + e] = rope_element(c + latent, e, half, rotary, table);
}

// Writing this step's keys and values into the paged KV cache, by slot mapping, with the
// rotary embedding of q and k fused in (one launch instead of two).
//
// The rows are the fused qkv activation (bf16, row-major [rows, row_stride]): q_heads query
// heads from column 0, then kv_heads key heads, then kv_heads value heads, head_dim each.
// One layer's cache is [num_blocks, block_size, kv_heads, head_dim], so slot s (= block *
// block_size + offset in block) starts at element s * kv_heads * head_dim. Every offset is
// a 64-bit product of widened operands. A negative slot marks a row whose K and V are not
// written; a slot past the pool (num_slots) is skipped as well, so a bad plan can never
// write outside the cache (the host refuses such plans before launching, this is the
// second line of defence).
//
// Rotary (rotary != 0): every query head is rotated in place and every key head is rotated
// on its way to the cache (qkv's own keys are left as they were: nothing reads them), by
// the angle of the row's position. cos_sin holds, per position, head_dim/2 cosines then
// head_dim/2 sines (f32). rotary == 2 pairs element 2i with 2i+1 (interleaved); rotary == 1
// pairs element i with i + head_dim/2. With rotary == 0, positions and cos_sin are not read.

#define KV_WRITE_THREADS 64  // threads per (row, head) block

// One block per (row, head): blocks 0 .. q_heads - 1 of a row rotate its query heads (and
// do nothing without rotary), the next kv_heads write one KV head each, so a one-row decode
// step still spreads over q_heads + kv_heads blocks.
extern "C" __global__ void __launch_bounds__(KV_WRITE_THREADS) kv_write_bf16(
    bf16* __restrict__ qkv, i64 row_stride, int q_heads, int kv_heads, int head_dim,
    const int* __restrict__ positions, const float* __restrict__ cos_sin, int rotary,
    const i64* __restrict__ slot_mapping, int rows, i64 num_slots, bf16* __restrict__ k_cache,
    bf16* __restrict__ v_cache) {
    pdl_begin();
    const int heads = q_heads + kv_heads;
    const i64 row = blockIdx.x / heads;
    const int head = blockIdx.x % heads;
    if (row >= rows) return;
    const int half = head_dim / 2;
    bf16* q = qkv + row * row_stride;
    const float* table = rotary ? cos_sin + (i64)positions[row] * head_dim : nullptr;
    if (head < q_heads) {
        if (!rotary) return;
        bf16* x = q + (i64)head * head_dim;
        // Each thread rotates whole pairs, so it reads both elements before writing them.
        for (int p = threadIdx.x; p < half; p += blockDim.x) {
            const int a = rotary == 2 ? 2 * p : p, b = rotary == 2 ? 2 * p + 1 : p + half;
            const bf16 ya = rope_element(x, a, half, rotary, table);
            const bf16 yb = rope_element(x, b, half, rotary, table);
            x[a] = ya;
            x[b] = yb;
        }
        return;
    }
    const i64 slot = slot_mapping[row];
    if (slot < 0 || slot >= num_slots) return;
    const i64 kv = head - q_heads;
    const bf16* k = q + ((i64)q_heads + kv) * head_dim;
    const bf16* v = q + ((i64)q_heads + kv_heads + kv) * head_dim;
    const i64 dst = (slot * kv_heads + kv) * head_dim;
    if (rotary) {
        for (int e = threadIdx.x; e < head_dim; e += blockDim.x)
            k_cache[dst + e] = rope_element(k, e, half, rotary, table);
    } else {
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) k_cache[dst + i] = k[i];
    }
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v_cache[dst + i] = v[i];
}

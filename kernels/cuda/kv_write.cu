// Writing this step's keys and values into the paged KV cache, by slot mapping.
//
// The source rows live inside the fused qkv activation (bf16, row-major [rows, row_stride]):
// K starts at column k_col, V at column v_col, each `width` = num_kv_heads * head_dim wide.
// One layer's cache is [num_blocks, block_size, num_kv_heads, head_dim], so slot s (= block *
// block_size + offset in block) starts at element s * width. Every offset is a 64-bit
// product of widened operands. A negative slot marks a row to skip; a slot past the pool
// (num_slots) is skipped as well, so a bad plan can never write outside the cache (the host
// refuses such plans before launching, this is the second line of defence).

// One block per row; the threads copy the row's K and V, `width` elements each.
extern "C" __global__ void __launch_bounds__(256) kv_write_bf16(
    const bf16* __restrict__ qkv, i64 row_stride, i64 k_col, i64 v_col,
    const i64* __restrict__ slot_mapping, int rows, int width, i64 num_slots,
    bf16* __restrict__ k_cache, bf16* __restrict__ v_cache) {
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const i64 slot = slot_mapping[row];
    if (slot < 0 || slot >= num_slots) return;
    const bf16* src = qkv + row * row_stride;
    const i64 dst = slot * (i64)width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        k_cache[dst + i] = src[k_col + i];
        v_cache[dst + i] = src[v_col + i];
    }
}

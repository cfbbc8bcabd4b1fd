// Whole KV blocks copied between the paged pool and a staging buffer, for the host tier
// below a GPU pool (peregrine-actors' backend/gpu_host_blocks.rs). Entry e of `blocks` is
// pool block blocks[e]; its copy in the staging buffer starts at element
// e * gridDim.x * block_elems and holds the block's part of every cache in the order of
// `parts` (each a layer's K or V cache, by its base address), one after another. One
// thread block per (part, entry), 16-byte pieces (block_elems is a multiple of 8), every
// offset a 64-bit product. An entry whose id is not below num_blocks is skipped, so a bad
// list can never reach outside the pool (the host refuses one before launching: this is
// the second line of defence).

#define KV_BLOCKS_THREADS 256

// The 16-byte pieces of entry `entry`'s part `part`: in the pool and in the staging buffer.
__device__ __forceinline__ bool kv_block_part(const unsigned long long* parts, i64 block_elems,
                                              const unsigned* blocks, i64 num_blocks, i64 entry,
                                              int part, bf16* staging, uint4** pool_piece,
                                              uint4** staged_piece) {
    const unsigned block = blocks[entry];
    if ((i64)block >= num_blocks) return false;
    *pool_piece = reinterpret_cast<uint4*>(reinterpret_cast<bf16*>(parts[part]) + (i64)block * block_elems);
    *staged_piece = reinterpret_cast<uint4*>(staging + (entry * gridDim.x + part) * block_elems);
    return true;
}

extern "C" __global__ void __launch_bounds__(KV_BLOCKS_THREADS) kv_blocks_gather(
    const unsigned long long* __restrict__ parts, i64 block_elems, const unsigned* __restrict__ blocks,
    i64 num_blocks, bf16* __restrict__ staging) {
    pdl_begin();
    uint4 *pool, *staged;
    if (!kv_block_part(parts, block_elems, blocks, num_blocks, blockIdx.y, blockIdx.x, staging, &pool, &staged))
        return;
    for (i64 i = threadIdx.x; i < block_elems / 8; i += blockDim.x) staged[i] = pool[i];
}

extern "C" __global__ void __launch_bounds__(KV_BLOCKS_THREADS) kv_blocks_scatter(
    const unsigned long long* __restrict__ parts, i64 block_elems, const unsigned* __restrict__ blocks,
    i64 num_blocks, bf16* __restrict__ staging) {
    pdl_begin();
    uint4 *pool, *staged;
    if (!kv_block_part(parts, block_elems, blocks, num_blocks, blockIdx.y, blockIdx.x, staging, &pool, &staged))
        return;
    for (i64 i = threadIdx.x; i < block_elems / 8; i += blockDim.x) pool[i] = staged[i];
}

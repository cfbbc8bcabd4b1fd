// Prefill attention on tensor cores (sm_80 and up): the contract of paged_attention_prefill_*
// (attention.cu, which this file follows in the same module: same parameters, work list,
// tiles of PA_TILE query rows, stores), with the products of mma.sync.m16n8k16 (bf16 in,
// f32 sums), as flash attention 2 computes them.
//
// One block per (query tile, head), PA_MMA_WARPS warps, warp w taking rows 16w .. 16w + 15
// of the tile; blocks take the work list from its end, so a prompt's longest tiles start
// first. The block walks key tiles of PA_MMA_BK keys from key 0 in order: each tile's slot
// offsets are looked up once (one thread a key, into shared memory), then its K and V rows
// are copied into shared memory (cp.async, zeros past the tile's last key), the next K
// tile while this one's values are summed. A warp keeps its query rows as mma fragments in
// registers, computes its 16 x PA_MMA_BK scores with ldmatrix'd K, masks them where the
// tile reaches past its first row, updates each row's running max (of raw scores) and sum
// (exponents in log2 units, the scale folded into one fma; the four lanes holding a row
// combine by a two-step butterfly), rounds the probabilities to bf16 as the A fragments of
// the value product (the score fragments' layout is theirs) and adds P V into its 16 x D
// output in registers. Each row's reduction order is fixed by PA_MMA_BK alone: a
// product's sums for one row do not depend on the other rows, a key tile wholly past a
// row's position adds exactly nothing (it is skipped where the whole warp is past it), so
// a row's result depends on its own query and keys only, never on the batch or on how the
// prompt was cut.
//
// Requires 16-byte aligned q rows (q and q_stride * 2 bytes multiples of 16; the launcher
// checks). Shared rows are padded by PA_MMA_PAD bf16 so that ldmatrix reads them without
// bank conflicts. Where tensor-core products are missing (before sm_80, HIP) the kernels
// trap; the launcher does not choose them there.

#define PA_MMA_BK 64        // keys per tile
#define PA_MMA_WARPS 4      // warps of a block: PA_TILE / 16
#define PA_MMA_PAD 8        // bf16 after each shared row
#define PA_MMA_THREADS 128  // PA_MMA_WARPS * WARP_SIZE

#ifdef TENSOR_CORES
// The element offsets (slot and KV head) of keys first .. first + PA_MMA_BK - 1 into
// shared `slots`, -1 past token `last`: one thread a key.
__device__ __forceinline__ void pa_key_slots(i64* slots, const int* table, int first, int last,
                                             int block_size, i64 slot_elems, i64 head_col) {
    const int r = threadIdx.x;
    if (r < PA_MMA_BK) {
        const int t = first + r;
        slots[r] = t <= last ? pa_slot_offset(table, t, block_size, slot_elems) + head_col : -1;
    }
}

// Copies a tile of PA_MMA_BK keys (or values) into shared `dst`, rows of D + PA_MMA_PAD bf16:
// row r from `cache` at offset slots[r], zeros where that is -1.
template <int D>
__device__ __forceinline__ void pa_load_keys(bf16* dst, const bf16* __restrict__ cache,
                                             const i64* slots) {
    constexpr int CHUNKS = D / 8;
    constexpr int ROW = D + PA_MMA_PAD;
#pragma unroll
    for (int idx = threadIdx.x; idx < PA_MMA_BK * CHUNKS; idx += PA_MMA_THREADS) {
        const int r = idx / CHUNKS, c = idx % CHUNKS;
        const i64 at = slots[r];
        copy16_async(shared_addr(dst + r * ROW + c * 8), at < 0 ? cache : cache + at + c * 8, at >= 0);
    }
}
#endif

template <int D>
__device__ __forceinline__ void pa_prefill_mma(PA_PREFILL_PARAMS) {
#ifdef TENSOR_CORES
    constexpr int ROW = D + PA_MMA_PAD;     // a shared row, in bf16
    constexpr int CHUNKS = D / 8;           // 16-byte chunks of a row
    constexpr int DEPTH = D / 16;           // depth steps of the score product
    constexpr int KEY_TILES = PA_MMA_BK / 8;  // score fragments of 8 keys
    constexpr int DIM_TILES = D / 8;          // output fragments of 8 dims
    // The K tile, then the V tile; the query tile passes through the V tile's place first.
    __shared__ __align__(16) bf16 tiles[2 * PA_MMA_BK * ROW];
    __shared__ i64 slots[PA_MMA_BK];  // the offsets of the next tile's keys
    bf16* const k_tile = tiles;
    bf16* const v_tile = tiles + PA_MMA_BK * ROW;

    const int h = blockIdx.x % num_heads;
    if (blockIdx.x / num_heads >= live[PA_LIVE_PREFILL]) return;  // past this step's tiles
    // The last tiles of the list first: a prompt's later tiles see more keys, and run
    // before its shorter ones rather than alone at the end of the grid.
    const int w = live[PA_LIVE_PREFILL] - 1 - blockIdx.x / num_heads;
    const int seq = prefill_work[2 * w];
    const int row0 = prefill_work[2 * w + 1] * PA_TILE;  // first query of the tile
    const int qlen = q_len[seq];
    const int rows_here = min(PA_TILE, qlen - row0);     // >= 1: the host lists tiles < q_len
    const int past = context_len[seq] - qlen;            // query i sits at position past + i
    const int kv_head = h / (num_heads / num_kv_heads);
    const i64 slot_elems = (i64)num_kv_heads * D;
    const i64 head_col = (i64)kv_head * D;
    const int* table = block_table + table_start[seq];
    const i64 first_row = (i64)q_start[seq] + row0;
    const int last_key = past + row0 + rows_here - 1;  // the last key any row sees

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int g = lane / 4, quad = lane % 4;  // the thread's fragment row and column pair
    const int warp_row = warp * 16;
    const bool busy = warp_row < rows_here;  // the warp has rows of the tile
    // The last key each of the thread's two rows sees (g and g + 8 of the warp); a row past
    // the tile's end (a zero query) takes the last row's mask and writes nothing.
    const int pos_lo = past + row0 + min(warp_row + g, rows_here - 1);
    const int pos_hi = past + row0 + min(warp_row + g + 8, rows_here - 1);
    const int warp_last = past + row0 + min(warp_row + 15, rows_here - 1);
    const int warp_first = past + row0 + min(warp_row, rows_here - 1);  // its first row's last key

    // The query tile (zeros past its end) into the V tile's place, K tile 0 beside it.
    for (int idx = threadIdx.x; idx < PA_TILE * CHUNKS; idx += PA_MMA_THREADS) {
        const int r = idx / CHUNKS, c = idx % CHUNKS;
        const bool valid = r < rows_here;
        const bf16* src = valid ? q + (first_row + r) * q_stride + (i64)h * D + c * 8 : q;
        copy16_async(shared_addr(v_tile + r * ROW + c * 8), src, valid);
    }
    pa_key_slots(slots, table, 0, last_key, block_size, slot_elems, head_col);
    __syncthreads();
    pa_load_keys<D>(k_tile, k_cache, slots);
    copy_async_commit();
    copy_async_wait<0>();
    __syncthreads();
    unsigned qf[DEPTH][4];  // the warp's query rows as A fragments, by depth step
#pragma unroll
    for (int kk = 0; kk < DEPTH; ++kk) {
        ldmatrix_x4(shared_addr(v_tile + (warp_row + lane % 16) * ROW + kk * 16 + (lane / 16) * 8), qf[kk]);
    }
    __syncthreads();  // the query tile is in registers: its place takes V tile 0
    pa_load_keys<D>(v_tile, v_cache, slots);
    copy_async_commit();
    __syncthreads();  // every thread has read the offsets of tile 0

    const float scale_log2 = scale * 1.4426950408889634f;  // scores to log2 units
    float m_lo = NEG_INF, m_hi = NEG_INF;  // running max of rows g and g + 8 (raw scores)
    float l_lo = 0.0f, l_hi = 0.0f;        // this thread's share of the running sums
    float acc[DIM_TILES][4];
#pragma unroll
    for (int n = 0; n < DIM_TILES; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    for (int k0 = 0; k0 <= last_key; k0 += PA_MMA_BK) {
        // Here K tile k0 is in shared memory and V tile k0 on its way; every thread has
        // issued V tile k0's copies, so the next tile's offsets may take their place.
        const bool active = busy && k0 <= warp_last;  // warp-uniform
        const bool more = k0 + PA_MMA_BK <= last_key;
        if (more) pa_key_slots(slots, table, k0 + PA_MMA_BK, last_key, block_size, slot_elems, head_col);
        float s[KEY_TILES][4];
#pragma unroll
        for (int n = 0; n < KEY_TILES; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        if (active) {
#pragma unroll
            for (int kk = 0; kk < DEPTH; ++kk) {
#pragma unroll
                for (int n = 0; n < KEY_TILES; n += 2) {
                    // Matrices: keys n*8.. at dims kk*16, +8; keys n*8+8.. at the same dims.
                    const int m = lane / 8;
                    const int key = n * 8 + lane % 8 + (m / 2) * 8;
                    unsigned b[4];
                    ldmatrix_x4(shared_addr(k_tile + key * ROW + kk * 16 + (m % 2) * 8), b);
                    mma_bf16_16816(s[n], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[0], b[1]);
                    mma_bf16_16816(s[n + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp has read the K tile: the next one may come in
        if (more) pa_load_keys<D>(k_tile, k_cache, slots);
        copy_async_commit();
        if (active) {
            // The causal mask only where the tile reaches past the warp's first row.
            const bool mask = k0 + PA_MMA_BK - 1 > warp_first;
            flash_tile_softmax(s, acc, mask, k0, quad, pos_lo, pos_hi, scale_log2, m_lo, m_hi, l_lo, l_hi);
        }
        copy_async_wait<1>();  // V tile k0 is in (the next K tile may still be on its way)
        __syncthreads();
        if (active) {
#pragma unroll
            for (int kk = 0; kk < PA_MMA_BK / 16; ++kk) {
                // The probabilities of keys kk*16 .. kk*16 + 15 as an A fragment.
                const unsigned a0 = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
                const unsigned a1 = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
                const unsigned a2 = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                const unsigned a3 = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int n = 0; n < DIM_TILES; n += 2) {
                    // Matrices (transposed): keys kk*16.., +8 at dims n*8; the same at n*8+8.
                    const int m = lane / 8;
                    const int key = kk * 16 + lane % 8 + (m % 2) * 8;
                    unsigned b[4];
                    ldmatrix_x4_t(shared_addr(v_tile + key * ROW + n * 8 + (m / 2) * 8), b);
                    mma_bf16_16816(acc[n], a0, a1, a2, a3, b[0], b[1]);
                    mma_bf16_16816(acc[n + 1], a0, a1, a2, a3, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp has read the V tile
        if (more) pa_load_keys<D>(v_tile, v_cache, slots);
        copy_async_commit();
        copy_async_wait<1>();  // the next K tile is in
        __syncthreads();
    }

    if (busy) {
        l_lo += SHFL_XOR(l_lo, 1);
        l_lo += SHFL_XOR(l_lo, 2);
        l_hi += SHFL_XOR(l_hi, 1);
        l_hi += SHFL_XOR(l_hi, 2);
        const float inv_lo = 1.0f / l_lo, inv_hi = 1.0f / l_hi;
        const int r_lo = warp_row + g, r_hi = warp_row + g + 8;
        const i64 width = (i64)num_heads * D;
        unsigned* out_lo = reinterpret_cast<unsigned*>(o + (first_row + r_lo) * width + (i64)h * D);
        unsigned* out_hi = reinterpret_cast<unsigned*>(o + (first_row + r_hi) * width + (i64)h * D);
#pragma unroll
        for (int n = 0; n < DIM_TILES; ++n) {
            const int word = n * 4 + quad;  // dims 8n + 2 quad, + 1
            if (r_lo < rows_here) out_lo[word] = pack_bf16x2(acc[n][0] * inv_lo, acc[n][1] * inv_lo);
            if (r_hi < rows_here) out_hi[word] = pack_bf16x2(acc[n][2] * inv_hi, acc[n][3] * inv_hi);
        }
    }
#else
    (void)q, (void)q_stride, (void)k_cache, (void)v_cache, (void)q_start, (void)q_len;
    (void)context_len, (void)table_start, (void)block_table, (void)prefill_work, (void)live;
    (void)o, (void)num_heads, (void)num_kv_heads, (void)block_size, (void)scale;
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(PA_MMA_THREADS) paged_attention_prefill_mma_d64(PA_PREFILL_PARAMS) {
    pdl_begin();
    pa_prefill_mma<64>(PA_PREFILL_ARGS);
}

extern "C" __global__ void __launch_bounds__(PA_MMA_THREADS) paged_attention_prefill_mma_d128(PA_PREFILL_PARAMS) {
    pdl_begin();
    pa_prefill_mma<128>(PA_PREFILL_ARGS);
}

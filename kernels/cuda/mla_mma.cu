// Latent attention of prefill rows on tensor cores (sm_80 and up): the rows of sequences
// of more than one query (prefill, chunked prefill) on the paged-attention planner's
// prefill work list, each item MLA_TILE tokens of one sequence. The semantics are those of
// the CPU kernel (kernels/src/cpu/mla_attention.rs): a query at position p sees the cache
// rows of tokens 0 ..= p, scores them against [latent | rotary key] and sums their latent
// parts.
//
// Every head reads the same cache row, so a query row here is a (token, head) pair: the
// pairs of a sequence lie one after another in q ([rows, num_heads, width]) and in o
// ([rows, num_heads, latent]), and a tile of MLA_MMA_ROWS consecutive pairs (several tokens'
// heads, or some heads of one token) shares every key tile it reads. One block per
// (work item, tile of pairs): the item's pairs are cut into tiles of MLA_MMA_ROWS, at most
// num_heads of them, so the launcher's grid of items x num_heads blocks covers them (the
// blocks past an item's last tile return at once). Blocks take the work list from its end,
// so a prompt's later tiles, which see more keys, start first.
//
// A block of 4 x SLICES warps: warp w takes the 16 pairs 16 (w % 4) .. of the tile and the
// output dims SLICE * (w / 4) .. of the latent (SLICE = 256 at most: 128 sums a thread).
// The query tile stays in shared memory; key tiles of MLA_MMA_BK cache rows are copied in
// (cp.async, the next while this one is used), rows padded to whole 16-element steps with
// zeros. For each key tile the warps of a pair group compute its scores between them (each
// MLA_MMA_BK / SLICES keys, the whole row's depth) into shared memory; then every warp
// reads its rows' scores for the whole tile, masks them causally, updates the rows' running
// max and sum (log2 units, as attention_mma.cu) and adds P V for its slice of dims, V being
// the first `latent` elements of the same key rows. The warps of a group compute the same
// softmax from the same scores, so their slices agree. Each row's sums run over key tiles
// from key 0 in order and over the depth in order: a row's result depends on its own query
// and keys only, not on the other pairs of its tile or how the prompt was cut.
//
// Block ids are int in the table and widened to 64 bits before any multiplication by the
// row width; every element offset is a long long. Where tensor-core products are missing
// (before sm_80, HIP) the kernels trap; the launcher does not choose them there.

#define MLA_TILE 64        // tokens of a prefill work item: PA_TILE of attention.cu
#define MLA_LIVE_PREFILL 2 // index of the prefill list's live count in `live` (PA_LIVE_PREFILL)
#define MLA_MMA_ROWS 64    // (token, head) pairs of a block
#define MLA_MMA_BK 32      // keys per tile
#define MLA_MMA_PAD 8      // bf16 after each shared row

// The geometry of the kernel for cache rows of WIDTH elements, the first LATENT the value.
template <int LATENT, int WIDTH>
struct MlaMma {
    static constexpr int SLICE = LATENT < 256 ? LATENT : 256;  // output dims of a warp
    static constexpr int SLICES = LATENT / SLICE;
    static constexpr int THREADS = 4 * SLICES * 32;  // 32-lane warps (CUDA's; HIP traps)
    static constexpr int KEYS = MLA_MMA_BK / SLICES;   // keys a warp scores per tile
    static constexpr int DEPTH = (WIDTH + 15) / 16;    // depth steps of the score product
    static constexpr int ROW = DEPTH * 16 + MLA_MMA_PAD;  // a shared row, in bf16
    static constexpr int CHUNKS = WIDTH / 8;           // 16-byte chunks of a cache row
    static constexpr int SHARED_CHUNKS = DEPTH * 2;    // of a shared row (zeros past CHUNKS)
    static constexpr int S_ROW = MLA_MMA_BK + 4;       // floats of a row of scores
    static_assert(LATENT % SLICE == 0 && SLICE % 16 == 0 && WIDTH % 8 == 0, "shape");
    static_assert(KEYS % 16 == 0, "a warp scores whole pairs of 8-key fragments");
};

#define MLA_PREFILL_PARAMS                                                                      \
    const bf16 *__restrict__ q, const bf16 *__restrict__ cache, const int *__restrict__ q_start, \
        const int *__restrict__ q_len, const int *__restrict__ context_len,                     \
        const i64 *__restrict__ table_start, const int *__restrict__ block_table,               \
        const int *__restrict__ prefill_work, const int *__restrict__ live,                     \
        bf16 *__restrict__ o, int num_heads, int block_size, float scale

#ifdef TENSOR_CORES
// Each key's element offset (its cache row) for the tile of keys first .., -1 past `last`.
__device__ __forceinline__ void mla_key_slots(i64* slots, const int* table, int first, int last,
                                              int block_size, int width) {
    const int r = threadIdx.x;
    if (r < MLA_MMA_BK) {
        const int t = first + r;
        slots[r] = t <= last ? ((i64)table[t / block_size] * block_size + t % block_size) * width : -1;
    }
}

// Copies the key rows of `slots` into the shared tile `dst` (zeros for -1 and past WIDTH).
template <int LATENT, int WIDTH>
__device__ __forceinline__ void mla_load_keys(bf16* dst, const bf16* __restrict__ cache,
                                              const i64* slots) {
    using G = MlaMma<LATENT, WIDTH>;
    for (int idx = threadIdx.x; idx < MLA_MMA_BK * G::SHARED_CHUNKS; idx += G::THREADS) {
        const int r = idx / G::SHARED_CHUNKS, c = idx % G::SHARED_CHUNKS;
        const i64 at = slots[r];
        const bool valid = at >= 0 && c < G::CHUNKS;
        copy16_async(shared_addr(dst + r * G::ROW + c * 8), valid ? cache + at + c * 8 : cache, valid);
    }
}
#endif

template <int LATENT, int WIDTH>
__device__ __forceinline__ void mla_prefill_mma(MLA_PREFILL_PARAMS) {
#ifdef TENSOR_CORES
    using G = MlaMma<LATENT, WIDTH>;
    constexpr int ROW = G::ROW;
    constexpr int SCORE_TILES = MLA_MMA_BK / 8;  // 8-key fragments of a tile
    constexpr int DIM_TILES = G::SLICE / 8;       // 8-dim fragments of a warp's output
    // Dynamic shared memory (the launcher's mma_geometry): the query tile, two key tiles,
    // the scores, the key offsets of two tiles.
    extern __shared__ __align__(16) unsigned char mla_shared[];
    bf16* const q_tile = reinterpret_cast<bf16*>(mla_shared);
    bf16* const k_tiles = q_tile + MLA_MMA_ROWS * ROW;
    float* const scores = reinterpret_cast<float*>(k_tiles + 2 * MLA_MMA_BK * ROW);
    i64* const slots = reinterpret_cast<i64*>(scores + MLA_MMA_ROWS * G::S_ROW);

    const int item = blockIdx.x / num_heads;
    if (item >= live[MLA_LIVE_PREFILL]) return;  // past this step's items
    const int w = live[MLA_LIVE_PREFILL] - 1 - item;
    const int seq = prefill_work[2 * w];
    const int tok0 = prefill_work[2 * w + 1] * MLA_TILE;  // the item's first query token
    const int qlen = q_len[seq];
    const int pairs = min(MLA_TILE, qlen - tok0) * num_heads;
    const int pair0 = (blockIdx.x % num_heads) * MLA_MMA_ROWS;  // the tile's first pair
    if (pair0 >= pairs) return;
    const int rows_here = min(MLA_MMA_ROWS, pairs - pair0);
    const int past = context_len[seq] - qlen;  // query token i sits at position past + i
    const int* table = block_table + table_start[seq];
    const i64 first_row = ((i64)q_start[seq] + tok0) * num_heads + pair0;  // of q and o
    // The position of the tile's row r (rows past the tile's end take its last row's).
    const int at0 = past + tok0;
    auto position = [&](int r) { return at0 + (pair0 + min(r, rows_here - 1)) / num_heads; };
    const int last_key = position(rows_here - 1);

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int g = lane / 4, quad = lane % 4;  // the thread's fragment row and column pair
    const int warp_row = (warp % 4) * 16;     // the warp's first pair of the tile
    const int slice = warp / 4;               // its slice of the latent
    const bool busy = warp_row < rows_here;
    const int pos_lo = position(warp_row + g), pos_hi = position(warp_row + g + 8);
    const int warp_first = position(warp_row), warp_last = position(warp_row + 15);

    // The query tile (zeros past its rows and its width) and key tile 0.
    for (int idx = threadIdx.x; idx < MLA_MMA_ROWS * G::SHARED_CHUNKS; idx += G::THREADS) {
        const int r = idx / G::SHARED_CHUNKS, c = idx % G::SHARED_CHUNKS;
        const bool valid = r < rows_here && c < G::CHUNKS;
        const bf16* src = valid ? q + (first_row + r) * WIDTH + c * 8 : q;
        copy16_async(shared_addr(q_tile + r * ROW + c * 8), src, valid);
    }
    mla_key_slots(slots, table, 0, last_key, block_size, WIDTH);
    __syncthreads();
    mla_load_keys<LATENT, WIDTH>(k_tiles, cache, slots);
    copy_async_commit();

    const float scale_log2 = scale * 1.4426950408889634f;  // scores to log2 units
    float m_lo = NEG_INF, m_hi = NEG_INF;  // running max of rows g and g + 8 (raw scores)
    float l_lo = 0.0f, l_hi = 0.0f;        // this thread's share of the running sums
    float acc[DIM_TILES][4];
#pragma unroll
    for (int n = 0; n < DIM_TILES; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    for (int k0 = 0, tile = 0; k0 <= last_key; k0 += MLA_MMA_BK, ++tile) {
        // Key tile `tile` is in buffer `buf` or on its way; the other buffer and its
        // offsets were last read before the previous iteration's closing barrier.
        const int buf = tile & 1;
        const bf16* const k_tile = k_tiles + buf * MLA_MMA_BK * ROW;
        i64* const next_slots = slots + (buf ^ 1) * MLA_MMA_BK;
        const bool more = k0 + MLA_MMA_BK <= last_key;
        if (more) mla_key_slots(next_slots, table, k0 + MLA_MMA_BK, last_key, block_size, WIDTH);
        __syncthreads();
        if (more) mla_load_keys<LATENT, WIDTH>(k_tiles + (buf ^ 1) * MLA_MMA_BK * ROW, cache, next_slots);
        copy_async_commit();
        copy_async_wait<1>();  // this tile (and the query tile) are in
        __syncthreads();
        const bool active = busy && k0 <= warp_last;  // warp-uniform
        if (active) {
            // This warp's keys slice * KEYS .. of the tile against its 16 pairs.
            float s[G::KEYS / 8][4];
#pragma unroll
            for (int n = 0; n < G::KEYS / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 4
            for (int kk = 0; kk < G::DEPTH; ++kk) {
                unsigned a[4];
                ldmatrix_x4(shared_addr(q_tile + (warp_row + lane % 16) * ROW + kk * 16 + (lane / 16) * 8), a);
#pragma unroll
                for (int n = 0; n < G::KEYS / 8; n += 2) {
                    // Matrices: keys n*8.. at dims kk*16, +8; keys n*8+8.. at the same dims.
                    const int m = lane / 8;
                    const int key = slice * G::KEYS + n * 8 + lane % 8 + (m / 2) * 8;
                    unsigned b[4];
                    ldmatrix_x4(shared_addr(k_tile + key * ROW + kk * 16 + (m % 2) * 8), b);
                    mma_bf16_16816(s[n], a[0], a[1], a[2], a[3], b[0], b[1]);
                    mma_bf16_16816(s[n + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
                }
            }
            float* lo = scores + (warp_row + g) * G::S_ROW + slice * G::KEYS + 2 * quad;
            float* hi = lo + 8 * G::S_ROW;
#pragma unroll
            for (int n = 0; n < G::KEYS / 8; ++n) {
                *reinterpret_cast<float2*>(lo + n * 8) = make_float2(s[n][0], s[n][1]);
                *reinterpret_cast<float2*>(hi + n * 8) = make_float2(s[n][2], s[n][3]);
            }
        }
        __syncthreads();  // the tile's scores are whole
        if (active) {
            float s[SCORE_TILES][4];
            const float* lo = scores + (warp_row + g) * G::S_ROW + 2 * quad;
            const float* hi = lo + 8 * G::S_ROW;
#pragma unroll
            for (int n = 0; n < SCORE_TILES; ++n) {
                const float2 x = *reinterpret_cast<const float2*>(lo + n * 8);
                const float2 y = *reinterpret_cast<const float2*>(hi + n * 8);
                s[n][0] = x.x, s[n][1] = x.y, s[n][2] = y.x, s[n][3] = y.y;
            }
            // The causal mask only where the tile reaches past the warp's first row.
            const bool mask = k0 + MLA_MMA_BK - 1 > warp_first;
            flash_tile_softmax(s, acc, mask, k0, quad, pos_lo, pos_hi, scale_log2, m_lo, m_hi, l_lo, l_hi);
#pragma unroll
            for (int kk = 0; kk < MLA_MMA_BK / 16; ++kk) {
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
                    const int dim = slice * G::SLICE + n * 8 + (m / 2) * 8;
                    unsigned b[4];
                    ldmatrix_x4_t(shared_addr(k_tile + key * ROW + dim), b);
                    mma_bf16_16816(acc[n], a0, a1, a2, a3, b[0], b[1]);
                    mma_bf16_16816(acc[n + 1], a0, a1, a2, a3, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp has read the scores and the key tile
    }

    if (busy) {
        l_lo += SHFL_XOR(l_lo, 1);
        l_lo += SHFL_XOR(l_lo, 2);
        l_hi += SHFL_XOR(l_hi, 1);
        l_hi += SHFL_XOR(l_hi, 2);
        const float inv_lo = 1.0f / l_lo, inv_hi = 1.0f / l_hi;
        const int r_lo = warp_row + g, r_hi = warp_row + g + 8;
        unsigned* out_lo = reinterpret_cast<unsigned*>(o + (first_row + r_lo) * LATENT + slice * G::SLICE);
        unsigned* out_hi = reinterpret_cast<unsigned*>(o + (first_row + r_hi) * LATENT + slice * G::SLICE);
#pragma unroll
        for (int n = 0; n < DIM_TILES; ++n) {
            const int word = n * 4 + quad;  // dims 8n + 2 quad, + 1 of the slice
            if (r_lo < rows_here) out_lo[word] = pack_bf16x2(acc[n][0] * inv_lo, acc[n][1] * inv_lo);
            if (r_hi < rows_here) out_hi[word] = pack_bf16x2(acc[n][2] * inv_hi, acc[n][3] * inv_hi);
        }
    }
#else
    __trap();
#endif
}

// The shapes built: DeepSeek's (a latent of 512 and a rotary key of 64), and the small
// test models' (32 and 8). (Bounds spelled as numbers: a template's comma would split the
// macro's arguments.)
static_assert(MlaMma<512, 576>::THREADS == 256 && MlaMma<32, 40>::THREADS == 128, "bounds");

extern "C" __global__ void __launch_bounds__(256, 1)
    mla_prefill_mma_l512_w576(MLA_PREFILL_PARAMS) {
    pdl_begin();
    mla_prefill_mma<512, 576>(q, cache, q_start, q_len, context_len, table_start, block_table,
                              prefill_work, live, o, num_heads, block_size, scale);
}

extern "C" __global__ void __launch_bounds__(128)
    mla_prefill_mma_l32_w40(MLA_PREFILL_PARAMS) {
    pdl_begin();
    mla_prefill_mma<32, 40>(q, cache, q_start, q_len, context_len, table_start, block_table,
                            prefill_work, live, o, num_heads, block_size, scale);
}

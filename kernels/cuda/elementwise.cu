// Element-wise kernels of the model path: token embedding, the gated MLP activation, row
// gathers, a draft head's step fed from the step before, the feature ring's stores, column copies and random weights. One thread per output element; all offsets 64-bit.

// out[r, :] = table[tokens[r], :] widened to f32 (the residual stream is f32).
extern "C" __global__ void embedding_bf16_f32(const int* __restrict__ tokens,
                                              const bf16* __restrict__ table,
                                              float* __restrict__ out, int rows, int dim) {
    pdl_begin();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * dim) return;
    const i64 r = i / dim;
    const i64 c = i % dim;
    out[i] = to_f32(table[(i64)tokens[r] * dim + c]);
}

// embedding_bf16_f32, with the rows at position 0 zeroed (a multi-token prediction
// layer's embedding: the token before the first has none).
extern "C" __global__ void embedding_past_first_bf16_f32(const int* __restrict__ tokens,
                                                         const int* __restrict__ positions,
                                                         const bf16* __restrict__ table,
                                                         float* __restrict__ out, int rows,
                                                         int dim) {
    pdl_begin();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * dim) return;
    const i64 r = i / dim;
    const i64 c = i % dim;
    out[i] = positions[r] == 0 ? 0.0f : to_f32(table[(i64)tokens[r] * dim + c]);
}

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i].
extern "C" __global__ void silu_and_mul_bf16(const bf16* __restrict__ gate_up,
                                             bf16* __restrict__ out, int rows, int inter) {
    pdl_begin();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * inter) return;
    const i64 r = i / inter;
    const i64 c = i % inter;
    const float g = to_f32(gate_up[r * 2 * inter + c]);
    const float u = to_f32(gate_up[r * 2 * inter + inter + c]);
    out[i] = to_bf16(silu_times(g, u));
}

// out[j, :] = src[rows[j], :] for bf16 rows of `dim`.
extern "C" __global__ void gather_rows_bf16(const bf16* __restrict__ src,
                                            const int* __restrict__ rows,
                                            bf16* __restrict__ out, int count, int dim) {
    pdl_begin();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)count * dim) return;
    const i64 j = i / dim;
    out[i] = src[(i64)rows[j] * dim + i % dim];
}

// The inputs of a draft head's next step, made from the step before it on the device (a
// greedy proposal's steps queued back to back): for each of `count` rows j, with s =
// rows[j], pre_out[j, :] = pre[s, :] and tokens_out[j] = drafts_out[j] = to_target[ids[s]]
// (the row's draft-vocabulary argmax as a target id).
extern "C" __global__ void draft_feed_f32(const float* __restrict__ pre,
                                          const unsigned* __restrict__ ids,
                                          const int* __restrict__ rows,
                                          const int* __restrict__ to_target,
                                          float* __restrict__ pre_out,
                                          int* __restrict__ tokens_out,
                                          int* __restrict__ drafts_out, int count, int dim) {
    pdl_begin();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)count * dim) return;
    const i64 j = i / dim;
    const i64 c = i % dim;
    const i64 s = rows[j];
    pre_out[i] = pre[s * dim + c];
    if (c == 0) {
        const int token = to_target[ids[s]];
        tokens_out[j] = token;
        drafts_out[j] = token;
    }
}

// dst[pairs[2i]] = src[pairs[2i + 1]] for i < count: the drafts a draft head left on the
// device written into a verification step's token ids (`DraftHandOff`). Every index lies in
// its buffer: the caller's check.
extern "C" __global__ void scatter_ids_i32(const int* __restrict__ src,
                                           const int* __restrict__ pairs,
                                           int* __restrict__ dst, int count) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    dst[pairs[2 * i]] = src[pairs[2 * i + 1]];
}

// ring[(first + r) % capacity, :] = bf16(src[r, :]) for `rows` f32 rows of `dim`: a target
// forward's recorded layer inputs stored, on the target's stream, into the ring an EAGLE-3
// head gathers them from (`FeatureRing`).
extern "C" __global__ void ring_store_f32_bf16(const float* __restrict__ src,
                                               bf16* __restrict__ ring, i64 first,
                                               i64 capacity, int rows, int dim) {
    pdl_begin();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * dim) return;
    const i64 r = i / dim;
    ring[((first + r) % capacity) * dim + i % dim] = to_bf16(src[i]);
}

// out[i] = uniform in [-scale, scale), from a hash of (seed, i): random weights made on the
// device, as a dummy load format, without a host copy.
extern "C" __global__ void fill_uniform_bf16(bf16* __restrict__ out, i64 n,
                                             unsigned long long seed, float scale) {
    pdl_begin();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long z = seed + 0x9e3779b97f4a7c15ull * (unsigned long long)(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = (float)(z >> 40) * (1.0f / 16777216.0f);
    out[i] = to_bf16((2.0f * u - 1.0f) * scale);
}

// x[r, :] += bias for bf16 rows of `n` elements (Qwen2's q/k/v bias).
extern "C" __global__ void add_bias_bf16(bf16* __restrict__ x, const bf16* __restrict__ bias,
                                         int rows, int n) {
    pdl_begin();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * n) return;
    x[i] = to_bf16(to_f32(x[i]) + to_f32(bias[i % n]));
}

// dst[r, c] = src[r, c] widened to f32, for `rows` rows of `dim` columns of matrices whose
// rows are `src_stride` and `dst_stride` elements apart (the callers offset the pointers to
// the first column): a block of columns copied into or out of a wider matrix.
template <typename S>
__device__ __forceinline__ void copy_columns(const S* __restrict__ src, int src_stride,
                                             float* __restrict__ dst, int dst_stride, int rows,
                                             int dim) {
    pdl_begin();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * dim) return;
    const i64 r = i / dim;
    const i64 c = i % dim;
    dst[r * dst_stride + c] = to_f32(src[r * src_stride + c]);
}

extern "C" __global__ void copy_columns_f32(const float* __restrict__ src, int src_stride,
                                            float* __restrict__ dst, int dst_stride, int rows,
                                            int dim) {
    copy_columns(src, src_stride, dst, dst_stride, rows, dim);
}

extern "C" __global__ void copy_columns_bf16_f32(const bf16* __restrict__ src, int src_stride,
                                                 float* __restrict__ dst, int dst_stride,
                                                 int rows, int dim) {
    copy_columns(src, src_stride, dst, dst_stride, rows, dim);
}

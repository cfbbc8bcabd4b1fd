// RMSNorm, alone and fused with the residual add. One block per row; the row's sum of
// squares is reduced in f32 in an order fixed by the block size, so a row's result does
// not depend on the other rows of the batch.

// Row elements a thread keeps in registers between the sum of squares and the output, with
// their weights; rows longer than NORM_CACHED threads' worth (8192 elements at 1024
// threads) read the rest again. Each thread still adds its elements in ascending order.
#define NORM_CACHED 8

// One row: out = x * rsqrt(mean(x^2) + eps) * weight, for an f32 residual stream x; with
// ADD, x += delta first (written back), so x is read and written through one pointer. Every
// cached element is loaded before the first is stored back, so that the loads are in
// flight together rather than one round trip each behind a store that might alias them.
template <bool ADD>
__device__ __forceinline__ void rms_norm_row(float* x, const bf16* __restrict__ delta,
                                             const bf16* __restrict__ weight,
                                             bf16* __restrict__ out, int dim, float eps) {
    __shared__ float scratch[32];
    float v[NORM_CACHED], w[NORM_CACHED];
    // The weights are loaded while the kernel ahead finishes.
    pdl_launch_dependents();
#pragma unroll
    for (int j = 0; j < NORM_CACHED; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        w[j] = i < dim ? to_f32(weight[i]) : 0.0f;
    }
    pdl_wait();
#pragma unroll
    for (int j = 0; j < NORM_CACHED; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        v[j] = i < dim ? (ADD ? x[i] + to_f32(delta[i]) : x[i]) : 0.0f;
    }
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_CACHED; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < dim) {
            if (ADD) x[i] = v[j];
            sq += v[j] * v[j];
        }
    }
    for (int i = threadIdx.x + NORM_CACHED * blockDim.x; i < dim; i += blockDim.x) {
        const float t = ADD ? x[i] + to_f32(delta[i]) : x[i];
        if (ADD) x[i] = t;
        sq += t * t;
    }
    const float inv = rsqrtf(block_sum(sq, scratch) / dim + eps);
#pragma unroll
    for (int j = 0; j < NORM_CACHED; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < dim) out[i] = to_bf16(v[j] * inv * w[j]);
    }
    for (int i = threadIdx.x + NORM_CACHED * blockDim.x; i < dim; i += blockDim.x)
        out[i] = to_bf16(x[i] * inv * to_f32(weight[i]));
}

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight (x is only read), row r of the output
// starting `out_stride` elements after row r - 1 (dim for a dense output; wider to write
// into columns of a wider matrix).
extern "C" __global__ void rms_norm_f32_bf16(const float* __restrict__ x,
                                             const bf16* __restrict__ weight,
                                             bf16* __restrict__ out, int dim, int out_stride,
                                             float eps) {
    const i64 row = blockIdx.x;
    rms_norm_row<false>(const_cast<float*>(x + row * dim), nullptr, weight,
                        out + row * out_stride, dim, eps);
}

// residual[r] += delta[r]; out[r] = rms_norm(residual[r]) * weight.
extern "C" __global__ void add_rms_norm_f32_bf16(float* __restrict__ residual,
                                                 const bf16* __restrict__ delta,
                                                 const bf16* __restrict__ weight,
                                                 bf16* __restrict__ out, int dim, float eps) {
    const i64 row = blockIdx.x;
    rms_norm_row<true>(residual + row * dim, delta + row * dim, weight, out + row * dim, dim,
                       eps);
}

// In-place RMSNorm of each head of a bf16 [rows, width] matrix, `head_dim` elements at a
// time starting at column `first_col`, for `heads` heads (Qwen3's q_norm / k_norm). One
// warp per head.
extern "C" __global__ void head_rms_norm_bf16(bf16* __restrict__ x, const bf16* __restrict__ weight,
                                              int rows, int width, int first_col, int heads,
                                              int head_dim, float eps) {
    pdl_begin();
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (warp >= (i64)rows * heads) return;
    const i64 row = warp / heads;
    const int head = warp % heads;
    bf16* h = x + row * width + first_col + (i64)head * head_dim;
    float sq = 0.0f;
    for (int i = lane; i < head_dim; i += WARP_SIZE) {
        const float v = to_f32(h[i]);
        sq += v * v;
    }
    const float inv = rsqrtf(warp_sum(sq) / head_dim + eps);
    for (int i = lane; i < head_dim; i += WARP_SIZE) h[i] = to_bf16(to_f32(h[i]) * inv * to_f32(weight[i]));
}

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight for a bf16 x whose rows are
// `x_stride` elements apart (the first `dim` columns of a wider matrix), out dense: a
// compressed projection's own norm (DeepSeek's q_a_layernorm). One block per row.
extern "C" __global__ void rms_norm_bf16_rows(const bf16* __restrict__ x, i64 x_stride,
                                              const bf16* __restrict__ weight,
                                              bf16* __restrict__ out, int dim, float eps) {
    pdl_begin();
    __shared__ float scratch[32];
    const i64 row = blockIdx.x;
    const bf16* in = x + row * x_stride;
    float sq = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = to_f32(in[i]);
        sq += v * v;
    }
    const float inv = rsqrtf(block_sum(sq, scratch) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[row * dim + i] = to_bf16(to_f32(in[i]) * inv * to_f32(weight[i]));
}

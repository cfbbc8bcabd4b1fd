// RMSNorm, alone and fused with the residual add. One block per row; the row's sum of
// squares is reduced in f32 in an order fixed by the block size, so a row's result does
// not depend on the other rows of the batch.

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight, for an f32 residual stream x.
extern "C" __global__ void rms_norm_f32_bf16(const float* __restrict__ x,
                                             const bf16* __restrict__ weight,
                                             bf16* __restrict__ out, int dim, float eps) {
    __shared__ float scratch[32];
    const i64 row = blockIdx.x;
    const float* xr = x + row * dim;
    float sq = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) sq += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(sq, scratch) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[row * dim + i] = to_bf16(xr[i] * inv * to_f32(weight[i]));
}

// residual[r] += delta[r]; out[r] = rms_norm(residual[r]) * weight.
extern "C" __global__ void add_rms_norm_f32_bf16(float* __restrict__ residual,
                                                 const bf16* __restrict__ delta,
                                                 const bf16* __restrict__ weight,
                                                 bf16* __restrict__ out, int dim, float eps) {
    __shared__ float scratch[32];
    const i64 row = blockIdx.x;
    float* xr = residual + row * dim;
    const bf16* dr = delta + row * dim;
    float sq = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] + to_f32(dr[i]);
        xr[i] = v;
        sq += v * v;
    }
    const float inv = rsqrtf(block_sum(sq, scratch) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[row * dim + i] = to_bf16(xr[i] * inv * to_f32(weight[i]));
}

// In-place RMSNorm of each head of a bf16 [rows, width] matrix, `head_dim` elements at a
// time starting at column `first_col`, for `heads` heads (Qwen3's q_norm / k_norm). One
// warp per head.
extern "C" __global__ void head_rms_norm_bf16(bf16* __restrict__ x, const bf16* __restrict__ weight,
                                              int rows, int width, int first_col, int heads,
                                              int head_dim, float eps) {
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

// RMSNorm, alone and fused with the residual add. One block per row; the row's sum of
// squares is reduced in f32 in an order fixed by the block size, so a row's result does
// not depend on the other rows of the batch.

// Row elements a thread keeps in registers between the sum of squares and the output, with
// their weights, loaded before the block reduction; rows longer than NORM_CACHED threads'
// worth (8192 elements at 1024 threads) read the rest again. Each thread still adds its
// elements in ascending order.
#define NORM_CACHED 8

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight, for an f32 residual stream x.
extern "C" __global__ void rms_norm_f32_bf16(const float* __restrict__ x,
                                             const bf16* __restrict__ weight,
                                             bf16* __restrict__ out, int dim, float eps) {
    __shared__ float scratch[32];
    const i64 row = blockIdx.x;
    const float* xr = x + row * dim;
    bf16* outr = out + row * dim;
    float v[NORM_CACHED], w[NORM_CACHED];
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_CACHED; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        v[j] = i < dim ? xr[i] : 0.0f;
        w[j] = i < dim ? to_f32(weight[i]) : 0.0f;
        if (i < dim) sq += v[j] * v[j];
    }
    for (int i = threadIdx.x + NORM_CACHED * blockDim.x; i < dim; i += blockDim.x) sq += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(sq, scratch) / dim + eps);
#pragma unroll
    for (int j = 0; j < NORM_CACHED; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < dim) outr[i] = to_bf16(v[j] * inv * w[j]);
    }
    for (int i = threadIdx.x + NORM_CACHED * blockDim.x; i < dim; i += blockDim.x)
        outr[i] = to_bf16(xr[i] * inv * to_f32(weight[i]));
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
    bf16* outr = out + row * dim;
    float v[NORM_CACHED], w[NORM_CACHED];
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_CACHED; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        v[j] = i < dim ? xr[i] + to_f32(dr[i]) : 0.0f;
        w[j] = i < dim ? to_f32(weight[i]) : 0.0f;
        if (i < dim) {
            xr[i] = v[j];
            sq += v[j] * v[j];
        }
    }
    for (int i = threadIdx.x + NORM_CACHED * blockDim.x; i < dim; i += blockDim.x) {
        const float t = xr[i] + to_f32(dr[i]);
        xr[i] = t;
        sq += t * t;
    }
    const float inv = rsqrtf(block_sum(sq, scratch) / dim + eps);
#pragma unroll
    for (int j = 0; j < NORM_CACHED; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < dim) outr[i] = to_bf16(v[j] * inv * w[j]);
    }
    for (int i = threadIdx.x + NORM_CACHED * blockDim.x; i < dim; i += blockDim.x)
        outr[i] = to_bf16(xr[i] * inv * to_f32(weight[i]));
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

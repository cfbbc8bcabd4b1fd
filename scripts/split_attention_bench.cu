// A model-free timing of the decode attention of kernels/cuda/attention.cu: the split kernel
// (each bucket of query heads per block it has) and the combine, at the shapes issue 25
// measures (Llama-3.2-1B: 32 heads, 8 KV heads, head_dim 64; Llama-3-8B: head_dim 128),
// batch 64 after 128 and 191 tokens, batch 128 after 128, batch 1 and 8 after 32,000, batch 16 after 4,000.
// Each step writes its token's key and value as the engine's decode does (the fused KV
// write, no rotation). Every layer has caches of its own and enough layers rotate that the
// KV rows come from memory, not L2, as in a real step; block ids are a random permutation.
//
// The split kernel's shape and register budget are set at compile time (PA_SPLIT_THREADS,
// PA_UNROLL, PA_SPLIT_MIN_BLOCKS in attention.cu): scripts/gpu_run.sh splitbench builds
// this file once per set of -D flags and runs each build. Each line
// prints the kernel's registers, local memory (spills) and blocks per multiprocessor, its
// time per launch, the KV bytes it read at that time, and a hash of the outputs' bits: the
// same inputs give the same hash in every build and bucket whose arithmetic is the same
// (all but a different PA_SPLIT_THREADS, which changes the order of the block's sums).
#include "../kernels/cuda/attention.cu"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.cuh"

// Fills x with bf16 in [-1, 1) from a hash of the index and the seed.
__global__ void fill_random(bf16* x, i64 n, unsigned seed) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed * 2246822519u ^ (unsigned)(i >> 32);
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = to_bf16((float)(h & 0xffffff) / 8388608.0f - 1.0f);
    }
}

typedef void (*SplitKernel)(PA_SPLIT_PARAMS);

struct Shape {
    const char* name;
    int heads, kv_heads, d;
};

SplitKernel split_kernel(int d, int g) {
    if (d == 64) return g == 1 ? paged_attention_split_d64_g1 : g == 2 ? paged_attention_split_d64_g2 : paged_attention_split_d64_g4;
    return g == 1 ? paged_attention_split_d128_g1 : g == 2 ? paged_attention_split_d128_g2 : paged_attention_split_d128_g4;
}

template <typename T>
T* upload(const std::vector<T>& v) {
    T* p;
    CHECK(cudaMalloc(&p, v.size() * sizeof(T)));
    CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

void run_case(const Shape& s, int batch, int ctx) {
    const int block_size = 16, d = s.d;
    const int per_seq = (ctx + block_size - 1) / block_size;
    const i64 num_blocks = (i64)batch * per_seq;
    const i64 slot_elems = (i64)s.kv_heads * d;
    const i64 cache_elems = num_blocks * block_size * slot_elems;
    const double kv_bytes = 2.0 * batch * ctx * slot_elems * sizeof(bf16);  // K and V read a step
    // Enough layers that a pass over them is four times an H200's 50 MB of L2.
    const int layers = std::max(2, std::min(32, (int)(200e6 / kv_bytes) + 1));

    std::mt19937 rng(1234);
    std::vector<int> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int> q_start(batch), context_len(batch, ctx), positions(batch, ctx - 1);
    std::vector<i64> table_start(batch), slot_mapping(batch);
    std::vector<int> split, decode;
    const int parts = (ctx + PA_PARTITION - 1) / PA_PARTITION;
    for (int b = 0; b < batch; ++b) {
        q_start[b] = b;
        table_start[b] = (i64)b * per_seq;
        const int t = ctx - 1;
        slot_mapping[b] = (i64)ids[(i64)b * per_seq + t / block_size] * block_size + t % block_size;
        if (parts > 1) decode.insert(decode.end(), {b, (int)(split.size() / 2)});
        for (int p = 0; p < parts; ++p) split.insert(split.end(), {b, p});
    }
    const int num_work = (int)split.size() / 2, num_decode = (int)decode.size() / 2;
    std::vector<int> live = {num_work, num_decode, 0};
    if (decode.empty()) decode = {0, 0};

    const i64 q_stride = (i64)(s.heads + 2 * s.kv_heads) * d;
    bf16 *q, *o;
    float* scratch;
    CHECK(cudaMalloc(&q, batch * q_stride * sizeof(bf16)));
    CHECK(cudaMalloc(&o, (i64)batch * s.heads * d * sizeof(bf16)));
    CHECK(cudaMalloc(&scratch, (i64)num_work * s.heads * (d + 2) * sizeof(float)));
    fill_random<<<256, 256>>>(q, batch * q_stride, 7);
    std::vector<bf16*> k(layers), v(layers);
    for (int l = 0; l < layers; ++l) {
        CHECK(cudaMalloc(&k[l], cache_elems * sizeof(bf16)));
        CHECK(cudaMalloc(&v[l], cache_elems * sizeof(bf16)));
        fill_random<<<1024, 256>>>(k[l], cache_elems, 100 + 2 * l);
        fill_random<<<1024, 256>>>(v[l], cache_elems, 101 + 2 * l);
    }
    int *d_q_start = upload(q_start), *d_ctx = upload(context_len), *d_pos = upload(positions);
    int *d_table = upload(ids), *d_split = upload(split), *d_decode = upload(decode), *d_live = upload(live);
    i64 *d_table_start = upload(table_start), *d_slots = upload(slot_mapping);
    int* d_step_tokens = upload(std::vector<int>(batch, 1));  // one token a sequence
    PaNewKv nk = {d_pos, nullptr, 0, d_slots, d_step_tokens, num_blocks * block_size, 1};
    const float scale = 1.0f / sqrtf((float)d);

    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    const int group = s.heads / s.kv_heads;
    for (int g : {1, 2, 4}) {
        if (g > group) break;
        SplitKernel kernel = split_kernel(d, g);
        cudaFuncAttributes attr;
        CHECK(cudaFuncGetAttributes(&attr, kernel));
        int per_sm = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, PA_SPLIT_THREADS, 0));
        const int blocks = num_work * s.kv_heads * ((group + g - 1) / g);
        auto split_on = [&](int l) {
            kernel<<<blocks, PA_SPLIT_THREADS>>>(q, q_stride, k[l], v[l], d_q_start, d_ctx, d_table_start, d_table,
                                                 d_split, num_work, d_live, scratch, o, s.heads, s.kv_heads,
                                                 block_size, scale, nk);
        };
        auto combine = [&]() {
            if (num_decode > 0)
                paged_attention_combine<<<num_decode * s.heads, PA_COMBINE_THREADS>>>(scratch, num_work, s.heads, d, d_decode,
                                                                                     d_live, d_q_start, d_ctx, o);
        };
        // The outputs of layer 0, hashed (FNV-1a over the bits).
        CHECK(cudaMemset(o, 0xff, (i64)batch * s.heads * d * sizeof(bf16)));
        split_on(0);
        combine();
        CHECK(cudaDeviceSynchronize());
        std::vector<unsigned short> out((i64)batch * s.heads * d);
        CHECK(cudaMemcpy(out.data(), o, out.size() * 2, cudaMemcpyDeviceToHost));
        unsigned long long hash = 1469598103934665603ull;
        for (unsigned short x : out) hash = (hash ^ x) * 1099511628211ull;

        const int iters = std::max(20, std::min(400, (int)(40e9 / kv_bytes)));
        for (int i = 0; i < layers; ++i) split_on(i);
        CHECK(cudaEventRecord(t0));
        for (int i = 0; i < iters; ++i) split_on(i % layers);
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        float split_ms;
        CHECK(cudaEventElapsedTime(&split_ms, t0, t1));
        CHECK(cudaEventRecord(t0));
        for (int i = 0; i < iters; ++i) combine();
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        float combine_ms;
        CHECK(cudaEventElapsedTime(&combine_ms, t0, t1));
        CHECK(cudaGetLastError());
        const double split_us = 1e3 * split_ms / iters, combine_us = 1e3 * combine_ms / iters;
        printf("%-4s batch %3d ctx %5d g%d: %3d regs %4zu B local %2d blocks/SM %5d blocks | split %8.2f us "
               "(%6.0f GB/s) combine %6.2f us | hash %016llx\n",
               s.name, batch, ctx, g, attr.numRegs, attr.localSizeBytes, per_sm, blocks, split_us,
               kv_bytes / split_us / 1e3, combine_us, hash);
    }
    for (int l = 0; l < layers; ++l) {
        CHECK(cudaFree(k[l]));
        CHECK(cudaFree(v[l]));
    }
    for (void* p : {(void*)q, (void*)o, (void*)scratch, (void*)d_q_start, (void*)d_ctx, (void*)d_pos, (void*)d_table,
                    (void*)d_split, (void*)d_decode, (void*)d_live, (void*)d_table_start, (void*)d_slots, (void*)d_step_tokens})
        CHECK(cudaFree(p));
}

// With arguments SHAPE BATCH CONTEXT (SHAPE 1B or 8B), that case alone (for a profiler).
int main(int argc, char** argv) {
    const Shape small = {"1B", 32, 8, 64}, large = {"8B", 32, 8, 128};
    if (argc == 4) {
        run_case(std::string(argv[1]) == "8B" ? large : small, atoi(argv[2]), atoi(argv[3]));
        return 0;
    }
    printf("PA_SPLIT_THREADS %d PA_UNROLL %d PA_SPLIT_MIN_BLOCKS %d\n", PA_SPLIT_THREADS, PA_UNROLL,
           PA_SPLIT_MIN_BLOCKS);
    for (const Shape& s : {small, large}) {
        run_case(s, 64, 129);
        run_case(s, 64, 192);
        run_case(s, 128, 129);
        run_case(s, 1, 4001);
        run_case(s, 16, 4001);
        run_case(s, 1, 32001);
        run_case(s, 8, 32001);
    }
    return 0;
}

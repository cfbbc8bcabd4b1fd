// A model-free timing of the kernel chain of one batch-1 decode step of a Llama shape
// (default: Llama-3.2-1B), replayed as a CUDA graph with programmatic dependent launch as
// the engine launches it, to compare ways of chaining the same kernels:
//   unfused: add_rms_norm, qkv, attention stand-in, o, add_rms_norm, gate/up, down
//   fused:   normed qkv, attention stand-in, adding o, normed gate/up, adding down
//   no-norm: the unfused chain less its norms (what the fused one can at best reach)
//   empty:   as many one-block kernels as the unfused chain, doing nothing (the chain's
//            own cost)
//   program: the fused chain's products as gemv_program (gemv_program_probe.cuh), a
//            persistent grid per layer between the attention stand-ins, and timings of
//            one product alone through it and through the kernels (and the normed
//            kernels' products alone against the plain kernels')
// The attention stand-in copies q into the attention output (a decode step's attention
// over a short context reads little, so it is a dependent step and little else). Every
// layer has weights of its own, so nothing comes from L2 that would come from memory in a
// real step. Each chain runs with the GEMV grids capped at 1, 2, 3, 4 and 8 blocks per
// multiprocessor (at most the kernel's occupancy) and uncapped (a block per column group).
// It also checks that the fused chain's residual stream matches the unfused one's after
// all layers, and the program's the fused one's to the bit. Arguments: hidden, qkv width,
// intermediate size, layers.
//
// Build and run on a GPU machine: scripts/gpu_run.sh chain. Built with -DGEMM_BASE it times
// scripts/gemm_base.cu (an earlier kernels/cuda/gemm.cu, such as `git show
// REV:kernels/cuda/gemm.cu`) in place of the current one; gpu_run.sh does so where that
// file exists. A gemm.cu whose one-row kernels stage their row defines GEMV_STAGES_ONE_ROW
// (from 5ff5a08 on; ac020ae's, the first to stage, does not), and the launches here give
// them the shared memory only where it does.
#ifdef GEMM_BASE
#include "gemm_base.cu"
#else
#include "../kernels/cuda/gemm.cu"
#endif
#ifdef GEMV_STAGES_ONE_ROW
#define GEMV_STAGES 1
#else
#define GEMV_STAGES 0
#endif
#include "../kernels/cuda/norm.cu"
#include "gemv_program_probe.cuh"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>

#include "cuda_check.cuh"

extern "C" __global__ void attention_standin(const bf16* __restrict__ qkv, bf16* __restrict__ out, int dim) {
    pdl_begin();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x) out[i] = qkv[i];
}

extern "C" __global__ void empty_kernel() { pdl_begin(); }

struct Shape {
    int hidden = 2048, qkv = 3072, inter = 8192, layers = 16;
};

static cudaStream_t stream;

// The RMSNorms' epsilon.
static const float kEps = 1e-5f;

// Launches with programmatic dependent launch, as the engine does.
template <typename... Args>
static void launch_sized(void (*kernel)(Args...), int blocks, int threads, int shared_bytes, Args... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

template <typename... Args>
static void launch(void (*kernel)(Args...), int blocks, int threads, Args... args) {
    launch_sized(kernel, blocks, threads, 0, args...);
}

static int slices_for(int k) {
    int s = 1;
    while (s < 8 && k > s * 2048 && k % (2 * s * 8) == 0) s *= 2;
    return s;
}

// Blocks per multiprocessor a GEMV grid is capped at: 0 for none (a block per column group),
// else that many times the multiprocessors, at most what the kernel's occupancy allows.
static int cap_per_sm = 0;
static int sms = 0;

template <typename Kernel>
static int gemv_blocks(Kernel kernel, int n, int k, int shared_bytes) {
    const int groups = (n + 8 / slices_for(k) - 1) / (8 / slices_for(k));
    if (cap_per_sm == 0) return groups;
    int occupancy = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, kernel, 256, shared_bytes));
    const int cap = sms * (cap_per_sm < occupancy ? cap_per_sm : occupancy);
    return groups < cap ? groups : cap;
}

// The dynamic shared memory a one-row GEMV stages its row in (gemm.cu): a row of k elements
// of x_size bytes, and room for a normed product's gamma, which the gemm.cu of ac020ae to
// a2a826c stages beside the row (later ones stage x * gamma in the row's place).
static int staged_bytes(int k, int x_size, bool normed) {
    return GEMV_STAGES ? k * x_size + (normed ? 2 * k : 0) : 0;
}

// A one-row GEMV launch over rows of k elements of x_size bytes (normed: the f32 residual
// stream), its grid capped as gemv_blocks says.
template <typename... Params, typename... Args>
static void launch_gemv(void (*kernel)(Params...), int n, int k, int x_size, bool normed, Args... args) {
    const int bytes = staged_bytes(k, x_size, normed);
    launch_sized(kernel, gemv_blocks(kernel, n, k, bytes), 256, bytes, args...);
}

// Uniform values in [-scale, scale) from a hash of the index and the seed, made on the device.
__global__ void fill_random(bf16* out, size_t n, float scale, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ (unsigned)(i >> 32) * 40503u ^ seed * 2246822519u;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        out[i] = __float2bfloat16(scale * ((h >> 8) * (1.0f / 8388608.0f) - 1.0f));
    }
}

static bf16* random_bf16(size_t n, float scale, unsigned seed) {
    bf16* d;
    CHECK(cudaMalloc(&d, n * sizeof(bf16)));
    fill_random<<<1024, 256>>>(d, n, scale, seed);
    CHECK(cudaDeviceSynchronize());
    return d;
}

struct Layer {
    bf16 *g1, *qkv, *o, *g2, *gate_up, *down;
};

struct Buffers {
    float* residual;
    bf16 *normed, *qkv, *attn, *delta, *act;
};

enum Chain {
    UNFUSED,
    FUSED,
    NO_NORM,
    EMPTY,
    PROGRAM,
    // One product alone, in every layer.
    GATE_KERNELS,
    GATE_PROGRAM1,
    GATE_PROGRAM4,
    DOWN_KERNELS,
    DOWN_PROGRAM1,
    // One product alone, its kernel with and without the fused norm.
    GATE_PLAIN,
    QKV_NORMED,
    QKV_PLAIN,
};

static unsigned* barrier;

// A gemv_program step.
static ProgramStep step(GemvMode mode, const void* x, const bf16* gamma, const bf16* w, void* out, int n,
                        int k) {
    return ProgramStep{x, gamma, w, out, (int)mode, n, k, slices_for(k)};
}

static int shared_optin = 0;

static void launch_program(const std::vector<ProgramStep>& steps) {
    Program p = {};
    int stretch_most = 0, x_bytes = 0, normed_elems = 0;
    for (size_t i = 0; i < steps.size(); i++) {
        const ProgramStep& st = steps[i];
        const bool normed = st.mode == GEMV_NORMED || st.mode == GEMV_NORMED_GATED;
        const int halves = st.mode == GEMV_NORMED_GATED ? 2 : 1;
        stretch_most = std::max(stretch_most, halves * st.k / st.slices * 2);
        x_bytes = std::max(x_bytes, st.k * (normed ? 4 : 2));
        if (normed) normed_elems = std::max(normed_elems, st.k);
    }
    // A slot holds the longest stretch (shorter ones leave the rest unused: packing two into
    // a copy group measured slower).
    p.slot_bytes = (stretch_most + 127) / 128 * 128;
    for (size_t i = 0; i < steps.size(); i++) p.steps[i] = steps[i];
    p.count = (int)steps.size();
    p.barrier = barrier;
    p.eps = kEps;
    p.x_bytes = x_bytes;
    p.normed_elems = normed_elems;
    const int smem = PROGRAM_WARPS * PROGRAM_DEPTH * p.slot_bytes + x_bytes + normed_elems * 4;
    if (smem > shared_optin) {
        fprintf(stderr, "%d slots of %d bytes and x do not fit\n", PROGRAM_WARPS * PROGRAM_DEPTH, p.slot_bytes);
        exit(1);
    }
    CHECK(cudaFuncSetAttribute(gemv_program, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    launch_sized(gemv_program, sms, PROGRAM_WARPS * 32, smem, p);
}

// The one-row products of a layer, as every chain here launches them: the normed ones read
// the f32 residual stream and the norm's weight, the others b.normed (qkv, gate/up) or the
// input they are given.

static void qkv_normed(const Shape& s, const Layer& w, Buffers& b) {
    launch_gemv(gemv_normed_bf16_r1, s.qkv, s.hidden, 4, true, (const float*)b.residual, (const bf16*)w.g1,
                (const bf16*)w.qkv, b.qkv, 1, s.qkv, s.hidden, slices_for(s.hidden), kEps);
}

static void qkv_plain(const Shape& s, const Layer& w, Buffers& b) {
    launch_gemv(gemv_fixed_order_bf16_r1, s.qkv, s.hidden, 2, false, (const bf16*)b.normed, (const bf16*)w.qkv,
                b.qkv, 1, s.qkv, s.hidden, slices_for(s.hidden));
}

static void gate_up_normed(const Shape& s, const Layer& w, Buffers& b) {
    launch_gemv(gemv_normed_gated_bf16_r1, s.inter, s.hidden, 4, true, (const float*)b.residual, (const bf16*)w.g2,
                (const bf16*)w.gate_up, b.act, 1, s.inter, s.hidden, slices_for(s.hidden), kEps);
}

static void gate_up_plain(const Shape& s, const Layer& w, Buffers& b) {
    launch_gemv(gemv_gated_bf16_r1, s.inter, s.hidden, 2, false, (const bf16*)b.normed, (const bf16*)w.gate_up,
                b.act, 1, s.inter, s.hidden, slices_for(s.hidden));
}

// out = x . w over n columns of depth k: added into the residual stream, or stored in b.delta.
static void product_add(int n, int k, const bf16* x, const bf16* w, Buffers& b) {
    launch_gemv(gemv_add_f32_r1, n, k, 2, false, x, w, b.residual, 1, n, k, slices_for(k));
}

static void product_plain(int n, int k, const bf16* x, const bf16* w, Buffers& b) {
    launch_gemv(gemv_fixed_order_bf16_r1, n, k, 2, false, x, w, b.delta, 1, n, k, slices_for(k));
}

static void enqueue(Chain chain, const Shape& s, const std::vector<Layer>& layers, Buffers& b) {
    const int H = s.hidden;
    for (int l = 0; l < s.layers; l++) {
        const Layer& w = layers[l];
        if (chain == EMPTY) {
            for (int i = 0; i < 7; i++) launch(empty_kernel, 1, 32);
            continue;
        }
        if (chain == GATE_KERNELS) {
            gate_up_normed(s, w, b);
            continue;
        }
        if (chain == DOWN_KERNELS) {
            product_add(H, s.inter, b.act, w.down, b);
            continue;
        }
        if (chain == GATE_PLAIN) {
            gate_up_plain(s, w, b);
            continue;
        }
        if (chain == QKV_NORMED) {
            qkv_normed(s, w, b);
            continue;
        }
        if (chain == QKV_PLAIN) {
            qkv_plain(s, w, b);
            continue;
        }
        if (chain == GATE_PROGRAM1) {
            launch_program({step(GEMV_NORMED_GATED, b.residual, w.g2, w.gate_up, b.act, s.inter, H)});
            continue;
        }
        if (chain == DOWN_PROGRAM1) {
            launch_program({step(GEMV_ADD, b.act, nullptr, w.down, b.residual, H, s.inter)});
            continue;
        }
        if (chain == GATE_PROGRAM4) {
            if (l % 4 == 0) {
                std::vector<ProgramStep> steps;
                for (int i = l; i < std::min(l + 4, s.layers); i++)
                    steps.push_back(step(GEMV_NORMED_GATED, b.residual, layers[i].g2, layers[i].gate_up, b.act, s.inter, H));
                launch_program(steps);
            }
            continue;
        }
        if (chain == PROGRAM) {
            // The layer's qkv product ran at the end of the program before (the first
            // layer's runs alone).
            if (l == 0)
                launch_program({step(GEMV_NORMED, b.residual, w.g1, w.qkv, b.qkv, s.qkv, H)});
            launch(attention_standin, 8, 256, (const bf16*)b.qkv, b.attn, H);
            std::vector<ProgramStep> steps = {
                step(GEMV_ADD, b.attn, nullptr, w.o, b.residual, H, H),
                step(GEMV_NORMED_GATED, b.residual, w.g2, w.gate_up, b.act, s.inter, H),
                step(GEMV_ADD, b.act, nullptr, w.down, b.residual, H, s.inter)};
            if (l + 1 < s.layers)
                steps.push_back(step(GEMV_NORMED, b.residual, layers[l + 1].g1, layers[l + 1].qkv, b.qkv, s.qkv, H));
            launch_program(steps);
            continue;
        }
        if (chain == FUSED) {
            qkv_normed(s, w, b);
            launch(attention_standin, 8, 256, (const bf16*)b.qkv, b.attn, H);
            product_add(H, H, b.attn, w.o, b);
            gate_up_normed(s, w, b);
            product_add(H, s.inter, b.act, w.down, b);
            continue;
        }
        const bool norms = chain == UNFUSED;
        if (norms)
            launch(add_rms_norm_f32_bf16, 1, 1024, b.residual, (const bf16*)b.delta, (const bf16*)w.g1,
                   b.normed, H, kEps);
        qkv_plain(s, w, b);
        launch(attention_standin, 8, 256, (const bf16*)b.qkv, b.attn, H);
        product_plain(H, H, b.attn, w.o, b);
        if (norms)
            launch(add_rms_norm_f32_bf16, 1, 1024, b.residual, (const bf16*)b.delta, (const bf16*)w.g2,
                   b.normed, H, kEps);
        gate_up_plain(s, w, b);
        product_plain(H, s.inter, b.act, w.down, b);
    }
    if (chain == UNFUSED) {
        // The last layer's down projection joins the residual stream, as the final norm's
        // add would (the fused chain's last product adds it itself).
        launch(add_rms_norm_f32_bf16, 1, 1024, b.residual, (const bf16*)b.delta, (const bf16*)layers[0].g1,
               b.normed, H, kEps);
    }
}

static std::vector<float> residual_after(Chain chain, const Shape& s, const std::vector<Layer>& layers,
                                         Buffers& b, const std::vector<float>& start) {
    CHECK(cudaMemcpy(b.residual, start.data(), start.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(b.delta, 0, s.hidden * sizeof(bf16)));
    enqueue(chain, s, layers, b);
    CHECK(cudaStreamSynchronize(stream));
    std::vector<float> out(start.size());
    CHECK(cudaMemcpy(out.data(), b.residual, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}

static double time_chain(Chain chain, const Shape& s, const std::vector<Layer>& layers, Buffers& b) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    enqueue(chain, s, layers, b);
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 20; i++) CHECK(cudaGraphLaunch(exec, stream));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    const int reps = 200;
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < reps; i++) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    return 1000.0 * ms / reps;
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe as they are printed
    Shape s;
    if (argc == 5) s = Shape{atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4])};
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int H = s.hidden;
    std::vector<Layer> layers;
    double bytes = 0;
    for (int l = 0; l < s.layers; l++) {
        const unsigned seed = 100 + 10 * l;
        layers.push_back(Layer{random_bf16(H, 1.0f, seed), random_bf16((size_t)s.qkv * H, 0.03f, seed + 1),
                               random_bf16((size_t)H * H, 0.03f, seed + 2), random_bf16(H, 1.0f, seed + 3),
                               random_bf16((size_t)2 * s.inter * H, 0.03f, seed + 4),
                               random_bf16((size_t)H * s.inter, 0.03f, seed + 5)});
        bytes += 2.0 * ((double)s.qkv * H + (double)H * H + 3.0 * s.inter * H);
    }
    Buffers b;
    CHECK(cudaMalloc(&b.residual, H * sizeof(float)));
    CHECK(cudaMalloc(&b.normed, H * sizeof(bf16)));
    CHECK(cudaMalloc(&b.qkv, s.qkv * sizeof(bf16)));
    CHECK(cudaMalloc(&b.attn, H * sizeof(bf16)));
    CHECK(cudaMalloc(&b.delta, H * sizeof(bf16)));
    CHECK(cudaMalloc(&b.act, s.inter * sizeof(bf16)));

    // The fused chain against the unfused one: the same residual stream within bf16 noise.
    std::vector<float> start(H);
    srand(7);
    for (auto& v : start) v = (rand() / (float)RAND_MAX) * 2.0f - 1.0f;
    const auto want = residual_after(UNFUSED, s, layers, b, start);
    const auto got = residual_after(FUSED, s, layers, b, start);
    double worst = 0, largest = 0;
    for (int i = 0; i < H; i++) {
        worst = fmax(worst, fabs(want[i] - got[i]));
        largest = fmax(largest, fabs(want[i]));
    }
    printf("residual after %d layers: largest |x| %.4f, fused vs unfused max |diff| %.5f (%.2e of largest)\n",
           s.layers, largest, worst, worst / largest);
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaMalloc(&barrier, 64 * sizeof(unsigned)));
    CHECK(cudaMemset(barrier, 0, 64 * sizeof(unsigned)));

    printf("shape hidden %d qkv %d inter %d layers %d: %.1f MB of weights\n", s.hidden, s.qkv, s.inter,
           s.layers, bytes / 1e6);
    const char* names[] = {"unfused", "fused", "no-norm", "empty", "program"};
    CHECK(cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    {
        const auto programmed = residual_after(PROGRAM, s, layers, b, start);
        int differ = 0;
        double far = 0;
        for (int i = 0; i < H; i++) {
            differ += programmed[i] != got[i];
            far = fmax(far, fabs(programmed[i] - got[i]));
        }
        printf("program: %d of %d residual values differ from fused (want 0), max |diff| %.3g\n", differ, H, far);
    }
    {
        // One product alone, 16 layers of it: the kernels (grids capped at 4 blocks per
        // multiprocessor) against a program per layer, and four layers to a program.
        cap_per_sm = 4;
        const char* probe_names[] = {"gate/up kernels", "gate/up program x1", "gate/up program x4", "down kernels",
                                     "down program x1", "gate/up unnormed", "qkv kernels", "qkv unnormed"};
        const double gate_up = 2.0 * 2 * s.inter * H * s.layers, down = 2.0 * s.inter * H * s.layers;
        const double qkv = 2.0 * s.qkv * H * s.layers;
        const double probe_bytes[] = {gate_up, gate_up, gate_up, down, down, gate_up, qkv, qkv};
        for (int c = GATE_KERNELS; c <= QKV_PLAIN; c++) {
            const double us = time_chain((Chain)c, s, layers, b);
            printf("%-20s %8.1f us  %.2f TB/s\n", probe_names[c - GATE_KERNELS], us,
                   probe_bytes[c - GATE_KERNELS] / (us * 1e-6) / 1e12);
        }
    }
    const int caps[] = {0, 1, 2, 3, 4, 8};
    for (int round = 0; round < 2; round++) {
        for (int cap : caps) {
            cap_per_sm = cap;
            for (int c = 0; c < 5; c++) {
                if ((c == EMPTY || c == PROGRAM) && cap != 0) continue;
                const double us = time_chain((Chain)c, s, layers, b);
                printf("round %d cap %d %-16s %8.1f us/step  %6.2f us/layer  %.2f TB/s\n", round, cap,
                       names[c], us, us / s.layers, c == EMPTY ? 0.0 : bytes / (us * 1e-6) / 1e12);
            }
        }
    }
    const struct {
        const char* name;
        const void* kernel;
    } kernels[] = {{"plain", (const void*)gemv_fixed_order_bf16_r1}, {"gated", (const void*)gemv_gated_bf16_r1},
                   {"normed", (const void*)gemv_normed_bf16_r1},
                   {"normed gated", (const void*)gemv_normed_gated_bf16_r1}, {"add", (const void*)gemv_add_f32_r1}};
    for (const auto& k : kernels) {
        int occupancy = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, k.kernel, 256, 0));
        printf("occupancy of %s: %d blocks/SM\n", k.name, occupancy);
    }
    return 0;
}

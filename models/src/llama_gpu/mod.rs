//! The Llama family on the CUDA backend: bf16 weights on the device, the forward pass of
//! `LlamaModel` kernel for kernel, logits in f32. Built with the `cuda` feature.

mod forward;
mod graph;
mod weights;
mod workspace;

pub use forward::GpuForwardError;
pub(crate) use forward::{attend, project_logits, LayerKv, LogitRows};
pub use graph::{CapturedDecode, GraphKind, GreedyInput, QueuedStep, ReplayedStep};
pub use weights::GpuWeights;
pub use workspace::{AuxStates, StepBuffers, Workspace, WorkspaceDims};

use crate::config::ModelConfig;
use crate::gpu_graph::SharedGraphBuffers;
use crate::weights::Weights;
use cudarc::driver::{CudaSlice, CudaView};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_kernels::cuda::gemm::Gemm;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::attention::{DeviceAttentionPlan, GpuPagedAttention};
use peregrine_ops::{Rotary, RotaryLayout};
use peregrine_runtime::cuda::Gpu;
use peregrine_runtime::host_memory::human_bytes;
use std::path::Path;
use std::sync::Arc;

/// How a GPU model is set up.
#[derive(Clone, Copy, Debug)]
pub struct GpuModelOptions {
    /// The most tokens one forward may carry (sizes the activation workspace).
    pub max_tokens: usize,
    /// The most rows one forward may ask logits for.
    pub max_logit_rows: usize,
    /// Batch-invariant kernels (`--deterministic`).
    pub deterministic: bool,
    /// Products of up to this many rows use the GEMV kernel rather than cuBLAS.
    pub gemv_max_rows: usize,
}

impl GpuModelOptions {
    /// The products' handles on `gpu`'s stream, GEMV up to `gemv_max_rows` rows.
    pub(crate) fn gemm(&self, gpu: &Gpu) -> anyhow::Result<Gemm> {
        Ok(Gemm::new(gpu.stream().clone(), self.deterministic)?
            .with_gemv_max_rows(self.gemv_max_rows))
    }

    /// The attention kernel of one-token steps: the prefill kernel in deterministic mode,
    /// so that no position's result depends on how its prompt was cut into chunks.
    pub(crate) fn decode_kernel(&self) -> DecodeKernel {
        if self.deterministic {
            DecodeKernel::Prefill
        } else {
            DecodeKernel::Split
        }
    }
}

/// A Llama-family model on one GPU.
pub struct GpuLlama {
    core: Arc<LlamaCore>,
    /// The activations of eager steps.
    work: Workspace,
    /// The metadata of eager steps, restaged every step into buffers that only grow.
    plan: DeviceAttentionPlan,
    /// The buffers of the graphs, one set for decode steps and one for verification steps,
    /// while any graph was captured from them: shared by every graph of their kind (each
    /// holds them too) and replaced only by a capture for more rows.
    graph_buffers: SharedGraphBuffers<graph::GraphBuffers>,
}

/// What every kernel of the forward reads and never writes: the weights, the rotary table,
/// the products' handles and workspace. Captured graphs hold it, so it outlives them.
struct LlamaCore {
    config: ModelConfig,
    gpu: Arc<Gpu>,
    kernels: Arc<CudaKernels>,
    weights: GpuWeights,
    cos_sin: CudaSlice<f32>,
    interleaved: bool,
    attention: GpuPagedAttention,
    /// The attention kernel of one-token steps: the prefill kernel in deterministic mode,
    /// so that no position's result depends on how its prompt was cut into chunks.
    decode_kernel: DecodeKernel,
    gemm: Gemm,
}

/// A model's embedding table on the device, kept alive (with the rest of the model's
/// weights) while this handle lives.
#[derive(Clone)]
pub struct SharedEmbedding(Arc<LlamaCore>);

impl SharedEmbedding {
    /// `[vocab, hidden]` bf16.
    pub fn table(&self) -> CudaView<'_, bf16> {
        self.0.weights.embed.as_view()
    }

    /// The device the table is on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.0.gpu
    }
}

impl GpuLlama {
    /// Loads the checkpoint in `dir` onto the GPU in bf16.
    pub fn load(
        dir: &Path,
        gpu: Arc<Gpu>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
    ) -> anyhow::Result<GpuLlama> {
        let config = ModelConfig::from_dir(dir)?;
        check_supported(&config)?;
        let weights = GpuWeights::load(&gpu, &config, &Weights::open(dir)?)?;
        GpuLlama::new(config, weights, gpu, kernels, options)
    }

    /// A model of `config`'s shapes with random weights made on the device (uniform, scaled
    /// by each matrix's fan-in), for benchmarks of architectures whose weights are not here.
    pub fn random(
        config: ModelConfig,
        seed: u64,
        gpu: Arc<Gpu>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
    ) -> anyhow::Result<GpuLlama> {
        check_supported(&config)?;
        let weights = GpuWeights::random(&gpu, &kernels, &config, seed)?;
        GpuLlama::new(config, weights, gpu, kernels, options)
    }

    fn new(
        config: ModelConfig,
        weights: GpuWeights,
        gpu: Arc<Gpu>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
    ) -> anyhow::Result<GpuLlama> {
        let c = &config;
        let rotary = Rotary::new(
            c.head_dim,
            c.rope_theta,
            &c.rope_scaling,
            RotaryLayout::HalfSplit,
        );
        let positions = u32::try_from(c.max_model_len)?;
        let cos_sin = gpu.upload(&rotary.cos_sin_table(positions))?;
        let planned = WorkspaceDims::of(c).bytes(options.max_tokens, options.max_logit_rows);
        let (free, _) = gpu.memory()?;
        anyhow::ensure!(
            planned <= free,
            "the activations of a step of {} tokens and {} logit rows need {} of device \
             memory, but {} is free after the weights",
            options.max_tokens,
            options.max_logit_rows,
            human_bytes(planned),
            human_bytes(free)
        );
        let work = Workspace::new(&gpu, c, options.max_tokens, options.max_logit_rows, &[])?;
        let gemm = options.gemm(&gpu)?;
        let decode_kernel = options.decode_kernel();
        let plan = DeviceAttentionPlan::growing(&gpu, decode_kernel)?;
        let core = LlamaCore {
            attention: GpuPagedAttention {
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                scale: 1.0 / (c.head_dim as f32).sqrt(),
            },
            interleaved: rotary.is_interleaved(),
            decode_kernel,
            config,
            gpu,
            kernels,
            weights,
            cos_sin,
            gemm,
        };
        Ok(GpuLlama {
            core: Arc::new(core),
            work,
            plan,
            graph_buffers: SharedGraphBuffers::default(),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.core.config
    }

    /// The device the model is on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.core.gpu
    }

    /// Bytes of parameters on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.core.weights.bytes()
    }

    /// Bytes of the activation workspace.
    pub fn workspace_bytes(&self) -> u64 {
        self.work.bytes()
    }

    /// A KV cache layout of `num_blocks` blocks of `block_size` tokens for this model.
    pub fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        self.core.config.kv_layout(num_blocks, block_size)
    }

    /// From now on, every forward records the input of each layer in `layers` (the
    /// residual stream entering it) for every row, in that order of columns, for
    /// [`GpuLlama::last_aux`]; empty: none. Unless it records those already, drops the
    /// graph buffers, so that graphs captured from now on record them too (capture again:
    /// graphs captured before do not).
    pub fn record_aux(&mut self, layers: &[usize]) -> anyhow::Result<()> {
        let c = &self.core.config;
        if let Some(l) = layers.iter().find(|&&l| l >= c.num_layers) {
            anyhow::bail!(
                "the input of layer {l} asked of a model of {} layers",
                c.num_layers
            );
        }
        if self.work.aux_layers() == layers {
            return Ok(());
        }
        self.work.record(&self.core.gpu, layers, c.hidden_size)?;
        self.graph_buffers.clear();
        Ok(())
    }

    /// The layer inputs the last eager forward of `rows` rows recorded, f32
    /// `[rows, layers * hidden]`; `None` when it records none.
    pub fn last_aux(&self, rows: usize) -> Option<CudaView<'_, f32>> {
        let aux = self.work.aux.as_ref()?;
        let width = aux.layers.len() * self.core.config.hidden_size;
        Some(aux.states.slice(0..rows.min(self.work.max_tokens) * width))
    }

    /// The embedding table on the device, shared: an EAGLE-3 head without its own reads it.
    pub fn shared_embedding(&self) -> SharedEmbedding {
        SharedEmbedding(self.core.clone())
    }

    /// Bytes of K and V one token takes across all layers (bf16).
    pub fn kv_bytes_per_token(&self) -> u64 {
        let c = &self.core.config;
        (2 * c.num_layers * c.num_kv_heads * c.head_dim * 2) as u64
    }
}

/// Refuses what the GPU forward does not run yet: latent attention and mixtures of experts
/// (DeepSeek-V2/V3, Qwen3-MoE run on the CPU).
fn check_supported(config: &ModelConfig) -> anyhow::Result<()> {
    if config.mla.is_some() || config.moe.is_some() {
        anyhow::bail!(
            "{:?} models (latent attention, mixtures of experts) run on the CPU only for now: \
             use --device cpu",
            config.architecture
        );
    }
    Ok(())
}

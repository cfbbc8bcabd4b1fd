//! The Llama family on the CUDA backend: bf16 weights on the device, the forward pass of
//! `LlamaModel` kernel for kernel, logits in f32. Built with the `cuda` feature.

mod experts;
pub(crate) mod forward;
mod graph;
mod latent;
mod layer;
mod step;
mod upload;
mod weights;
mod workspace;

pub use experts::{ExpertBuffers, GpuExperts};
pub use forward::GpuForwardError;
pub(crate) use forward::{attend, norm_into, project_logits, LayerKv, LogitRows};
pub use graph::{
    AuxHandOff, CapturedDecode, GraphKind, GreedyInput, QueuedStep, ReplayedStep, StepMasks,
};
pub use latent::{GpuLatent, LatentBuffers};
pub(crate) use step::{LayerInput, LayerStep};
pub(crate) use upload::to_device;
pub use upload::{GpuWeightError, RandomWeights};
pub use weights::{GpuAttention, GpuGrouped, GpuLayer, GpuMlp, GpuWeights};
pub use workspace::{AuxStates, StepBuffers, Workspace, WorkspaceDims};

use crate::config::ModelConfig;
use crate::graph::cuda::SharedGraphBuffers;
use crate::llama::rotary_of;
use crate::weights::Weights;
use cudarc::driver::{CudaSlice, CudaView};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_kernels::cuda::gemm::Gemm;
use peregrine_kernels::cuda::mla::runs_prefill;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::attention::{DeviceAttentionPlan, GpuPagedAttention};
use peregrine_ops::cuda::GpuKvCache;
use peregrine_runtime::cuda::{Gpu, GpuError};
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

    /// The model's output projection, `[vocab, hidden]` bf16: its `lm_head`, or the
    /// embedding table it is tied to.
    pub fn output_head(&self) -> CudaView<'_, bf16> {
        let w = &self.0.weights;
        w.lm_head.as_ref().unwrap_or(&w.embed).as_view()
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
        check_supported(&config, &options)?;
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
        check_supported(&config, &options)?;
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
        let rotary = rotary_of(c);
        let positions = u32::try_from(c.max_model_len)?;
        let cos_sin = gpu.upload(&rotary.cos_sin_table(positions))?;
        let planned = Workspace::bytes_for(c, options.max_tokens, options.max_logit_rows);
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
        let plan = attention_plan(
            c,
            &kernels,
            DeviceAttentionPlan::growing(&gpu, decode_kernel)?,
        );
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
    /// residual stream entering it; "layer `num_layers`" is the last layer's output, before
    /// the final norm, which a multi-token prediction head reads) for every row, in that
    /// order of columns, for
    /// [`GpuLlama::last_aux`]; empty: none. Unless it records those already, drops the
    /// graph buffers, so that graphs captured from now on record them too (capture again:
    /// graphs captured before do not).
    pub fn record_aux(&mut self, layers: &[usize]) -> anyhow::Result<()> {
        let c = &self.core.config;
        if let Some(l) = layers.iter().find(|&&l| l > c.num_layers) {
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

    /// Bytes one token takes in the KV cache across all layers (bf16): its keys and
    /// values, or under latent attention its latent rows.
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.core.config.kv_bytes_per_token(2)
    }

    /// For a model with a mixture of experts, the bytes a decode step of `batch` sequences
    /// of `context` tokens must read at least: every weight but the routed experts', the
    /// routed experts a batch of that size is expected to choose if its rows chose
    /// uniformly (`E · (1 - (1 - K/E)^batch)` a layer), and the KV cache rows the step
    /// reads. `None` for a dense model (its floor is its weights).
    pub fn routed_step_bytes(&self, batch: usize, context: usize) -> Option<u64> {
        let m = self.core.config.moe.as_ref()?;
        let (e, k) = (m.num_experts as f64, m.experts_per_token as f64);
        let chosen = e * (1.0 - (1.0 - k / e).powi(batch as i32));
        let routed: u64 = self
            .core
            .weights
            .layers
            .iter()
            .map(|l| match &l.mlp {
                GpuMlp::Experts(x) => 2 * (x.gate_up.len() + x.down.len()) as u64,
                GpuMlp::Dense { .. } => 0,
            })
            .sum();
        let read_routed = routed as f64 * chosen / e;
        let kv = self.kv_bytes_per_token() * (batch * context) as u64;
        Some(self.weight_bytes() - routed + read_routed as u64 + kv)
    }

    /// A zeroed KV cache of `num_blocks` blocks of `block_size` tokens for every layer,
    /// holding what the model's attention keeps (keys and values, or latent rows).
    pub fn new_cache(&self, num_blocks: u64, block_size: u64) -> Result<GpuKvCache, GpuError> {
        let c = &self.core.config;
        let layout = c.kv_layout(num_blocks, block_size);
        GpuKvCache::with_rows(&self.core.gpu, c.num_layers, layout, c.kv_rows())
    }
}

/// `plan` as model `c`'s attention needs it on `kernels`: under latent attention without a
/// prefill kernel for the device and shape, every sequence is cut into one-row sequences
/// (the split kernel runs decode rows only).
pub(crate) fn attention_plan(
    c: &ModelConfig,
    kernels: &CudaKernels,
    plan: DeviceAttentionPlan,
) -> DeviceAttentionPlan {
    match &c.mla {
        Some(m) if !runs_prefill(kernels, m.kv_lora_rank, m.kv_lora_rank + m.qk_rope_head_dim) => {
            plan.cutting_every_sequence()
        }
        _ => plan,
    }
}

/// The heads and per-head width of the split kernels' scratch records of model `c`: its
/// query heads of `head_dim`, or under latent attention of the latent.
pub(crate) fn scratch_heads(c: &ModelConfig) -> (usize, usize) {
    match &c.mla {
        Some(m) => (c.num_heads, m.kv_lora_rank),
        None => (c.num_heads, c.head_dim),
    }
}

/// Refuses what the GPU forward does not run: latent attention under `--deterministic`
/// (its per-head products go through cuBLAS, whose results are not batch-invariant).
fn check_supported(config: &ModelConfig, options: &GpuModelOptions) -> anyhow::Result<()> {
    if config.mla.is_some() && options.deterministic {
        anyhow::bail!(
            "--deterministic is not available for {:?} models on the GPU yet (latent \
             attention's per-head products are not batch-invariant there): use --device cpu \
             or leave --deterministic off",
            config.architecture
        );
    }
    Ok(())
}

//! DeepSeek-V3's multi-token prediction layer on the GPU (`cuda` feature), kernel for
//! kernel the CPU [`MtpHead`](super::MtpHead):
//!
//! ```text
//! e  = embed(x), 0 at position 0                              (one kernel)
//! g  = target_norm(h) at step 0 (h: the target's last-layer output), else pre
//! u  = cat(enorm(e), hnorm(g))                                 [T, 2H], two norms
//! y  = decoder block(eh_proj(u))   (the target's layer kinds)  pre = y
//! logits = shared_head.head(shared_head.norm(y))               [rows, vocab]
//! ```
//!
//! The layer is a [`GpuLayer`] run by the target's own layer code; its cache is one layer of
//! the target's kind (latent rows under MLA) in the blocks of the target's pool; its plan is
//! its own, staged over its own rows (never the target's padded one).

use super::MtpError;
use crate::config::ModelConfig;
use crate::draft_head::cuda::features::StagedFeatures;
use crate::draft_head::cuda::head::GpuDraftHead;
use crate::draft_head::cuda::DraftHeadKind;
use crate::eagle3::{DraftVocab, FeatureKind};
use crate::llama::cuda::{
    attention_plan, norm_into, project_logits, scratch_heads, to_device, GpuForwardError, GpuLayer,
    GpuModelOptions, LayerInput, LayerStep, LogitRows, RandomWeights, SharedEmbedding, Workspace,
};
use crate::llama::rotary_of;
use crate::weights::Weights;
use cudarc::driver::{CudaSlice, CudaView, DriverError};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_kernels::cuda::elementwise::{copy_columns, embedding_past_first};
use peregrine_kernels::cuda::gemm::Gemm;
use peregrine_kernels::cuda::norm::{rms_norm, rms_norm_columns};
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::attention::{
    AttentionError, DeviceAttentionPlan, GpuPagedAttention, RotaryTable,
};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::KvRows;
use peregrine_runtime::cuda::{Gpu, GpuError};
use std::path::Path;
use std::sync::Arc;

/// A multi-token prediction head on one GPU.
pub type GpuMtpHead = GpuDraftHead<MtpCore>;

/// A table the head reads: its own (the checkpoint stores one in the layer), or the
/// target's.
enum Table {
    Own(CudaSlice<bf16>),
    TargetEmbedding(SharedEmbedding),
    TargetHead(SharedEmbedding),
}

impl Table {
    fn view(&self) -> CudaView<'_, bf16> {
        match self {
            Table::Own(t) => t.as_view(),
            Table::TargetEmbedding(shared) => shared.table(),
            Table::TargetHead(shared) => shared.output_head(),
        }
    }
}

/// What every kernel of the head's forward reads and never writes; graphs hold it.
pub struct MtpCore {
    /// The target's configuration: the layer is of its shapes.
    config: ModelConfig,
    aux: [usize; 1],
    vocab: DraftVocab,
    gpu: Arc<Gpu>,
    kernels: Arc<CudaKernels>,
    embed: Table,
    lm_head: Table,
    /// The target's final norm, which its last-layer output goes through at step 0.
    target_norm: CudaSlice<bf16>,
    enorm: CudaSlice<bf16>,
    hnorm: CudaSlice<bf16>,
    /// `[H, 2H]`.
    eh_proj: CudaSlice<bf16>,
    layer: GpuLayer,
    head_norm: CudaSlice<bf16>,
    cos_sin: CudaSlice<f32>,
    interleaved: bool,
    attention: GpuPagedAttention,
    decode_kernel: DecodeKernel,
    gemm: Gemm,
}

/// The activations of one forward of the head, at its largest step.
pub struct MtpWorkspace {
    /// The layer's activations, logits `[logit rows, vocab]`, `pre` in the residual.
    work: Workspace,
    /// The staged target outputs (`[tokens, H]`) or `pre`; a step fed the target's
    /// outputs leaves its `g` in the `pre` buffer.
    features: StagedFeatures,
    /// f32 `[tokens, H]`: the tokens' embeddings.
    e: CudaSlice<f32>,
    /// bf16 `[tokens, 2H]`: `eh_proj`'s input.
    u: CudaSlice<bf16>,
}

impl MtpWorkspace {
    /// Buffers for `max_tokens` tokens and `max_logit_rows` logit rows.
    fn new(
        core: &MtpCore,
        max_tokens: usize,
        max_logit_rows: usize,
    ) -> Result<MtpWorkspace, GpuError> {
        let (gpu, t, h) = (&core.gpu, max_tokens, core.config.hidden_size);
        Ok(MtpWorkspace {
            work: Workspace::new(gpu, &core.config, t, max_logit_rows, &[])?,
            features: StagedFeatures::new(gpu, t, h, h)?,
            e: gpu.zeros(t * h)?,
            u: gpu.zeros(t * 2 * h)?,
        })
    }
}

/// The head's parameters but the rotary table and handles.
struct MtpParams {
    embed: Table,
    lm_head: Table,
    target_norm: CudaSlice<bf16>,
    enorm: CudaSlice<bf16>,
    hnorm: CudaSlice<bf16>,
    eh_proj: CudaSlice<bf16>,
    layer: GpuLayer,
    head_norm: CudaSlice<bf16>,
}

impl GpuDraftHead<MtpCore> {
    /// The first multi-token prediction layer of the checkpoint in `dir` (its
    /// `model.layers.{num_hidden_layers}.*`) for the target `target` onto `gpu`, reading
    /// the target's embedding table and output projection from `shared` unless the layer
    /// stores its own. Every shape is checked as the CPU [`MtpHead`](super::MtpHead)
    /// checks it.
    pub fn load(
        dir: &Path,
        target: &ModelConfig,
        shared: SharedEmbedding,
        gpu: Arc<Gpu>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
    ) -> anyhow::Result<GpuMtpHead> {
        if target.mtp_layers == 0 {
            return Err(MtpError::NoLayers.into());
        }
        let w = Weights::open(dir)?;
        let (l, h, vocab) = (target.num_layers, target.hidden_size, target.vocab_size);
        let p = format!("model.layers.{l}");
        let get = |name: &str, shape: &[usize]| -> anyhow::Result<CudaSlice<bf16>> {
            let values = w.f32(name, shape).map_err(MtpError::from)?;
            Ok(to_device(&gpu, &values)?)
        };
        let own = |name: &str, fallback: Table| -> anyhow::Result<Table> {
            let name = format!("{p}.{name}");
            Ok(match w.contains(&name) {
                true => Table::Own(get(&name, &[vocab, h])?),
                false => fallback,
            })
        };
        let params = MtpParams {
            embed: own(
                "embed_tokens.weight",
                Table::TargetEmbedding(shared.clone()),
            )?,
            lm_head: own("shared_head.head.weight", Table::TargetHead(shared))?,
            target_norm: get("model.norm.weight", &[h])?,
            enorm: get(&format!("{p}.enorm.weight"), &[h])?,
            hnorm: get(&format!("{p}.hnorm.weight"), &[h])?,
            eh_proj: get(&format!("{p}.eh_proj.weight"), &[h, 2 * h])?,
            layer: GpuLayer::load(&gpu, target, &w, l)?,
            head_norm: get(&format!("{p}.shared_head.norm.weight"), &[h])?,
        };
        GpuMtpHead::new(target, params, gpu, kernels, options)
    }

    /// A head for `target` with random weights made on the device from `seed` (the layer
    /// as [`GpuLayer::random`] makes it, `eh_proj` uniform in `±1/sqrt(2H)`, norm weights
    /// 1), reading the target's embedding table and output projection from `shared`: for
    /// benchmarks of checkpoints whose weights are not here.
    pub fn random(
        target: &ModelConfig,
        shared: SharedEmbedding,
        seed: u64,
        gpu: Arc<Gpu>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
    ) -> anyhow::Result<GpuMtpHead> {
        anyhow::ensure!(target.mtp_layers > 0, MtpError::NoLayers);
        let h = target.hidden_size;
        let mut r = RandomWeights::new(&gpu, &kernels, seed);
        let params = MtpParams {
            embed: Table::TargetEmbedding(shared.clone()),
            lm_head: Table::TargetHead(shared),
            target_norm: r.ones(h)?,
            enorm: r.ones(h)?,
            hnorm: r.ones(h)?,
            eh_proj: r.linear(h, 2 * h)?,
            layer: GpuLayer::random(&mut r, target, target.num_layers)?,
            head_norm: r.ones(h)?,
        };
        GpuMtpHead::new(target, params, gpu, kernels, options)
    }

    fn new(
        target: &ModelConfig,
        params: MtpParams,
        gpu: Arc<Gpu>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
    ) -> anyhow::Result<GpuMtpHead> {
        let c = target.clone();
        let rotary = rotary_of(&c);
        let cos_sin = gpu.upload(&rotary.cos_sin_table(u32::try_from(c.max_model_len)?))?;
        let identity = vec![0i64; c.vocab_size];
        let vocab = DraftVocab::from_d2t(&identity, c.vocab_size)
            .expect("the identity maps inside the vocabulary");
        let decode_kernel = options.decode_kernel();
        let core = MtpCore {
            aux: [c.num_layers],
            vocab,
            embed: params.embed,
            lm_head: params.lm_head,
            target_norm: params.target_norm,
            enorm: params.enorm,
            hnorm: params.hnorm,
            eh_proj: params.eh_proj,
            layer: params.layer,
            head_norm: params.head_norm,
            cos_sin,
            interleaved: rotary.is_interleaved(),
            attention: GpuPagedAttention {
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                scale: 1.0 / (c.head_dim as f32).sqrt(),
            },
            decode_kernel,
            gemm: options.gemm(&gpu)?,
            config: c,
            gpu: gpu.clone(),
            kernels,
        };
        GpuDraftHead::over(core, &options)
    }

    /// The target's configuration, whose shapes the head's layer has.
    pub fn config(&self) -> &ModelConfig {
        &self.core.config
    }

    /// Bytes of the head's own parameters (the target's tables it reads are not counted).
    pub fn weight_bytes(&self) -> u64 {
        let c = &self.core;
        let own = |t: &Table| match t {
            Table::Own(s) => 2 * s.len() as u64,
            _ => 0,
        };
        let small = [&c.target_norm, &c.enorm, &c.hnorm, &c.eh_proj, &c.head_norm];
        let small: u64 = small.iter().map(|s| 2 * s.len() as u64).sum();
        c.layer.bytes() + small + own(&c.embed) + own(&c.lm_head)
    }
}

impl DraftHeadKind for MtpCore {
    type Work = MtpWorkspace;
    const NAME: &'static str = "MTP head";

    fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn kernels(&self) -> &CudaKernels {
        &self.kernels
    }

    fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    /// The target's.
    fn vocab(&self) -> &DraftVocab {
        &self.vocab
    }

    /// The one target "layer" the head reads: layer `num_layers`'s input, the last
    /// layer's output.
    fn aux_layers(&self) -> &[usize] {
        &self.aux
    }

    /// The target's last-layer outputs and the head's own `pre` are both `H` wide.
    fn feature_width(&self, _kind: FeatureKind) -> usize {
        self.config.hidden_size
    }

    /// The target's.
    fn max_positions(&self) -> usize {
        self.config.max_model_len
    }

    /// One layer of the target's.
    fn kv_bytes_per_token(&self) -> u64 {
        let c = &self.config;
        c.kv_bytes_per_token(2) / c.num_layers.max(1) as u64
    }

    fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        self.config.kv_layout(num_blocks, block_size)
    }

    fn kv_rows(&self) -> KvRows {
        self.config.kv_rows()
    }

    fn decode_kernel(&self) -> DecodeKernel {
        self.decode_kernel
    }

    /// Under latent attention cut as the target's plans are ([`attention_plan`]).
    fn growing_plan(&self) -> Result<DeviceAttentionPlan, DriverError> {
        let plan = DeviceAttentionPlan::growing(&self.gpu, self.decode_kernel)?;
        Ok(attention_plan(&self.config, &self.kernels, plan))
    }

    /// Under latent attention cut as the target's plans are ([`attention_plan`]).
    fn fixed_plan(&self, capacity: PlanCapacity) -> Result<DeviceAttentionPlan, AttentionError> {
        let (heads, width) = scratch_heads(&self.config);
        let plan =
            DeviceAttentionPlan::fixed(&self.gpu, self.decode_kernel, capacity, heads, width)?;
        Ok(attention_plan(&self.config, &self.kernels, plan))
    }

    /// Room for the target's outputs whatever `features` says: they are `H` wide.
    fn work(
        &self,
        rows: usize,
        logit_rows: usize,
        _features: bool,
    ) -> anyhow::Result<MtpWorkspace> {
        Ok(MtpWorkspace::new(self, rows, logit_rows)?)
    }

    fn parts(work: &mut MtpWorkspace) -> (&mut Workspace, &mut StagedFeatures) {
        (&mut work.work, &mut work.features)
    }

    fn launch(
        &self,
        w: &mut MtpWorkspace,
        n: usize,
        r: usize,
        every_row: bool,
        kind: FeatureKind,
        dplan: &DeviceAttentionPlan,
        cache: &mut GpuKvCache,
    ) -> Result<(), GpuForwardError> {
        let c = &self.config;
        let (h, eps) = (c.hidden_size, c.rms_norm_eps as f32);
        let (k, stream, gemm) = (&*self.kernels, self.gpu.stream(), &self.gemm);
        let mut b = w.work.step(n);
        let (e, feature) = (
            &mut w.e.slice_mut(0..n * h),
            &mut w.features.pre.slice_mut(0..n * h),
        );
        let u = &mut w.u.slice_mut(0..n * 2 * h);

        let (tokens, positions) = (dplan.token_ids(), dplan.positions());
        embedding_past_first(k, stream, &tokens, &positions, &self.embed.view(), e, h)?;
        rms_norm_columns(
            k,
            stream,
            &e.as_view(),
            &self.enorm.as_view(),
            u,
            n,
            2 * h,
            eps,
        )?;
        if kind == FeatureKind::Aux {
            // g = target_norm(h), widened to f32 for hnorm.
            let aux = w.features.aux.slice(0..n * h);
            copy_columns(k, stream, &aux, h, feature, h, n, h)?;
            let norm = self.target_norm.as_view();
            rms_norm(k, stream, &feature.as_view(), &norm, &mut b.normed, n, eps)?;
            copy_columns(k, stream, &b.normed.as_view(), h, feature, h, n, h)?;
        }
        let u_g = &mut u.slice_mut(h..);
        let hnorm = self.hnorm.as_view();
        rms_norm_columns(k, stream, &feature.as_view(), &hnorm, u_g, n, 2 * h, eps)?;
        let eh_proj = self.eh_proj.as_view();
        gemm.linear(k, stream, &u.as_view(), &eh_proj, &mut b.delta, n, h)?;
        copy_columns(k, stream, &b.delta.as_view(), h, &mut b.residual, h, n, h)?;

        let layer = &self.layer;
        norm_into(k, stream, &mut b, true, &layer.input_norm.as_view(), n, eps)?;
        let cos_sin = self.cos_sin.as_view();
        let step = LayerStep {
            kernels: k,
            stream,
            gemm,
            config: c,
            attention: &self.attention,
            rotary: RotaryTable {
                cos_sin: &cos_sin,
                positions: c.max_model_len,
                interleaved: self.interleaved,
            },
            plan: dplan,
        };
        step.run(layer, &mut b, n, LayerInput::Normed, cache, 0)?;
        norm_into(k, stream, &mut b, false, &self.head_norm.as_view(), n, eps)?;
        let out = LogitRows {
            picked: b.picked,
            logits: b.logits,
            rows: r,
            every_row,
        };
        let head = self.lm_head.view();
        project_logits(k, stream, gemm, &b.normed.as_view(), h, &head, dplan, out)
    }
}

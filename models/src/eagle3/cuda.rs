//! An EAGLE-3 head on the GPU (`cuda` feature): the head's tensors in bf16 and its forward,
//! kernel for kernel the CPU [`Eagle3Head::forward`]; the greedy draft is chosen on the
//! device and only its id comes back.
//!
//! `u = cat(input_layernorm(e), hidden_norm(g))` is written by two norms into the two
//! halves of one `[T, 2H]` matrix; `g` (from `fc`, or the staged `pre`) is widened into the
//! f32 residual stream, which becomes `h1`, then `h2` (the next step's `pre`).

use super::{DraftVocab, Eagle3Config, Eagle3Head, FeatureKind};
use crate::draft_head::cuda::features::StagedFeatures;
use crate::draft_head::cuda::head::GpuDraftHead;
use crate::draft_head::cuda::DraftHeadKind;
use crate::llama::cuda::{
    attend, project_logits, to_device, GpuForwardError, GpuModelOptions, LayerKv, LogitRows,
    SharedEmbedding, Workspace, WorkspaceDims,
};
use crate::weights::Weights;
use crate::ModelConfig;
use cudarc::driver::{CudaSlice, CudaView, DriverError};
use half::bf16;
use peregrine_kernels::cpu::{KvLayout, Matrix};
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_kernels::cuda::elementwise::{copy_columns, embedding};
use peregrine_kernels::cuda::gemm::Gemm;
use peregrine_kernels::cuda::norm::{add_rms_norm, rms_norm_columns};
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::attention::{
    AttentionError, DeviceAttentionPlan, GpuPagedAttention, RotaryTable,
};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::{KvRows, Rotary, RotaryLayout};
use peregrine_runtime::cuda::{Gpu, GpuError};
use std::path::Path;
use std::sync::Arc;

/// An EAGLE-3 head on one GPU.
pub type GpuEagle3Head = GpuDraftHead<HeadCore>;

/// The head's embedding table: its own, or the target's.
enum HeadEmbedding {
    Own(CudaSlice<bf16>),
    Target(SharedEmbedding),
}

/// What every kernel of the head's forward reads and never writes; graphs hold it.
pub struct HeadCore {
    config: Eagle3Config,
    aux_layers: Vec<usize>,
    vocab: DraftVocab,
    gpu: Arc<Gpu>,
    kernels: Arc<CudaKernels>,
    embed: HeadEmbedding,
    fc: CudaSlice<bf16>,
    input_norm: CudaSlice<bf16>,
    hidden_norm: CudaSlice<bf16>,
    qkv: CudaSlice<bf16>,
    o_proj: CudaSlice<bf16>,
    post_norm: CudaSlice<bf16>,
    gate_up: CudaSlice<bf16>,
    down: CudaSlice<bf16>,
    norm: CudaSlice<bf16>,
    lm_head: CudaSlice<bf16>,
    cos_sin: CudaSlice<f32>,
    /// Positions the rotary table holds.
    positions: usize,
    interleaved: bool,
    attention: GpuPagedAttention,
    decode_kernel: DecodeKernel,
    gemm: Gemm,
}

/// The activations of one forward of the head, at its largest step.
pub struct HeadWorkspace {
    /// The decoder layer's activations, logits `[logit rows, V_d]`.
    work: Workspace,
    /// The staged target features (`[tokens, fc_in]`) or `pre`.
    features: StagedFeatures,
    /// bf16 `[tokens, H]`: `fc`'s output.
    g: CudaSlice<bf16>,
    /// f32 `[tokens, H]`: the tokens' embeddings.
    e: CudaSlice<f32>,
    /// bf16 `[tokens, 2H]`: the layer's input.
    u: CudaSlice<bf16>,
}

impl HeadWorkspace {
    /// Buffers for `max_tokens` tokens and `max_logit_rows` logit rows; room for target
    /// features only when `aux` (graphs run steps fed `pre`).
    fn new(
        core: &HeadCore,
        max_tokens: usize,
        max_logit_rows: usize,
        aux: bool,
    ) -> Result<HeadWorkspace, GpuError> {
        let c = &core.config;
        let (gpu, t, h) = (&core.gpu, max_tokens, c.hidden_size);
        let dims = WorkspaceDims {
            hidden: h,
            head_dim: c.head_dim,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            intermediate: c.intermediate_size,
            vocab: c.draft_vocab_size,
        };
        let fc_in = if aux { core.fc.len() / h } else { 0 };
        Ok(HeadWorkspace {
            work: Workspace::with_dims(gpu, dims, max_tokens, max_logit_rows)?,
            features: StagedFeatures::new(gpu, t, fc_in, h)?,
            g: gpu.zeros(t * h)?,
            e: gpu.zeros(t * h)?,
            u: gpu.zeros(t * 2 * h)?,
        })
    }
}

impl GpuDraftHead<HeadCore> {
    /// Loads the head in `dir` for `target` onto `gpu`, reading the target's embedding
    /// table from `target_embed` when the head has none of its own. The tensors are read
    /// and checked as [`Eagle3Head::from_weights`] does, then converted to bf16.
    pub fn load(
        dir: &Path,
        target: &ModelConfig,
        target_embed: SharedEmbedding,
        gpu: Arc<Gpu>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
    ) -> anyhow::Result<GpuEagle3Head> {
        let config = Eagle3Config::from_dir(dir)?;
        let weights = Weights::open(dir)?;
        let own = weights.contains("embed_tokens.weight");
        // The target's table stays on the device: the host head gets none.
        let host = Eagle3Head::from_weights(
            config,
            &weights,
            target,
            Arc::new(Matrix::empty(target.hidden_size)),
        )?;
        let embed = if own {
            HeadEmbedding::Own(to_device(&gpu, &host.weights.embed.to_f32())?)
        } else {
            HeadEmbedding::Target(target_embed)
        };
        GpuEagle3Head::new(&host, embed, target.max_model_len, gpu, kernels, options)
    }

    /// The head `host` (whose embedding table must be its own) on `gpu`, with a rotary
    /// table of `max_positions` positions: for tests that compare the two.
    pub fn from_host(
        host: &Eagle3Head,
        max_positions: usize,
        gpu: Arc<Gpu>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
    ) -> anyhow::Result<GpuEagle3Head> {
        let embed = HeadEmbedding::Own(to_device(&gpu, &host.weights.embed.to_f32())?);
        GpuEagle3Head::new(host, embed, max_positions, gpu, kernels, options)
    }

    fn new(
        host: &Eagle3Head,
        embed: HeadEmbedding,
        max_positions: usize,
        gpu: Arc<Gpu>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
    ) -> anyhow::Result<GpuEagle3Head> {
        let c = host.config.clone();
        let w = &*host.weights;
        let up = |values: &[f32]| to_device(&gpu, values);
        let rotary = Rotary::new(
            c.head_dim,
            c.rope_theta,
            &c.rope_scaling,
            RotaryLayout::HalfSplit,
        );
        let positions = max_positions.max(c.max_model_len);
        let cos_sin = gpu.upload(&rotary.cos_sin_table(u32::try_from(positions)?))?;
        let gemm = options.gemm(&gpu)?;
        let decode_kernel = options.decode_kernel();
        let core = HeadCore {
            aux_layers: host.aux_layers.clone(),
            vocab: host.vocab.clone(),
            embed,
            fc: up(&w.fc.weight())?,
            input_norm: up(w.input_norm.weight())?,
            hidden_norm: up(w.hidden_norm.weight())?,
            qkv: up(&w.qkv.weight())?,
            o_proj: up(&w.o_proj.weight())?,
            post_norm: up(w.post_norm.weight())?,
            gate_up: up(&w.gate_up.weight())?,
            down: up(&w.down.weight())?,
            norm: up(w.norm.weight())?,
            lm_head: up(&w.lm_head.weight())?,
            cos_sin,
            positions,
            interleaved: rotary.is_interleaved(),
            attention: GpuPagedAttention {
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                scale: 1.0 / (c.head_dim as f32).sqrt(),
            },
            decode_kernel,
            gemm,
            config: c,
            gpu: gpu.clone(),
            kernels,
        };
        GpuDraftHead::over(core, &options)
    }

    /// The head's configuration.
    pub fn config(&self) -> &Eagle3Config {
        &self.core.config
    }
}

impl HeadCore {
    /// The embedding table the head reads.
    fn embedding(&self) -> CudaView<'_, bf16> {
        match &self.embed {
            HeadEmbedding::Own(table) => table.as_view(),
            HeadEmbedding::Target(shared) => shared.table(),
        }
    }
}

impl DraftHeadKind for HeadCore {
    type Work = HeadWorkspace;
    const NAME: &'static str = "EAGLE-3 head";

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

    fn vocab(&self) -> &DraftVocab {
        &self.vocab
    }

    fn aux_layers(&self) -> &[usize] {
        &self.aux_layers
    }

    fn feature_width(&self, kind: FeatureKind) -> usize {
        match kind {
            FeatureKind::Aux => self.fc.len() / self.config.hidden_size,
            FeatureKind::Pre => self.config.hidden_size,
        }
    }

    /// Its rotary table's: the longer of its own context and the target's.
    fn max_positions(&self) -> usize {
        self.positions
    }

    fn kv_bytes_per_token(&self) -> u64 {
        let c = &self.config;
        (2 * c.num_kv_heads * c.head_dim * 2) as u64
    }

    fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        self.config.kv_layout(num_blocks, block_size)
    }

    fn kv_rows(&self) -> KvRows {
        KvRows::KeysAndValues
    }

    fn decode_kernel(&self) -> DecodeKernel {
        self.decode_kernel
    }

    fn growing_plan(&self) -> Result<DeviceAttentionPlan, DriverError> {
        DeviceAttentionPlan::growing(&self.gpu, self.decode_kernel)
    }

    fn fixed_plan(&self, capacity: PlanCapacity) -> Result<DeviceAttentionPlan, AttentionError> {
        let c = &self.config;
        DeviceAttentionPlan::fixed(
            &self.gpu,
            self.decode_kernel,
            capacity,
            c.num_heads,
            c.head_dim,
        )
    }

    fn work(
        &self,
        rows: usize,
        logit_rows: usize,
        features: bool,
    ) -> anyhow::Result<HeadWorkspace> {
        Ok(HeadWorkspace::new(self, rows, logit_rows, features)?)
    }

    fn parts(work: &mut HeadWorkspace) -> (&mut Workspace, &mut StagedFeatures) {
        (&mut work.work, &mut work.features)
    }

    fn launch(
        &self,
        w: &mut HeadWorkspace,
        n: usize,
        r: usize,
        every_row: bool,
        kind: FeatureKind,
        dplan: &DeviceAttentionPlan,
        cache: &mut GpuKvCache,
    ) -> Result<(), GpuForwardError> {
        let c = &self.config;
        let (h, d, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let width = qd + 2 * kvd;
        let eps = c.rms_norm_eps as f32;
        let (k, stream, gemm) = (&*self.kernels, self.gpu.stream(), &self.gemm);
        let mut b = w.work.step(n);
        let (residual, normed, delta) = (&mut b.residual, &mut b.normed, &mut b.delta);
        let (qkv, attn) = (&mut b.qkv, &mut b.attn);
        let (gate_up, act) = (&mut b.gate_up, &mut b.act);
        let u = &mut w.u.slice_mut(0..n * 2 * h);

        // g into the residual stream, in f32.
        match kind {
            FeatureKind::Aux => {
                let fc_in = self.feature_width(kind);
                let g = &mut w.g.slice_mut(0..n * h);
                let aux = w.features.aux.slice(0..n * fc_in);
                gemm.linear(k, stream, &aux, &self.fc.as_view(), g, n, h)?;
                copy_columns(k, stream, &g.as_view(), h, residual, h, n, h)?;
            }
            FeatureKind::Pre => {
                let pre = w.features.pre.slice(0..n * h);
                copy_columns(k, stream, &pre, h, residual, h, n, h)?;
            }
        }
        let e = &mut w.e.slice_mut(0..n * h);
        embedding(k, stream, &dplan.token_ids(), &self.embedding(), e, h)?;
        let input_norm = self.input_norm.as_view();
        rms_norm_columns(k, stream, &e.as_view(), &input_norm, u, n, 2 * h, eps)?;
        let hidden_norm = self.hidden_norm.as_view();
        let u_g = &mut u.slice_mut(h..);
        rms_norm_columns(
            k,
            stream,
            &residual.as_view(),
            &hidden_norm,
            u_g,
            n,
            2 * h,
            eps,
        )?;
        if c.norm_before_residual {
            // The residual stream starts from hidden_norm(g) rather than g.
            let g_normed = u.slice(h..);
            copy_columns(k, stream, &g_normed, 2 * h, residual, h, n, h)?;
        }
        gemm.linear(k, stream, &u.as_view(), &self.qkv.as_view(), qkv, n, width)?;
        let cos_sin = self.cos_sin.as_view();
        let rotary = RotaryTable {
            cos_sin: &cos_sin,
            positions: self.positions,
            interleaved: self.interleaved,
        };
        let kv = LayerKv::of(cache, 0);
        let attention = &self.attention;
        attend(k, stream, attention, qkv, width, rotary, kv, dplan, attn)?;
        let o_proj = self.o_proj.as_view();
        gemm.linear(k, stream, &attn.as_view(), &o_proj, delta, n, h)?;
        let post = self.post_norm.as_view();
        add_rms_norm(k, stream, residual, &delta.as_view(), &post, normed, n, eps)?;
        let gu = self.gate_up.as_view();
        gemm.gate_up_act(k, stream, &normed.as_view(), &gu, gate_up, act, n, inter)?;
        let down = self.down.as_view();
        gemm.linear(k, stream, &act.as_view(), &down, delta, n, h)?;
        let norm = self.norm.as_view();
        add_rms_norm(k, stream, residual, &delta.as_view(), &norm, normed, n, eps)?;
        let out = LogitRows {
            picked: b.picked,
            logits: b.logits,
            rows: r,
            every_row,
        };
        let head = self.lm_head.as_view();
        project_logits(k, stream, gemm, &normed.as_view(), h, &head, dplan, out)
    }
}

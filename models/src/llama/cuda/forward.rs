//! The forward pass on the GPU, kernel for kernel the CPU `LlamaModel::forward`.

use super::step::{LayerInput, LayerStep};
use super::{GpuLlama, LlamaCore, StepBuffers, Workspace};
use crate::config::ModelConfig;
use crate::llama::{check_inputs, ForwardError};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::elementwise::{copy_columns, embedding, gather_rows};
use peregrine_kernels::cuda::gemm::{Gemm, GemmError};
use peregrine_kernels::cuda::norm::{add_rms_norm, rms_norm};
use peregrine_kernels::cuda::sampling::ArgmaxCopies;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::attention::{
    write_kv, AttentionError, DeviceAttentionPlan, GpuPagedAttention, RotaryTable,
};
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::{AttentionPlan, KvRows};
use peregrine_runtime::cuda::GpuError;

/// A GPU forward pass that cannot run, with the reason.
#[derive(Debug, thiserror::Error)]
pub enum GpuForwardError {
    #[error(transparent)]
    Input(#[from] ForwardError),
    #[error("{tokens} tokens exceed the workspace of {max} tokens")]
    TooManyTokens { tokens: usize, max: usize },
    #[error("{rows} logit rows exceed the workspace of {max}")]
    TooManyLogitRows { rows: usize, max: usize },
    #[error("position {position} is past the model's {max} positions")]
    Position { position: u32, max: usize },
    #[error("the KV cache has {cache} layers but the model {model}")]
    CacheLayers { cache: usize, model: usize },
    #[error("the KV cache holds {cache:?} but the model's attention needs {model:?}")]
    CacheRows { cache: KvRows, model: KvRows },
    #[error(transparent)]
    Attention(#[from] AttentionError),
    #[error(transparent)]
    Gemm(#[from] GemmError),
    #[error("CUDA: {0}")]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Ring(#[from] crate::eagle3::feature_ring::RingError),
    #[error("features in a feature ring were given to a head that reads none")]
    NoFeatureRing,
    #[error("the step's grammar masks: {0}")]
    Masks(String),
    #[error("handing on the step's layer inputs: {0}")]
    HandOff(String),
    #[error("drafts handed off on the device: {0}")]
    Drafts(#[from] crate::draft_head::cuda::hand_off::HandOffError),
}

impl GpuLlama {
    /// Runs `tokens` (one per planned row) through the model, writing their keys and values
    /// into `cache`, and returns the device logits (`[logit_rows.len(), vocab]`, f32) of the
    /// rows named in `logit_rows`. The work is queued on the model's stream; reading the
    /// view (a download) waits for it.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        cache: &mut GpuKvCache,
        logit_rows: &[usize],
    ) -> Result<CudaView<'_, f32>, GpuForwardError> {
        let core = &*self.core;
        let c = &core.config;
        check_inputs(tokens, plan, logit_rows, c.vocab_size)?;
        let (n, r) = (tokens.len(), logit_rows.len());
        let w = &mut self.work;
        check_step(c, w, n, r, plan.positions().iter().max().copied(), cache)?;
        self.plan.stage(tokens, plan, logit_rows)?;
        let every_row = logit_rows.iter().copied().eq(0..n);
        core.launch(w, n, r, every_row, &self.plan, cache)?;
        Ok(w.logits.slice(0..r * c.vocab_size))
    }

    /// [`GpuLlama::forward`], then [`GpuLlama::last_argmax`] of its logit rows.
    pub fn forward_argmax(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        cache: &mut GpuKvCache,
        logit_rows: &[usize],
    ) -> Result<Vec<u32>, GpuForwardError> {
        self.forward(tokens, plan, cache, logit_rows)?;
        self.last_argmax(logit_rows.len())
    }

    /// The argmax (the lowest id among ties) of the first `rows` logit rows of the last
    /// forward, on the device, into buffers kept from step to step: only the ids come to
    /// the host.
    pub fn last_argmax(&mut self, rows: usize) -> Result<Vec<u32>, GpuForwardError> {
        if rows > self.work.max_logit_rows {
            return Err(GpuForwardError::TooManyLogitRows {
                rows,
                max: self.work.max_logit_rows,
            });
        }
        self.core.argmax(&mut self.work, rows)?;
        Ok(self.core.gpu.download(&self.work.ids.slice(0..rows))?)
    }

    /// The logits of the first `rows` logit rows of the last forward, `[rows, vocab]` f32.
    pub fn last_logits(&self, rows: usize) -> CudaView<'_, f32> {
        let rows = rows.min(self.work.max_logit_rows);
        self.work
            .logits
            .slice(0..rows * self.core.config.vocab_size)
    }

    /// [`GpuLlama::forward`] with the logits copied to the host.
    pub fn forward_to_host(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        cache: &mut GpuKvCache,
        logit_rows: &[usize],
    ) -> Result<Vec<f32>, GpuForwardError> {
        let gpu = self.gpu().clone();
        let logits = self.forward(tokens, plan, cache, logit_rows)?;
        Ok(gpu.download(&logits)?)
    }
}

/// Refuses a step of `n` tokens and `r` logit rows that the workspace `w` cannot hold, a
/// position past the model's, or a cache of another depth.
pub(super) fn check_step(
    c: &ModelConfig,
    w: &Workspace,
    n: usize,
    r: usize,
    max_position: Option<u32>,
    cache: &GpuKvCache,
) -> Result<(), GpuForwardError> {
    if n > w.max_tokens {
        return Err(GpuForwardError::TooManyTokens {
            tokens: n,
            max: w.max_tokens,
        });
    }
    if r > w.max_logit_rows {
        return Err(GpuForwardError::TooManyLogitRows {
            rows: r,
            max: w.max_logit_rows,
        });
    }
    if let Some(position) = max_position.filter(|&p| p as usize >= c.max_model_len) {
        return Err(GpuForwardError::Position {
            position,
            max: c.max_model_len,
        });
    }
    if cache.num_layers() != c.num_layers {
        return Err(GpuForwardError::CacheLayers {
            cache: cache.num_layers(),
            model: c.num_layers,
        });
    }
    if cache.rows() != c.kv_rows() {
        return Err(GpuForwardError::CacheRows {
            cache: cache.rows(),
            model: c.kv_rows(),
        });
    }
    Ok(())
}

impl LlamaCore {
    /// Queues the argmax of the first `rows` rows of `w.logits` into `w.ids`.
    pub(super) fn argmax(&self, w: &mut Workspace, rows: usize) -> Result<(), GpuForwardError> {
        self.argmax_copying(w, rows, ArgmaxCopies::default())
    }

    /// [`LlamaCore::argmax`], each id also written where `copies` says.
    pub(super) fn argmax_copying(
        &self,
        w: &mut Workspace,
        rows: usize,
        copies: ArgmaxCopies,
    ) -> Result<(), GpuForwardError> {
        let vocab = self.config.vocab_size;
        w.argmax_copying(&self.kernels, self.gpu.stream(), rows, vocab, copies)
    }

    /// Queues the forward of the `n` rows staged in `dplan` (the plan's own rows, or a
    /// captured size it is padded to), leaving the logits of its `r` logit rows in
    /// `w.logits`; `every_row` says that they are all `n` rows in order (a decode step), so
    /// that the final hidden states need no gather. Reads no host value of the step but its sizes, so a
    /// graph captured from it serves every step staged into the same buffers.
    pub(super) fn launch(
        &self,
        w: &mut Workspace,
        n: usize,
        r: usize,
        every_row: bool,
        dplan: &DeviceAttentionPlan,
        cache: &mut GpuKvCache,
    ) -> Result<(), GpuForwardError> {
        assert!(
            !every_row || r == n,
            "every row's logits, but {r} of {n} rows"
        );
        let c = &self.config;
        let (h, eps) = (c.hidden_size, c.rms_norm_eps as f32);
        let (k, stream, gemm) = (&*self.kernels, self.gpu.stream(), &self.gemm);
        let weights = &self.weights;

        let mut b = w.step(n);
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
        let embed = weights.embed.as_view();
        embedding(k, stream, &dplan.token_ids(), &embed, &mut b.residual, h)?;
        // One-row decode steps of the Llama family fold each RMSNorm into the product after
        // it and each residual add into the product before it (Gemm::fuses_norms): the
        // residual stream then always holds the next norm's input. Latent attention and
        // mixtures read a normed activation.
        let plain = c.mla.is_none() && c.moe.is_none();
        let fused = plain && gemm.fuses_norms(n);
        let input = if fused {
            LayerInput::Fused
        } else {
            LayerInput::Normed
        };
        for (l, layer) in weights.layers.iter().enumerate() {
            let norm = layer.input_norm.as_view();
            if !fused {
                norm_into(k, stream, &mut b, l == 0, &norm, n, eps)?;
            }
            // The residual now holds the layer's input: recorded where asked.
            record_input(k, stream, &mut b, l, n, h)?;
            step.run(layer, &mut b, n, input, cache, l)?;
        }
        let final_norm = weights.norm.as_view();
        norm_into(k, stream, &mut b, fused, &final_norm, n, eps)?;
        // "The input of layer `num_layers`": the last layer's output, before the final norm.
        record_input(k, stream, &mut b, c.num_layers, n, h)?;
        let head = weights.lm_head.as_ref().unwrap_or(&weights.embed).as_view();
        let out = LogitRows {
            picked: b.picked,
            logits: b.logits,
            rows: r,
            every_row,
        };
        project_logits(k, stream, gemm, &b.normed.as_view(), h, &head, dplan, out)
    }
}

/// Queues `normed = norm(residual)` of the first `n` rows of `b` under `weight`, after
/// `residual += delta` unless `first` (the residual holds the whole sum already).
pub(crate) fn norm_into(
    k: &CudaKernels,
    stream: &CudaStream,
    b: &mut StepBuffers,
    first: bool,
    weight: &CudaView<bf16>,
    n: usize,
    eps: f32,
) -> Result<(), GpuForwardError> {
    let (residual, normed) = (&mut b.residual, &mut b.normed);
    if first {
        rms_norm(k, stream, &residual.as_view(), weight, normed, n, eps)?;
    } else {
        add_rms_norm(
            k,
            stream,
            residual,
            &b.delta.as_view(),
            weight,
            normed,
            n,
            eps,
        )?;
    }
    Ok(())
}

/// Copies the residual stream of the first `n` rows of `b` (rows of `h`) into the columns
/// of every recorded layer that is `layer`, where `b` records layer inputs.
fn record_input(
    k: &CudaKernels,
    stream: &CudaStream,
    b: &mut StepBuffers,
    layer: usize,
    n: usize,
    h: usize,
) -> Result<(), GpuForwardError> {
    let Some(aux) = b.aux.as_deref_mut() else {
        return Ok(());
    };
    let stride = aux.layers.len() * h;
    for j in (0..aux.layers.len()).filter(|&j| aux.layers[j] == layer) {
        let dst = &mut aux.states.slice_mut(j * h..n * stride);
        copy_columns(k, stream, &b.residual.as_view(), h, dst, stride, n, h)?;
    }
    Ok(())
}

/// One layer's KV cache and its layout.
pub(crate) struct LayerKv<'a> {
    pub k_cache: &'a mut CudaSlice<bf16>,
    pub v_cache: &'a mut CudaSlice<bf16>,
    pub layout: KvLayout,
}

impl LayerKv<'_> {
    /// Layer `layer` of `cache`.
    pub(crate) fn of(cache: &mut GpuKvCache, layer: usize) -> LayerKv<'_> {
        let layout = *cache.layout();
        let (k_cache, v_cache) = cache.layer_mut(layer);
        LayerKv {
            k_cache,
            v_cache,
            layout,
        }
    }
}

/// Writes the keys and values of the `qkv` rows (`[rows, width]`, rotary applied to q and
/// k in place) into `kv` and queues their attention over it into `attn`: in one launch
/// where the plan says the split kernel writes them (a decode step), else a write then the
/// attention.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    k: &CudaKernels,
    stream: &CudaStream,
    attention: &GpuPagedAttention,
    qkv: &mut CudaViewMut<bf16>,
    width: usize,
    rotary: RotaryTable,
    kv: LayerKv,
    dplan: &DeviceAttentionPlan,
    attn: &mut CudaViewMut<bf16>,
) -> Result<(), GpuForwardError> {
    let LayerKv {
        k_cache,
        v_cache,
        layout,
    } = kv;
    let layout = &layout;
    if dplan.fuses_kv_write() {
        let qkv = &qkv.as_view();
        let rot = Some(rotary);
        attention.forward_writing_kv(
            k, stream, qkv, width, rot, k_cache, v_cache, layout, dplan, attn,
        )?;
    } else {
        let heads = attention.num_heads;
        let rot = Some(rotary);
        write_kv(
            k, stream, qkv, width, heads, rot, k_cache, v_cache, layout, dplan,
        )?;
        let q = qkv.as_view();
        attention.forward(k, stream, &q, width, k_cache, v_cache, layout, dplan, attn)?;
    }
    Ok(())
}

/// Where the logits of a forward go: `rows` rows into `logits`, through `picked` unless
/// `every_row` (the rows are every staged row, in order: no gather).
pub(crate) struct LogitRows<'a> {
    pub picked: &'a mut CudaSlice<bf16>,
    pub logits: &'a mut CudaSlice<f32>,
    pub rows: usize,
    pub every_row: bool,
}

/// Queues `logits = normed[logit rows] · headᵀ` (f32) for rows of `h`, the logit rows
/// staged in `dplan`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn project_logits(
    k: &CudaKernels,
    stream: &CudaStream,
    gemm: &Gemm,
    normed: &CudaView<bf16>,
    h: usize,
    head: &CudaView<bf16>,
    dplan: &DeviceAttentionPlan,
    out: LogitRows,
) -> Result<(), GpuForwardError> {
    let r = out.rows;
    let vocab = head.len() / h;
    let logits = &mut out.logits.slice_mut(0..r * vocab);
    if out.every_row {
        gemm.linear(k, stream, normed, head, logits, r, vocab)?;
    } else {
        let picked = &mut out.picked.slice_mut(0..r * h);
        gather_rows(k, stream, normed, &dplan.logit_rows(), picked, h)?;
        gemm.linear(k, stream, &picked.as_view(), head, logits, r, vocab)?;
    }
    Ok(())
}

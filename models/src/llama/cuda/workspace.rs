//! The activation buffers of one forward, allocated once at the largest step and viewed
//! per step, so a step allocates nothing and its peak memory is known at start-up.

use super::experts::ExpertBuffers;
use super::latent::LatentBuffers;
use super::GpuForwardError;
use crate::config::ModelConfig;
use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut};
use half::bf16;
use peregrine_kernels::cuda::sampling::{
    argmax_partials, sample_argmax_into, sample_mask, ArgmaxCopies,
};
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::sampler::mask_layout;
use peregrine_ops::sampling::TokenMask;
use peregrine_runtime::cuda::{Gpu, GpuError};
use std::sync::Arc;

/// The widths a workspace is sized by.
#[derive(Clone, Copy, Debug)]
pub struct WorkspaceDims {
    pub hidden: usize,
    pub head_dim: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    /// Logits per row.
    pub vocab: usize,
}

impl WorkspaceDims {
    /// The widths of model `c`.
    pub fn of(c: &ModelConfig) -> WorkspaceDims {
        WorkspaceDims {
            hidden: c.hidden_size,
            head_dim: c.head_dim,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            intermediate: c.intermediate_size,
            vocab: c.vocab_size,
        }
    }
}

impl WorkspaceDims {
    /// The device bytes [`Workspace::with_dims`] allocates for `max_tokens` tokens and
    /// `max_logit_rows` logit rows (what [`Workspace::bytes`] then reports): known before
    /// anything is allocated, so a step too large for the device is refused first.
    pub fn bytes(&self, max_tokens: usize, max_logit_rows: usize) -> u64 {
        let (t, r) = (max_tokens as u64, max_logit_rows as u64);
        let (h, d) = (self.hidden as u64, self.head_dim as u64);
        let (qd, kvd) = (self.heads as u64 * d, self.kv_heads as u64 * d);
        let (inter, vocab) = (self.intermediate as u64, self.vocab as u64);
        // normed, qkv, attn, delta, gate_up, act per token; picked per logit row.
        let b16 = t
            .saturating_mul(h + (qd + 2 * kvd) + qd + h + 2 * inter + inter)
            .saturating_add(r.saturating_mul(h));
        // residual per token; logits per logit row.
        let f32s = t.saturating_mul(h).saturating_add(r.saturating_mul(vocab));
        let partials = argmax_partials(max_logit_rows, self.vocab) as u64;
        b16.saturating_mul(2)
            .saturating_add(f32s.saturating_mul(4))
            .saturating_add(4 * r + 8 * partials)
    }
}

/// A forward's views of a [`Workspace`] (see [`Workspace::step`]).
pub struct StepBuffers<'a> {
    pub residual: CudaViewMut<'a, f32>,
    pub normed: CudaViewMut<'a, bf16>,
    pub delta: CudaViewMut<'a, bf16>,
    pub qkv: CudaViewMut<'a, bf16>,
    pub attn: CudaViewMut<'a, bf16>,
    pub gate_up: CudaViewMut<'a, bf16>,
    pub act: CudaViewMut<'a, bf16>,
    /// Whole: the logit rows are counted apart from the forward's rows.
    pub picked: &'a mut CudaSlice<bf16>,
    pub logits: &'a mut CudaSlice<f32>,
    pub aux: Option<&'a mut AuxStates>,
    /// Whole, sliced by the forward: latent attention's and the mixture's activations.
    pub latent: Option<&'a mut LatentBuffers>,
    pub experts: Option<&'a mut ExpertBuffers>,
}

/// The inputs of some layers, recorded for every row of a forward (the target features of
/// an EAGLE-3 head).
pub struct AuxStates {
    /// The recorded layers, in the order of their columns.
    pub layers: Vec<usize>,
    /// f32 `[tokens, layers.len() * hidden]`: row r holds each layer's input of row r.
    pub states: CudaSlice<f32>,
}

/// Activations for up to `max_tokens` tokens and `max_logit_rows` logit rows.
pub struct Workspace {
    pub max_tokens: usize,
    pub max_logit_rows: usize,
    /// The widths the buffers were sized by.
    pub dims: WorkspaceDims,
    /// Residual stream, f32 `[tokens, hidden]`.
    pub residual: CudaSlice<f32>,
    /// Normed activations, `[tokens, hidden]`.
    pub normed: CudaSlice<bf16>,
    /// Fused q/k/v projections, `[tokens, q + k + v]`.
    pub qkv: CudaSlice<bf16>,
    /// Attention output, `[tokens, q]`.
    pub attn: CudaSlice<bf16>,
    /// Output of o_proj or down, `[tokens, hidden]`.
    pub delta: CudaSlice<bf16>,
    /// Fused gate/up projections, `[tokens, 2 * intermediate]`.
    pub gate_up: CudaSlice<bf16>,
    /// The MLP activation, `[tokens, intermediate]`.
    pub act: CudaSlice<bf16>,
    /// Final-normed hidden states of those rows, `[logit rows, hidden]`.
    pub picked: CudaSlice<bf16>,
    /// Logits, f32 `[logit rows, vocab]`.
    pub logits: CudaSlice<f32>,
    /// The argmax of each logit row.
    pub ids: CudaSlice<u32>,
    /// The argmax's per-chunk partial results.
    pub partials: CudaSlice<u64>,
    /// The recorded layer inputs, when the forward records some.
    pub aux: Option<AuxStates>,
    /// Latent attention's activations, for a model that has it.
    pub latent: Option<LatentBuffers>,
    /// The mixture's activations, for a model that has one.
    pub experts: Option<ExpertBuffers>,
}

impl Workspace {
    /// Allocates the buffers for `c`, recording the inputs of `aux_layers` (none when empty).
    pub fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        max_tokens: usize,
        max_logit_rows: usize,
        aux_layers: &[usize],
    ) -> Result<Workspace, GpuError> {
        let mut work = Workspace::with_dims(gpu, WorkspaceDims::of(c), max_tokens, max_logit_rows)?;
        work.record(gpu, aux_layers, c.hidden_size)?;
        if c.mla.is_some() {
            work.latent = Some(LatentBuffers::new(gpu, c, max_tokens)?);
        }
        if c.moe.is_some() {
            work.experts = Some(ExpertBuffers::new(gpu, c, max_tokens)?);
        }
        Ok(work)
    }

    /// The device bytes [`Workspace::new`] allocates for model `c` (less recorded layer
    /// inputs): known before anything is allocated.
    pub fn bytes_for(c: &ModelConfig, max_tokens: usize, max_logit_rows: usize) -> u64 {
        let latent = if c.mla.is_some() {
            LatentBuffers::bytes_for(c, max_tokens)
        } else {
            0
        };
        let experts = if c.moe.is_some() {
            ExpertBuffers::bytes_for(c, max_tokens)
        } else {
            0
        };
        WorkspaceDims::of(c)
            .bytes(max_tokens, max_logit_rows)
            .saturating_add(latent)
            .saturating_add(experts)
    }

    /// From now on the forward records the inputs of `layers` (none when empty) into
    /// buffers for rows of `hidden`, replacing those it recorded before.
    pub fn record(&mut self, gpu: &Gpu, layers: &[usize], hidden: usize) -> Result<(), GpuError> {
        self.aux = None;
        if !layers.is_empty() {
            self.aux = Some(AuxStates {
                layers: layers.to_vec(),
                states: gpu.zeros(self.max_tokens * layers.len() * hidden)?,
            });
        }
        Ok(())
    }

    /// Allocates the buffers for widths `dims`, recording no layer.
    pub fn with_dims(
        gpu: &Gpu,
        dims: WorkspaceDims,
        max_tokens: usize,
        max_logit_rows: usize,
    ) -> Result<Workspace, GpuError> {
        let t = max_tokens;
        let WorkspaceDims {
            hidden: h,
            head_dim: d,
            heads,
            kv_heads,
            intermediate: inter,
            vocab,
        } = dims;
        let (qd, kvd) = (heads * d, kv_heads * d);
        Ok(Workspace {
            max_tokens,
            max_logit_rows,
            dims,
            residual: gpu.zeros(t * h)?,
            normed: gpu.zeros(t * h)?,
            qkv: gpu.zeros(t * (qd + 2 * kvd))?,
            attn: gpu.zeros(t * qd)?,
            delta: gpu.zeros(t * h)?,
            gate_up: gpu.zeros(t * 2 * inter)?,
            act: gpu.zeros(t * inter)?,
            picked: gpu.zeros(max_logit_rows * h)?,
            logits: gpu.zeros(max_logit_rows * vocab)?,
            ids: gpu.zeros(max_logit_rows)?,
            partials: gpu.zeros(argmax_partials(max_logit_rows, vocab))?,
            aux: None,
            latent: None,
            experts: None,
        })
    }

    /// The views of a forward of `n` rows, each buffer its own, so that the kernels of the
    /// forward can read one and write another.
    pub fn step(&mut self, n: usize) -> StepBuffers<'_> {
        let WorkspaceDims {
            hidden: h,
            head_dim: d,
            heads,
            kv_heads,
            intermediate: inter,
            ..
        } = self.dims;
        let (qd, width) = (heads * d, (heads + 2 * kv_heads) * d);
        StepBuffers {
            residual: self.residual.slice_mut(0..n * h),
            normed: self.normed.slice_mut(0..n * h),
            delta: self.delta.slice_mut(0..n * h),
            qkv: self.qkv.slice_mut(0..n * width),
            attn: self.attn.slice_mut(0..n * qd),
            gate_up: self.gate_up.slice_mut(0..n * 2 * inter),
            act: self.act.slice_mut(0..n * inter),
            picked: &mut self.picked,
            logits: &mut self.logits,
            aux: self.aux.as_mut(),
            latent: self.latent.as_mut(),
            experts: self.experts.as_mut(),
        }
    }

    /// Queues, over the first logit rows of `vocab` (one per entry of `masks`), setting to
    /// −∞ each logit its row's mask forbids (rows without one are left as they are): one
    /// upload of the masks, one launch. Nothing is queued when no row has a mask.
    pub fn mask_logits(
        &mut self,
        kernels: &CudaKernels,
        gpu: &Gpu,
        vocab: usize,
        masks: &[Option<TokenMask>],
    ) -> Result<(), GpuForwardError> {
        if masks.iter().all(Option::is_none) {
            return Ok(());
        }
        let (masked, staged) = mask_layout(vocab, masks.iter().map(Option::as_ref));
        let staged = gpu.upload(&staged)?;
        let mut logits = self.logits.slice_mut(0..masks.len() * vocab);
        sample_mask(
            kernels,
            gpu.stream(),
            &mut logits,
            vocab,
            &staged.slice(..masked),
            &staged.slice(masked..),
        )?;
        Ok(())
    }

    /// Queues the argmax (the lowest id among ties) of the first `rows` logit rows of
    /// `vocab` into `ids`.
    pub fn argmax(
        &mut self,
        kernels: &CudaKernels,
        stream: &Arc<CudaStream>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), GpuForwardError> {
        self.argmax_copying(kernels, stream, rows, vocab, ArgmaxCopies::default())
    }

    /// [`Workspace::argmax`], each id also written where `copies` says.
    pub fn argmax_copying(
        &mut self,
        kernels: &CudaKernels,
        stream: &Arc<CudaStream>,
        rows: usize,
        vocab: usize,
        copies: ArgmaxCopies,
    ) -> Result<(), GpuForwardError> {
        let logits = self.logits.slice(0..rows * vocab);
        let ids = &mut self.ids.slice_mut(0..rows);
        let partials = &mut self.partials;
        sample_argmax_into(kernels, stream, &logits, vocab, partials, ids, copies)?;
        Ok(())
    }

    /// The layers whose inputs a forward records (empty: none).
    pub fn aux_layers(&self) -> &[usize] {
        self.aux.as_ref().map_or(&[], |a| &a.layers)
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        let b16 = [
            &self.normed,
            &self.qkv,
            &self.attn,
            &self.delta,
            &self.gate_up,
            &self.act,
            &self.picked,
        ]
        .iter()
        .map(|s| s.len() as u64 * 2)
        .sum::<u64>();
        let f32s = self.residual.len() + self.logits.len();
        let aux = self.aux.as_ref().map_or(0, |a| a.states.len());
        let argmax = 4 * self.ids.len() as u64 + 8 * self.partials.len() as u64;
        let latent = self.latent.as_ref().map_or(0, LatentBuffers::bytes);
        let experts = self.experts.as_ref().map_or(0, ExpertBuffers::bytes);
        b16 + 4 * (f32s + aux) as u64 + argmax + latent + experts
    }
}

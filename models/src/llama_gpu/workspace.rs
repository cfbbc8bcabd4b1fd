//! The activation buffers of one forward, allocated once at the largest step and viewed
//! per step, so a step allocates nothing and its peak memory is known at start-up.

use crate::config::ModelConfig;
use cudarc::driver::CudaSlice;
use half::bf16;
use peregrine_kernels::cuda::sampling::argmax_partials;
use peregrine_runtime::cuda::{Gpu, GpuError};

/// Activations for up to `max_tokens` tokens and `max_logit_rows` logit rows.
pub struct Workspace {
    pub max_tokens: usize,
    pub max_logit_rows: usize,
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
}

impl Workspace {
    /// Allocates the buffers for `c`.
    pub fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        max_tokens: usize,
        max_logit_rows: usize,
    ) -> Result<Workspace, GpuError> {
        let t = max_tokens;
        let (h, d) = (c.hidden_size, c.head_dim);
        let (qd, kvd, inter) = (c.num_heads * d, c.num_kv_heads * d, c.intermediate_size);
        Ok(Workspace {
            max_tokens,
            max_logit_rows,
            residual: gpu.zeros(t * h)?,
            normed: gpu.zeros(t * h)?,
            qkv: gpu.zeros(t * (qd + 2 * kvd))?,
            attn: gpu.zeros(t * qd)?,
            delta: gpu.zeros(t * h)?,
            gate_up: gpu.zeros(t * 2 * inter)?,
            act: gpu.zeros(t * inter)?,
            picked: gpu.zeros(max_logit_rows * h)?,
            logits: gpu.zeros(max_logit_rows * c.vocab_size)?,
            ids: gpu.zeros(max_logit_rows)?,
            partials: gpu.zeros(argmax_partials(max_logit_rows, c.vocab_size))?,
        })
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
        b16 + 4 * self.residual.len() as u64 + 4 * self.logits.len() as u64
    }
}

//! What a decoder layer's kernels read besides its weights, buffers and cache
//! ([`LayerStep`], run by `layer.rs`), and how its input reaches it.

use crate::config::ModelConfig;
use cudarc::driver::CudaStream;
use peregrine_kernels::cuda::gemm::Gemm;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::attention::{DeviceAttentionPlan, GpuPagedAttention, RotaryTable};

/// What a decoder layer's kernels read besides its weights, buffers and cache: the model's
/// shapes, the handles of its stream and the step's plan.
pub(crate) struct LayerStep<'a, 'b> {
    pub kernels: &'a CudaKernels,
    pub stream: &'a CudaStream,
    pub gemm: &'a Gemm,
    pub config: &'a ModelConfig,
    pub attention: &'a GpuPagedAttention,
    pub rotary: RotaryTable<'a, 'b>,
    pub plan: &'a DeviceAttentionPlan,
}

/// How a layer's input reaches it.
#[derive(Clone, Copy)]
pub(crate) enum LayerInput {
    /// Normed into `normed` already; the layer's output is left in `delta`, for the next
    /// norm to add.
    Normed,
    /// Still in the residual stream, the input norm (`input_norm`) folded into the first
    /// product and every output added into the residual stream (a one-row decode step of a
    /// plain Llama-family model, `Gemm::fuses_norms`).
    Fused,
}

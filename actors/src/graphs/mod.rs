//! The GraphCaptureManager: which batch sizes are captured, and the captured graphs, each
//! owning every buffer it reads or writes. A decode batch is padded up to the smallest
//! captured size that holds it and replayed; a larger one runs eagerly. `CpuDecodeGraphs`
//! is the CPU backend's: recorded forwards over one set of staged buffers; `CpuHeadGraphs`
//! the same for an EAGLE-3 head's decode step.

mod cpu;
mod head;
mod manager;
mod sizes;

pub use cpu::{CpuDecodeGraphs, Replayed};
pub use head::CpuHeadGraphs;
pub use manager::GraphCaptureManager;
pub use sizes::CaptureSizes;

use peregrine_ops::AttentionPlan;

/// Whether a step is what a decode graph runs: one token per sequence, and the logits of
/// every row, in order.
pub fn is_decode_step(tokens: &[u32], plan: &AttentionPlan, logit_rows: &[usize]) -> bool {
    let n = plan.seqs().len();
    tokens.len() == n
        && plan.seqs().iter().all(|s| s.q_len == 1)
        && logit_rows.iter().copied().eq(0..n)
}

//! The engine's graphs, the one home of graph capture on the serving side: which batch
//! sizes are captured (`sizes`), the GraphCaptureManager that captures one graph per size
//! and finds the graph a batch pads up to (`manager`, any graph type: the CPU's recorded
//! forwards, the CUDA graphs of `peregrine_models::llama::cuda` and `eagle3`), the CPU
//! backend's graphs of the target's decode step (`cpu_decode`) and of an EAGLE-3 head's
//! (`cpu_head`), and the capture of the target's and the draft's graphs as one set, at
//! start-up and on reload (`capture`). Each graph owns every buffer it reads or writes. A
//! decode batch is padded up to the smallest captured size that holds it and replayed; a
//! larger one runs eagerly.
//!
//! Below this crate: the models' own captures and what they share
//! (`peregrine_models::graph::cuda`, `peregrine_models::graph::cpu`), and the recorded CPU
//! graph and staged inputs (`peregrine_runtime::cpu`, `peregrine_runtime::staging`).

mod capture;
mod cpu;
mod manager;
mod sizes;

pub use capture::GraphCapture;
pub use cpu::{CpuDecodeGraphs, CpuHeadGraphs, Replayed};
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

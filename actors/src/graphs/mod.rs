//! The GraphCaptureManager: which batch sizes are captured, and the captured graphs, each
//! owning every buffer it reads or writes. A decode batch is padded up to the smallest
//! captured size that holds it and replayed; a larger one runs eagerly. `CpuDecodeGraphs`
//! is the CPU backend's: recorded forwards over one set of staged buffers.

mod cpu;
mod manager;
mod sizes;

pub use cpu::{CpuDecodeGraphs, Replayed};
pub use manager::GraphCaptureManager;
pub use sizes::CaptureSizes;

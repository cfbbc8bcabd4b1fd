//! The CPU's captured graphs: the target's decode steps (`decode`) and a draft head's
//! (`head`), replayed over staged, padded inputs as the CUDA graphs are.

mod decode;
mod head;

pub use decode::{CpuDecodeGraphs, Replayed};
pub use head::CpuHeadGraphs;

//! What every model's captured graphs are built of, by device: the CPU's recorded forwards
//! (`cpu`) and the CUDA graphs' limits, shared buffers and captures (`cuda`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

//! Devices and memory: the `Device` a computation runs on, element types, host buffers and
//! tensor views whose offsets are 64-bit, the staged inputs of captured graphs, and the CPU's
//! pooled buffers and recorded graphs (`cpu_graph`).
//!
//! The CPU backend is always built; the CUDA backend (`cuda` module) comes with the `cuda`
//! cargo feature.

pub mod cpu_graph;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
mod dtype;
mod staging;
mod tensor;

pub use device::Device;
pub use dtype::DType;
pub use staging::{Padding, StageError, StagedInput, StagedView};
pub use tensor::{Tensor, TensorError};

// Every element and byte offset in Peregrine is computed in 64 bits; on the CPU backend
// that is `usize`, so refuse to build where `usize` is narrower.
const _: () = assert!(usize::BITS == 64, "Peregrine needs a 64-bit target");

//! Memory and its addresses: what the host has to give (`host_memory`), the staged inputs of captured graphs (`staging`), the CPU's
//! pooled buffers and recorded graphs (`cpu`), and with the `cuda` feature the CUDA
//! device, its streams, buffers and graphs and the NVRTC compiler with its cache (`cuda`).
//!
//! The CPU backend is always built; the CUDA backend (`cuda` module) comes with the `cuda`
//! cargo feature.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host_memory;
mod staging;

pub use staging::{Padding, StageError, StagedInput, StagedView};

// Every element and byte offset in Peregrine is computed in 64 bits; on the CPU backend
// that is `usize`, so refuse to build where `usize` is narrower.
const _: () = assert!(usize::BITS == 64, "Peregrine needs a 64-bit target");

//! Kernel sources, one launcher per kernel.
//!
//! The CPU kernels are plain Rust over `f32` slices, multi-threaded with rayon where it
//! pays. Every reduction inside a row runs in an order that depends only on that row's own
//! shape, never on how many other rows are in the batch or where they sit, so the CPU
//! backend is batch-invariant (bit-exact) by construction. GPU kernels (CUDA C that also
//! compiles as HIP) are in `cuda`, built with the `cuda` feature.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

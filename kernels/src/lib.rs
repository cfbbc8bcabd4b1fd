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

/// Outside deterministic mode, products of up to this many rows go through the GEMV kernel
/// by default: single rows. On the H200 (Llama-3.2-1B shape, batch 1) a decode step takes
/// 1.142 ms through graphs with it against 1.254 ms with cuBLASLt, and an eager step queues
/// in 0.67 ms against 1.11 ms (cuBLASLt's host cost per call); from two rows cuBLAS is
/// faster (`bench latency --gemv-max-rows N` measures the two side by side).
pub const GEMV_MAX_ROWS: usize = 1;

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
/// where nothing else is chosen: single rows. On the H200 (Llama-3.2-1B shape, batch 1) a
/// decode step takes 1.142 ms through graphs with it against 1.254 ms with cuBLASLt, and an
/// eager step queues in 0.67 ms against 1.11 ms (cuBLASLt's host cost per call).
pub const GEMV_MAX_ROWS: usize = 1;

/// The rows up to which a model of `hidden_size` takes the GEMV kernel (outside
/// deterministic mode): where its staged kernels of several rows measured faster than
/// cuBLAS. On the H200, through graphs (`bench latency --verify-rows 4 --gemv-max-rows N`,
/// random weights): the SmolLM2-135M shape (576) decodes 2 sequences in 0.482 ms against
/// 0.885 with cuBLAS, 4 in 0.655 against 0.891, and verifies 4 rows of one sequence in
/// 0.752 against 0.948; the Llama-3.2-1B shape (2048) decodes 2 in 0.912 against 1.118 but
/// 4 in 1.444 against 1.130. Larger models keep [`GEMV_MAX_ROWS`] (not measured).
pub fn gemv_max_rows_for(hidden_size: usize) -> usize {
    match hidden_size {
        0..=1024 => 4,
        1025..=2048 => 2,
        _ => GEMV_MAX_ROWS,
    }
}

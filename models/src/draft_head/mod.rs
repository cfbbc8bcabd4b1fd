//! What the kinds of draft head (EAGLE-3, a multi-token prediction layer) share, by device:
//! on CUDA, one eager head, its graphs and its staged features for every kind (`cuda`). On
//! the CPU each kind records its own forward (`eagle3::record`, `mtp`), run by the actors'
//! `CpuHead`.

#[cfg(feature = "cuda")]
pub mod cuda;

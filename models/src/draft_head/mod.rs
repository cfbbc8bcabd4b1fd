//! What the kinds of draft head (EAGLE-3, a multi-token prediction layer) share, by device:
//! on CUDA, one eager head, its graphs and its staged features for every kind (`cuda`). On
//! the CPU each kind records its own forward (`eagle3::record`, `mtp`), run by the actors'
//! `CpuHead`. A chained proposal on CUDA may leave its drafts on the device
//! ([`cuda::hand_off`]), named by [`HandedDraft`].

#[cfg(feature = "cuda")]
pub mod cuda;

/// Where one draft a proposal left on the device lies (the CUDA hand-off's write that left
/// it there, and its index): plain data the actors' messages carry in place of the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandedDraft {
    /// The write's generation.
    pub generation: u64,
    /// Its index among the drafts that write copied in.
    pub index: usize,
}

//! What a draft head's decode graphs keep for proposals chained on the device
//! ([`chain`](crate::draft_head::cuda::chain)): the draft vocabulary on the device, the
//! rows each feed reads, and the drafts of every step.

use crate::draft_head::cuda::DraftHeadKind;
use cudarc::driver::CudaSlice;

/// The most draft steps one chain records.
pub const MAX_CHAIN_STEPS: usize = 16;

/// What a decode graph's buffers keep for chains: the draft vocabulary on the device, the
/// rows each feed reads, and the drafts of every step.
pub struct ChainBuffers {
    /// Draft id to target id.
    pub(super) to_target: CudaSlice<i32>,
    /// `0..rows`: a decode step feeds the next from its own rows.
    pub(super) own_rows: CudaSlice<i32>,
    /// The rows of a step 0 that feed step 1 (each sequence's last), padded.
    pub(super) first_rows: CudaSlice<i32>,
    /// `[MAX_CHAIN_STEPS, rows]`: each step's drafts.
    pub(super) drafts: CudaSlice<i32>,
    /// The sequences a step holds.
    pub(super) rows: usize,
}

impl ChainBuffers {
    /// Buffers for chains of up to `rows` sequences of the head `core`.
    pub fn new<C: DraftHeadKind>(core: &C, rows: usize) -> anyhow::Result<ChainBuffers> {
        let gpu = core.gpu();
        let vocab = core.vocab();
        let to_target: Vec<i32> = (0..vocab.len())
            .map(|d| i32::try_from(vocab.target(d)).expect("target ids are checked at load"))
            .collect();
        let own: Vec<i32> = (0..rows as i32).collect();
        Ok(ChainBuffers {
            to_target: gpu.upload(&to_target)?,
            own_rows: gpu.upload(&own)?,
            first_rows: gpu.zeros(rows)?,
            drafts: gpu.zeros(MAX_CHAIN_STEPS * rows)?,
            rows,
        })
    }
}

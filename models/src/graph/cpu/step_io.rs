//! A step's inputs as pooled buffers, and the one code path that stages a planned batch into
//! them, padded up to a size: for an eager forward (padded to its own size) and for the
//! replay of a captured graph (padded to the captured size) alike.

use crate::ForwardError;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::cpu::{BufferPool, CpuBuffer};
use peregrine_runtime::{Padding, StagedInput};

/// The sizes of a step: token rows, sequences and logit rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    /// Token rows (one per fed token).
    pub rows: usize,
    /// Sequences.
    pub seqs: usize,
    /// Rows whose logits are computed.
    pub logit_rows: usize,
}

impl StepShape {
    /// The shape of the step `plan` plans for `tokens`, asking the logits of `logit_rows`,
    /// with the entries of its widest block table.
    pub fn of(tokens: &[u32], plan: &AttentionPlan, logit_rows: &[usize]) -> (StepShape, usize) {
        let shape = StepShape {
            rows: tokens.len(),
            seqs: plan.seqs().len(),
            logit_rows: logit_rows.len(),
        };
        let max_blocks = plan.seqs().iter().map(|s| s.block_table.len()).max();
        (shape, max_blocks.unwrap_or(0))
    }

    /// A decode step of `n` sequences: one row each, every row a logit row.
    pub fn decode(n: usize) -> StepShape {
        StepShape {
            rows: n,
            seqs: n,
            logit_rows: n,
        }
    }
}

/// The input buffers a forward reads, allocated once at their largest shape; a step uses
/// their first rows.
pub struct StepInputs {
    /// The shape the buffers hold.
    pub capacity: StepShape,
    /// Entries of one block table.
    pub max_blocks: usize,
    /// `[rows]` token ids.
    pub token_ids: CpuBuffer<u32>,
    /// `[rows]` positions.
    pub positions: CpuBuffer<u32>,
    /// `[rows]` KV slots.
    pub slot_mapping: CpuBuffer<i64>,
    /// `[seqs + 1]` each sequence's first query row, then the planned row count.
    pub query_start: CpuBuffer<u32>,
    /// `[seqs]` each sequence's tokens after the step.
    pub seq_lens: CpuBuffer<u32>,
    /// `[seqs, max_blocks]` block ids.
    pub block_tables: CpuBuffer<u32>,
    /// `[logit_rows]` the rows whose logits are computed.
    pub logit_rows: CpuBuffer<u32>,
}

impl StepInputs {
    /// Input buffers of `capacity` from `pool`, with block tables of `max_blocks`.
    pub fn new(pool: &BufferPool, capacity: StepShape, max_blocks: usize) -> StepInputs {
        StepInputs {
            capacity,
            max_blocks,
            token_ids: pool.alloc(capacity.rows),
            positions: pool.alloc(capacity.rows),
            slot_mapping: pool.alloc(capacity.rows),
            query_start: pool.alloc(capacity.seqs + 1),
            seq_lens: pool.alloc(capacity.seqs),
            block_tables: pool.alloc(capacity.seqs * max_blocks),
            logit_rows: pool.alloc(capacity.logit_rows),
        }
    }
}

/// The host side of staging: each input declared with its shape at the largest step, its
/// batch axis and its padding. Token ids, positions, query starts, sequence lengths, block
/// tables and logit rows repeat their last real entry; the slot mapping's padded rows point
/// at the scratch slot, which no sequence owns.
pub struct StepStaging {
    token_ids: StagedInput<u32>,
    positions: StagedInput<u32>,
    slot_mapping: StagedInput<i64>,
    query_start: StagedInput<u32>,
    seq_lens: StagedInput<u32>,
    block_tables: StagedInput<u32>,
    logit_rows: StagedInput<u32>,
    max_blocks: usize,
}

impl StepStaging {
    /// Staging for steps up to `capacity` with block tables of `max_blocks`; padded token
    /// rows write their keys and values into `scratch_slot` (negative: nowhere).
    pub fn new(
        capacity: StepShape,
        max_blocks: usize,
        scratch_slot: i64,
    ) -> Result<StepStaging, ForwardError> {
        let repeat = Padding::RepeatLast;
        Ok(StepStaging {
            token_ids: StagedInput::new("token_ids", &[capacity.rows], 0, repeat)?,
            positions: StagedInput::new("positions", &[capacity.rows], 0, repeat)?,
            slot_mapping: StagedInput::new(
                "slot_mapping",
                &[capacity.rows],
                0,
                Padding::Fill(scratch_slot),
            )?,
            query_start: StagedInput::new("query_start", &[capacity.seqs + 1], 0, repeat)?,
            seq_lens: StagedInput::new("seq_lens", &[capacity.seqs], 0, repeat)?,
            block_tables: StagedInput::new(
                "block_tables",
                &[capacity.seqs, max_blocks],
                0,
                repeat,
            )?,
            logit_rows: StagedInput::new("logit_rows", &[capacity.logit_rows], 0, repeat)?,
            max_blocks,
        })
    }

    /// Stages `tokens` under `plan` (planned over the real tokens), with logits at
    /// `logit_rows`, padded up to `padded`, into `inputs`.
    pub fn stage(
        &mut self,
        inputs: &StepInputs,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        padded: StepShape,
    ) -> Result<(), ForwardError> {
        let seqs = plan.seqs();
        let mut query_start: Vec<u32> = seqs.iter().map(|s| s.q_start as u32).collect();
        query_start.push(plan.rows() as u32);
        let seq_lens: Vec<u32> = seqs.iter().map(|s| s.context_len as u32).collect();
        let mut tables = vec![0u32; seqs.len() * self.max_blocks];
        for (i, s) in seqs.iter().enumerate() {
            if s.block_table.len() > self.max_blocks {
                return Err(ForwardError::TableWidth {
                    seq: i,
                    blocks: s.block_table.len(),
                    max: self.max_blocks,
                });
            }
            tables[i * self.max_blocks..][..s.block_table.len()].copy_from_slice(&s.block_table);
        }
        let rows: Vec<u32> = logit_rows.iter().map(|&r| r as u32).collect();
        let (n, b, r) = (tokens.len(), seqs.len(), rows.len());
        copy(
            &mut self.token_ids,
            tokens,
            n,
            padded.rows,
            &inputs.token_ids,
        )?;
        copy(
            &mut self.positions,
            plan.positions(),
            n,
            padded.rows,
            &inputs.positions,
        )?;
        let slots = plan.slot_mapping();
        copy(
            &mut self.slot_mapping,
            slots,
            n,
            padded.rows,
            &inputs.slot_mapping,
        )?;
        let starts = &inputs.query_start;
        copy(
            &mut self.query_start,
            &query_start,
            b + 1,
            padded.seqs + 1,
            starts,
        )?;
        copy(
            &mut self.seq_lens,
            &seq_lens,
            b,
            padded.seqs,
            &inputs.seq_lens,
        )?;
        copy(
            &mut self.block_tables,
            &tables,
            b,
            padded.seqs,
            &inputs.block_tables,
        )?;
        copy(
            &mut self.logit_rows,
            &rows,
            r,
            padded.logit_rows,
            &inputs.logit_rows,
        )
    }
}

/// Stages `real` (`real_batch` entries) padded to `padded` entries and copies the padded
/// view into the first elements of `buffer` (every input here has its batch on axis 0, so
/// the view is a prefix of the staged data).
pub(crate) fn copy<T: Copy + Default + bytemuck::Pod>(
    staged: &mut StagedInput<T>,
    real: &[T],
    real_batch: usize,
    padded: usize,
    buffer: &CpuBuffer<T>,
) -> Result<(), ForwardError> {
    let view = staged.stage(real, real_batch, padded)?;
    let len: usize = view.shape().iter().product();
    buffer.write()[..len].copy_from_slice(&staged.as_slice()[..len]);
    Ok(())
}

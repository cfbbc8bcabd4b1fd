//! Attention metadata, planned over the real tokens of a step (docs/architecture.md, rule 3).

/// A plan that cannot be built or does not fit the buffers it is run on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("sequence {seq}: {tokens} tokens need {needed} blocks of {block_size} but its table has {have}")]
    ShortBlockTable {
        seq: usize,
        tokens: usize,
        block_size: usize,
        needed: usize,
        have: usize,
    },
    #[error("sequence {seq}: block id {block} is outside the pool of {num_blocks} blocks")]
    BlockOutOfPool {
        seq: usize,
        block: u32,
        num_blocks: u64,
    },
    #[error("sequence {seq} feeds no tokens")]
    EmptySequence { seq: usize },
    #[error("staged attention metadata, sequence {seq}: {reason}")]
    Metadata { seq: usize, reason: String },
    #[error("attention plan covers {planned} rows but {buffer} has only {rows}")]
    RowsExceedBuffer {
        planned: usize,
        buffer: &'static str,
        rows: usize,
    },
}

/// What one sequence feeds this step.
#[derive(Clone, Copy, Debug)]
pub struct SeqSpec<'a> {
    /// Tokens already in the cache before this step.
    pub num_cached: usize,
    /// New tokens this step (a prefill chunk, or one decode token).
    pub num_new: usize,
    /// The sequence's block ids, covering at least `num_cached + num_new` tokens.
    pub block_table: &'a [u32],
}

/// One sequence's rows in a planned step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedSeq {
    /// First query row.
    pub q_start: usize,
    /// Query rows.
    pub q_len: usize,
    /// Tokens in the cache after this step's writes.
    pub context_len: usize,
    /// This step's tokens at the end of the context, the last of them this sequence's last
    /// row, each carried by the row before the next: `q_len`, or for a row cut from a
    /// sequence ([`AttentionPlan::one_row_sequences`]) the rows of that sequence up to it.
    pub step_tokens: usize,
    /// Block ids, in order.
    pub block_table: Vec<u32>,
}

/// Positions, slot mapping and per-sequence rows for one step, over the real tokens only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionPlan {
    positions: Vec<u32>,
    slot_mapping: Vec<i64>,
    seqs: Vec<PlannedSeq>,
}

impl AttentionPlan {
    /// Plans `seqs`, in order, over a pool of `num_blocks` blocks of `block_size` tokens.
    /// Every block id a sequence will touch is checked against the pool here, once.
    pub fn new(seqs: &[SeqSpec], block_size: usize, num_blocks: u64) -> Result<Self, PlanError> {
        let mut plan = AttentionPlan {
            positions: Vec::new(),
            slot_mapping: Vec::new(),
            seqs: Vec::with_capacity(seqs.len()),
        };
        for (i, s) in seqs.iter().enumerate() {
            if s.num_new == 0 {
                return Err(PlanError::EmptySequence { seq: i });
            }
            let context_len = s.num_cached + s.num_new;
            let needed = context_len.div_ceil(block_size);
            if s.block_table.len() < needed {
                return Err(PlanError::ShortBlockTable {
                    seq: i,
                    tokens: context_len,
                    block_size,
                    needed,
                    have: s.block_table.len(),
                });
            }
            let used = &s.block_table[..needed];
            if let Some(&block) = used.iter().find(|&&b| b as u64 >= num_blocks) {
                return Err(PlanError::BlockOutOfPool {
                    seq: i,
                    block,
                    num_blocks,
                });
            }
            for pos in s.num_cached..context_len {
                let block = used[pos / block_size] as u64;
                let slot = block * block_size as u64 + (pos % block_size) as u64;
                plan.positions.push(pos as u32);
                plan.slot_mapping.push(slot as i64);
            }
            plan.seqs.push(PlannedSeq {
                q_start: plan.positions.len() - s.num_new,
                q_len: s.num_new,
                context_len,
                step_tokens: s.num_new,
                block_table: used.to_vec(),
            });
        }
        Ok(plan)
    }

    /// Query rows planned: the real token count of the step.
    pub fn rows(&self) -> usize {
        self.positions.len()
    }

    /// Position of every planned token.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// Cache slot of every planned token.
    pub fn slot_mapping(&self) -> &[i64] {
        &self.slot_mapping
    }

    /// The planned sequences, in order.
    pub fn seqs(&self) -> &[PlannedSeq] {
        &self.seqs
    }

    /// The same step with each sequence of 2 to `max_rows` rows cut into one-row
    /// sequences, one per row in order, each seeing the keys up to its own position (the
    /// rows of a verification step as the decode rows they would be); `None` when no
    /// sequence is cut. Positions, slots and rows are the plan's.
    pub fn one_row_sequences(&self, max_rows: usize) -> Option<AttentionPlan> {
        let cut = |s: &PlannedSeq| s.q_len > 1 && s.q_len <= max_rows;
        if !self.seqs.iter().any(cut) {
            return None;
        }
        let mut seqs = Vec::with_capacity(self.rows());
        for s in &self.seqs {
            if !cut(s) {
                seqs.push(s.clone());
                continue;
            }
            let past = s.context_len - s.q_len;
            seqs.extend((0..s.q_len).map(|i| PlannedSeq {
                q_start: s.q_start + i,
                q_len: 1,
                context_len: past + i + 1,
                step_tokens: i + 1,
                block_table: s.block_table.clone(),
            }));
        }
        Some(AttentionPlan {
            positions: self.positions.clone(),
            slot_mapping: self.slot_mapping.clone(),
            seqs,
        })
    }

    /// Refuses the plan if it covers more rows than q or o hold.
    pub fn check_fits(&self, q_rows: usize, o_rows: usize) -> Result<(), PlanError> {
        Self::check_rows(self.rows(), q_rows, o_rows)
    }

    /// Refuses `planned` rows over q or o of fewer rows: the host's check before every
    /// attention launch, on plain integers.
    pub fn check_rows(planned: usize, q_rows: usize, o_rows: usize) -> Result<(), PlanError> {
        for (buffer, rows) in [("q", q_rows), ("o", o_rows)] {
            if planned > rows {
                return Err(PlanError::RowsExceedBuffer {
                    planned,
                    buffer,
                    rows,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_positions_and_slots_over_real_tokens() {
        let a = [5u32, 70_000];
        let b = [65_535u32, 65_536];
        let plan = AttentionPlan::new(
            &[
                SeqSpec {
                    num_cached: 15,
                    num_new: 2,
                    block_table: &a,
                },
                SeqSpec {
                    num_cached: 0,
                    num_new: 17,
                    block_table: &b,
                },
            ],
            16,
            70_001,
        )
        .unwrap();
        assert_eq!(plan.rows(), 19);
        assert_eq!(plan.positions()[..3], [15, 16, 0]);
        assert_eq!(plan.slot_mapping()[..2], [5 * 16 + 15, 70_000 * 16]);
        assert_eq!(plan.slot_mapping()[2], 65_535 * 16);
        assert_eq!(plan.slot_mapping()[18], 65_536 * 16);
        assert_eq!(plan.seqs()[1].q_start, 2);
        assert!(plan.check_fits(19, 19).is_ok());
        let err = plan.check_fits(24, 18).unwrap_err();
        assert_eq!(
            err.to_string(),
            "attention plan covers 19 rows but o has only 18"
        );
    }

    #[test]
    fn short_sequences_are_cut_into_the_decode_rows_they_would_be() {
        let (a, b, c) = ([3u32, 9], [65_535u32, 65_536], [7u32]);
        let spec = |num_cached, num_new, block_table| SeqSpec {
            num_cached,
            num_new,
            block_table,
        };
        let specs = [spec(14, 4, &a[..]), spec(0, 20, &b[..]), spec(5, 1, &c[..])];
        let plan = AttentionPlan::new(&specs, 16, 70_000).unwrap();
        assert_eq!(plan.one_row_sequences(3), None);
        let cut = plan.one_row_sequences(4).unwrap();
        assert_eq!(cut.positions(), plan.positions());
        assert_eq!(cut.slot_mapping(), plan.slot_mapping());
        let shapes: Vec<(usize, usize, usize, usize)> = cut
            .seqs()
            .iter()
            .map(|s| (s.q_start, s.q_len, s.context_len, s.step_tokens))
            .collect();
        // The 4-row sequence becomes rows 0..4 at contexts 15..18, each carrying the step's
        // tokens up to its own; the 20-row chunk and the decode row stay as they were.
        assert_eq!(
            shapes,
            [
                (0, 1, 15, 1),
                (1, 1, 16, 2),
                (2, 1, 17, 3),
                (3, 1, 18, 4),
                (4, 20, 20, 20),
                (24, 1, 6, 1)
            ]
        );
        assert!(cut.seqs()[..4].iter().all(|s| s.block_table == a));
        assert_eq!(cut.seqs()[4], plan.seqs()[1]);
    }

    #[test]
    fn refuses_short_tables_and_foreign_blocks() {
        let t = [1u32];
        let short = AttentionPlan::new(
            &[SeqSpec {
                num_cached: 16,
                num_new: 1,
                block_table: &t,
            }],
            16,
            4,
        );
        assert!(matches!(
            short,
            Err(PlanError::ShortBlockTable { needed: 2, .. })
        ));
        let t = [4u32];
        let outside = AttentionPlan::new(
            &[SeqSpec {
                num_cached: 0,
                num_new: 1,
                block_table: &t,
            }],
            16,
            4,
        );
        assert!(matches!(
            outside,
            Err(PlanError::BlockOutOfPool { block: 4, .. })
        ));
    }
}

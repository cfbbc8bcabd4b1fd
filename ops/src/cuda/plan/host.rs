//! A step's arrays on the host, as the kernels read them: its token ids and logit rows
//! (checked against its plan), and its plan's per-sequence arrays.

use super::AttentionError;
use crate::attention::AttentionPlan;

/// A step's token ids and logit rows as the kernels read them, with its plan.
pub(super) struct StepRows<'a> {
    pub(super) plan: &'a AttentionPlan,
    pub(super) tokens: Vec<i32>,
    pub(super) logit_rows: Vec<i32>,
}

impl<'a> StepRows<'a> {
    /// Refuses token ids that are not one per planned row, and logit rows past them.
    pub(super) fn new(
        tokens: &[u32],
        plan: &'a AttentionPlan,
        logit_rows: &[usize],
    ) -> Result<StepRows<'a>, AttentionError> {
        if tokens.len() != plan.rows() {
            return Err(AttentionError::Shape(format!(
                "{} token ids for {} planned rows",
                tokens.len(),
                plan.rows()
            )));
        }
        if let Some(&row) = logit_rows.iter().find(|&&r| r >= plan.rows()) {
            return Err(AttentionError::Shape(format!(
                "logit row {row} of {} planned rows",
                plan.rows()
            )));
        }
        Ok(StepRows {
            plan,
            tokens: tokens.iter().map(|&t| t as i32).collect(),
            logit_rows: logit_rows.iter().map(|&r| r as i32).collect(),
        })
    }
}

/// A plan's per-sequence arrays on the host.
#[derive(Default)]
pub(super) struct SeqArrays {
    pub(super) q_start: Vec<i32>,
    pub(super) q_len: Vec<i32>,
    pub(super) context_len: Vec<i32>,
    pub(super) step_tokens: Vec<i32>,
    pub(super) table_start: Vec<i64>,
    pub(super) block_table: Vec<i32>,
}

impl SeqArrays {
    /// The arrays of `plan`, each table starting `table_stride` entries after the last
    /// (its own length when `None`) and padded with its last id up to that stride. Without
    /// a stride, a sequence whose table is the one before it (the rows of a cut sequence)
    /// shares its entries.
    pub(super) fn new(plan: &AttentionPlan, table_stride: Option<usize>) -> SeqArrays {
        let mut a = SeqArrays::default();
        let mut previous: Option<&[u32]> = None;
        for s in plan.seqs() {
            assert!(
                s.q_start + s.q_len <= i32::MAX as usize,
                "attention plan: rows past i32"
            );
            // A fused KV write reads the step's tokens from the rows before this one's last.
            assert!(
                s.step_tokens >= s.q_len
                    && s.step_tokens <= s.q_start + s.q_len
                    && s.step_tokens <= s.context_len,
                "attention plan: the step's tokens past the sequence's rows"
            );
            a.q_start.push(s.q_start as i32);
            a.q_len.push(s.q_len as i32);
            a.context_len.push(s.context_len as i32);
            a.step_tokens.push(s.step_tokens as i32);
            let table: &[u32] = &s.block_table;
            if table_stride.is_none() && previous == Some(table) {
                let last = *a.table_start.last().expect("a sequence before");
                a.table_start.push(last);
                continue;
            }
            previous = Some(table);
            a.table_start.push(a.block_table.len() as i64);
            // Ids past i32::MAX wrap here, but the ops refuse such a plan before launching.
            let start = a.block_table.len();
            a.block_table
                .extend(s.block_table.iter().map(|&b| b as i32));
            if let Some(stride) = table_stride {
                // Entries past the table are never read (the context bounds them).
                let last = s.block_table.last().map_or(0, |&b| b as i32);
                a.block_table.resize(start + stride, last);
            }
        }
        a
    }
}

//! Growing the running sequences, preempting from the back of the list when blocks run out.

use super::BlockManager;
use crate::messages::{GrowSeq, RequestId};
use std::collections::HashSet;

/// The grown block tables, in `grow` order, and the preempted sequences.
type Grown = (Vec<(RequestId, Vec<u32>)>, Vec<RequestId>);

impl BlockManager {
    /// Gives each sequence of `grow`, in order, blocks for its `tokens_after_step`. When
    /// too few blocks are free, the last sequence still in the list is preempted (all its
    /// blocks freed) until the current one fits; it may be the current one itself.
    ///
    /// An id listed twice counts once. An id holding no blocks (never admitted, or already
    /// freed) cannot grow: it is reported as preempted, so the scheduler restarts it.
    pub(super) fn grow(&mut self, grow: &[GrowSeq]) -> Grown {
        let mut preempted = Vec::new();
        let mut seen = HashSet::new();
        let mut live: Vec<GrowSeq> = Vec::with_capacity(grow.len());
        for g in grow {
            if !seen.insert(g.id) {
                continue;
            }
            if self.seqs.contains_key(&g.id) {
                live.push(*g);
            } else {
                preempted.push(g.id);
            }
        }
        let mut i = 0;
        while let Some(&g) = live.get(i) {
            let need = self.blocks_for(g.tokens_after_step);
            let have = self.seqs.get(&g.id).map_or(0, |s| s.table.len());
            let extra = need.saturating_sub(have);
            if extra <= self.free.len() {
                if let Some(mut seq) = self.seqs.remove(&g.id) {
                    seq.table.extend(self.take_free_blocks(extra));
                    self.seqs.insert(g.id, seq);
                }
                i += 1;
            } else if let Some(victim) = live.pop() {
                self.release(victim.id);
                preempted.push(victim.id);
            }
        }
        let grown = live
            .iter()
            .map(|g| (g.id, self.block_table(g.id).unwrap_or_default().to_vec()))
            .collect();
        (grown, preempted)
    }
}

//! Admitting new sequences: their cached prefix, then fresh blocks for what the token
//! budget lets them compute this step.

use super::block_manager::{Hit, SeqBlocks};
use super::BlockManager;
use crate::messages::{AdmitSeq, AdmittedSeq};

impl BlockManager {
    /// Admits the sequences of `admit` in order until one does not fit or the budget is
    /// spent. Each takes its longest cached prefix of whole blocks, never the last token
    /// (it must be computed to give logits), less its last block when the manager is
    /// [recomputing the last hit](BlockManager::recomputing_last_hit), and
    /// `min(rest, budget)` tokens to compute. A sequence that scores its prompt takes
    /// nothing from the cache and computes at most what is left of `scoring_rows` (all
    /// such sequences together; `None`: unbounded); where none is left it does not fit.
    /// Never preempts. Cached tokens do not use the budget.
    ///
    /// Prefix-cache stats count admitted sequences only (a sequence that waits is counted
    /// once, when it gets in): `prefix_queries` the tokens looked up (the capped length),
    /// `prefix_hits` the tokens found. An id that already holds blocks is restarted: its
    /// old blocks are released first.
    pub(super) fn admit(
        &mut self,
        admit: &[AdmitSeq],
        token_budget: usize,
        scoring_rows: Option<usize>,
    ) -> Vec<AdmittedSeq> {
        let mut budget = token_budget;
        let mut rows = scoring_rows.unwrap_or(usize::MAX);
        let mut admitted = Vec::new();
        for seq in admit {
            let room = match seq.scores_prompt {
                true => budget.min(rows),
                false => budget,
            };
            if room == 0 {
                break;
            }
            self.release(seq.id);
            let len = seq.tokens.len();
            let lookup_len = match seq.scores_prompt {
                true => 0,
                false => (len.saturating_sub(1) / self.block_size) * self.block_size,
            };
            let mut hits = self.cached_prefix(&seq.tokens[..lookup_len]);
            if self.recompute_last_hit {
                hits.pop();
            }
            let num_cached = hits.len() * self.block_size;
            let num_scheduled = (len - num_cached).min(room);
            let fresh = self
                .blocks_for(num_cached + num_scheduled)
                .saturating_sub(hits.len());
            // Host and disk hits need a pool block each, as fresh blocks do.
            let loads = hits
                .iter()
                .filter(|h| matches!(h.at, Hit::Host { .. } | Hit::Disk { .. }))
                .count();
            let free_hits = hits
                .iter()
                .filter(|h| matches!(h.at, Hit::Pool { block, .. } if self.free.contains(block)))
                .count();
            if fresh + loads > self.free.len().saturating_sub(free_hits) {
                break;
            }
            let num_registered = hits.len();
            let (mut table, chain, content) = self.take_hits(&seq.tokens, &hits);
            table.extend(self.take_free_blocks(fresh));
            if self.cache.is_some() {
                self.prefix_queries += lookup_len as u64;
                self.prefix_hits += num_cached as u64;
                self.pool_hits += hits
                    .iter()
                    .filter(|h| matches!(h.at, Hit::Pool { .. }))
                    .count() as u64;
            }
            budget -= num_scheduled;
            if seq.scores_prompt {
                rows -= num_scheduled;
            }
            admitted.push(AdmittedSeq {
                id: seq.id,
                num_cached,
                num_scheduled,
                block_table: table.clone(),
            });
            self.seqs.insert(
                seq.id,
                SeqBlocks {
                    table,
                    num_registered,
                    chain,
                    content,
                },
            );
        }
        admitted
    }
}

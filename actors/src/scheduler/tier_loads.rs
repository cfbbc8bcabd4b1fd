//! Requests waiting on blocks loaded from a tier below the pool. A prefix found in host
//! memory or on disk is copied into fresh pool blocks while the other requests' steps go
//! on (a disk read on the disk tier's thread; on the GPU every load's copy on a stream of
//! its own): the KV allocator grants the loads ([`KvMove::Load`],
//! [`KvMove::DiskRead`]) with the admission, and every sequence whose block table holds a
//! pool block still being loaded (the request the loads were granted for, and any admitted
//! meanwhile that shares its prefix) is held out of the steps, and out of the allocator's
//! growing (so never preempted), until the runner reports the block
//! ([`crate::messages::StepDone::loads`]): the request waits, not the batch.
//!
//! A block whose disk slot failed its checks was never filled: each sequence holding it is
//! sent back to wait, to be admitted again once none of its blocks is still being loaded
//! (the allocator has forgotten the block by then, so it misses and is computed). The
//! blocks of a request that ends (or is sent back) while a load into them is pending go
//! back to the allocator only once no load into them is.

use crate::messages::{KvMove, LoadDone, RequestId};
use std::collections::HashSet;

/// The pool blocks being loaded and the frees that wait for them.
#[derive(Default)]
pub struct PendingLoads {
    /// Pool blocks a granted load is to fill, not yet reported.
    blocks: HashSet<u32>,
    /// Blocks whose load failed, until [`PendingLoads::clear_failed`].
    failed: HashSet<u32>,
    /// Requests ended (or sent back) holding blocks still being loaded, with those tables:
    /// freed once none is.
    frees: Vec<(RequestId, Vec<u32>)>,
}

impl PendingLoads {
    /// Notes the loads among `moves`, granted with an admission.
    pub fn start(&mut self, moves: &[KvMove]) {
        self.blocks.extend(moves.iter().filter_map(|m| match m {
            KvMove::Load { block, .. } | KvMove::DiskRead { block, .. } => Some(*block),
            _ => None,
        }));
    }

    /// Whether any load is pending or any free waits.
    pub fn any(&self) -> bool {
        !self.blocks.is_empty() || !self.frees.is_empty()
    }

    /// Whether `table` holds a block still being loaded.
    pub fn holds(&self, table: &[u32]) -> bool {
        !self.blocks.is_empty() && table.iter().any(|b| self.blocks.contains(b))
    }

    /// Where in `table` the first block whose load failed (and was not yet dealt with) is.
    pub fn first_failed(&self, table: &[u32]) -> Option<usize> {
        if self.failed.is_empty() {
            return None;
        }
        table.iter().position(|b| self.failed.contains(b))
    }

    /// Frees request `id` (of block table `table`) now, `true`, unless a load into one of
    /// its blocks is pending: then its free waits for the loads (`false`).
    pub fn free_now(&mut self, id: RequestId, table: &[u32]) -> bool {
        if !self.holds(table) {
            return true;
        }
        self.frees.push((id, table.to_vec()));
        false
    }

    /// Takes the runner's report of finished loads in: the blocks stop being pending and
    /// the failed ones are kept for [`PendingLoads::first_failed`] until
    /// [`PendingLoads::clear_failed`]; returns the waiting frees that may go now.
    pub fn finish(&mut self, loads: &[LoadDone]) -> Vec<RequestId> {
        for load in loads {
            self.blocks.remove(&load.block);
            if !load.ok {
                self.failed.insert(load.block);
            }
        }
        let mut ready = Vec::new();
        self.frees.retain(|(id, table)| {
            let waits = table.iter().any(|b| self.blocks.contains(b));
            if !waits {
                ready.push(*id);
            }
            waits
        });
        ready
    }

    /// Every block still pending, as loads that failed: what a runner that waited for a
    /// load and had none pending never started (a step whose moves failed part way).
    pub fn abandoned(&self) -> Vec<LoadDone> {
        self.blocks
            .iter()
            .map(|&block| LoadDone { block, ok: false })
            .collect()
    }

    /// Forgets the failed blocks once every sequence holding one has been sent back.
    pub fn clear_failed(&mut self) {
        self.failed.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::PendingLoads;
    use crate::messages::{KvMove, KvSource, LoadDone, RequestId};
    use std::sync::Arc;

    #[test]
    fn host_loads_and_disk_reads_hold_their_blocks_until_reported() {
        let mut loads = PendingLoads::default();
        loads.start(&[
            KvMove::Spill { block: 1, slot: 0 },
            KvMove::Load { slot: 0, block: 2 },
            KvMove::DiskWrite {
                from: KvSource::Pool(3),
                slot: 4,
                parent: [0; 32],
                tokens: Arc::from(vec![5u32]),
            },
            KvMove::DiskRead {
                slot: 6,
                chain: [7; 32],
                block: 8,
            },
        ]);
        assert!(loads.any());
        for (table, held) in [(&[1, 3][..], false), (&[2], true), (&[9, 8], true)] {
            assert_eq!(loads.holds(table), held, "{table:?}");
        }
        assert!(!loads.free_now(RequestId(1), &[8, 9]));
        assert!(loads.free_now(RequestId(2), &[1]));
        let done = |block, ok| LoadDone { block, ok };
        let mut abandoned = loads.abandoned();
        abandoned.sort_by_key(|d| d.block);
        assert_eq!(abandoned, [done(2, false), done(8, false)]);
        assert!(loads.finish(&[done(2, true)]).is_empty());
        assert_eq!(loads.first_failed(&[2]), None);
        assert_eq!(loads.finish(&[done(8, false)]), [RequestId(1)]);
        assert_eq!(loads.first_failed(&[9, 8]), Some(1));
        loads.clear_failed();
        assert_eq!(loads.first_failed(&[9, 8]), None);
        assert!(!loads.any());
    }
}

//! Requests waiting on disk reads. A prefix found in the disk tier is read by the backend's
//! disk thread while the other requests' steps go on: the KV allocator grants the reads
//! ([`KvMove::DiskRead`]) with the admission, and every sequence whose block table holds
//! a pool block still being read (the request the reads were granted for, and any admitted
//! meanwhile that shares its prefix) is held out of the steps, and out of the allocator's
//! growing (so never preempted), until the runner reports the block
//! ([`crate::messages::StepDone::reads`]): the request waits, not the batch.
//!
//! A block whose slot failed its checks was never filled: each sequence holding it is sent
//! back to wait, to be admitted again once none of its blocks is still being read (the
//! allocator has forgotten the block by then, so it misses and is computed). The blocks of
//! a request that ends (or is sent back) while a read into them is pending go back to the
//! allocator only once no read into them is.

use crate::messages::{KvMove, ReadDone, RequestId};
use std::collections::HashSet;

/// The pool blocks being read and the frees that wait for them.
#[derive(Default)]
pub struct PendingReads {
    /// Pool blocks a granted disk read is to fill, not yet reported.
    blocks: HashSet<u32>,
    /// Blocks whose read failed, until the next [`PendingReads::finish`] has sent back the
    /// sequences holding them.
    failed: HashSet<u32>,
    /// Requests ended (or sent back) holding blocks still being read, with those tables:
    /// freed once none is.
    frees: Vec<(RequestId, Vec<u32>)>,
}

impl PendingReads {
    /// Notes the disk reads among `moves`, granted with an admission.
    pub fn start(&mut self, moves: &[KvMove]) {
        self.blocks.extend(moves.iter().filter_map(|m| match m {
            KvMove::DiskRead { block, .. } => Some(*block),
            _ => None,
        }));
    }

    /// Whether any read is pending or any free waits.
    pub fn any(&self) -> bool {
        !self.blocks.is_empty() || !self.frees.is_empty()
    }

    /// Whether `table` holds a block still being read.
    pub fn holds(&self, table: &[u32]) -> bool {
        !self.blocks.is_empty() && table.iter().any(|b| self.blocks.contains(b))
    }

    /// Where in `table` the first block whose read failed (and was not yet dealt with) is.
    pub fn first_failed(&self, table: &[u32]) -> Option<usize> {
        if self.failed.is_empty() {
            return None;
        }
        table.iter().position(|b| self.failed.contains(b))
    }

    /// Frees request `id` (of block table `table`) now, `true`, unless a read into one of
    /// its blocks is pending: then its free waits for the reads (`false`).
    pub fn free_now(&mut self, id: RequestId, table: &[u32]) -> bool {
        if !self.holds(table) {
            return true;
        }
        self.frees.push((id, table.to_vec()));
        false
    }

    /// Takes the runner's report of finished reads in: the blocks stop being pending and
    /// the failed ones are kept for [`PendingReads::first_failed`] until
    /// [`PendingReads::clear_failed`]; returns the waiting frees that may go now.
    pub fn finish(&mut self, reads: &[ReadDone]) -> Vec<RequestId> {
        for read in reads {
            self.blocks.remove(&read.block);
            if !read.ok {
                self.failed.insert(read.block);
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

    /// Forgets the failed blocks once every sequence holding one has been sent back.
    pub fn clear_failed(&mut self) {
        self.failed.clear();
    }
}

//! The free blocks, in the order they are reused: least recently freed first, and blocks
//! never used at all before any of them.

use std::collections::BTreeMap;

/// Free blocks ordered by when they were freed. Each free block carries a stamp; the
/// smallest stamp is reused first. A new queue stamps its blocks `0..num_blocks` (lowest id
/// first) and later frees get larger stamps, so never-used blocks go before freed ones.
pub struct FreeQueue {
    /// stamp -> block, in reuse order.
    order: BTreeMap<u64, u32>,
    /// Per block: its stamp while it is free.
    stamps: Vec<Option<u64>>,
    next_stamp: u64,
}

impl FreeQueue {
    /// A queue holding every block of a pool of `num_blocks`, lowest id first.
    pub fn new(num_blocks: u32) -> FreeQueue {
        let stamps = (0..u64::from(num_blocks)).map(Some).collect();
        let order = (0..num_blocks).map(|b| (u64::from(b), b)).collect();
        FreeQueue {
            order,
            stamps,
            next_stamp: u64::from(num_blocks),
        }
    }

    /// Free blocks.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether `block` is free.
    pub fn contains(&self, block: u32) -> bool {
        self.stamp_of(block).is_some()
    }

    /// Puts `block` at the back: it is reused after every block freed before it. A block
    /// already in the queue moves to the back.
    pub fn push_back(&mut self, block: u32) {
        self.remove(block);
        let Some(slot) = self.stamps.get_mut(block as usize) else {
            return;
        };
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        *slot = Some(stamp);
        self.order.insert(stamp, block);
    }

    /// Takes the block to reuse next.
    pub fn pop_front(&mut self) -> Option<u32> {
        let (_, block) = self.order.pop_first()?;
        if let Some(slot) = self.stamps.get_mut(block as usize) {
            *slot = None;
        }
        Some(block)
    }

    /// Takes `block` out of the queue wherever it is; false if it was not free.
    pub fn remove(&mut self, block: u32) -> bool {
        let Some(stamp) = self.stamps.get_mut(block as usize).and_then(Option::take) else {
            return false;
        };
        self.order.remove(&stamp);
        true
    }

    /// Checks that the order and the per-block stamps describe the same set, so no block
    /// is queued twice.
    pub fn check(&self) -> Result<(), String> {
        for (&stamp, &block) in &self.order {
            if self.stamp_of(block) != Some(stamp) {
                return Err(format!(
                    "free queue: block {block} is queued at stamp {stamp} but its stamp is {:?}",
                    self.stamp_of(block)
                ));
            }
            if stamp >= self.next_stamp {
                return Err(format!("free queue: stamp {stamp} was never handed out"));
            }
        }
        let stamped = self.stamps.iter().filter(|s| s.is_some()).count();
        if stamped != self.order.len() {
            return Err(format!(
                "free queue: {stamped} blocks are stamped free but {} are queued",
                self.order.len()
            ));
        }
        Ok(())
    }

    fn stamp_of(&self, block: u32) -> Option<u64> {
        self.stamps.get(block as usize).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::FreeQueue;

    #[test]
    fn never_used_blocks_come_first_then_least_recently_freed() {
        let mut q = FreeQueue::new(4);
        assert_eq!(q.pop_front(), Some(0));
        assert_eq!(q.pop_front(), Some(1));
        q.push_back(1);
        q.push_back(0);
        assert_eq!(q.pop_front(), Some(2));
        assert_eq!(q.pop_front(), Some(3));
        assert_eq!(q.pop_front(), Some(1));
        assert_eq!(q.pop_front(), Some(0));
        assert_eq!(q.pop_front(), None);
        q.check().unwrap();
    }

    #[test]
    fn remove_takes_a_block_from_the_middle_and_push_never_duplicates() {
        let mut q = FreeQueue::new(3);
        assert!(q.remove(1));
        assert!(!q.remove(1));
        assert!(!q.contains(1));
        q.push_back(0);
        q.push_back(0);
        assert_eq!(q.len(), 2);
        q.check().unwrap();
        assert!(!q.remove(7));
        q.push_back(7);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_front(), Some(2));
        assert_eq!(q.pop_front(), Some(0));
    }
}

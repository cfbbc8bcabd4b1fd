//! The single-request generator's pool of KV cache blocks (the serving engine's pool is
//! the KV allocator's, `kv_allocator`). Allocations give their blocks back when dropped, so
//! an early return cannot leak them.

use std::sync::{Arc, Mutex};

/// Not enough free blocks for a request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the KV cache has {free} free blocks, {wanted} are needed")]
pub struct OutOfBlocks {
    pub wanted: usize,
    pub free: usize,
}

/// The free list of a pool of blocks.
#[derive(Clone)]
pub struct BlockPool {
    free: Arc<Mutex<Vec<u32>>>,
}

/// Blocks held by one sequence, in order; dropping it frees them.
pub struct BlockAllocation {
    ids: Vec<u32>,
    free: Arc<Mutex<Vec<u32>>>,
}

impl BlockPool {
    /// A pool whose blocks are all free. Blocks are handed out lowest id first.
    pub fn new(num_blocks: u32) -> BlockPool {
        BlockPool {
            free: Arc::new(Mutex::new((0..num_blocks).rev().collect())),
        }
    }

    /// An empty allocation that grows with [`BlockAllocation::grow_to`].
    pub fn empty(&self) -> BlockAllocation {
        BlockAllocation {
            ids: Vec::new(),
            free: self.free.clone(),
        }
    }
}

impl BlockAllocation {
    /// The block ids, in sequence order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Takes free blocks until the allocation holds at least `blocks`; on failure nothing
    /// is taken.
    pub fn grow_to(&mut self, blocks: usize) -> Result<(), OutOfBlocks> {
        if blocks <= self.ids.len() {
            return Ok(());
        }
        let mut free = self.free.lock().expect("block pool lock");
        let wanted = blocks - self.ids.len();
        if free.len() < wanted {
            return Err(OutOfBlocks {
                wanted,
                free: free.len(),
            });
        }
        let at = free.len() - wanted;
        self.ids.extend(free.drain(at..).rev());
        Ok(())
    }
}

impl Drop for BlockAllocation {
    fn drop(&mut self) {
        if let Ok(mut free) = self.free.lock() {
            free.extend(self.ids.drain(..).rev());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_return_on_drop_and_failure_takes_nothing() {
        let pool = BlockPool::new(5);
        let mut a = pool.empty();
        a.grow_to(3).unwrap();
        assert_eq!(a.ids(), &[0, 1, 2]);
        let mut b = pool.empty();
        assert_eq!(b.grow_to(3), Err(OutOfBlocks { wanted: 3, free: 2 }));
        assert!(b.ids().is_empty(), "a failed grow takes nothing");
        drop(a);
        b.grow_to(4).unwrap();
        let mut c = pool.empty();
        assert_eq!(c.grow_to(2), Err(OutOfBlocks { wanted: 2, free: 1 }));
    }
}

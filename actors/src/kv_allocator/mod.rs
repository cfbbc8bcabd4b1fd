//! The KV allocator: the block pool of the paged KV cache, with reference-counted blocks,
//! per-sequence block tables, an LRU free queue and a prefix cache, behind an actor that
//! answers the scheduler's one `AllocateStep` per step.
//!
//! The prefix cache is exact: a full block's key is (the chain id of the previous block,
//! the block's token ids), compared in full, and chain ids are never reused (see
//! `prefix_cache.rs`).

mod actor;
mod admit;
mod block_manager;
mod disk_tier;
mod free_queue;
mod grow;
mod host_tier;
mod invariants;
mod prefix_cache;
mod step;
#[cfg(test)]
mod tests;

pub use actor::{KvAllocator, KvAllocatorHandle};
pub use block_manager::BlockManager;
pub use prefix_cache::{CacheEvent, ChainId, Medium};

//! The CPU stand-in for device memory and captured graphs, so that the padding, staging and
//! lifetime rules of graph replay (docs/architecture.md, rules 3 to 5) are exercised on any
//! machine.
//!
//! [`BufferPool`] hands out [`CpuBuffer`]s and recycles freed storage by size, as a caching
//! device allocator does: a freed buffer's memory is soon another buffer's. In poisoning
//! builds (this crate's tests, or the `poison` feature that the other crates' tests turn on)
//! freed storage is overwritten with a pattern that reads as NaN, as a huge integer or as an
//! out-of-range id, so that a replay that reads freed memory fails loudly.
//!
//! A [`CpuGraph`] records kernel calls with the buffers they touch and replays them in
//! order; every recorded op holds owning handles of its buffers, so nothing a graph reads
//! or writes returns to the pool while the graph lives.

mod graph;
mod pool;

pub use graph::{CpuGraph, GraphError, OpError};
pub use pool::{BufferHandle, BufferId, BufferPool, CpuBuffer, ReadGuard, WriteGuard, POISON_WORD};

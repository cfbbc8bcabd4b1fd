//! The serving runtime. For now: the KV block pool and the single-request generator that
//! `peregrine generate` drives. The gateway, scheduler, target runner, draft proposer and
//! graph-capture manager, with the typed messages between them, join this crate with the
//! serving issue.

pub mod block_pool;
pub mod generator;

pub use block_pool::{BlockAllocation, BlockPool, OutOfBlocks};
pub use generator::{FinishReason, GenerationRequest, GenerationStats, Generator};

//! The serving runtime: the actors (scheduler, KV allocator, target runner; the gateway
//! lives in the binary's `serve` command), the typed messages between them, and the
//! single-request generator that `peregrine generate` drives; the DraftProposer and the
//! speculation statistics.
//! The GraphCaptureManager (`graphs`) captures the decode step per batch size; `capture`
//! captures the target's and the draft's graphs together.

pub mod actor_thread;
pub mod backend;
pub mod block_pool;
pub mod capture;
pub mod draft;
pub mod engine;
pub mod gateway;
pub mod generator;
pub mod graphs;
pub mod kv_allocator;
pub mod messages;
pub mod metrics;
pub mod scheduler;
pub mod spec_alarm;
pub mod spec_stats;
pub mod target_runner;

pub use block_pool::{BlockAllocation, BlockPool, OutOfBlocks};
pub use generator::{GenerationRequest, GenerationStats, Generator};
pub use messages::FinishReason;

//! The serving runtime: the actors (the HTTP gateway, the scheduler, the KV allocator, the
//! target runner and its model backends, the draft proposer), the typed messages between
//! them (`messages`), how they are assembled (`engine`), the KV-cache events routers read
//! (`kv_events`), the disk tier's file (`kv_disk`), their metrics, liveness
//! (`health`), speculation statistics (under the scheduler, which keeps them); and the
//! graphs (`graphs`): the captured sizes, the GraphCaptureManager, the CPU backend's
//! graphs, and the capture of the target's and the draft's graphs together.

pub mod actor_thread;
pub mod backend;
pub mod draft;
pub mod engine;
pub mod gateway;
pub mod graphs;
pub mod health;
pub mod kv_allocator;
pub mod kv_disk;
pub mod kv_events;
pub mod messages;
pub mod metrics;
pub mod scheduler;
pub mod target_runner;

pub use messages::FinishReason;

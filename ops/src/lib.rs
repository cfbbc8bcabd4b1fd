//! Model operators built on the kernels: linear layers, norms, rotary embeddings, paged
//! attention with its metadata planner, the KV cache, and sampling.

pub mod attention;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod kv_cache;
pub mod linear;
pub mod norm;
pub mod rotary;
pub mod sampling;

pub use attention::{AttentionPlan, MlaAttention, PagedAttention, PlanError, SeqSpec, StagedMeta};
pub use kv_cache::{KvCache, KvDtype, KvRows};
pub use linear::Linear;
pub use norm::RmsNorm;
pub use rotary::{RopeScaling, Rotary, RotaryLayout, RotaryTables};

//! Why a GPU attention call, KV write or plan was refused or failed.

use crate::attention::PlanError;
use cudarc::driver::DriverError;

/// Why an attention call or KV write was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum AttentionError {
    /// The plan does not fit its buffers (more planned rows than q, o or qkv hold).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The driver reported an error.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    /// The plan names a block or slot past the pool the caches hold.
    #[error("attention plan names {what} {index} but the pool has {limit}")]
    OutsidePool {
        /// `"block"` or `"slot"`.
        what: &'static str,
        /// The largest block id or slot the plan names.
        index: u64,
        /// Blocks (or slots) in the pool, or the i32 table's limit.
        limit: u64,
    },
    /// Heads, head size, strides or columns that do not match the layout or the buffers.
    #[error("attention shape: {0}")]
    Shape(String),
}

//! Paged attention: the metadata planner and the attention op that checks a plan against
//! its buffers before running.

mod paged;
mod plan;

pub use paged::PagedAttention;
pub use plan::{AttentionPlan, PlanError, PlannedSeq, SeqSpec};

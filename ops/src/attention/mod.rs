//! Paged attention: the metadata planner and the attention op that checks a plan (or the
//! staged metadata of a graph) against its buffers before running.

mod paged;
mod plan;

pub use paged::{PagedAttention, StagedMeta};
pub use plan::{AttentionPlan, PlanError, PlannedSeq, SeqSpec};

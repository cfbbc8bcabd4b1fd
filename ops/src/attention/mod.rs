//! Paged attention: the metadata planner and the attention ops (grouped-query, and latent) that checks a plan (or the
//! staged metadata of a graph) against its buffers before running.

mod mla;
mod paged;
mod plan;

pub use mla::MlaAttention;
pub use paged::{PagedAttention, StagedMeta};
pub use plan::{AttentionPlan, PlanError, PlannedSeq, SeqSpec};

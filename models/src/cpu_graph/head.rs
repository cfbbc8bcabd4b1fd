//! What a draft head (an EAGLE-3 head, an MTP layer) shows a graph of its decode step: the
//! buffers it records over, at the largest step they serve, and its recording, so that one
//! capture and one staging path serve every head.

use super::ops::Graph;
use super::step_io::{StepInputs, StepShape};
use crate::eagle3::FeatureKind;
use crate::llama::ForwardError;
use peregrine_runtime::cpu_graph::CpuBuffer;

/// The buffers of a head's forward that a caller stages into and reads back.
pub trait HeadIo {
    /// The staged inputs.
    fn inputs(&self) -> &StepInputs;
    /// `[rows, width]` the staged feature of each row.
    fn feature(&self) -> &CpuBuffer<f32>;
    /// `[logit_rows, vocab]` the logits of the logit rows.
    fn logits(&self) -> &CpuBuffer<f32>;
    /// `[rows, H]` every row's `pre` after a replay.
    fn pre(&self) -> &CpuBuffer<f32>;
}

/// A head whose forward records into a CPU graph over buffers of its own.
pub trait GraphHead {
    /// Its buffers.
    type Buffers: HeadIo;
    /// The width of one row of the feature of `kind`.
    fn feature_width(&self, kind: FeatureKind) -> usize;
    /// Buffers for steps up to `capacity` fed features of `kind`, with block tables of
    /// `max_blocks`, from the head's pool.
    fn buffers(&self, capacity: StepShape, max_blocks: usize, kind: FeatureKind) -> Self::Buffers;
    /// Records the head's forward of a step of `shape` (at most the buffers' capacity) over
    /// `b`.
    fn record(
        &self,
        graph: &mut Graph,
        b: &Self::Buffers,
        shape: StepShape,
    ) -> Result<(), ForwardError>;
}

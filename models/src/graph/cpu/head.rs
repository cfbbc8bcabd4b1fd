//! What a draft head (an EAGLE-3 head, an MTP layer) shows a graph of its decode step: the
//! buffers it records over, at the largest step they serve, and its recording, so that one
//! capture and one staging path serve every head.

use super::ops::Graph;
use super::step_io::{StepInputs, StepShape};
use crate::eagle3::{FeatureKind, HeadInput, HeadOutput, HeadStaging};
use crate::llama::{check_inputs, ForwardError};
use peregrine_ops::{AttentionPlan, KvCache};
use peregrine_runtime::cpu::{CpuBuffer, CpuGraph};

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

/// One eager forward of `head`: `tokens` (target ids below `vocab`, one per planned row of
/// `plan`) fed `input` from the host, staged at the step's own size into buffers from the
/// head's pool, recorded and replayed once against `cache` (a captured graph replays the
/// same recording); the logits of `logit_rows` and `pre` of every row.
pub fn forward_eagerly<H: GraphHead>(
    head: &H,
    vocab: usize,
    tokens: &[u32],
    input: HeadInput,
    plan: &AttentionPlan,
    cache: &mut KvCache,
    logit_rows: &[usize],
) -> Result<HeadOutput, ForwardError> {
    check_inputs(tokens, plan, logit_rows, vocab)?;
    let Some((kind, features)) = input.host() else {
        return Err(ForwardError::DeviceFeatures);
    };
    let width = head.feature_width(kind);
    if features.len() != tokens.len() * width {
        return Err(ForwardError::HiddenShape {
            what: match kind {
                FeatureKind::Aux => "aux hidden states",
                FeatureKind::Pre => "pre",
            },
            len: features.len(),
            rows: tokens.len(),
            width,
        });
    }
    let (shape, max_blocks) = StepShape::of(tokens, plan, logit_rows);
    let buffers = head.buffers(shape, max_blocks, kind);
    HeadStaging::new(shape, max_blocks, -1, width)?
        .stage(&buffers, tokens, features, plan, logit_rows, shape)?;
    let mut graph = CpuGraph::new();
    head.record(&mut graph, &buffers, shape)?;
    graph.replay(cache)?;
    let logits = buffers.logits().read().to_vec();
    let pre = buffers.pre().read().to_vec();
    Ok(HeadOutput { logits, pre })
}

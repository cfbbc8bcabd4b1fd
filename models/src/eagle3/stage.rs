//! Staging a planned step of the head into its buffers, padded up to a size: the step's
//! inputs as [`StepStaging`] stages them, and each row's feature (`[rows, width]`, batch
//! on axis 0), whose padded rows repeat the last real row.

use crate::graph::cpu::head::HeadIo;
use crate::graph::cpu::step_io::{copy, StepShape, StepStaging};
use crate::llama::ForwardError;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::{Padding, StagedInput};

/// The host side of staging a head step.
pub struct HeadStaging {
    step: StepStaging,
    feature: StagedInput<f32>,
    width: usize,
}

impl HeadStaging {
    /// Staging for steps up to `capacity` with block tables of `max_blocks` and features
    /// of `width`; padded rows write their keys and values into `scratch_slot` (negative:
    /// nowhere).
    pub fn new(
        capacity: StepShape,
        max_blocks: usize,
        scratch_slot: i64,
        width: usize,
    ) -> Result<HeadStaging, ForwardError> {
        let shape = [capacity.rows, width];
        Ok(HeadStaging {
            step: StepStaging::new(capacity, max_blocks, scratch_slot)?,
            feature: StagedInput::new("feature", &shape, 0, Padding::RepeatLast)?,
            width,
        })
    }

    /// Stages `tokens` with their `features` (`[tokens, width]`) under `plan` (planned
    /// over the real tokens), with logits at `logit_rows`, padded up to `padded`, into
    /// `buffers`.
    pub fn stage(
        &mut self,
        buffers: &impl HeadIo,
        tokens: &[u32],
        features: &[f32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        padded: StepShape,
    ) -> Result<(), ForwardError> {
        let n = tokens.len();
        if features.len() != n * self.width {
            return Err(ForwardError::HiddenShape {
                what: "features",
                len: features.len(),
                rows: n,
                width: self.width,
            });
        }
        self.step
            .stage(buffers.inputs(), tokens, plan, logit_rows, padded)?;
        copy(
            &mut self.feature,
            features,
            n,
            padded.rows,
            buffers.feature(),
        )
    }
}

//! The CPU backend's captured graphs of a draft head's decode step (an EAGLE-3 head's or an
//! MTP layer's draft steps after the first: one row per request, fed the row's previous
//! `pre`): one recorded
//! forward per batch size, all viewing one set of buffers sized for the largest, and the
//! staging that pads a batch (and its `pre` rows) up to its graph's size.

use crate::graphs::{CaptureSizes, GraphCaptureManager};
use peregrine_models::eagle3::{FeatureKind, HeadOutput, HeadStaging};
use peregrine_models::graph::cpu::head::{GraphHead, HeadIo};
use peregrine_models::StepShape;
use peregrine_ops::{AttentionPlan, KvCache};
use peregrine_runtime::cpu::CpuGraph;

/// Graphs of the head's decode step with the buffers they share (each graph also owns
/// them).
pub struct CpuHeadGraphs<H: GraphHead> {
    manager: GraphCaptureManager<CpuGraph<KvCache>>,
    buffers: H::Buffers,
    staging: HeadStaging,
    hidden: usize,
}

impl<H: GraphHead> CpuHeadGraphs<H> {
    /// Captures `head`'s decode step for every size of `sizes`, over block tables of
    /// `max_blocks`; padded rows write their keys and values into `scratch_slot`.
    pub fn capture(
        head: &H,
        sizes: &CaptureSizes,
        max_blocks: usize,
        scratch_slot: i64,
    ) -> anyhow::Result<CpuHeadGraphs<H>> {
        let largest = StepShape::decode(sizes.largest());
        let kind = FeatureKind::Pre;
        let buffers = head.buffers(largest, max_blocks, kind);
        let hidden = head.feature_width(kind);
        let staging = HeadStaging::new(largest, max_blocks, scratch_slot, hidden)?;
        let manager = GraphCaptureManager::capture(sizes.clone(), |size| {
            let mut graph = CpuGraph::new();
            head.record(&mut graph, &buffers, StepShape::decode(size))?;
            Ok(graph)
        })?;
        Ok(CpuHeadGraphs {
            manager,
            buffers,
            staging,
            hidden,
        })
    }

    /// The captured sizes.
    pub fn sizes(&self) -> &CaptureSizes {
        self.manager.sizes()
    }

    /// Replays the graph that serves this step, padded up to its size, if the step is pure
    /// decode (one token and one logit row per sequence, in order) and a captured size
    /// holds it; `pre` holds each row's previous `pre`. `None` leaves the step to the
    /// eager forward.
    pub fn replay(
        &mut self,
        tokens: &[u32],
        pre: &[f32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        cache: &mut KvCache,
    ) -> anyhow::Result<Option<HeadOutput>> {
        let n = plan.seqs().len();
        let max_blocks = self.buffers.inputs().max_blocks;
        let Some((size, graph)) = self
            .manager
            .graph_for_step(tokens, plan, logit_rows, max_blocks)
        else {
            return Ok(None);
        };
        let padded = StepShape::decode(size);
        self.staging
            .stage(&self.buffers, tokens, pre, plan, logit_rows, padded)?;
        graph.replay(cache)?;
        let vocab = self.buffers.logits().len() / self.sizes().largest();
        let logits = self.buffers.logits().read()[..n * vocab].to_vec();
        let pre = self.buffers.pre().read()[..n * self.hidden].to_vec();
        Ok(Some(HeadOutput { logits, pre }))
    }
}

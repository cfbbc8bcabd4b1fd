//! The CPU backend's captured decode graphs: one recorded forward per batch size, all
//! viewing one set of buffers sized for the largest, and the staging that pads a batch up
//! to its graph's size.

use crate::graphs::{CaptureSizes, GraphCaptureManager};
use peregrine_models::{LlamaBuffers, LlamaModel, StepShape, StepStaging};
use peregrine_ops::{AttentionPlan, KvCache};
use peregrine_runtime::cpu::CpuGraph;

/// Graphs of the decode step with the buffers they share (each graph also owns them).
pub struct CpuDecodeGraphs {
    manager: GraphCaptureManager<CpuGraph<KvCache>>,
    buffers: LlamaBuffers,
    staging: StepStaging,
}

/// What a replay gives back: the logits of the real rows, and their hidden states when
/// recorded.
pub struct Replayed {
    /// `[n, vocab]`: the real rows' logits.
    pub logits: Vec<f32>,
    /// `[n, aux_layers * hidden]`: the real rows' recorded hidden states, if recorded.
    pub hidden: Option<Vec<f32>>,
    /// The captured size the batch was padded to.
    pub size: usize,
}

impl CpuDecodeGraphs {
    /// Captures `model`'s decode step for every size of `sizes`, over block tables of
    /// `max_blocks`, recording the inputs of `aux_layers`; padded rows write their keys and
    /// values into `scratch_slot`.
    pub fn capture(
        model: &LlamaModel,
        sizes: &CaptureSizes,
        max_blocks: usize,
        scratch_slot: i64,
        aux_layers: &[usize],
    ) -> anyhow::Result<CpuDecodeGraphs> {
        let largest = StepShape::decode(sizes.largest());
        let buffers = model.buffers(largest, max_blocks, aux_layers.len());
        let staging = StepStaging::new(largest, max_blocks, scratch_slot)?;
        let manager = GraphCaptureManager::capture(sizes.clone(), |size| {
            let mut graph = CpuGraph::new();
            model.record(&mut graph, &buffers, StepShape::decode(size), aux_layers)?;
            Ok(graph)
        })?;
        Ok(CpuDecodeGraphs {
            manager,
            buffers,
            staging,
        })
    }

    /// The captured sizes.
    pub fn sizes(&self) -> &CaptureSizes {
        self.manager.sizes()
    }

    /// Replays the graph that serves this step, padded up to its size, if the step is pure
    /// decode (one token and one logit row per sequence, in order) and a captured size
    /// holds it; `None` leaves the step to the eager forward.
    pub fn replay(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        cache: &mut KvCache,
        vocab: usize,
    ) -> anyhow::Result<Option<Replayed>> {
        let n = plan.seqs().len();
        let max_blocks = self.buffers.inputs.max_blocks;
        let Some((size, graph)) = self
            .manager
            .graph_for_step(tokens, plan, logit_rows, max_blocks)
        else {
            return Ok(None);
        };
        let padded = StepShape::decode(size);
        let inputs = &self.buffers.inputs;
        self.staging
            .stage(inputs, tokens, plan, logit_rows, padded)?;
        graph.replay(cache)?;
        let logits = self.buffers.logits.read()[..n * vocab].to_vec();
        let aux = self.buffers.aux.read();
        let width = aux.len() / size.max(1);
        let hidden = (width > 0).then(|| aux[..n * width].to_vec());
        Ok(Some(Replayed {
            logits,
            hidden,
            size,
        }))
    }
}

//! What every model's CUDA graphs are built of, whichever the model (the Llama family's
//! decode and verification steps in `llama::cuda::graph`, an EAGLE-3 head's decode step in
//! `draft_head::cuda::graph`): the limits a set of graphs serves, the buffers their captures
//! share (allocated at the largest size, reused by every smaller capture, held by every
//! graph: docs/architecture.md, rule 5), the graphs of one step per context class, the
//! scratch step a graph is captured from, and the capture itself.

use crate::llama::cuda::forward::GpuForwardError;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::attention::{DecodeKernel, PARTITION_TOKENS};
use peregrine_ops::cuda::attention::AttentionError;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::{AttentionPlan, PlanError, SeqSpec};
use peregrine_runtime::cuda::Gpu;
use std::sync::{Arc, Mutex};

/// A KV cache that captured graphs share with the eager steps: a graph holds it, so the
/// cache cannot be freed while the graph lives.
pub type SharedKvCache = Arc<Mutex<GpuKvCache>>;

/// What the decode graphs of a model serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphLimits {
    /// The largest captured size: the rows the shared buffers hold.
    pub max_rows: usize,
    /// The longest context a graph serves (longer steps run eagerly).
    pub max_context: usize,
    /// The slot padded rows write into; its block belongs to no sequence.
    pub scratch_slot: i64,
}

impl GraphLimits {
    /// Whether buffers allocated for these limits serve a capture of `size` rows under
    /// `wanted`: as many rows or more, the same longest context and scratch slot.
    pub fn serve(&self, size: usize, wanted: &GraphLimits) -> bool {
        self.max_rows >= size
            && self.max_context == wanted.max_context
            && self.scratch_slot == wanted.scratch_slot
    }
}

/// The buffers a model's captured graphs share, one set per kind of graph: each set is
/// allocated by the first capture of its kind (the largest size: capture that first) and
/// reused by every later capture it serves; a capture it does not serve allocates a new
/// set, which replaces it for the captures after. Every graph holds the set it was captured
/// over, so replacing a set frees nothing a graph reads.
pub struct SharedGraphBuffers<B>(Vec<Arc<Mutex<B>>>);

impl<B> Default for SharedGraphBuffers<B> {
    fn default() -> Self {
        SharedGraphBuffers(Vec::new())
    }
}

impl<B> SharedGraphBuffers<B> {
    /// Forgets every set: the next capture of each kind allocates anew.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// The set of buffers of the kind `same_kind` picks, if `serves` says it serves the
    /// capture at hand; else a new set from `allocate`, which replaces that kind's.
    pub fn for_capture(
        &mut self,
        same_kind: impl Fn(&B) -> bool,
        serves: impl Fn(&B) -> bool,
        allocate: impl FnOnce() -> anyhow::Result<B>,
    ) -> anyhow::Result<Arc<Mutex<B>>> {
        let lock = |b: &Arc<Mutex<B>>| -> bool {
            let b = b.lock().unwrap_or_else(|e| e.into_inner());
            same_kind(&b) && serves(&b)
        };
        if let Some(held) = self.0.iter().find(|b| lock(b)) {
            return Ok(held.clone());
        }
        let fresh = Arc::new(Mutex::new(allocate()?));
        self.0
            .retain(|b| !same_kind(&b.lock().unwrap_or_else(|e| e.into_inner())));
        self.0.push(fresh.clone());
        Ok(fresh)
    }
}

/// The context classes a decode step is captured for: contexts of one split partition
/// (whose grids launch no combine), then every context up to `max_context`. The prefill
/// kernel's grid does not depend on the context: one class.
pub fn context_classes(max_context: usize, decode: DecodeKernel) -> Vec<usize> {
    match decode {
        DecodeKernel::Split if max_context > PARTITION_TOKENS => {
            vec![PARTITION_TOKENS, max_context]
        }
        _ => vec![max_context],
    }
}

/// One captured step's graphs, one per context class, by ascending class: the longest
/// context each serves.
pub struct ContextGraphs(Vec<(usize, CudaGraph)>);

impl ContextGraphs {
    /// A graph per class of `classes` (ascending): `stage` stages the step into `state`
    /// for grids that serve contexts up to a class, `queue` queues it (see
    /// [`capture_graph`]).
    pub fn capture<S>(
        gpu: &Gpu,
        classes: Vec<usize>,
        state: &mut S,
        stage: impl Fn(&mut S, usize) -> Result<(), GpuForwardError>,
        queue: impl Fn(&mut S) -> Result<(), GpuForwardError>,
    ) -> anyhow::Result<ContextGraphs> {
        let mut graphs = Vec::with_capacity(classes.len());
        for context in classes {
            stage(state, context)?;
            graphs.push((context, capture_graph(gpu, || queue(state))?));
        }
        Ok(ContextGraphs(graphs))
    }

    /// The longest context a graph serves.
    pub fn max_context(&self) -> usize {
        self.0.last().map_or(0, |(c, _)| *c)
    }

    /// The graph of the smallest class that serves a step whose longest context is
    /// `plan`'s, with that class; refused past the largest class.
    pub fn serving(&self, plan: &AttentionPlan) -> Result<(usize, &CudaGraph), GpuForwardError> {
        let longest = plan.seqs().iter().map(|s| s.context_len).max().unwrap_or(0);
        match self.0.iter().find(|(c, _)| *c >= longest) {
            Some((context, graph)) => Ok((*context, graph)),
            None => Err(AttentionError::Shape(format!(
                "a context of {longest} tokens, past the graphs' {}",
                self.max_context()
            ))
            .into()),
        }
    }
}

/// The plan of a step of `size` one-token sequences at position 0 of the scratch block (that
/// of `scratch_slot`): the step a graph is captured from, which writes no sequence's KV.
pub fn scratch_plan(
    size: usize,
    scratch_slot: i64,
    layout: &KvLayout,
) -> Result<AttentionPlan, PlanError> {
    let block_size = layout.block_size as usize;
    let table = [(scratch_slot as usize / block_size) as u32];
    let specs: Vec<SeqSpec> = (0..size)
        .map(|_| SeqSpec {
            num_cached: 0,
            num_new: 1,
            block_table: &table,
        })
        .collect();
    AttentionPlan::new(&specs, block_size, layout.num_blocks)
}

/// Runs `queue` once eagerly and waits for it, so that every lazy allocation and choice
/// (cuBLASLt plans) happens outside the capture, then captures what it queues on `gpu`'s
/// stream into a graph, uploaded.
pub fn capture_graph(
    gpu: &Gpu,
    mut queue: impl FnMut() -> Result<(), GpuForwardError>,
) -> anyhow::Result<CudaGraph> {
    queue()?;
    gpu.synchronize()?;
    let stream = gpu.stream();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let queued = queue();
    // The capture ends whatever happened, so that the stream is usable again.
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    queued?;
    let graph = graph?.ok_or_else(|| anyhow::anyhow!("the capture recorded nothing"))?;
    graph.upload()?;
    Ok(graph)
}

//! Decode steps captured as CUDA graphs: one graph per batch size, all reading and writing
//! one set of buffers allocated at the largest size, which every graph holds (docs/architecture.md,
//! rule 5), with the model's weights and the KV cache. Verification steps (each sequence's
//! last token and its drafts, any number a sequence, every row a logit row) are captured
//! the same way per number of rows, over a set of buffers of their own, their attention
//! through the model's decode kernel: the split kernel takes each row as the decode row it
//! would be (the plan cuts the sequences into one-row sequences; the kernel writes each
//! row's key and value, a row reading its sequence's earlier rows from qkv), its grid of one row's partitions per
//! row holding any such step; under --deterministic the prefill kernel, whose grid of one
//! work item per row holds the query tiles of any such step (a tile holds at least one
//! row).
//!
//! Each decode size is captured once per context class (contexts of one split partition,
//! and the rest up to the longest a graph serves), so that short contexts launch no
//! combine; the prefill kernel has one grid for every context.
//! A step is padded up to its graph's size: token ids and positions repeat the last real
//! row, slot mappings point padded rows at a scratch slot no sequence owns, and attention
//! is planned over the real rows only (the graph's grids are those of its size; the kernels
//! skip the work items past the step's). The argmax of every row is part of the graph; a
//! decode graph's also writes each token as the next step's token id and into page-locked
//! host memory (see `ahead`), which is why a decode step is captured in two variants, one
//! per host buffer, and its launches alternate between them.

use super::{attention_plan, scratch_heads, GpuForwardError, GpuLlama, LlamaCore, Workspace};
use crate::draft_head::cuda::hand_off::{DraftHandOff, HandOffError};
use crate::draft_head::HandedDraft;
use crate::graph::cuda::{
    context_classes, scratch_plan, ContextGraphs, GraphLimits, SharedKvCache,
};
use crate::llama::check_inputs;
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaView};
use peregrine_kernels::cuda::sampling::{greedy_verdicts, ArgmaxCopies};
use peregrine_ops::cuda::attention::{AttentionError, DeviceAttentionPlan};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::cuda::MappedHost;
use std::sync::{Arc, Mutex, MutexGuard};

mod ahead;
pub use ahead::{AuxHandOff, GreedyInput, QueuedStep, StepMasks};

/// What a graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphKind {
    /// Decode steps: one row a sequence, through the model's decode kernel.
    Decode,
    /// Verification steps: any rows a sequence, each row through the model's decode kernel
    /// (see the module docs).
    Verify,
}

/// The buffers every graph of one kind of a model addresses.
pub(super) struct GraphBuffers {
    limits: GraphLimits,
    kind: GraphKind,
    plan: DeviceAttentionPlan,
    work: Workspace,
    /// Steps queued over these buffers so far (replays, and the runs of a capture): a step
    /// queued ahead is read only while no step came after it.
    steps: u64,
    /// Where a decode graph's argmax publishes its tokens to the host, one buffer per
    /// variant of the graph (`max_rows` each): launches alternate between the variants, so
    /// the host reads one step's tokens while the next step writes the other buffer.
    published: [MappedHost<u32>; GRAPH_VARIANTS],
    /// Recorded after a launch of each variant by [`CapturedDecode::greedy_step`].
    done: [CudaEvent; GRAPH_VARIANTS],
    /// A verification's sequences' row offsets (`max_rows + 1`) and its greedy verdicts
    /// (`2 * max_rows`: each sequence's accepted drafts, then every row's argmax), for
    /// [`ReplayedStep::greedy_verdicts`].
    verdict_starts: CudaSlice<i32>,
    verdicts: CudaSlice<i32>,
}

/// Variants a decode step is captured in, differing only in where its argmax publishes
/// the tokens for the host.
const GRAPH_VARIANTS: usize = 2;

/// One captured decode (or verification) step and everything its kernels address.
pub struct CapturedDecode {
    /// Rows: sequences of a decode graph.
    size: usize,
    kind: GraphKind,
    /// The step's graphs, one set per variant (decode steps: [`GRAPH_VARIANTS`]).
    graphs: Vec<ContextGraphs>,
    buffers: Arc<Mutex<GraphBuffers>>,
    core: Arc<LlamaCore>,
    _cache: SharedKvCache,
}

// SAFETY: a graph's executable may be launched from any thread; it is launched only under
// the lock of its buffers, so never concurrently with itself or another graph that shares
// them. The other fields are Send.
unsafe impl Send for CapturedDecode {}

impl CapturedDecode {
    /// The rows (the sequences of a decode step) the graph was captured for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// What the graph runs.
    pub fn kind(&self) -> GraphKind {
        self.kind
    }

    /// The longest context the graph serves.
    pub fn max_context(&self) -> usize {
        self.graphs[0].max_context()
    }
}

/// The outputs of one replay; the graphs' buffers stay locked while it lives.
pub struct ReplayedStep<'a> {
    buffers: MutexGuard<'a, GraphBuffers>,
    core: &'a LlamaCore,
    rows: usize,
}

impl ReplayedStep<'_> {
    /// The logits of the real rows, `[rows, vocab]` f32.
    pub fn logits(&self) -> CudaView<'_, f32> {
        let vocab = self.core.config.vocab_size;
        self.buffers.work.logits.slice(0..self.rows * vocab)
    }

    /// The layer inputs the graph recorded for the real rows, f32 `[rows, layers *
    /// hidden]`, when its model records some.
    pub fn aux(&self) -> Option<CudaView<'_, f32>> {
        self.buffers.aux(self.rows, self.core.config.hidden_size)
    }

    /// The argmax of each real row, copied to the host (waits for the graph).
    pub fn greedy_ids(&self) -> Result<Vec<u32>, GpuForwardError> {
        Ok(self
            .core
            .gpu
            .download(&self.buffers.work.ids.slice(0..self.rows))?)
    }

    /// The greedy verdicts of a verification step, judged on the device and read back
    /// once (waits for the graph): each real row's argmax, and how many drafts each
    /// sequence accepts, a sequence's rows being `starts[s]..starts[s + 1]` (its last
    /// token, then its drafts; `starts` rises from 0 to the real rows) and a draft accepted
    /// while the argmax of the row before it is the draft. Refused for other offsets.
    pub fn greedy_verdicts(
        &mut self,
        starts: &[usize],
    ) -> Result<(Vec<u32>, Vec<usize>), GpuForwardError> {
        let rows = self.rows;
        let rises = starts.windows(2).all(|w| w[0] < w[1]);
        if starts.first() != Some(&0) || starts.last() != Some(&rows) || !rises {
            return Err(AttentionError::Shape(format!(
                "verdicts over sequences starting at rows {starts:?} of a step of {rows}"
            ))
            .into());
        }
        let n = starts.len() - 1;
        let stream = self.core.gpu.stream();
        // Rows of a step: below 2^31.
        let offsets: Vec<i32> = starts.iter().map(|&r| r as i32).collect();
        let b = &mut *self.buffers;
        stream.memcpy_htod(&offsets, &mut b.verdict_starts.slice_mut(0..n + 1))?;
        greedy_verdicts(
            &self.core.kernels,
            stream,
            (
                &b.work.ids.slice(0..rows),
                &b.plan.token_ids().slice(0..rows),
            ),
            &b.verdict_starts.slice(0..n + 1),
            &mut b.verdicts.slice_mut(0..n + rows),
            n,
        )?;
        let out = self.core.gpu.download(&b.verdicts.slice(0..n + rows))?;
        let accepted = out[..n].iter().map(|&a| a as usize).collect();
        let ids = out[n..].iter().map(|&id| id as u32).collect();
        Ok((ids, accepted))
    }
}

impl GraphBuffers {
    /// The layer inputs the last step recorded for its first `rows` rows (of `hidden`
    /// features a layer), f32 `[rows, layers * hidden]`, where the graphs record some.
    fn aux(&self, rows: usize, hidden: usize) -> Option<CudaView<'_, f32>> {
        let aux = self.work.aux.as_ref()?;
        Some(aux.states.slice(0..rows * aux.layers.len() * hidden))
    }

    fn new(
        core: &LlamaCore,
        limits: GraphLimits,
        kind: GraphKind,
        block_size: usize,
        aux_layers: &[usize],
    ) -> anyhow::Result<Self> {
        let c = &core.config;
        let gpu = &core.gpu;
        let rows = limits.max_rows;
        let capacity = PlanCapacity {
            rows,
            decode_only: kind == GraphKind::Decode,
            max_context: limits.max_context,
            block_size,
            scratch_slot: limits.scratch_slot,
        };
        let kernel = core.decode_kernel;
        let (heads, head_dim) = scratch_heads(c);
        let plan = DeviceAttentionPlan::fixed(gpu, kernel, capacity, heads, head_dim)?;
        let plan = attention_plan(c, &core.kernels, plan);
        let work = Workspace::new(gpu, c, rows, rows, aux_layers)?;
        let published = [
            MappedHost::new(gpu.stream(), rows)?,
            MappedHost::new(gpu.stream(), rows)?,
        ];
        let done = [
            gpu.context().new_event(None)?,
            gpu.context().new_event(None)?,
        ];
        Ok(GraphBuffers {
            limits,
            kind,
            plan,
            work,
            steps: 0,
            published,
            done,
            verdict_starts: gpu.zeros(rows + 1)?,
            verdicts: gpu.zeros(2 * rows)?,
        })
    }

    /// Stages a step (`tokens` over `plan`) padded to `size` rows, for grids that serve
    /// contexts up to `context`.
    fn stage(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        size: usize,
        context: usize,
    ) -> Result<(), GpuForwardError> {
        // Decode and verification graphs give the logits of every row, in order.
        let rows: Vec<usize> = (0..tokens.len()).collect();
        self.plan.stage_padded(tokens, plan, &rows, size, context)?;
        Ok(())
    }

    /// The variant of the next launch, of `variants`: launches alternate between them.
    fn next_variant(&self, variants: usize) -> usize {
        (self.steps % variants as u64) as usize
    }

    /// Launches `graph` (one of those captured over these buffers) on the staged step.
    fn launch_graph(&mut self, graph: &CudaGraph) -> Result<(), GpuForwardError> {
        self.steps += 1;
        graph.launch()?;
        Ok(())
    }

    /// Queues the forward and argmax of `size` staged rows (all of them logit rows). A
    /// decode step's argmax also writes each token as the next step's token id and into
    /// the `variant`'s published buffer.
    fn launch(
        &mut self,
        core: &LlamaCore,
        size: usize,
        cache: &mut GpuKvCache,
        variant: usize,
    ) -> Result<(), GpuForwardError> {
        self.steps += 1;
        core.launch(&mut self.work, size, size, true, &self.plan, cache)?;
        let copies = match self.kind {
            GraphKind::Decode => ArgmaxCopies {
                fed: Some(self.plan.token_ids_mut()),
                published: Some(&self.published[variant]),
            },
            GraphKind::Verify => ArgmaxCopies::default(),
        };
        core.argmax_copying(&mut self.work, size, copies)
    }
}

impl GpuLlama {
    /// Captures the decode step of `size` sequences (one token each) over `cache` as one
    /// graph per context class, serving contexts up to `limits.max_context`. The first
    /// capture, or one past the rows of the shared buffers or with other limits, allocates
    /// new shared buffers (capture the largest size first). Each graph's step is run once
    /// eagerly before it is captured, over the scratch slot alone.
    pub fn capture_decode(
        &mut self,
        size: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedDecode> {
        self.capture(size, GraphKind::Decode, limits, cache)
    }

    /// [`GpuLlama::capture_decode`] for verification steps of up to `rows` rows (any
    /// number a sequence, every row a logit row), over buffers of their own of
    /// `limits.max_rows` rows.
    pub fn capture_verify(
        &mut self,
        rows: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedDecode> {
        self.capture(rows, GraphKind::Verify, limits, cache)
    }

    fn capture(
        &mut self,
        size: usize,
        kind: GraphKind,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedDecode> {
        anyhow::ensure!(
            size >= 1 && size <= limits.max_rows,
            "a graph of {size} rows past the {} its buffers hold",
            limits.max_rows
        );
        let core = self.core.clone();
        let mut kv = cache.lock().unwrap_or_else(|e| e.into_inner());
        let block_size = kv.layout().block_size as usize;
        let aux_layers = self.work.aux_layers().to_vec();
        let buffers = self.graph_buffers.for_capture(
            |b| b.kind == kind,
            |b| b.limits.serve(size, &limits) && b.work.aux_layers() == aux_layers,
            || GraphBuffers::new(&core, limits, kind, block_size, &aux_layers),
        )?;
        let plan = scratch_plan(size, limits.scratch_slot, kv.layout())?;
        let tokens = vec![0u32; size];
        let classes = context_classes(limits.max_context, core.decode_kernel);
        let variants = match kind {
            GraphKind::Decode => GRAPH_VARIANTS,
            GraphKind::Verify => 1,
        };
        let mut b = buffers.lock().unwrap_or_else(|e| e.into_inner());
        let graphs = (0..variants)
            .map(|variant| {
                ContextGraphs::capture(
                    &core.gpu,
                    classes.clone(),
                    &mut (&mut *b, &mut *kv),
                    |(b, _), context| b.stage(&tokens, &plan, size, context),
                    |(b, kv)| b.launch(&core, size, kv, variant),
                )
            })
            .collect::<anyhow::Result<_>>()?;
        drop(b);
        Ok(CapturedDecode {
            size,
            kind,
            graphs,
            buffers,
            core,
            _cache: cache.clone(),
        })
    }
}

impl CapturedDecode {
    /// Runs the step `tokens` over `plan` (planned over the real rows) through the graph,
    /// padded to its size; every row is a logit row. Refused, with nothing launched, when
    /// the step does not fit the graph (more rows, a longer context, or for a decode graph
    /// a sequence of more than one row): run it eagerly then.
    pub fn replay(
        &self,
        tokens: &[u32],
        plan: &AttentionPlan,
    ) -> Result<ReplayedStep<'_>, GpuForwardError> {
        check_inputs(tokens, plan, &[], self.core.config.vocab_size)?;
        let mut b = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        let variant = b.next_variant(self.graphs.len());
        let (context, graph) = self.serving(tokens.len(), plan, variant)?;
        b.stage(tokens, plan, self.size, context)?;
        b.launch_graph(graph)?;
        Ok(ReplayedStep {
            buffers: b,
            core: &self.core,
            rows: tokens.len(),
        })
    }

    /// [`CapturedDecode::replay`] with some of the step's tokens taken from drafts a draft
    /// head left on the device: token `row` of `tokens` (a placeholder there) is `draft`
    /// for each `(row, draft)` of `fed`, written on the device after the rest are staged and
    /// before the graph runs, its stream waiting for the head's write. Refused, with
    /// nothing launched, as `replay` is, and for a row past the step's tokens or a draft
    /// `hand_off` no longer holds.
    pub fn replay_fed(
        &self,
        tokens: &[u32],
        plan: &AttentionPlan,
        hand_off: &DraftHandOff,
        fed: &[(usize, HandedDraft)],
    ) -> Result<ReplayedStep<'_>, GpuForwardError> {
        check_inputs(tokens, plan, &[], self.core.config.vocab_size)?;
        if let Some(&(row, _)) = fed.iter().find(|(row, _)| *row >= tokens.len()) {
            let rows = tokens.len();
            return Err(HandOffError::Row { row, rows }.into());
        }
        let mut b = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        let variant = b.next_variant(self.graphs.len());
        let (context, graph) = self.serving(tokens.len(), plan, variant)?;
        b.stage(tokens, plan, self.size, context)?;
        let (kernels, stream) = (&self.core.kernels, self.core.gpu.stream());
        hand_off.feed(kernels, stream, fed, &mut b.plan.token_ids_mut())?;
        b.launch_graph(graph)?;
        Ok(ReplayedStep {
            buffers: b,
            core: &self.core,
            rows: tokens.len(),
        })
    }

    /// The context class and graph of `variant` that serve a step of `rows` rows over
    /// `plan`, checked as a replay needs: refused when the step does not fit the graph.
    fn serving(
        &self,
        rows: usize,
        plan: &AttentionPlan,
        variant: usize,
    ) -> Result<(usize, &CudaGraph), GpuForwardError> {
        let c = &self.core.config;
        if self.kind == GraphKind::Decode
            && (plan.seqs().iter().any(|s| s.q_len != 1) || rows != plan.seqs().len())
        {
            return Err(
                AttentionError::Shape("a decode graph runs one row per sequence".into()).into(),
            );
        }
        // docs/architecture.md, rule 3: the real rows fit q and o, which hold the graph's size.
        plan.check_fits(self.size, self.size)
            .map_err(AttentionError::from)?;
        if let Some(&position) = plan.positions().iter().max() {
            if position as usize >= c.max_model_len {
                return Err(GpuForwardError::Position {
                    position,
                    max: c.max_model_len,
                });
            }
        }
        self.graphs[variant].serving(plan)
    }
}

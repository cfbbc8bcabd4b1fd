//! A draft head's steps captured as CUDA graphs, as the target's are (`llama::cuda::graph`),
//! for any head on the GPU ([`DraftHeadKind`]: an EAGLE-3 head, a multi-token prediction
//! layer): its draft steps after the first (one row per sequence, fed its `pre`), and its
//! step 0 of a decode-shaped batch (up to the rows a sequence verifies, fed target
//! features gathered from the feature ring, every row a logit row: the verification graphs'
//! shape). One graph per size and context class, each kind over one set of buffers
//! allocated at its largest size, which every graph of the kind holds with the head's
//! weights and its KV cache (docs/architecture.md, rule 5). Each graph has a plan of its
//! own, fixed at its size and staged over the head's real rows: the target's padded plan
//! never reaches the head. A step is padded up to its graph's size: token ids, positions
//! and the staged `pre` repeat the last real row, and slot mappings point padded rows at a
//! scratch slot no sequence owns; a step 0's features are gathered into the real rows only,
//! before the graph runs.

use crate::draft_head::cuda::chain_buffers::ChainBuffers;
use crate::draft_head::cuda::{DraftHeadKind, GpuHeadDrafts};
use crate::eagle3::feature_ring::FeatureRing;
use crate::eagle3::FeatureKind;
use crate::graph::cuda::{
    context_classes, scratch_plan, ContextGraphs, GraphLimits, SharedGraphBuffers, SharedKvCache,
};
use crate::llama::cuda::GpuForwardError;
use crate::llama::{check_inputs, ForwardError};
use peregrine_ops::cuda::attention::{AttentionError, DeviceAttentionPlan};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::{Padding, StagedInput};
use std::sync::{Arc, Mutex, MutexGuard};

/// Which step of the head a graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadGraphKind {
    /// A draft step after the first: one row per sequence, fed its `pre`.
    Decode,
    /// Step 0 of a decode-shaped batch: any rows a sequence, fed target features from the
    /// feature ring, every row a logit row.
    First,
}

/// The buffers every graph of one kind of a head addresses.
pub struct HeadGraphBuffers<C: DraftHeadKind> {
    kind: HeadGraphKind,
    limits: GraphLimits,
    pub(super) plan: DeviceAttentionPlan,
    pub(super) work: C::Work,
    /// The host side of the staged `pre`, `[rows, H]` (batch on axis 0), for decode graphs.
    pre: Option<StagedInput<f32>>,
    /// What a proposal's steps queued back to back need (decode graphs).
    pub(super) chain: Option<ChainBuffers>,
}

/// One captured step of a head and everything its kernels address.
pub struct CapturedHead<C: DraftHeadKind> {
    size: usize,
    pub(super) kind: HeadGraphKind,
    pub(super) graphs: ContextGraphs,
    pub(super) buffers: Arc<Mutex<HeadGraphBuffers<C>>>,
    pub(super) core: Arc<C>,
    /// The ring a step 0's features are gathered from.
    ring: Option<Arc<FeatureRing>>,
    _cache: SharedKvCache,
}

// SAFETY: as for the target's `CapturedDecode`: launched only under the lock of its
// buffers; the other fields are Send.
unsafe impl<C: DraftHeadKind> Send for CapturedHead<C> {}

impl<C: DraftHeadKind> HeadGraphBuffers<C> {
    fn new(
        core: &C,
        kind: HeadGraphKind,
        limits: GraphLimits,
        block_size: usize,
    ) -> anyhow::Result<Self> {
        let decode = kind == HeadGraphKind::Decode;
        let capacity = PlanCapacity {
            rows: limits.max_rows,
            // The head's draft steps: one row a sequence.
            decode_only: decode,
            max_context: limits.max_context,
            block_size,
            scratch_slot: limits.scratch_slot,
        };
        let plan = core.fixed_plan(capacity)?;
        let work = core.work(limits.max_rows, limits.max_rows, !decode)?;
        let shape = [limits.max_rows, core.hidden_size()];
        let (pre, chain) = match kind {
            HeadGraphKind::Decode => (
                Some(StagedInput::new("pre", &shape, 0, Padding::RepeatLast)?),
                Some(ChainBuffers::new(core, limits.max_rows)?),
            ),
            HeadGraphKind::First => (None, None),
        };
        Ok(HeadGraphBuffers {
            kind,
            limits,
            plan,
            work,
            pre,
            chain,
        })
    }

    /// Stages a step (`tokens` over `plan`, fed `pre` in a decode graph) padded to `size`
    /// rows, for grids that serve contexts up to `context`. A step 0's features are
    /// gathered apart ([`DraftHeadKind::gather`]).
    pub(super) fn stage(
        &mut self,
        core: &C,
        tokens: &[u32],
        pre: &[f32],
        plan: &AttentionPlan,
        size: usize,
        context: usize,
    ) -> Result<(), GpuForwardError> {
        let rows: Vec<usize> = (0..tokens.len()).collect();
        self.plan.stage_padded(tokens, plan, &rows, size, context)?;
        let Some(staged_pre) = &mut self.pre else {
            return Ok(());
        };
        let h = core.hidden_size();
        staged_pre
            .stage(pre, tokens.len(), size)
            .map_err(|e| AttentionError::Shape(e.to_string()))?;
        let staged = &staged_pre.as_slice()[..size * h];
        let dst = &mut C::staged_pre(&mut self.work).slice_mut(0..size * h);
        core.gpu().stream().memcpy_htod(staged, dst)?;
        Ok(())
    }

    /// Queues the forward and argmax of `size` staged rows.
    fn launch(
        &mut self,
        core: &C,
        size: usize,
        cache: &mut GpuKvCache,
    ) -> Result<(), GpuForwardError> {
        let kind = match self.kind {
            HeadGraphKind::Decode => FeatureKind::Pre,
            HeadGraphKind::First => FeatureKind::Aux,
        };
        core.launch_greedy(&mut self.work, size, kind, &self.plan, cache)
    }
}

/// Captures the step of `kind` of the head `core` (whose graphs' buffers are
/// `graph_buffers`, whose step 0 reads `ring`) for `size` rows over `cache` (its one-layer
/// cache) as one graph per context class, serving contexts up to `limits.max_context`.
/// The first capture, or one past the rows of the shared buffers or with other limits,
/// allocates new shared buffers (capture the largest size first). Each graph's step runs
/// once eagerly before it is captured, over the scratch slot alone.
pub fn capture_head<C: DraftHeadKind>(
    core: &Arc<C>,
    graph_buffers: &mut SharedGraphBuffers<HeadGraphBuffers<C>>,
    ring: Option<Arc<FeatureRing>>,
    (size, kind): (usize, HeadGraphKind),
    limits: GraphLimits,
    cache: &SharedKvCache,
) -> anyhow::Result<CapturedHead<C>> {
    anyhow::ensure!(
        size >= 1 && size <= limits.max_rows,
        "a head graph of {size} rows past the {} its buffers hold",
        limits.max_rows
    );
    anyhow::ensure!(
        kind == HeadGraphKind::Decode || ring.is_some(),
        "graphs of step 0 read the feature ring, and the head reads none"
    );
    let mut kv = cache.lock().unwrap_or_else(|e| e.into_inner());
    let block_size = kv.layout().block_size as usize;
    let buffers = graph_buffers.for_capture(
        |b| b.kind == kind,
        |b| b.limits.serve(size, &limits),
        || HeadGraphBuffers::new(&**core, kind, limits, block_size),
    )?;
    let plan = scratch_plan(size, limits.scratch_slot, kv.layout())?;
    let tokens = vec![0u32; size];
    let pre = vec![0.5f32; size * core.hidden_size()];
    let classes = context_classes(limits.max_context, core.decode_kernel());
    let mut b = buffers.lock().unwrap_or_else(|e| e.into_inner());
    let graphs = ContextGraphs::capture(
        core.gpu(),
        classes,
        &mut (&mut *b, &mut *kv),
        |(b, _), context| b.stage(core, &tokens, &pre, &plan, size, context),
        |(b, kv)| b.launch(core, size, kv),
    )?;
    drop(b);
    Ok(CapturedHead {
        size,
        kind,
        graphs,
        buffers,
        core: core.clone(),
        ring,
        _cache: cache.clone(),
    })
}

impl<C: DraftHeadKind> CapturedHead<C> {
    /// The batch size the graph was captured for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The longest context the graph serves.
    pub fn max_context(&self) -> usize {
        self.graphs.max_context()
    }

    /// Runs the head's draft step `tokens` fed `pre` (`[rows, H]`) over `plan` (planned
    /// over the real rows, one per sequence) through the graph, padded to its size, and
    /// returns each row's greedy draft (and its logits, with `logits`) and `pre`. Refused,
    /// with nothing launched, when the step does not fit the graph: run it eagerly then.
    pub fn replay(
        &self,
        tokens: &[u32],
        pre: &[f32],
        plan: &AttentionPlan,
        logits: bool,
    ) -> Result<GpuHeadDrafts, GpuForwardError> {
        let core = &*self.core;
        check_inputs(tokens, plan, &[], core.vocab_size())?;
        let n = tokens.len();
        if self.kind != HeadGraphKind::Decode
            || plan.seqs().iter().any(|s| s.q_len != 1)
            || n != plan.seqs().len()
        {
            return Err(
                AttentionError::Shape("a decode graph runs one row per sequence".into()).into(),
            );
        }
        let h = core.hidden_size();
        if pre.len() != n * h {
            return Err(ForwardError::HiddenShape {
                what: "pre",
                len: pre.len(),
                rows: n,
                width: h,
            }
            .into());
        }
        // docs/architecture.md, rule 3: the real rows fit q and o, which hold the graph's size.
        plan.check_fits(self.size, self.size)
            .map_err(AttentionError::from)?;
        core.check_positions(plan)?;
        let (context, graph) = self.graphs.serving(plan)?;
        let mut b = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        b.stage(core, tokens, pre, plan, self.size, context)?;
        graph.launch()?;
        core.drafts(&mut b.work, n, n, logits)
    }

    /// Runs step 0 of `tokens` over `plan` (planned over the real rows), fed the feature
    /// ring's rows `features` (one a token), through the graph, padded to its size, and
    /// returns the greedy draft of each row of `logit_rows` and every row's `pre`.
    /// Refused, with nothing launched, when the step does not fit the graph.
    pub fn replay_first(
        &self,
        tokens: &[u32],
        features: &[u64],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> Result<GpuHeadDrafts, GpuForwardError> {
        let mut b = self.queue_first(tokens, features, plan, logit_rows)?;
        let n = tokens.len();
        let every = self.core.drafts(&mut b.work, n, n, false)?;
        Ok(GpuHeadDrafts {
            drafts: logit_rows.iter().map(|&r| every.drafts[r]).collect(),
            logits: None,
            pre: every.pre,
        })
    }

    /// Queues step 0 as [`replay_first`](Self::replay_first) does and reads nothing back:
    /// its results stay in the buffers returned, locked.
    pub(super) fn queue_first(
        &self,
        tokens: &[u32],
        features: &[u64],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> Result<MutexGuard<'_, HeadGraphBuffers<C>>, GpuForwardError> {
        let core = &*self.core;
        check_inputs(tokens, plan, logit_rows, core.vocab_size())?;
        let n = tokens.len();
        if self.kind != HeadGraphKind::First {
            return Err(AttentionError::Shape("not a graph of step 0".into()).into());
        }
        if features.len() != n {
            return Err(ForwardError::HiddenShape {
                what: "feature ring rows",
                len: features.len(),
                rows: n,
                width: 1,
            }
            .into());
        }
        let ring = self.ring.as_deref().ok_or(GpuForwardError::NoFeatureRing)?;
        // docs/architecture.md, rule 3: the real rows fit q and o, which hold the graph's size.
        plan.check_fits(self.size, self.size)
            .map_err(AttentionError::from)?;
        core.check_positions(plan)?;
        let (context, graph) = self.graphs.serving(plan)?;
        let mut b = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        b.stage(core, tokens, &[], plan, self.size, context)?;
        core.gather(&mut b.work, ring, features)?;
        graph.launch()?;
        Ok(b)
    }
}

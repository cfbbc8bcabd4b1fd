//! The multi-token prediction head's steps captured as CUDA graphs, as the EAGLE-3 head's
//! are (`eagle3::gpu_graph`): its draft steps after the first (one row per sequence, fed
//! its `pre`), and its step 0 of a decode-shaped batch (up to the rows a sequence
//! verifies, fed the target's last-layer outputs gathered from the feature ring, every row
//! a logit row). One graph per size and context class over one set of buffers a kind,
//! held with the head's weights and its cache (DESIGN.md rule 4). Each graph has a plan of
//! its own, fixed at its size and staged over the head's real rows, padded rows at a
//! scratch slot: the target's padded plan never reaches the head.

use super::gpu::{GpuMtpHead, MtpCore, MtpWorkspace};
use crate::eagle3::feature_ring::FeatureRing;
use crate::eagle3::gpu::GpuHeadDrafts;
use crate::eagle3::FeatureKind;
use crate::gpu_graph::{context_classes, scratch_plan, ContextGraphs, GraphLimits, SharedKvCache};
use crate::llama::{check_inputs, ForwardError};
use crate::llama_gpu::{attention_plan, scratch_heads, GpuForwardError};
use peregrine_ops::cuda::attention::{AttentionError, DeviceAttentionPlan};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::{Padding, StagedInput};
use std::sync::{Arc, Mutex};

/// Which step of the head a graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MtpGraphKind {
    /// A draft step after the first: one row per sequence, fed its `pre`.
    Decode,
    /// Step 0 of a decode-shaped batch, fed the target's outputs from the feature ring.
    First,
}

/// The buffers every graph of one kind addresses.
pub(super) struct MtpGraphBuffers {
    kind: MtpGraphKind,
    limits: GraphLimits,
    plan: DeviceAttentionPlan,
    work: MtpWorkspace,
    /// The host side of the staged `pre`, `[rows, H]`, for decode graphs.
    pre: Option<StagedInput<f32>>,
}

/// One captured step of the head and everything its kernels address.
pub struct CapturedMtpStep {
    size: usize,
    kind: MtpGraphKind,
    graphs: ContextGraphs,
    buffers: Arc<Mutex<MtpGraphBuffers>>,
    core: Arc<MtpCore>,
    /// The ring a step 0's features are gathered from.
    ring: Option<Arc<FeatureRing>>,
    _cache: SharedKvCache,
}

// SAFETY: as for the target's `CapturedDecode`: launched only under the lock of its
// buffers; the other fields are Send.
unsafe impl Send for CapturedMtpStep {}

impl MtpGraphBuffers {
    fn new(
        core: &MtpCore,
        kind: MtpGraphKind,
        limits: GraphLimits,
        block_size: usize,
    ) -> anyhow::Result<Self> {
        let c = &core.config;
        let decode = kind == MtpGraphKind::Decode;
        let capacity = PlanCapacity {
            rows: limits.max_rows,
            decode_only: decode,
            max_context: limits.max_context,
            block_size,
            scratch_slot: limits.scratch_slot,
        };
        let (heads, width) = scratch_heads(c);
        let plan =
            DeviceAttentionPlan::fixed(&core.gpu, core.decode_kernel, capacity, heads, width)?;
        let plan = attention_plan(c, plan);
        let work = MtpWorkspace::new(core, limits.max_rows, limits.max_rows)?;
        let pre = match kind {
            MtpGraphKind::Decode => {
                let shape = [limits.max_rows, c.hidden_size];
                Some(StagedInput::new("pre", &shape, 0, Padding::RepeatLast)?)
            }
            MtpGraphKind::First => None,
        };
        Ok(MtpGraphBuffers {
            kind,
            limits,
            plan,
            work,
            pre,
        })
    }

    /// Stages a step (`tokens` over `plan`, fed `pre` in a decode graph) padded to `size`
    /// rows, for grids that serve contexts up to `context`.
    fn stage(
        &mut self,
        core: &MtpCore,
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
        let h = core.config.hidden_size;
        staged_pre
            .stage(pre, tokens.len(), size)
            .map_err(|e| AttentionError::Shape(e.to_string()))?;
        let staged = &staged_pre.as_slice()[..size * h];
        let dst = &mut self.work.feature.slice_mut(0..size * h);
        core.gpu.stream().memcpy_htod(staged, dst)?;
        Ok(())
    }

    /// Queues the forward and argmax of `size` staged rows.
    fn launch(
        &mut self,
        core: &MtpCore,
        size: usize,
        cache: &mut GpuKvCache,
    ) -> Result<(), GpuForwardError> {
        let kind = match self.kind {
            MtpGraphKind::Decode => FeatureKind::Pre,
            MtpGraphKind::First => FeatureKind::Aux,
        };
        core.launch(&mut self.work, size, size, true, kind, &self.plan, cache)?;
        core.argmax(&mut self.work.work, size)
    }
}

impl GpuMtpHead {
    /// Captures the head's draft step of `size` sequences (one row each, fed its `pre`)
    /// over `cache` (the head's one-layer cache) as one graph per context class, serving
    /// contexts up to `limits.max_context`. The first capture, or one past the rows of the
    /// shared buffers or with other limits, allocates new shared buffers (capture the
    /// largest size first). Each graph's step runs once eagerly before it is captured,
    /// over the scratch slot alone.
    pub fn capture_decode(
        &mut self,
        size: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedMtpStep> {
        self.capture(size, MtpGraphKind::Decode, limits, cache)
    }

    /// [`GpuMtpHead::capture_decode`] for step 0 of up to `rows` rows (any number a
    /// sequence, every row a logit row) fed the target's outputs from the head's feature
    /// ring, over buffers of their own. Refused for a head that reads no ring.
    pub fn capture_first(
        &mut self,
        rows: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedMtpStep> {
        anyhow::ensure!(
            self.feature_ring().is_some(),
            "graphs of step 0 read the feature ring, and the head reads none"
        );
        self.capture(rows, MtpGraphKind::First, limits, cache)
    }

    fn capture(
        &mut self,
        size: usize,
        kind: MtpGraphKind,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedMtpStep> {
        anyhow::ensure!(
            size >= 1 && size <= limits.max_rows,
            "a head graph of {size} rows past the {} its buffers hold",
            limits.max_rows
        );
        let core = self.core.clone();
        let mut kv = cache.lock().unwrap_or_else(|e| e.into_inner());
        let block_size = kv.layout().block_size as usize;
        let buffers = self.graph_buffers.for_capture(
            |b| b.kind == kind,
            |b| b.limits.serve(size, &limits),
            || MtpGraphBuffers::new(&core, kind, limits, block_size),
        )?;
        let plan = scratch_plan(size, limits.scratch_slot, kv.layout())?;
        let tokens = vec![0u32; size];
        let pre = vec![0.5f32; size * core.config.hidden_size];
        let classes = context_classes(limits.max_context, core.decode_kernel);
        let mut b = buffers.lock().unwrap_or_else(|e| e.into_inner());
        let graphs = ContextGraphs::capture(
            &core.gpu,
            classes,
            &mut (&mut *b, &mut *kv),
            |(b, _), context| b.stage(&core, &tokens, &pre, &plan, size, context),
            |(b, kv)| b.launch(&core, size, kv),
        )?;
        drop(b);
        Ok(CapturedMtpStep {
            size,
            kind,
            graphs,
            buffers,
            core,
            ring: self.feature_ring_handle(),
            _cache: cache.clone(),
        })
    }
}

impl CapturedMtpStep {
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
        let c = &core.config;
        check_inputs(tokens, plan, &[], c.vocab_size)?;
        let n = tokens.len();
        if self.kind != MtpGraphKind::Decode
            || plan.seqs().iter().any(|s| s.q_len != 1)
            || n != plan.seqs().len()
        {
            return Err(
                AttentionError::Shape("a decode graph runs one row per sequence".into()).into(),
            );
        }
        if pre.len() != n * c.hidden_size {
            return Err(ForwardError::HiddenShape {
                what: "pre",
                len: pre.len(),
                rows: n,
                width: c.hidden_size,
            }
            .into());
        }
        // DESIGN.md rule 3: the real rows fit q and o, which hold the graph's size.
        plan.check_fits(self.size, self.size)
            .map_err(AttentionError::from)?;
        core.check_positions(plan)?;
        let (context, graph) = self.graphs.serving(plan)?;
        let mut b = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        b.stage(core, tokens, pre, plan, self.size, context)?;
        graph.launch()?;
        core.drafts(&b.work.work, n, n, logits)
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
        let core = &*self.core;
        check_inputs(tokens, plan, logit_rows, core.config.vocab_size)?;
        let n = tokens.len();
        if self.kind != MtpGraphKind::First {
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
        // DESIGN.md rule 3: the real rows fit q and o, which hold the graph's size.
        plan.check_fits(self.size, self.size)
            .map_err(AttentionError::from)?;
        core.check_positions(plan)?;
        let (context, graph) = self.graphs.serving(plan)?;
        let mut b = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        b.stage(core, tokens, &[], plan, self.size, context)?;
        b.work.gather_features(core, ring, features)?;
        graph.launch()?;
        let every = core.drafts(&b.work.work, n, n, false)?;
        Ok(GpuHeadDrafts {
            drafts: logit_rows.iter().map(|&r| every.drafts[r]).collect(),
            logits: None,
            pre: every.pre,
        })
    }
}

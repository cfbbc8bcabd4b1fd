//! A draft head on the GPU, whatever its kind (an EAGLE-3 head, DeepSeek-V3's multi-token
//! prediction layer): the eager step's checks, staging and downloads, the feature ring it
//! reads and the captures of its graphs, over what differs between the kinds
//! ([`DraftHeadKind`]).

use crate::draft_head::cuda::graph::{capture_head, CapturedHead, HeadGraphBuffers, HeadGraphKind};
use crate::draft_head::cuda::{DraftHeadKind, GpuHeadDrafts};
use crate::eagle3::feature_ring::FeatureRing;
use crate::eagle3::{DraftVocab, FeatureKind, HeadInput, HeadOutput};
use crate::graph::cuda::{GraphLimits, SharedGraphBuffers, SharedKvCache};
use crate::llama::cuda::{GpuForwardError, GpuModelOptions};
use crate::llama::{check_inputs, ForwardError};
use peregrine_kernels::cpu::KvLayout;
use peregrine_ops::cuda::attention::DeviceAttentionPlan;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::cuda::{Gpu, GpuError};
use std::sync::Arc;

/// A draft head of kind `K` on one GPU.
pub struct GpuDraftHead<K: DraftHeadKind> {
    pub(crate) core: Arc<K>,
    /// The activations of eager steps.
    work: K::Work,
    /// The metadata of eager steps: the head's own, staged over its own rows.
    plan: DeviceAttentionPlan,
    /// The buffers of the graphs, while any graph was captured from them.
    graph_buffers: SharedGraphBuffers<HeadGraphBuffers<K>>,
    /// The ring the target hands its features off in, where it does.
    ring: Option<Arc<FeatureRing>>,
}

impl<K: DraftHeadKind> GpuDraftHead<K> {
    /// The head over `core`, whose weights were just uploaded, with eager buffers of
    /// `options`' sizes.
    pub(crate) fn over(core: K, options: &GpuModelOptions) -> anyhow::Result<GpuDraftHead<K>> {
        // No kernel may read a weight still on its way (programmatic dependent launch).
        core.gpu().synchronize()?;
        let work = core.work(options.max_tokens, options.max_logit_rows, true)?;
        let plan = core.growing_plan()?;
        Ok(GpuDraftHead {
            core: Arc::new(core),
            work,
            plan,
            graph_buffers: SharedGraphBuffers::default(),
            ring: None,
        })
    }

    /// The ring the target hands its features off in, where the head reads one.
    pub fn feature_ring(&self) -> Option<&FeatureRing> {
        self.ring.as_deref()
    }

    /// From now on step 0 may read its features from `ring` ([`HeadInput::Ring`]), the
    /// ring the target stores its recorded layer inputs (or last-layer outputs) into.
    /// Refused when its rows are not as wide as step 0's features.
    pub fn read_features_from(&mut self, ring: Arc<FeatureRing>) -> anyhow::Result<()> {
        let width = self.core.feature_width(FeatureKind::Aux);
        anyhow::ensure!(
            ring.width() == width,
            "a feature ring of rows of {} for a head whose step 0 reads {width}",
            ring.width()
        );
        self.ring = Some(ring);
        Ok(())
    }

    /// The width of a row's `pre`.
    pub fn hidden_size(&self) -> usize {
        self.core.hidden_size()
    }

    /// The width of the target features one row of step 0 reads.
    pub fn aux_width(&self) -> usize {
        self.core.feature_width(FeatureKind::Aux)
    }

    /// The target layers whose inputs feed step 0, in concatenation order.
    pub fn aux_layers(&self) -> &[usize] {
        self.core.aux_layers()
    }

    /// The draft vocabulary (draft id to target id).
    pub fn vocab(&self) -> &DraftVocab {
        self.core.vocab()
    }

    /// The positions the head serves.
    pub fn max_positions(&self) -> usize {
        self.core.max_positions()
    }

    /// The device the head runs on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        self.core.gpu()
    }

    /// Bytes one token takes in the head's one-layer cache (bf16).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.core.kv_bytes_per_token()
    }

    /// The head's one-layer cache layout over `num_blocks` blocks of `block_size` tokens.
    pub fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        self.core.kv_layout(num_blocks, block_size)
    }

    /// A zeroed one-layer cache of `layout`, holding what the head's attention keeps.
    pub fn new_cache(&self, layout: KvLayout) -> Result<GpuKvCache, GpuError> {
        GpuKvCache::with_rows(self.core.gpu(), 1, layout, self.core.kv_rows())
    }

    /// Runs `tokens` (one per planned row) with features `input` through the head, writing
    /// their cache rows into layer 0 of `cache`, and returns the draft-vocabulary logits of
    /// `logit_rows` (`[rows, V_d]`) and every row's `pre`, as the CPU head's forward does.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        input: HeadInput,
        plan: &AttentionPlan,
        cache: &mut GpuKvCache,
        logit_rows: &[usize],
    ) -> Result<HeadOutput, GpuForwardError> {
        self.run(tokens, input, plan, cache, logit_rows)?;
        let (n, r) = (tokens.len(), logit_rows.len());
        let (h, v) = (self.core.hidden_size(), self.core.vocab().len());
        let gpu = self.core.gpu().clone();
        let w = K::layer_work(&mut self.work);
        Ok(HeadOutput {
            logits: gpu.download(&w.logits.slice(0..r * v))?,
            pre: gpu.download(&w.residual.slice(0..n * h))?,
        })
    }

    /// [`GpuDraftHead::forward`], choosing each logit row's greedy draft on the device
    /// (and, with `logits`, downloading the rows' logits too).
    pub fn forward_greedy(
        &mut self,
        tokens: &[u32],
        input: HeadInput,
        plan: &AttentionPlan,
        cache: &mut GpuKvCache,
        logit_rows: &[usize],
        logits: bool,
    ) -> Result<GpuHeadDrafts, GpuForwardError> {
        self.run(tokens, input, plan, cache, logit_rows)?;
        let (n, r) = (tokens.len(), logit_rows.len());
        self.core.argmax(&mut self.work, r)?;
        self.core.drafts(&mut self.work, n, r, logits)
    }

    /// Captures the head's decode step of `size` sequences (one row each, fed its `pre`)
    /// over `cache` (the head's one-layer cache) as one graph per context class, serving
    /// contexts up to `limits.max_context` ([`capture_head`]).
    pub fn capture_decode(
        &mut self,
        size: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedHead<K>> {
        self.capture(size, HeadGraphKind::Decode, limits, cache)
    }

    /// [`GpuDraftHead::capture_decode`] for step 0 of up to `rows` rows (any number a
    /// sequence, every row a logit row) fed features of the head's feature ring, over
    /// buffers of their own of `limits.max_rows` rows. Refused for a head that reads no
    /// ring.
    pub fn capture_first(
        &mut self,
        rows: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedHead<K>> {
        self.capture(rows, HeadGraphKind::First, limits, cache)
    }

    fn capture(
        &mut self,
        size: usize,
        kind: HeadGraphKind,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedHead<K>> {
        let ring = self.ring.clone();
        let buffers = &mut self.graph_buffers;
        capture_head(&self.core, buffers, ring, (size, kind), limits, cache)
    }

    /// Checks and stages a step, then queues its forward.
    fn run(
        &mut self,
        tokens: &[u32],
        input: HeadInput,
        plan: &AttentionPlan,
        cache: &mut GpuKvCache,
        logit_rows: &[usize],
    ) -> Result<(), GpuForwardError> {
        self.check(tokens, input, plan, logit_rows, cache)?;
        let core = &*self.core;
        let (n, r) = (tokens.len(), logit_rows.len());
        let ring = self.ring.as_deref();
        K::features(&mut self.work).stage(core.gpu(), core.kernels(), input, ring)?;
        self.plan.stage(tokens, plan, logit_rows)?;
        let every_row = logit_rows.iter().copied().eq(0..n);
        let kind = input.kind();
        core.launch(&mut self.work, n, r, every_row, kind, &self.plan, cache)
    }

    /// Refuses a step the buffers, the rotary table or the cache cannot hold.
    fn check(
        &mut self,
        tokens: &[u32],
        input: HeadInput,
        plan: &AttentionPlan,
        logit_rows: &[usize],
        cache: &GpuKvCache,
    ) -> Result<(), GpuForwardError> {
        let core = &*self.core;
        check_inputs(tokens, plan, logit_rows, core.vocab_size())?;
        let (n, r) = (tokens.len(), logit_rows.len());
        // A ring row holds a whole row of features.
        let (len, width) = match input.host() {
            Some((kind, features)) => (features.len(), core.feature_width(kind)),
            None => (input.rows(), 1),
        };
        if len != n * width {
            return Err(ForwardError::HiddenShape {
                what: "head features",
                len,
                rows: n,
                width,
            }
            .into());
        }
        let work = K::layer_work(&mut self.work);
        if n > work.max_tokens {
            let max = work.max_tokens;
            return Err(GpuForwardError::TooManyTokens { tokens: n, max });
        }
        if r > work.max_logit_rows {
            let max = work.max_logit_rows;
            return Err(GpuForwardError::TooManyLogitRows { rows: r, max });
        }
        core.check_positions(plan)?;
        if cache.num_layers() != 1 {
            let layers = cache.num_layers();
            return Err(GpuForwardError::CacheLayers {
                cache: layers,
                model: 1,
            });
        }
        if cache.rows() != core.kv_rows() {
            let (cache, model) = (cache.rows(), core.kv_rows());
            return Err(GpuForwardError::CacheRows { cache, model });
        }
        Ok(())
    }
}

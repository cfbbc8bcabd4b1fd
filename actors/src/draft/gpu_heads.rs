//! The draft heads the CUDA backend's head runner ([`GpuHead`](super::GpuHead)) drives: an
//! EAGLE-3 head and a DeepSeek-V3 multi-token prediction layer, both fed the target's
//! recorded states on the device and both replaying captured graphs of their steps.

use peregrine_kernels::cpu::KvLayout;
use peregrine_models::eagle3::feature_ring::FeatureRing;
use peregrine_models::eagle3::gpu::{GpuEagle3Head, GpuHeadDrafts, HeadCore};
use peregrine_models::eagle3::{DraftVocab, HeadInput};
use peregrine_models::gpu_graph::{GraphLimits, SharedKvCache};
use peregrine_models::head_graph::{CapturedHead, GraphedHead};
use peregrine_models::llama_gpu::GpuForwardError;
use peregrine_models::mtp::gpu::{GpuMtpHead, MtpCore};
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::cuda::Gpu;
use std::sync::Arc;

/// A draft head on the GPU.
pub trait GpuDraftHead: Send {
    /// What the head's graphs hold of it.
    type Core: GraphedHead;
    /// What the head is, for messages.
    const NAME: &'static str;
    /// The device the head runs on.
    fn gpu(&self) -> &Arc<Gpu>;
    /// The width of the head's `pre`.
    fn hidden_size(&self) -> usize;
    /// The width of the target features one row of step 0 reads.
    fn aux_width(&self) -> usize;
    /// The target layers whose inputs the head reads.
    fn aux_layers(&self) -> &[usize];
    /// Its draft vocabulary.
    fn vocab(&self) -> &DraftVocab;
    /// The positions the head serves.
    fn max_positions(&self) -> usize;
    /// The layout of the head's one-layer cache over `num_blocks` blocks of `block_size`
    /// tokens.
    fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout;
    /// A zeroed one-layer cache of the head's shape and `layout`.
    fn new_cache(&self, layout: KvLayout) -> anyhow::Result<GpuKvCache>;
    /// Runs a step eagerly and chooses each logit row's greedy draft on the device.
    fn forward_greedy(
        &mut self,
        tokens: &[u32],
        input: HeadInput,
        plan: &AttentionPlan,
        cache: &mut GpuKvCache,
        logit_rows: &[usize],
        logits: bool,
    ) -> Result<GpuHeadDrafts, GpuForwardError>;
    /// The ring the head reads the target's features from, where it reads one.
    fn feature_ring(&self) -> Option<&FeatureRing>;
    /// Captures the head's draft step of `size` sequences.
    fn capture_decode(
        &mut self,
        size: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedHead<Self::Core>>;
    /// Captures the head's step 0 of up to `rows` rows fed the feature ring.
    fn capture_first(
        &mut self,
        rows: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedHead<Self::Core>>;
}

/// Implements [`GpuDraftHead`] for a head (whose graphs hold `$core`) whose inherent
/// methods have these names; `$width` is the width of a row of step 0.
macro_rules! draft_head {
    ($head:ty, $core:ty, $name:literal, |$h:ident| $width:expr, |$c:ident, $layout:ident| $cache:expr) => {
        impl GpuDraftHead for $head {
            type Core = $core;
            const NAME: &'static str = $name;
            fn gpu(&self) -> &Arc<Gpu> {
                <$head>::gpu(self)
            }
            fn hidden_size(&self) -> usize {
                self.config().hidden_size
            }
            fn aux_width(&self) -> usize {
                let $h = self;
                $width
            }
            fn aux_layers(&self) -> &[usize] {
                <$head>::aux_layers(self)
            }
            fn vocab(&self) -> &DraftVocab {
                <$head>::vocab(self)
            }
            fn max_positions(&self) -> usize {
                <$head>::max_positions(self)
            }
            fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
                self.config().kv_layout(num_blocks, block_size)
            }
            fn new_cache(&self, $layout: KvLayout) -> anyhow::Result<GpuKvCache> {
                let $c = self;
                Ok($cache?)
            }
            fn forward_greedy(
                &mut self,
                tokens: &[u32],
                input: HeadInput,
                plan: &AttentionPlan,
                cache: &mut GpuKvCache,
                logit_rows: &[usize],
                logits: bool,
            ) -> Result<GpuHeadDrafts, GpuForwardError> {
                <$head>::forward_greedy(self, tokens, input, plan, cache, logit_rows, logits)
            }
            fn feature_ring(&self) -> Option<&FeatureRing> {
                <$head>::feature_ring(self)
            }
            fn capture_decode(
                &mut self,
                size: usize,
                limits: GraphLimits,
                cache: &SharedKvCache,
            ) -> anyhow::Result<CapturedHead<$core>> {
                <$head>::capture_decode(self, size, limits, cache)
            }
            fn capture_first(
                &mut self,
                rows: usize,
                limits: GraphLimits,
                cache: &SharedKvCache,
            ) -> anyhow::Result<CapturedHead<$core>> {
                <$head>::capture_first(self, rows, limits, cache)
            }
        }
    };
}

draft_head!(
    GpuEagle3Head,
    HeadCore,
    "EAGLE-3 head",
    |h| h.aux_layers().len() * h.config().target_hidden_size,
    |h, layout| GpuKvCache::new(h.gpu(), 1, layout)
);

draft_head!(
    GpuMtpHead,
    MtpCore,
    "MTP head",
    |h| h.config().hidden_size,
    |h, layout| GpuKvCache::with_rows(h.gpu(), 1, layout, h.config().kv_rows())
);

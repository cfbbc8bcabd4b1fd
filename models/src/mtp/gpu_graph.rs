//! The multi-token prediction head's steps captured as CUDA graphs (`head_graph`), as the
//! EAGLE-3 head's are: its draft steps after the first (one row per sequence, fed its
//! `pre`), and its step 0 of a decode-shaped batch (fed the target's last-layer outputs
//! gathered from the feature ring).

use super::gpu::{GpuMtpHead, MtpCore, MtpWorkspace};
use crate::eagle3::feature_ring::FeatureRing;
use crate::eagle3::gpu::GpuHeadDrafts;
use crate::eagle3::FeatureKind;
use crate::gpu_graph::{GraphLimits, SharedKvCache};
use crate::head_graph::{capture_head, CapturedHead, GraphedHead, HeadGraphKind};
use crate::llama_gpu::{attention_plan, scratch_heads, GpuForwardError};
use cudarc::driver::CudaSlice;
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_ops::cuda::attention::{AttentionError, DeviceAttentionPlan};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::cuda::Gpu;
use std::sync::Arc;

/// One captured step of a multi-token prediction head.
pub type CapturedMtpStep = CapturedHead<MtpCore>;

impl GraphedHead for MtpCore {
    type Work = MtpWorkspace;

    fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn decode_kernel(&self) -> DecodeKernel {
        self.decode_kernel
    }

    /// Under latent attention cut as the target's plans are ([`attention_plan`]).
    fn fixed_plan(&self, capacity: PlanCapacity) -> Result<DeviceAttentionPlan, AttentionError> {
        let (heads, width) = scratch_heads(&self.config);
        let plan =
            DeviceAttentionPlan::fixed(&self.gpu, self.decode_kernel, capacity, heads, width)?;
        Ok(attention_plan(&self.config, &self.kernels, plan))
    }

    fn graph_work(&self, rows: usize, _features: bool) -> anyhow::Result<MtpWorkspace> {
        Ok(MtpWorkspace::new(self, rows, rows)?)
    }

    fn staged_pre(work: &mut MtpWorkspace) -> &mut CudaSlice<f32> {
        &mut work.features.pre
    }

    fn gather(
        &self,
        work: &mut MtpWorkspace,
        ring: &FeatureRing,
        ids: &[u64],
    ) -> Result<(), GpuForwardError> {
        work.features.gather(&self.gpu, &self.kernels, ring, ids)
    }

    fn launch_greedy(
        &self,
        work: &mut MtpWorkspace,
        n: usize,
        kind: FeatureKind,
        plan: &DeviceAttentionPlan,
        cache: &mut GpuKvCache,
    ) -> Result<(), GpuForwardError> {
        self.launch(work, n, n, true, kind, plan, cache)?;
        self.argmax(&mut work.work, n)
    }

    fn check_positions(&self, plan: &AttentionPlan) -> Result<(), GpuForwardError> {
        MtpCore::check_positions(self, plan)
    }

    fn drafts(
        &self,
        work: &MtpWorkspace,
        n: usize,
        r: usize,
        logits: bool,
    ) -> Result<GpuHeadDrafts, GpuForwardError> {
        MtpCore::drafts(self, &work.work, n, r, logits)
    }
}

impl GpuMtpHead {
    /// Captures the head's draft step of `size` sequences (one row each, fed its `pre`)
    /// over `cache` (the head's one-layer cache) as one graph per context class, serving
    /// contexts up to `limits.max_context` ([`capture_head`]).
    pub fn capture_decode(
        &mut self,
        size: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedMtpStep> {
        self.capture(size, HeadGraphKind::Decode, limits, cache)
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
        self.capture(rows, HeadGraphKind::First, limits, cache)
    }

    fn capture(
        &mut self,
        size: usize,
        kind: HeadGraphKind,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedMtpStep> {
        let ring = self.feature_ring_handle();
        let buffers = &mut self.graph_buffers;
        capture_head(&self.core, buffers, ring, (size, kind), limits, cache)
    }
}

//! The EAGLE-3 head's steps captured as CUDA graphs (`head_graph`): its decode step (one
//! row per sequence, fed its `pre`) and its step 0 of a decode-shaped batch (fed target
//! features gathered from the feature ring).

use super::feature_ring::FeatureRing;
use super::gpu::{GpuEagle3Head, GpuHeadDrafts, HeadCore, HeadWorkspace};
use super::FeatureKind;
use crate::gpu_graph::{GraphLimits, SharedKvCache};
use crate::head_graph::{capture_head, CapturedHead, GraphedHead, HeadGraphKind};
use crate::llama_gpu::GpuForwardError;
use cudarc::driver::CudaSlice;
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_ops::cuda::attention::{AttentionError, DeviceAttentionPlan};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::cuda::Gpu;
use std::sync::Arc;

/// One captured step of an EAGLE-3 head.
pub type CapturedHeadDecode = CapturedHead<HeadCore>;

impl GraphedHead for HeadCore {
    type Work = HeadWorkspace;

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

    fn fixed_plan(&self, capacity: PlanCapacity) -> Result<DeviceAttentionPlan, AttentionError> {
        let c = &self.config;
        DeviceAttentionPlan::fixed(
            &self.gpu,
            self.decode_kernel,
            capacity,
            c.num_heads,
            c.head_dim,
        )
    }

    fn graph_work(&self, rows: usize, features: bool) -> anyhow::Result<HeadWorkspace> {
        Ok(HeadWorkspace::new(self, rows, rows, features)?)
    }

    fn staged_pre(work: &mut HeadWorkspace) -> &mut CudaSlice<f32> {
        &mut work.features.pre
    }

    fn gather(
        &self,
        work: &mut HeadWorkspace,
        ring: &FeatureRing,
        ids: &[u64],
    ) -> Result<(), GpuForwardError> {
        work.features.gather(&self.gpu, &self.kernels, ring, ids)
    }

    fn launch_greedy(
        &self,
        work: &mut HeadWorkspace,
        n: usize,
        kind: FeatureKind,
        plan: &DeviceAttentionPlan,
        cache: &mut GpuKvCache,
    ) -> Result<(), GpuForwardError> {
        self.launch(work, n, n, true, kind, plan, cache)?;
        self.argmax(&mut work.work, n)
    }

    fn check_positions(&self, plan: &AttentionPlan) -> Result<(), GpuForwardError> {
        HeadCore::check_positions(self, plan)
    }

    fn drafts(
        &self,
        work: &HeadWorkspace,
        n: usize,
        r: usize,
        logits: bool,
    ) -> Result<GpuHeadDrafts, GpuForwardError> {
        HeadCore::drafts(self, &work.work, n, r, logits)
    }
}

impl GpuEagle3Head {
    /// Captures the head's decode step of `size` sequences (one row each, fed its `pre`)
    /// over `cache` (the head's one-layer cache) as one graph per context class, serving
    /// contexts up to `limits.max_context` ([`capture_head`]).
    pub fn capture_decode(
        &mut self,
        size: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedHeadDecode> {
        self.capture(size, HeadGraphKind::Decode, limits, cache)
    }

    /// [`GpuEagle3Head::capture_decode`] for step 0 of up to `rows` rows (any number a
    /// sequence, every row a logit row) fed features of the head's feature ring, over
    /// buffers of their own of `limits.max_rows` rows. Refused for a head that reads no
    /// ring.
    pub fn capture_first(
        &mut self,
        rows: usize,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedHeadDecode> {
        self.capture(rows, HeadGraphKind::First, limits, cache)
    }

    fn capture(
        &mut self,
        size: usize,
        kind: HeadGraphKind,
        limits: GraphLimits,
        cache: &SharedKvCache,
    ) -> anyhow::Result<CapturedHeadDecode> {
        let ring = self.feature_ring_handle();
        let buffers = &mut self.graph_buffers;
        capture_head(&self.core, buffers, ring, (size, kind), limits, cache)
    }
}

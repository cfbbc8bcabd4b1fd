//! The draft heads on the GPU. What differs between their kinds ([`DraftHeadKind`]: the
//! weights, the forward they queue, the cache's shape), with what follows from it (the
//! argmax, the drafts' downloads, the position check), for the eager head
//! ([`GpuDraftHead`](crate::draft_head::cuda::head::GpuDraftHead)) and its graphs
//! ([`graph`](crate::draft_head::cuda::graph)). A third kind implements the trait and gets the rest.

pub mod chain;
pub mod chain_buffers;
pub mod features;
pub mod graph;
pub mod hand_off;
pub mod head;

use crate::draft_head::cuda::features::StagedFeatures;
use crate::eagle3::feature_ring::FeatureRing;
use crate::eagle3::{DraftVocab, FeatureKind};
use crate::llama::cuda::{GpuForwardError, Workspace};
use cudarc::driver::{CudaSlice, DriverError};
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::attention::{AttentionError, DeviceAttentionPlan};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::{AttentionPlan, KvRows};
use peregrine_runtime::cuda::Gpu;
use std::sync::Arc;

/// What a kind of draft head provides: the part of the head every kernel reads and none
/// writes (its weights and handles; graphs hold it), and the forward it queues.
pub trait DraftHeadKind: Send + Sync + 'static {
    /// The activations of one forward.
    type Work: Send;
    /// What the head is, for messages.
    const NAME: &'static str;
    /// The device the head runs on.
    fn gpu(&self) -> &Arc<Gpu>;
    /// The kernels it launches.
    fn kernels(&self) -> &CudaKernels;
    /// The width of a row's `pre`.
    fn hidden_size(&self) -> usize;
    /// The vocabulary token ids are checked against.
    fn vocab_size(&self) -> usize;
    /// Its draft vocabulary (draft id to target id); the logits are this wide.
    fn vocab(&self) -> &DraftVocab;
    /// The target layers whose inputs feed step 0, in concatenation order.
    fn aux_layers(&self) -> &[usize];
    /// The width of one row of the features of `kind`.
    fn feature_width(&self, kind: FeatureKind) -> usize;
    /// The positions the head serves (its rotary table's).
    fn max_positions(&self) -> usize;
    /// Bytes one token takes in the head's one-layer cache (bf16).
    fn kv_bytes_per_token(&self) -> u64;
    /// The layout of the head's one-layer cache over `num_blocks` blocks of `block_size`
    /// tokens.
    fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout;
    /// What the head's cache keeps a token (keys and values, or latent rows).
    fn kv_rows(&self) -> KvRows;
    /// The attention kernel of one-row steps.
    fn decode_kernel(&self) -> DecodeKernel;
    /// A growing plan for eager steps, as the head's attention runs it.
    fn growing_plan(&self) -> Result<DeviceAttentionPlan, DriverError>;
    /// A fixed plan of `capacity` as the head's attention runs it.
    fn fixed_plan(&self, capacity: PlanCapacity) -> Result<DeviceAttentionPlan, AttentionError>;
    /// Activations for `rows` rows and `logit_rows` logit rows, with room for target
    /// features when `features`.
    fn work(&self, rows: usize, logit_rows: usize, features: bool) -> anyhow::Result<Self::Work>;
    /// The decoder layer's activations of `work` and its staged features (or `pre`), apart.
    fn parts(work: &mut Self::Work) -> (&mut Workspace, &mut StagedFeatures);
    /// The decoder layer's activations of `work`.
    fn layer_work(work: &mut Self::Work) -> &mut Workspace {
        Self::parts(work).0
    }
    /// The staged features (or `pre`) of `work`.
    fn features(work: &mut Self::Work) -> &mut StagedFeatures {
        Self::parts(work).1
    }
    /// Queues the forward of the `n` rows staged in `plan` (features of `kind` staged in
    /// `work`), leaving the logits of its `r` logit rows in the layer work's logits and
    /// every row's `pre` in its residual. Reads no host value of the step but its sizes, so
    /// that a graph captured from it serves every step staged into the same buffers.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        work: &mut Self::Work,
        n: usize,
        r: usize,
        every_row: bool,
        kind: FeatureKind,
        plan: &DeviceAttentionPlan,
        cache: &mut GpuKvCache,
    ) -> Result<(), GpuForwardError>;

    /// Queues the argmax of the first `rows` logit rows of `work` into its ids.
    fn argmax(&self, work: &mut Self::Work, rows: usize) -> Result<(), GpuForwardError> {
        let (k, stream, v) = (self.kernels(), self.gpu().stream(), self.vocab().len());
        Self::layer_work(work).argmax(k, stream, rows, v)
    }

    /// Queues the forward and argmax of the `n` rows staged in `plan`, every row a logit
    /// row, fed features of `kind`.
    fn launch_greedy(
        &self,
        work: &mut Self::Work,
        n: usize,
        kind: FeatureKind,
        plan: &DeviceAttentionPlan,
        cache: &mut GpuKvCache,
    ) -> Result<(), GpuForwardError> {
        self.launch(work, n, n, true, kind, plan, cache)?;
        self.argmax(work, n)
    }

    /// Gathers the rows `ids` of `ring` into the staged features of `work`.
    fn gather(
        &self,
        work: &mut Self::Work,
        ring: &FeatureRing,
        ids: &[u64],
    ) -> Result<(), GpuForwardError> {
        Self::features(work).gather(self.gpu(), self.kernels(), ring, ids)
    }

    /// The staged `pre` of `work`, f32 `[rows, H]`.
    fn staged_pre(work: &mut Self::Work) -> &mut CudaSlice<f32> {
        &mut Self::features(work).pre
    }

    /// Refuses a plan with a position past the rotary table.
    fn check_positions(&self, plan: &AttentionPlan) -> Result<(), GpuForwardError> {
        let max = self.max_positions();
        match plan.positions().iter().max() {
            Some(&position) if position as usize >= max => {
                Err(GpuForwardError::Position { position, max })
            }
            _ => Ok(()),
        }
    }

    /// The drafts (target ids) of the first `r` argmax ids of `work` and the `pre` of its
    /// first `n` rows (with `logits`, the first `r` logit rows too), downloaded (waits for
    /// the stream).
    fn drafts(
        &self,
        work: &mut Self::Work,
        n: usize,
        r: usize,
        logits: bool,
    ) -> Result<GpuHeadDrafts, GpuForwardError> {
        let (gpu, h, v) = (self.gpu(), self.hidden_size(), self.vocab().len());
        let w = Self::layer_work(work);
        let ids = gpu.download(&w.ids.slice(0..r))?;
        let logits = match logits {
            true => Some(gpu.download(&w.logits.slice(0..r * v))?),
            false => None,
        };
        Ok(GpuHeadDrafts {
            drafts: ids
                .into_iter()
                .map(|id| self.vocab().target(id as usize))
                .collect(),
            logits,
            pre: gpu.download(&w.residual.slice(0..n * h))?,
        })
    }
}

/// The greedy drafts of one forward and every row's `pre`.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuHeadDrafts {
    /// The draft of each logit row, a target id.
    pub drafts: Vec<u32>,
    /// The draft-vocabulary logits of each logit row (`[rows, V_d]`), where asked.
    pub logits: Option<Vec<f32>>,
    /// `pre` of every row, f32 `[rows, H]`.
    pub pre: Vec<f32>,
}

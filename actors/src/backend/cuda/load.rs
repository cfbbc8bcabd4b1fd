//! Loading the CUDA backend: the target on device 0 with its profiling forward, the draft
//! model or head `--speculative-method` names beside it (each on a stream of its own), the
//! pool sized from what they leave of the device's memory, and the drafter built over the
//! target's pool.

use super::GpuBackend;
use crate::backend::{blocks_in, check_draft, HeadLimits, Loaded, StepCapacity};
use crate::draft::{
    with_fault, BackendDraft, DraftMethod, DraftSpec, Eagle3, GpuHead, Ngram, LAZY_ROWS,
};
use anyhow::{bail, Context};
use peregrine_kernels::cuda::CudaKernels;
use peregrine_kernels::gemv_max_rows_for;
use peregrine_models::draft_head::cuda::chain_buffers::MAX_CHAIN_STEPS;
use peregrine_models::draft_head::cuda::hand_off::DraftHandOff;
use peregrine_models::eagle3::cuda::GpuEagle3Head;
use peregrine_models::eagle3::feature_ring::FeatureRing;
use peregrine_models::eagle3::Eagle3Config;
use peregrine_models::llama::cuda::{GpuLlama, GpuModelOptions};
use peregrine_models::mtp::cuda::GpuMtpHead;
use peregrine_models::ModelConfig;
use peregrine_ops::{AttentionPlan, SeqSpec};
use peregrine_runtime::cuda::Gpu;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::info;

/// How the GPU backend is set up.
#[derive(Clone, Debug)]
pub struct GpuSettings {
    /// The share of device memory for weights, activations and the pool, in (0, 1].
    pub gpu_memory_utilization: f32,
    /// Bytes of the pool (the target's KV and any drafter's beside it), within what
    /// `gpu_memory_utilization` leaves; `None`: all of that.
    pub kv_cache_memory: Option<u64>,
    pub block_size: usize,
    /// The most tokens of one step (sizes the activations).
    pub max_num_batched_tokens: usize,
    /// The most sequences of one step (sizes the logits).
    pub max_num_seqs: usize,
    /// Drafts verified per sequence and step (0 without speculation): each takes one more
    /// row of logits.
    pub num_speculative_tokens: usize,
    /// Batch-invariant kernels.
    pub deterministic: bool,
    /// The longest context a decode graph serves (longer steps run eagerly).
    pub max_seq_len_to_capture: usize,
    /// Where compiled kernels are cached.
    pub kernel_cache: PathBuf,
    /// The drafter, built with the target; a draft model or head is loaded beside it on
    /// the device, and its KV takes its share of every block.
    pub draft: Option<DraftSpec>,
}

/// The default of [`GpuSettings::max_seq_len_to_capture`] (vLLM's).
pub const MAX_SEQ_LEN_TO_CAPTURE: usize = 8192;

/// What the backend loads beside the target for its drafter.
enum Beside {
    /// Nothing: no drafter, or n-gram lookup.
    Nothing,
    /// A draft model of the target's tokenizer.
    Model(Box<GpuLlama>),
    /// A draft head, and the ring the target hands it its features in on the device.
    Head(Box<HeadBeside>, Arc<FeatureRing>),
}

/// A draft head the backend loaded beside the target.
enum HeadBeside {
    Eagle3(GpuEagle3Head),
    Mtp(GpuMtpHead),
}

impl Beside {
    /// Bytes one token takes in the drafter's KV (its share of every block).
    fn kv_bytes_per_token(&self) -> u64 {
        match self {
            Beside::Nothing => 0,
            Beside::Model(draft) => draft.kv_bytes_per_token(),
            Beside::Head(head, _) => match head.as_ref() {
                HeadBeside::Eagle3(h) => h.kv_bytes_per_token(),
                HeadBeside::Mtp(h) => h.kv_bytes_per_token(),
            },
        }
    }

    /// Bytes of the draft model's weights (a head's are not counted).
    fn weight_bytes(&self) -> u64 {
        match self {
            Beside::Model(draft) => draft.weight_bytes(),
            _ => 0,
        }
    }
}

/// Loads the checkpoint in `dir` onto device 0, with the drafter `s.draft` names beside it,
/// and sizes the pool: what is free after the weights and a profiling forward of
/// `max_num_batched_tokens` tokens, less the share of the device that
/// `gpu_memory_utilization` leaves to others.
pub fn cuda_backend(dir: &Path, s: &GpuSettings) -> anyhow::Result<Loaded> {
    let gpu = Arc::new(Gpu::open(0).context("opening CUDA device 0")?);
    let kernels = Arc::new(CudaKernels::load(&gpu, &s.kernel_cache)?);
    info!(
        device = gpu.name(),
        arch = gpu.arch(),
        compiled = kernels.freshly_compiled(),
        "kernels loaded"
    );
    let max_logit_rows =
        (s.max_num_seqs * (1 + s.num_speculative_tokens)).min(s.max_num_batched_tokens);
    let mut model = load_profiled(dir, gpu.clone(), &kernels, s, max_logit_rows)?;
    let beside = load_beside(s, &mut model, &gpu, &kernels)?;
    let num_blocks = pool_blocks(s, &gpu, &model, &beside)?;
    let capacity = StepCapacity {
        max_tokens: s.max_num_batched_tokens,
        max_seqs: s.max_num_seqs,
        max_logit_rows,
    };
    let drafts = s.num_speculative_tokens;
    let blocks = u64::from(num_blocks);
    let mut target = GpuBackend::new(model, kernels.clone(), capacity, blocks, drafts, s)?;
    let drafter = match beside {
        Beside::Nothing => match s.draft {
            Some(DraftSpec::Ngram { min, max }) => Some(Box::new(Ngram::new(min, max)?) as _),
            _ => None,
        },
        Beside::Model(draft) => {
            let capacity = StepCapacity {
                max_logit_rows: s.max_num_seqs,
                ..capacity
            };
            let draft = GpuBackend::new(*draft, kernels, capacity, blocks, 0, s)?;
            info!(
                blocks = num_blocks,
                draft_bytes_per_layer = draft.pool.bytes_per_layer,
                "draft model loaded beside the target"
            );
            Some(Box::new(BackendDraft::new(Box::new(draft), &target.pool)?) as _)
        }
        Beside::Head(head, ring) => {
            target.ring = Some(ring);
            let hand_off = drafts_hand_off(&gpu, s)?;
            target.drafts = Some(hand_off.clone());
            Some(head_drafter(*head, &target, s, hand_off)?)
        }
    };
    Ok(Loaded {
        target: Box::new(target),
        drafter,
    })
}

/// Loads what `s.draft` drafts with beside `model` on `gpu`: a drafter runs on a stream of
/// its own (a second handle on the device) and asks one logit row per sequence; a head's
/// features are recorded by the target (their memory taken before the pool's is measured)
/// and handed to it through a ring on the device.
fn load_beside(
    s: &GpuSettings,
    model: &mut GpuLlama,
    gpu: &Gpu,
    kernels: &Arc<CudaKernels>,
) -> anyhow::Result<Beside> {
    let own_gpu = || -> anyhow::Result<Arc<Gpu>> {
        Ok(Arc::new(Gpu::open(0).context("opening CUDA device 0")?))
    };
    Ok(match &s.draft {
        None | Some(DraftSpec::Ngram { .. }) => Beside::Nothing,
        Some(DraftSpec::Model(draft_dir)) => {
            let loaded = load_profiled(draft_dir, own_gpu()?, kernels, s, s.max_num_seqs)
                .with_context(|| format!("the draft model {}", draft_dir.display()))?;
            check_draft(loaded.config(), model.config())?;
            Beside::Model(Box::new(loaded))
        }
        Some(DraftSpec::Eagle3Head(head_dir)) => {
            let options = head_options(s, model.config());
            let aux = Eagle3Config::from_dir(head_dir)?.aux_layers(model.config().num_layers)?;
            model.record_aux(&aux)?;
            let (embed, target) = (model.shared_embedding(), model.config());
            let mut loaded = GpuEagle3Head::load(
                head_dir,
                target,
                embed,
                own_gpu()?,
                kernels.clone(),
                options,
            )
            .with_context(|| format!("loading the EAGLE-3 head {}", head_dir.display()))?;
            let ring = feature_ring(gpu, s, aux.len() * target.hidden_size)?;
            loaded.read_features_from(ring.clone())?;
            Beside::Head(Box::new(HeadBeside::Eagle3(loaded)), ring)
        }
        Some(DraftSpec::Mtp(dir)) => {
            let options = head_options(s, model.config());
            // The layer reads the target's last-layer output: "the input of layer L".
            model.record_aux(&[model.config().num_layers])?;
            let (shared, target) = (model.shared_embedding(), model.config());
            let mut loaded =
                GpuMtpHead::load(dir, target, shared, own_gpu()?, kernels.clone(), options)
                    .with_context(|| format!("loading the MTP layer of {}", dir.display()))?;
            let ring = feature_ring(gpu, s, target.hidden_size)?;
            loaded.read_features_from(ring.clone())?;
            Beside::Head(Box::new(HeadBeside::Mtp(loaded)), ring)
        }
    })
}

/// Blocks of the pool: what `kv_cache_memory`, or else `gpu_memory_utilization`, leaves of
/// the device after the weights and activations, in blocks that hold the KV of `model` and
/// of what drafts `beside` it; at least two (one is the graphs' scratch block).
fn pool_blocks(
    s: &GpuSettings,
    gpu: &Gpu,
    model: &GpuLlama,
    beside: &Beside,
) -> anyhow::Result<u32> {
    let (free, total) = gpu.memory()?;
    let reserved = (total as f64 * (1.0 - s.gpu_memory_utilization as f64)) as u64;
    let Some(budget) = free.checked_sub(reserved).filter(|&b| b > 0) else {
        bail!(
            "gpu_memory_utilization {} leaves no room for the KV cache: {free} of {total} bytes \
             are free after the weights ({} bytes) and activations, and {reserved} must stay free",
            s.gpu_memory_utilization,
            model.weight_bytes() + beside.weight_bytes()
        );
    };
    let budget = match s.kv_cache_memory {
        Some(bytes) if bytes > budget => bail!(
            "kv_cache_memory {bytes} bytes is more than the {budget} bytes of the GPU that \
             gpu_memory_utilization {} leaves for the KV cache",
            s.gpu_memory_utilization
        ),
        Some(bytes) => bytes,
        None => budget,
    };
    let per_token = model.kv_bytes_per_token() + beside.kv_bytes_per_token();
    let block_bytes = per_token * s.block_size as u64;
    let num_blocks = blocks_in(budget, block_bytes, s.block_size, "the GPU memory left")?;
    if num_blocks < 2 {
        bail!("the GPU memory left holds one KV block, and one is the graphs' scratch block");
    }
    Ok(num_blocks)
}

/// The drafter of `head`: its runner over the blocks of `target`'s pool, sized for the
/// steps `s` allows.
fn head_drafter(
    head: HeadBeside,
    target: &GpuBackend,
    s: &GpuSettings,
    hand_off: Arc<DraftHandOff>,
) -> anyhow::Result<Box<dyn DraftMethod>> {
    let limits = HeadLimits {
        max_tokens: s.max_num_batched_tokens,
        max_logit_rows: s.max_num_seqs,
        max_seq_len_to_capture: s.max_seq_len_to_capture,
        verify_rows: 1 + s.num_speculative_tokens,
    };
    let pool = &target.pool;
    Ok(match head {
        HeadBeside::Eagle3(h) => Box::new(with_fault(Eagle3::with_runner(
            GpuHead::beside(h, pool, limits)?.handing_drafts_to(hand_off),
        ))?),
        HeadBeside::Mtp(h) => Box::new(with_fault(Eagle3::with_runner(
            GpuHead::beside(h, pool, limits)?.handing_drafts_to(hand_off),
        ))?),
    })
}

/// Where the head beside the target leaves a chained proposal's drafts for the
/// verification: room for the most steps a chain runs over the most sequences a step holds.
fn drafts_hand_off(gpu: &Gpu, s: &GpuSettings) -> anyhow::Result<Arc<DraftHandOff>> {
    let capacity = MAX_CHAIN_STEPS * s.max_num_seqs;
    let hand_off = DraftHandOff::new(gpu, capacity)
        .with_context(|| format!("a draft hand-off of {capacity} drafts"))?;
    Ok(Arc::new(hand_off))
}

/// The options of a draft head beside a target of `target`: one logit row a sequence.
fn head_options(s: &GpuSettings, target: &ModelConfig) -> GpuModelOptions {
    GpuModelOptions {
        max_tokens: s.max_num_batched_tokens,
        max_logit_rows: s.max_num_seqs,
        deterministic: s.deterministic,
        gemv_max_rows: gemv_max_rows_for(target.hidden_size),
    }
}

/// The ring the target hands rows of `width` off in to a head on `gpu`, of
/// [`feature_ring_rows`] rows.
fn feature_ring(gpu: &Gpu, s: &GpuSettings, width: usize) -> anyhow::Result<Arc<FeatureRing>> {
    let rows = feature_ring_rows(s);
    let ring = FeatureRing::new(gpu, rows, width)
        .with_context(|| format!("a feature ring of {rows} rows of {width}"))?;
    info!(
        rows,
        bytes = ring.bytes(),
        "feature ring for the draft head"
    );
    Ok(Arc::new(ring))
}

/// Rows of the feature ring a draft head reads: room for the rows a step 0 may still
/// read when a store begins (three steps of `max_num_batched_tokens`: the step, the one
/// queued ahead of it, and the one a proposal that asks no drafts runs beside; and every
/// sequence's rows that wait while its drafts are paused, with two verifications' more),
/// so that no row is overwritten before step 0 has read it.
fn feature_ring_rows(s: &GpuSettings) -> usize {
    let verify = 1 + s.num_speculative_tokens;
    3 * s.max_num_batched_tokens + s.max_num_seqs * (LAZY_ROWS + 2 * verify)
}

/// Loads the checkpoint in `dir` onto `gpu` and runs its profiling forward.
fn load_profiled(
    dir: &Path,
    gpu: Arc<Gpu>,
    kernels: &Arc<CudaKernels>,
    s: &GpuSettings,
    max_logit_rows: usize,
) -> anyhow::Result<GpuLlama> {
    let hidden = ModelConfig::from_dir(dir)
        .with_context(|| format!("reading the config of {}", dir.display()))?
        .hidden_size;
    let options = GpuModelOptions {
        max_tokens: s.max_num_batched_tokens,
        max_logit_rows,
        deterministic: s.deterministic,
        gemv_max_rows: gemv_max_rows_for(hidden),
    };
    // The activations are sized for the largest step: a step limit past the device's
    // memory fails here, with the limits named.
    let sized = || {
        format!(
            "with buffers for max_num_batched_tokens {} and max_num_seqs {} (lower them)",
            s.max_num_batched_tokens, s.max_num_seqs
        )
    };
    let mut model = GpuLlama::load(dir, gpu, kernels.clone(), options)
        .with_context(|| format!("loading {} onto the GPU {}", dir.display(), sized()))?;
    profile(&mut model, s, max_logit_rows)
        .with_context(|| format!("profiling the largest step {}", sized()))?;
    Ok(model)
}

/// Runs the largest step the scheduler may send, prefill of `max_num_batched_tokens`
/// tokens, over a temporary pool, so that the activations' peak (cuBLAS workspaces
/// included) is allocated before the free memory is measured.
fn profile(model: &mut GpuLlama, s: &GpuSettings, logit_rows: usize) -> anyhow::Result<()> {
    let tokens = s.max_num_batched_tokens;
    let longest = model.config().max_model_len.max(1);
    let per_seq = longest.min(tokens);
    let seqs = tokens.div_ceil(per_seq);
    let blocks_per_seq = per_seq.div_ceil(s.block_size);
    let num_blocks = (seqs * blocks_per_seq) as u64;
    let gpu = model.gpu().clone();
    let mut cache = model.new_cache(num_blocks, s.block_size as u64)?;
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|i| ((i * blocks_per_seq) as u32..((i + 1) * blocks_per_seq) as u32).collect())
        .collect();
    let specs: Vec<SeqSpec> = tables
        .iter()
        .enumerate()
        .map(|(i, table)| SeqSpec {
            num_cached: 0,
            num_new: per_seq.min(tokens - i * per_seq),
            block_table: table,
        })
        .collect();
    let plan = AttentionPlan::new(&specs, s.block_size, num_blocks)?;
    let ids = vec![0u32; tokens];
    let rows: Vec<usize> = (0..logit_rows.min(tokens)).collect();
    model.forward(&ids, &plan, &mut cache, &rows)?;
    gpu.synchronize()?;
    Ok(())
}

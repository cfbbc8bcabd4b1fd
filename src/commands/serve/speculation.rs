//! The draft method `--speculative-method` asks for, built over the target's pool.

use crate::commands::heads::draft_dir;
use anyhow::Context;
use peregrine_actors::backend::{DraftBeside, ModelBackend};
use peregrine_actors::draft::{
    BackendDraft, CpuMtpHead, DraftMethod, DraftModel, Eagle3, HeadRunner, Ngram,
};
use peregrine_config::{ServeConfig, SpeculativeMethod};
use peregrine_kernels::cpu::Matrix;
use peregrine_models::eagle3::{Eagle3Config, Eagle3Head};
use peregrine_models::mtp::MtpHead;
use peregrine_models::{LlamaModel, Weights};
use std::path::Path;
use std::sync::Arc;
use tracing::info;

/// The configured drafter, or `None` when speculation is off; `beside` is what the
/// target's backend loaded beside it. The configuration was validated already:
/// `draft_model` names a directory for the draft-model method, and for eagle3 unless the
/// default model's head is meant ([`draft_dir`]).
pub fn load_drafter(
    config: &ServeConfig,
    target: &mut dyn ModelBackend,
    beside: Option<DraftBeside>,
) -> anyhow::Result<Option<Box<dyn DraftMethod>>> {
    let Some(method) = config.speculative_method else {
        return Ok(None);
    };
    let draft_dir = draft_dir(config)?;
    let drafter = build_drafter(
        method,
        draft_dir.as_deref(),
        (config.ngram_min, config.ngram_max),
        target,
        beside,
    )?;
    info!(
        method = method.as_str(),
        num_speculative_tokens = config.num_speculative_tokens,
        "speculative decoding on"
    );
    Ok(Some(drafter))
}

/// The drafter of `method`: n-gram lookup over `(min, max)` tokens, or the model or
/// EAGLE-3 head in `draft_model` with a draft cache over `target`'s pool of blocks: the
/// one the target's backend loaded `beside` it (on the GPU), else one loaded here on the
/// CPU. The draft proposer owns it from then on.
pub fn build_drafter(
    method: SpeculativeMethod,
    draft_model: Option<&Path>,
    (ngram_min, ngram_max): (usize, usize),
    target: &mut dyn ModelBackend,
    beside: Option<DraftBeside>,
) -> anyhow::Result<Box<dyn DraftMethod>> {
    Ok(match (method, beside) {
        (SpeculativeMethod::Ngram, None) => Box::new(Ngram::new(ngram_min, ngram_max)?),
        (SpeculativeMethod::DraftModel, Some(DraftBeside::Model(draft))) => {
            Box::new(BackendDraft::new(draft, target.pool())?)
        }
        (SpeculativeMethod::DraftModel, None) => {
            let dir = draft_model.context("speculative_method draft_model needs --draft-model DIR")?;
            let model = LlamaModel::load(dir)
                .with_context(|| format!("loading the draft model {}", dir.display()))?;
            Box::new(DraftModel::new(model, target.config(), target.pool())?)
        }
        #[cfg(feature = "cuda")]
        (SpeculativeMethod::Eagle3, Some(DraftBeside::Eagle3Head(head, limits))) => {
            let runner = peregrine_actors::draft::GpuHead::beside(*head, target.pool(), limits)?;
            Box::new(with_fault(Eagle3::with_runner(runner))?)
        }
        (SpeculativeMethod::Eagle3, None) => {
            let dir = draft_model.context("speculative_method eagle3 needs --draft-model DIR")?;
            let head = load_eagle3(dir, target)
                .with_context(|| format!("loading the EAGLE-3 head {}", dir.display()))?;
            Box::new(with_fault(Eagle3::new(head, target.config(), target.pool())?)?)
        }
        #[cfg(feature = "cuda")]
        (SpeculativeMethod::Mtp, Some(DraftBeside::MtpHead(head, limits))) => {
            let runner = peregrine_actors::draft::GpuHead::beside(*head, target.pool(), limits)?;
            Box::new(with_fault(Eagle3::with_runner(runner))?)
        }
        (SpeculativeMethod::Mtp, None) => {
            let dir = draft_model.context("speculative_method mtp reads the target's folder")?;
            let head = load_mtp(dir, target)
                .with_context(|| format!("loading the MTP layer of {}", dir.display()))?;
            let runner = CpuMtpHead::new(head, target.config(), target.pool())?;
            Box::new(with_fault(Eagle3::with_runner(runner))?)
        }
        (method, Some(_)) => anyhow::bail!(
            "the backend loaded a drafter beside the target that speculative_method {} does not use",
            method.as_str()
        ),
    })
}

/// The environment variable of the fault hook (feature `fault-hooks`): the block id above
/// which an EAGLE-3 head's KV is zeroed after each of its forwards.
#[cfg(feature = "fault-hooks")]
const FAULT_ABOVE_VAR: &str = "PEREGRINE_FAULT_DRAFT_KV_ABOVE";

/// `method` with the fault hook set where the build has it and [`FAULT_ABOVE_VAR`] names
/// a block id (logged as a warning: a server so started corrupts its drafts on purpose).
#[cfg(feature = "fault-hooks")]
fn with_fault<R: HeadRunner>(method: Eagle3<R>) -> anyhow::Result<Eagle3<R>> {
    let Ok(value) = std::env::var(FAULT_ABOVE_VAR) else {
        return Ok(method);
    };
    let above: u32 = value
        .parse()
        .with_context(|| format!("{FAULT_ABOVE_VAR}={value:?} is not a block id"))?;
    tracing::warn!(
        above,
        "fault hook on: the EAGLE-3 head's KV above this block id is zeroed after each forward"
    );
    Ok(method.with_kv_fault_above(above))
}

/// `method` as it is: this build has no fault hook.
#[cfg(not(feature = "fault-hooks"))]
fn with_fault<R: HeadRunner>(method: Eagle3<R>) -> anyhow::Result<Eagle3<R>> {
    Ok(method)
}

/// What the CUDA backend loads beside the target for `method`: the draft model or the
/// EAGLE-3 head in `draft_model`, or the MTP layer of the target's folder (which
/// `draft_model` then names); nothing for n-gram or without speculation.
#[cfg(feature = "cuda")]
pub fn gpu_draft(
    method: Option<SpeculativeMethod>,
    draft_model: Option<&Path>,
) -> Option<peregrine_actors::backend::GpuDraft> {
    use peregrine_actors::backend::GpuDraft;
    let dir = draft_model?.to_path_buf();
    match method? {
        SpeculativeMethod::DraftModel => Some(GpuDraft::Model(dir)),
        SpeculativeMethod::Eagle3 => Some(GpuDraft::Eagle3Head(dir)),
        SpeculativeMethod::Mtp => Some(GpuDraft::Mtp(dir)),
        SpeculativeMethod::Ngram => None,
    }
}

/// The EAGLE-3 head in `dir` for `target` on the CPU, sharing the target's embedding table
/// when the head has none of its own, its products' weights quantized to Q8_0 (a quarter of
/// the bytes a step, the same acceptance: docs/performance.md).
fn load_eagle3(dir: &Path, target: &dyn ModelBackend) -> anyhow::Result<Eagle3Head> {
    let config = Eagle3Config::from_dir(dir)?;
    let weights = Weights::open(dir)?;
    let embed = match target.embedding_table() {
        Some(table) => table,
        None if weights.contains("embed_tokens.weight") => {
            Arc::new(Matrix::empty(target.config().hidden_size))
        }
        None => anyhow::bail!(
            "the head has no embed_tokens.weight and the {} backend does not share its table",
            target.pool().device
        ),
    };
    let float = Eagle3Head::from_weights(config, &weights, target.config(), embed)?;
    let float_bytes = float.product_weight_bytes();
    let head = float.quantized_q8_0();
    tracing::info!(
        float_mb = float_bytes as f64 / 1e6,
        q8_0_mb = head.product_weight_bytes() as f64 / 1e6,
        "EAGLE-3 head quantized to Q8_0 at load (its products read a quarter of the bytes)"
    );
    Ok(head)
}

/// The first multi-token prediction layer of the target checkpoint in `dir`, sharing the
/// target's embedding table and output projection where the layer has none of its own.
fn load_mtp(dir: &Path, target: &dyn ModelBackend) -> anyhow::Result<MtpHead> {
    let (Some(embed), Some(head)) = (target.embedding_table(), target.lm_head()) else {
        anyhow::bail!(
            "speculative_method mtp on the CPU reads the target's embedding and output \
             projection, which the {} backend does not share",
            target.pool().device
        );
    };
    let weights = Weights::open(dir)?;
    Ok(MtpHead::from_weights(
        target.config(),
        &weights,
        embed,
        head,
    )?)
}

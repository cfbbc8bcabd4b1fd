//! What `--speculative-method` asks for, resolved once from the configuration
//! ([`DraftSpec`]), and the drafter built from it where the target's backend is built: the
//! CPU's here ([`cpu_drafter`]); the CUDA backend builds its own beside the target, whose
//! memory it shares.

use super::{CpuMtpHead, DraftMethod, DraftModel, Eagle3, HeadRunner, Ngram};
use crate::backend::ModelBackend;
use anyhow::Context;
use peregrine_kernels::cpu::Matrix;
use peregrine_models::eagle3::{Eagle3Config, Eagle3Head};
use peregrine_models::mtp::MtpHead;
use peregrine_models::{LlamaModel, Weights};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The drafter of one speculative method, with what it is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftSpec {
    /// Lookup of each request's own n-grams of `min` to `max` tokens.
    Ngram { min: usize, max: usize },
    /// A draft model of the target's tokenizer in this directory.
    Model(PathBuf),
    /// An EAGLE-3 head in this directory.
    Eagle3Head(PathBuf),
    /// The first multi-token prediction layer of the target checkpoint in this directory.
    Mtp(PathBuf),
}

/// The drafter of `spec` on the CPU over `target`'s pool of blocks: the draft model's own
/// cache, or the head's one-layer cache, in blocks of the target's shape.
pub fn cpu_drafter(
    spec: &DraftSpec,
    target: &mut dyn ModelBackend,
) -> anyhow::Result<Box<dyn DraftMethod>> {
    Ok(match spec {
        DraftSpec::Ngram { min, max } => Box::new(Ngram::new(*min, *max)?),
        DraftSpec::Model(dir) => {
            let model = LlamaModel::load(dir)
                .with_context(|| format!("loading the draft model {}", dir.display()))?;
            Box::new(DraftModel::new(model, target.config(), target.pool())?)
        }
        DraftSpec::Eagle3Head(dir) => {
            let head = load_eagle3(dir, target)
                .with_context(|| format!("loading the EAGLE-3 head {}", dir.display()))?;
            Box::new(with_fault(Eagle3::new(
                head,
                target.config(),
                target.pool(),
            )?)?)
        }
        DraftSpec::Mtp(dir) => {
            let head = load_mtp(dir, target)
                .with_context(|| format!("loading the MTP layer of {}", dir.display()))?;
            let runner = CpuMtpHead::new(head, target.config(), target.pool())?;
            Box::new(with_fault(Eagle3::with_runner(runner))?)
        }
    })
}

/// The environment variable of the fault hook (feature `fault-hooks`): the block id above
/// which a draft head's KV is zeroed after each of its forwards.
#[cfg(feature = "fault-hooks")]
const FAULT_ABOVE_VAR: &str = "PEREGRINE_FAULT_DRAFT_KV_ABOVE";

/// `method` with the fault hook set where the build has it and [`FAULT_ABOVE_VAR`] names
/// a block id (logged as a warning: a server so started corrupts its drafts on purpose).
#[cfg(feature = "fault-hooks")]
pub(crate) fn with_fault<R: HeadRunner>(method: Eagle3<R>) -> anyhow::Result<Eagle3<R>> {
    let Ok(value) = std::env::var(FAULT_ABOVE_VAR) else {
        return Ok(method);
    };
    let above: u32 = value
        .parse()
        .with_context(|| format!("{FAULT_ABOVE_VAR}={value:?} is not a block id"))?;
    tracing::warn!(
        above,
        "fault hook on: the draft head's KV above this block id is zeroed after each forward"
    );
    Ok(method.with_kv_fault_above(above))
}

/// `method` as it is: this build has no fault hook.
#[cfg(not(feature = "fault-hooks"))]
pub(crate) fn with_fault<R: HeadRunner>(method: Eagle3<R>) -> anyhow::Result<Eagle3<R>> {
    Ok(method)
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

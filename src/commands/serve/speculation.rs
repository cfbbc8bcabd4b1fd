//! The drafter `--speculative-method` asks for, as the backend builds it.

use crate::commands::heads::draft_dir;
use anyhow::Context;
use peregrine_actors::draft::DraftSpec;
use peregrine_config::{ServeConfig, SpeculativeMethod};

/// What the configured drafter is built from, or `None` when speculation is off. The
/// configuration was validated already: `draft_model` names a directory for the
/// draft-model method, and for eagle3 unless the default model's head is meant
/// ([`draft_dir`]).
pub fn draft_spec(config: &ServeConfig) -> anyhow::Result<Option<DraftSpec>> {
    let Some(method) = config.speculative_method else {
        return Ok(None);
    };
    let dir = draft_dir(config)?;
    let needs_dir = |what: &str| {
        dir.clone()
            .with_context(|| format!("speculative_method {} {what}", method.as_str()))
    };
    Ok(Some(match method {
        SpeculativeMethod::Ngram => DraftSpec::Ngram {
            min: config.ngram_min,
            max: config.ngram_max,
        },
        SpeculativeMethod::DraftModel => DraftSpec::Model(needs_dir("needs --draft-model DIR")?),
        SpeculativeMethod::Eagle3 => DraftSpec::Eagle3Head(needs_dir("needs --draft-model DIR")?),
        SpeculativeMethod::Mtp => DraftSpec::Mtp(needs_dir("reads the target's folder")?),
    }))
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn config(method: Option<SpeculativeMethod>) -> ServeConfig {
        ServeConfig {
            speculative_method: method,
            model: Some(PathBuf::from("/my/model")),
            ..ServeConfig::default()
        }
    }

    #[test]
    fn each_method_names_what_its_drafter_is_built_from() {
        assert_eq!(draft_spec(&config(None)).unwrap(), None);
        let ngram = ServeConfig {
            ngram_min: 2,
            ngram_max: 5,
            ..config(Some(SpeculativeMethod::Ngram))
        };
        let spec = draft_spec(&ngram).unwrap();
        assert_eq!(spec, Some(DraftSpec::Ngram { min: 2, max: 5 }));
        for (method, want) in [
            (
                SpeculativeMethod::DraftModel,
                DraftSpec::Model as fn(_) -> _,
            ),
            (SpeculativeMethod::Eagle3, DraftSpec::Eagle3Head),
        ] {
            let named = ServeConfig {
                draft_model: Some(PathBuf::from("/my/draft")),
                ..config(Some(method))
            };
            let spec = draft_spec(&named).unwrap();
            assert_eq!(spec, Some(want(PathBuf::from("/my/draft"))));
        }
    }

    #[test]
    fn a_method_without_its_directory_is_refused_by_name() {
        // Another model than the default, and no head named: no directory to draft with.
        let err = draft_spec(&config(Some(SpeculativeMethod::Eagle3))).unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains("eagle3") && message.contains("--draft-model"),
            "{message}"
        );
        let err = draft_spec(&config(Some(SpeculativeMethod::DraftModel))).unwrap_err();
        assert!(format!("{err:#}").contains("--draft-model"), "{err:#}");
    }
}

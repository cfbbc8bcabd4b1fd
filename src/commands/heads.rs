//! The EAGLE-3 head Peregrine ships for its default model: `--speculative-method eagle3`
//! with the default model and no `--draft-model` drafts with it. It is looked for in the
//! model cache (`models/smollm2-135m-eagle3`, where an installed binary's user puts it) and
//! then in the `heads/` directory of the checkout the binary was built from.

use anyhow::bail;
use peregrine_config::{ServeConfig, SpeculativeMethod};
use peregrine_models::fetch::default_cache_dir;
use std::path::{Path, PathBuf};

/// The default model's head: its directory's name in the cache's `models/` and in the
/// checkout's `heads/`.
pub const DEFAULT_HEAD: &str = "smollm2-135m-eagle3";

/// The `heads/` directory of the checkout this binary was built from.
const CHECKOUT_HEADS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/heads");

/// The draft directory of `config`: `draft_model` when it names one; for eagle3 with the
/// default model and none named, the default model's head; for mtp, the target's own
/// folder (its multi-token prediction layers); otherwise none.
pub fn draft_dir(config: &ServeConfig) -> anyhow::Result<Option<PathBuf>> {
    if config.speculative_method == Some(SpeculativeMethod::Mtp) {
        return Ok(Some(crate::commands::model_dir(config)?.0));
    }
    let wants_default = config.draft_model.is_none()
        && config.model.is_none()
        && config.speculative_method == Some(SpeculativeMethod::Eagle3);
    if !wants_default {
        return Ok(config.draft_model.clone());
    }
    let cache = default_cache_dir(config.cache_dir.as_deref())?;
    default_head(&cache, Path::new(CHECKOUT_HEADS)).map(Some)
}

/// The default head in the cache at `cache`, else in the checkout's `heads`.
fn default_head(cache: &Path, heads: &Path) -> anyhow::Result<PathBuf> {
    let candidates = [
        cache.join("models").join(DEFAULT_HEAD),
        heads.join(DEFAULT_HEAD),
    ];
    if let Some(dir) = candidates.iter().find(|d| d.join("config.json").is_file()) {
        return Ok(dir.clone());
    }
    bail!(
        "speculative_method eagle3 with the default model drafts with its EAGLE-3 head, which \
         is in neither {} nor {}; copy the repository's heads/{DEFAULT_HEAD} to the first, or \
         name a head with --draft-model DIR",
        candidates[0].display(),
        candidates[1].display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkout_ships_the_default_head() {
        let dir = Path::new(CHECKOUT_HEADS).join(DEFAULT_HEAD);
        let config = peregrine_models::eagle3::Eagle3Config::from_dir(&dir).unwrap();
        assert_eq!(config.vocab_size, 49152);
        assert_eq!(config.target_hidden_size, 576);
    }

    #[test]
    fn the_cache_comes_before_the_checkout_and_a_missing_head_is_named() {
        let root = tempfile::tempdir().unwrap();
        let (cache, heads) = (root.path().join("cache"), root.path().join("heads"));
        let err = default_head(&cache, &heads).unwrap_err().to_string();
        assert!(
            err.contains("--draft-model") && err.contains(DEFAULT_HEAD),
            "{err}"
        );
        for dir in [
            heads.join(DEFAULT_HEAD),
            cache.join("models").join(DEFAULT_HEAD),
        ] {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("config.json"), "{}").unwrap();
            assert_eq!(default_head(&cache, &heads).unwrap(), dir);
        }
    }

    #[test]
    fn a_named_head_or_another_model_is_left_as_configured() {
        let mut config = ServeConfig {
            speculative_method: Some(SpeculativeMethod::Eagle3),
            draft_model: Some(PathBuf::from("/my/head")),
            ..ServeConfig::default()
        };
        assert_eq!(draft_dir(&config).unwrap(), Some(PathBuf::from("/my/head")));
        config.draft_model = None;
        config.model = Some(PathBuf::from("/my/model"));
        assert_eq!(draft_dir(&config).unwrap(), None);
        config.model = None;
        config.speculative_method = Some(SpeculativeMethod::Ngram);
        assert_eq!(draft_dir(&config).unwrap(), None);
    }
}

//! The checks across settings, once the file and the flags are merged (each setting's own
//! range check is its row's, in `settings.rs` and `checks.rs`).

use super::{ConfigError, DtypeChoice, Origin, ServeConfig, SpeculativeMethod};
use std::path::Path;

/// How an error names `field` of the merged configuration: its flag, and its key in
/// `file` when there is one (either may have set it).
fn named(field: &str, file: Option<&Path>) -> String {
    let flag = Origin::Flags.name(field);
    match file {
        Some(path) => format!("{flag} (or {}: {field})", path.display()),
        None => flag,
    }
}

impl ServeConfig {
    /// Checks that the speculation fields agree once the file and the flags are merged;
    /// `file` names the config file, if any, in the error.
    pub(super) fn validate_speculation(&self, file: Option<&Path>) -> Result<(), ConfigError> {
        let at = |field: &str| named(field, file);
        if self.ngram_min > self.ngram_max {
            return Err(ConfigError::Invalid {
                at: at("ngram_min"),
                reason: format!(
                    "({}) must not exceed ngram_max ({})",
                    self.ngram_min, self.ngram_max
                ),
            });
        }
        let wants_draft = matches!(
            self.speculative_method,
            Some(SpeculativeMethod::DraftModel | SpeculativeMethod::Eagle3)
        );
        // eagle3 with the default model drafts with the head shipped for it.
        let default_head =
            self.speculative_method == Some(SpeculativeMethod::Eagle3) && self.model.is_none();
        if let (Some(method), None, false) = (
            self.speculative_method.filter(|_| wants_draft),
            &self.draft_model,
            default_head,
        ) {
            return Err(ConfigError::Invalid {
                at: at("draft_model"),
                reason: format!(
                    "must name the draft model's (or EAGLE-3 head's) directory for \
                     speculative_method {} (eagle3 with the default model has its own head)",
                    method.as_str()
                ),
            });
        }
        if !wants_draft && self.draft_model.is_some() {
            return Err(ConfigError::Invalid {
                at: at("draft_model"),
                reason: "is only used with speculative_method draft_model or eagle3".into(),
            });
        }
        Ok(())
    }
}

impl ServeConfig {
    /// Refuses a dtype the device's backend does not compute in (`auto` is always its
    /// own), rather than accepting it and computing in another; `file` names the config
    /// file, if any, in the error.
    pub(super) fn validate_dtype(&self, file: Option<&Path>) -> Result<(), ConfigError> {
        let own = self.device.compute_dtype();
        if self.dtype == DtypeChoice::Auto || self.dtype == own {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            at: named("dtype", file),
            reason: format!(
                "{} is not supported by the {} backend, which computes in {}: use auto or {}",
                self.dtype.as_str(),
                self.device.as_str(),
                own.as_str(),
                own.as_str()
            ),
        })
    }

    /// Refuses a graph size past `max_num_seqs` once the file and the flags are merged
    /// (such a graph would never replay; on a reload that lowers `max_num_seqs`, lower the
    /// sizes with it); `file` names the config file, if any, in the error.
    pub(super) fn validate_graph_sizes(&self, file: Option<&Path>) -> Result<(), ConfigError> {
        let Some(size) = self.cudagraph_sizes.iter().flatten().copied().max() else {
            return Ok(());
        };
        if size <= self.max_num_seqs {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            at: named("cudagraph_sizes", file),
            reason: format!(
                "holds {size}, past max_num_seqs {}: a step never has that many sequences",
                self.max_num_seqs
            ),
        })
    }
}

impl ServeConfig {
    /// Refuses more sequences per step than tokens per step (vLLM's rule: every sequence
    /// of a step feeds at least one token); `file` names the config file, if any.
    pub(super) fn validate_step_limits(&self, file: Option<&Path>) -> Result<(), ConfigError> {
        if self.max_num_seqs <= self.max_num_batched_tokens {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            at: named("max_num_seqs", file),
            reason: format!(
                "({}) must not exceed max_num_batched_tokens ({}): every sequence of a step \
                 feeds at least one token",
                self.max_num_seqs, self.max_num_batched_tokens
            ),
        })
    }
}

//! Range checks on one layer, so that an error names the file key or the flag that set it.

use super::{ConfigError, DeviceKind, DtypeChoice, Layer, Origin, ServeConfig, SpeculativeMethod};
use std::path::Path;

/// The most draft tokens per step (the accepted-length histogram's buckets stop there).
pub const MAX_SPECULATIVE_TOKENS: usize = 16;
use crate::CacheConfig;

impl Layer {
    /// Checks every value this layer sets; types were checked when it was read.
    pub(super) fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
        let invalid = |field: &str, reason: String| ConfigError::Invalid {
            at: origin.name(field),
            reason,
        };
        let at_least_one = [
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_model_len", self.max_model_len),
            ("max_waiting_requests", self.max_waiting_requests),
            ("ngram_min", self.ngram_min),
            ("ngram_max", self.ngram_max),
        ];
        for (field, value) in at_least_one {
            if value == Some(0) {
                return Err(invalid(field, "must be at least 1, not 0".into()));
            }
        }
        if let Some(k) = self
            .num_speculative_tokens
            .filter(|k| !(1..=MAX_SPECULATIVE_TOKENS).contains(k))
        {
            let reason = format!("must be from 1 to {MAX_SPECULATIVE_TOKENS}, not {k}");
            return Err(invalid("num_speculative_tokens", reason));
        }
        if let Some(block_size) = self.block_size {
            let cache = CacheConfig {
                block_size,
                kv_cache_memory: None,
            };
            if cache.validate().is_err() {
                let reason = format!("must be a power of two from 1 to 256, not {block_size}");
                return Err(invalid("block_size", reason));
            }
        }
        if self.kv_cache_memory == Some(0) {
            return Err(invalid(
                "kv_cache_memory",
                "must be more than 0 bytes".into(),
            ));
        }
        if let Some(u) = self
            .gpu_memory_utilization
            .filter(|&u| !(u > 0.0 && u <= 1.0))
        {
            return Err(invalid(
                "gpu_memory_utilization",
                format!("must be in (0, 1], not {u}"),
            ));
        }
        if let Some(sizes) = &self.cudagraph_sizes {
            if sizes.is_empty() || sizes.contains(&0) {
                let reason = format!("must list batch sizes of at least 1, not {sizes:?}");
                return Err(invalid("cudagraph_sizes", reason));
            }
        }
        if let Some(level) = self.log_level.as_deref().filter(|l| !is_log_filter(l)) {
            let reason = format!(
                "must be error, warn, info, debug, trace, off or a filter such as \
                 \"info,peregrine=debug\", not {level:?}"
            );
            return Err(invalid("log_level", reason));
        }
        let texts = [
            ("host", self.host.as_deref()),
            ("served_model_name", self.served_model_name.as_deref()),
            ("admin_token", self.admin_token.as_deref()),
            ("model", self.model.as_ref().and_then(|p| p.to_str())),
            (
                "cache_dir",
                self.cache_dir.as_ref().and_then(|p| p.to_str()),
            ),
        ];
        for (field, value) in texts {
            if value.is_some_and(|v| v.trim().is_empty()) {
                return Err(invalid(field, "must not be empty".into()));
            }
        }
        if let Some(i) = self
            .api_keys
            .iter()
            .flatten()
            .position(|k| k.trim().is_empty())
        {
            return Err(invalid(
                "api_keys",
                format!("must not hold an empty key (key {})", i + 1),
            ));
        }
        if let Some(Err((field, reason))) = self.default_sampling.as_ref().map(|s| s.validate()) {
            return Err(invalid(&format!("default_sampling.{field}"), reason));
        }
        Ok(())
    }
}

impl ServeConfig {
    /// Checks that the speculation fields agree once the file and the flags are merged;
    /// `file` names the config file, if any, in the error.
    pub(super) fn validate_speculation(&self, file: Option<&Path>) -> Result<(), ConfigError> {
        let at = |field: &str| match file {
            Some(path) => format!(
                "{} (or {}: {field})",
                Origin::Flags.name(field),
                path.display()
            ),
            None => Origin::Flags.name(field),
        };
        if self.ngram_min > self.ngram_max {
            return Err(ConfigError::Invalid {
                at: at("ngram_min"),
                reason: format!(
                    "({}) must not exceed ngram_max ({})",
                    self.ngram_min, self.ngram_max
                ),
            });
        }
        if self.speculative_method == Some(SpeculativeMethod::Eagle3)
            && self.device != DeviceKind::Cpu
        {
            return Err(ConfigError::Invalid {
                at: at("speculative_method"),
                reason: format!(
                    "eagle3 runs on the CPU backend only for now (the {} backend does not hand \
                     its hidden states to a draft head); use --device cpu, or ngram or \
                     draft_model",
                    self.device.as_str()
                ),
            });
        }
        let wants_draft = matches!(
            self.speculative_method,
            Some(SpeculativeMethod::DraftModel | SpeculativeMethod::Eagle3)
        );
        if let (Some(method), None) = (
            self.speculative_method.filter(|_| wants_draft),
            &self.draft_model,
        ) {
            return Err(ConfigError::Invalid {
                at: at("draft_model"),
                reason: format!(
                    "must name the draft model's (or EAGLE-3 head's) directory for \
                     speculative_method {}",
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
        let flag = Origin::Flags.name("dtype");
        Err(ConfigError::Invalid {
            at: match file {
                Some(path) => format!("{flag} (or {}: dtype)", path.display()),
                None => flag,
            },
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
        let flag = Origin::Flags.name("cudagraph_sizes");
        Err(ConfigError::Invalid {
            at: match file {
                Some(path) => format!("{flag} (or {}: cudagraph_sizes)", path.display()),
                None => flag,
            },
            reason: format!(
                "holds {size}, past max_num_seqs {}: a step never has that many sequences",
                self.max_num_seqs
            ),
        })
    }
}

/// Whether `level` reads as a tracing filter: a bare level, or directives with `=`.
fn is_log_filter(level: &str) -> bool {
    let bare = ["error", "warn", "info", "debug", "trace", "off"];
    bare.contains(&level.to_ascii_lowercase().as_str()) || level.contains('=')
}

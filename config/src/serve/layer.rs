//! One source of settings, every field optional: the TOML file's format, and what the flags
//! say once read. Layers stack (flags over the file) before defaults fill the gaps.

use super::{ConfigError, DeviceKind, DtypeChoice, SamplingDefaults, SpeculativeMethod};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The settings one source gives; keys are the flag names with underscores.
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct Layer {
    pub model: Option<PathBuf>,
    pub served_model_name: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub api_keys: Option<Vec<String>>,
    pub admin_token: Option<String>,
    pub device: Option<DeviceKind>,
    pub dtype: Option<DtypeChoice>,
    pub max_num_seqs: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    pub max_model_len: Option<usize>,
    pub block_size: Option<usize>,
    #[serde(default, deserialize_with = "crate::byte_size::deserialize_byte_size")]
    pub kv_cache_memory: Option<u64>,
    pub gpu_memory_utilization: Option<f32>,
    pub enable_prefix_caching: Option<bool>,
    pub deterministic: Option<bool>,
    pub enforce_eager: Option<bool>,
    pub async_scheduling: Option<bool>,
    pub cudagraph_sizes: Option<Vec<usize>>,
    pub max_waiting_requests: Option<usize>,
    pub shutdown_timeout: Option<u64>,
    pub log_level: Option<String>,
    pub cache_dir: Option<PathBuf>,
    pub default_sampling: Option<SamplingDefaults>,
    pub speculative_method: Option<SpeculativeMethod>,
    pub draft_model: Option<PathBuf>,
    pub num_speculative_tokens: Option<usize>,
    pub ngram_min: Option<usize>,
    pub ngram_max: Option<usize>,
}

impl Layer {
    /// Reads the TOML text of the file at `path` (named in errors).
    pub(super) fn parse(path: &Path, text: &str) -> Result<Layer, ConfigError> {
        let error = |e: toml::de::Error| ConfigError::Parse {
            path: path.to_path_buf(),
            // Syntax errors show the line; field errors end with "in `key`": keep both on
            // one line.
            message: e.to_string().trim_end().replace("\nin `", " in `"),
        };
        let table: toml::Table = text.parse().map_err(error)?;
        table.try_into().map_err(error)
    }

    /// This layer with the gaps filled from `below`.
    pub(super) fn over(self, below: Layer) -> Layer {
        let Layer {
            model,
            served_model_name,
            host,
            port,
            api_keys,
            admin_token,
            device,
            dtype,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            block_size,
            kv_cache_memory,
            gpu_memory_utilization,
            enable_prefix_caching,
            deterministic,
            enforce_eager,
            async_scheduling,
            cudagraph_sizes,
            max_waiting_requests,
            shutdown_timeout,
            log_level,
            cache_dir,
            default_sampling,
            speculative_method,
            draft_model,
            num_speculative_tokens,
            ngram_min,
            ngram_max,
        } = self;
        Layer {
            model: model.or(below.model),
            served_model_name: served_model_name.or(below.served_model_name),
            host: host.or(below.host),
            port: port.or(below.port),
            api_keys: api_keys.or(below.api_keys),
            admin_token: admin_token.or(below.admin_token),
            device: device.or(below.device),
            dtype: dtype.or(below.dtype),
            max_num_seqs: max_num_seqs.or(below.max_num_seqs),
            max_num_batched_tokens: max_num_batched_tokens.or(below.max_num_batched_tokens),
            max_model_len: max_model_len.or(below.max_model_len),
            block_size: block_size.or(below.block_size),
            kv_cache_memory: kv_cache_memory.or(below.kv_cache_memory),
            gpu_memory_utilization: gpu_memory_utilization.or(below.gpu_memory_utilization),
            enable_prefix_caching: enable_prefix_caching.or(below.enable_prefix_caching),
            deterministic: deterministic.or(below.deterministic),
            enforce_eager: enforce_eager.or(below.enforce_eager),
            async_scheduling: async_scheduling.or(below.async_scheduling),
            cudagraph_sizes: cudagraph_sizes.or(below.cudagraph_sizes),
            max_waiting_requests: max_waiting_requests.or(below.max_waiting_requests),
            shutdown_timeout: shutdown_timeout.or(below.shutdown_timeout),
            log_level: log_level.or(below.log_level),
            cache_dir: cache_dir.or(below.cache_dir),
            default_sampling: default_sampling.or(below.default_sampling),
            speculative_method: speculative_method.or(below.speculative_method),
            draft_model: draft_model.or(below.draft_model),
            num_speculative_tokens: num_speculative_tokens.or(below.num_speculative_tokens),
            ngram_min: ngram_min.or(below.ngram_min),
            ngram_max: ngram_max.or(below.ngram_max),
        }
    }
}

//! The resolved server configuration: the file, the flags over it, the defaults under both.

use super::{
    ConfigError, DeviceKind, DtypeChoice, Layer, Origin, SamplingDefaults, ServeArgs,
    SpeculativeMethod,
};
use crate::CacheConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The server's validated configuration; field names are the config file's keys.
#[derive(Clone, PartialEq)]
pub struct ServeConfig {
    /// The model directory or known name; `None` serves the default model.
    pub model: Option<PathBuf>,
    /// The model name clients send; `None` uses the model's own name.
    pub served_model_name: Option<String>,
    /// The address to listen on.
    pub host: String,
    /// The port to listen on; 0 picks a free one.
    pub port: u16,
    /// Bearer tokens clients may send; empty means no authentication.
    pub api_keys: Vec<String>,
    /// The token the admin endpoints require; `None` turns them off.
    pub admin_token: Option<String>,
    /// The device to run on.
    pub device: DeviceKind,
    /// The compute dtype.
    pub dtype: DtypeChoice,
    /// The most sequences in one step.
    pub max_num_seqs: usize,
    /// The most tokens in one step.
    pub max_num_batched_tokens: usize,
    /// The longest prompt plus output; `None` uses the model's context length.
    pub max_model_len: Option<usize>,
    /// Tokens per KV cache block.
    pub block_size: usize,
    /// Bytes the KV cache may take.
    pub kv_cache_memory: u64,
    /// The fraction of GPU memory the server may use.
    pub gpu_memory_utilization: f32,
    /// Whether full KV blocks are shared between requests with the same prefix.
    pub enable_prefix_caching: bool,
    /// Batch-invariant GPU kernels.
    pub deterministic: bool,
    /// Run every step eagerly, capturing no graphs.
    pub enforce_eager: bool,
    /// On a GPU, each greedy decode step queues the step after it before its tokens reach
    /// the host (vLLM's async scheduling); ignored with speculative decoding.
    pub async_scheduling: bool,
    /// The batch sizes graphs are captured for; `None`: 1, 2, 4, 8 and every multiple of 8
    /// up to `max_num_seqs` (captured again when a reload changes it). Each size is at most
    /// `max_num_seqs`: a configuration with a larger one is refused.
    pub cudagraph_sizes: Option<Vec<usize>>,
    /// Requests that may wait for a slot before new ones are refused with 429.
    pub max_waiting_requests: usize,
    /// How long in-flight requests get to finish at shutdown.
    pub shutdown_timeout: Duration,
    /// The tracing filter: a level or directives such as `info,peregrine=debug`.
    pub log_level: String,
    /// The model cache; `None` uses `$PEREGRINE_CACHE`, else `$XDG_CACHE_HOME/peregrine`.
    pub cache_dir: Option<PathBuf>,
    /// Sampling parameters for requests that leave them out.
    pub default_sampling: SamplingDefaults,
    /// How drafts are proposed; `None` turns speculative decoding off.
    pub speculative_method: Option<SpeculativeMethod>,
    /// The draft model's directory, for `draft_model`.
    pub draft_model: Option<PathBuf>,
    /// The most draft tokens verified per request and step.
    pub num_speculative_tokens: usize,
    /// The shortest suffix the n-gram method matches.
    pub ngram_min: usize,
    /// The longest suffix the n-gram method matches.
    pub ngram_max: usize,
}

impl Default for ServeConfig {
    /// The defaults: the one place they are written.
    fn default() -> Self {
        ServeConfig {
            model: None,
            served_model_name: None,
            host: "127.0.0.1".to_string(),
            port: 8000,
            api_keys: Vec::new(),
            admin_token: None,
            device: DeviceKind::Cpu,
            dtype: DtypeChoice::Auto,
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            max_model_len: None,
            block_size: 16,
            kv_cache_memory: 1 << 30,
            gpu_memory_utilization: 0.9,
            enable_prefix_caching: true,
            deterministic: false,
            enforce_eager: false,
            async_scheduling: true,
            cudagraph_sizes: None,
            max_waiting_requests: 1024,
            shutdown_timeout: Duration::from_secs(30),
            log_level: "info".to_string(),
            cache_dir: None,
            default_sampling: SamplingDefaults::default(),
            speculative_method: None,
            draft_model: None,
            num_speculative_tokens: 3,
            ngram_min: 2,
            ngram_max: 4,
        }
    }
}

impl ServeConfig {
    /// Reads the file `--config` names (if any), applies the flags over it, fills the
    /// defaults and validates. Call it again to reload: the flags still win.
    pub fn load(args: &ServeArgs) -> Result<ServeConfig, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Some((path.as_path(), text))
            }
            None => None,
        };
        Self::resolve(
            file.as_ref().map(|(path, text)| (*path, text.as_str())),
            args,
        )
    }

    /// `load` once the file's text is read: `file` is its path and text.
    pub(super) fn resolve(
        file: Option<(&Path, &str)>,
        args: &ServeArgs,
    ) -> Result<ServeConfig, ConfigError> {
        let below = match file {
            Some((path, text)) => {
                let layer = Layer::parse(path, text)?;
                layer.validate(&Origin::File(path.to_path_buf()))?;
                layer
            }
            None => Layer::default(),
        };
        let flags = args.layer();
        flags.validate(&Origin::Flags)?;
        let config = Self::fill(flags.over(below));
        config.validate_speculation(file.map(|(path, _)| path))?;
        config.validate_graph_sizes(file.map(|(path, _)| path))?;
        config.validate_dtype(file.map(|(path, _)| path))?;
        Ok(config)
    }

    /// The layer's values, and the defaults where it has none.
    fn fill(layer: Layer) -> ServeConfig {
        let d = ServeConfig::default();
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
        } = layer;
        ServeConfig {
            model: model.or(d.model),
            served_model_name: served_model_name.or(d.served_model_name),
            host: host.unwrap_or(d.host),
            port: port.unwrap_or(d.port),
            api_keys: api_keys.unwrap_or(d.api_keys),
            admin_token: admin_token.or(d.admin_token),
            device: device.unwrap_or(d.device),
            dtype: dtype.unwrap_or(d.dtype),
            max_num_seqs: max_num_seqs.unwrap_or(d.max_num_seqs),
            max_num_batched_tokens: max_num_batched_tokens.unwrap_or(d.max_num_batched_tokens),
            max_model_len: max_model_len.or(d.max_model_len),
            block_size: block_size.unwrap_or(d.block_size),
            kv_cache_memory: kv_cache_memory.unwrap_or(d.kv_cache_memory),
            gpu_memory_utilization: gpu_memory_utilization.unwrap_or(d.gpu_memory_utilization),
            enable_prefix_caching: enable_prefix_caching.unwrap_or(d.enable_prefix_caching),
            deterministic: deterministic.unwrap_or(d.deterministic),
            enforce_eager: enforce_eager.unwrap_or(d.enforce_eager),
            async_scheduling: async_scheduling.unwrap_or(d.async_scheduling),
            cudagraph_sizes: cudagraph_sizes.or(d.cudagraph_sizes),
            max_waiting_requests: max_waiting_requests.unwrap_or(d.max_waiting_requests),
            shutdown_timeout: shutdown_timeout.map_or(d.shutdown_timeout, Duration::from_secs),
            log_level: log_level.unwrap_or(d.log_level),
            cache_dir: cache_dir.or(d.cache_dir),
            default_sampling: default_sampling.unwrap_or(d.default_sampling),
            speculative_method: speculative_method.or(d.speculative_method),
            draft_model: draft_model.or(d.draft_model),
            num_speculative_tokens: num_speculative_tokens.unwrap_or(d.num_speculative_tokens),
            ngram_min: ngram_min.unwrap_or(d.ngram_min),
            ngram_max: ngram_max.unwrap_or(d.ngram_max),
        }
    }

    /// The KV cache's shape and budget, for the KV allocator.
    pub fn cache_config(&self) -> CacheConfig {
        CacheConfig {
            block_size: self.block_size,
            kv_cache_memory: Some(self.kv_cache_memory),
        }
    }
}

//! The `peregrine serve` flags. None has a clap default, so that a flag left out does not
//! override the file; the defaults live in `ServeConfig::default`.

use super::{DeviceKind, DtypeChoice, Layer, SpeculativeMethod};
use crate::parse_byte_size;
use std::path::PathBuf;

/// `peregrine serve` flags; each one given overrides the config file.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// A TOML file with the same settings (names with underscores); flags override it.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// A Hugging Face model directory or a known name [default: smollm2-135m, fetched on first use].
    #[arg(long, value_name = "DIR|NAME")]
    pub model: Option<PathBuf>,
    /// The model name clients send [default: the model's name].
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// The address to listen on [default: 127.0.0.1].
    #[arg(long)]
    pub host: Option<String>,
    /// The port to listen on; 0 picks a free one [default: 8000].
    #[arg(long)]
    pub port: Option<u16>,
    /// A key clients must send as `Authorization: Bearer KEY`; repeat for several.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_key: Vec<String>,
    /// The token `/admin/*` endpoints require [default: admin endpoints off].
    #[arg(long, value_name = "TOKEN")]
    pub admin_token: Option<String>,
    /// The device to run on [default: cpu].
    #[arg(long)]
    pub device: Option<DeviceKind>,
    /// The compute dtype: auto, or the device's own (float32 on the CPU, bfloat16 on the
    /// GPU) [default: auto].
    #[arg(long)]
    pub dtype: Option<DtypeChoice>,
    /// The most sequences in one step [default: 64].
    #[arg(long, value_name = "N")]
    pub max_num_seqs: Option<usize>,
    /// The most tokens in one step [default: 2048].
    #[arg(long, value_name = "N")]
    pub max_num_batched_tokens: Option<usize>,
    /// The longest prompt plus output [default: the model's context length].
    #[arg(long, value_name = "N")]
    pub max_model_len: Option<usize>,
    /// Tokens per KV cache block, a power of two up to 256 [default: 16].
    #[arg(long, value_name = "N")]
    pub block_size: Option<usize>,
    /// Memory for the KV cache: 1073741824, 512MiB, 2GiB, 1.5GB... [default: 1GiB].
    #[arg(long, value_name = "BYTES", value_parser = parse_byte_size)]
    pub kv_cache_memory: Option<u64>,
    /// The fraction of GPU memory Peregrine may use, in (0, 1] [default: 0.9].
    #[arg(long, value_name = "FRACTION")]
    pub gpu_memory_utilization: Option<f32>,
    /// Turn prefix caching off (it is on by default).
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Batch-invariant GPU kernels: a request's tokens do not depend on the rest of the
    /// batch (the CPU backend always is).
    #[arg(long)]
    pub deterministic: bool,
    /// Run every step eagerly: capture no graphs.
    #[arg(long)]
    pub enforce_eager: bool,
    /// Turn async scheduling off: on a GPU, a greedy decode step otherwise queues the step
    /// after it before its tokens reach the host (vLLM's async scheduling).
    #[arg(long)]
    pub no_async_scheduling: bool,
    /// Batch sizes to capture graphs for, each from 1 to max_num_seqs [default: 1,2,4,8
    /// and every multiple of 8 up to max_num_seqs].
    #[arg(long, value_name = "1,2,4,...", value_delimiter = ',')]
    pub cudagraph_sizes: Option<Vec<usize>>,
    /// Requests that may wait for a slot before new ones get 429 [default: 1024].
    #[arg(long, value_name = "N")]
    pub max_waiting_requests: Option<usize>,
    /// Seconds in-flight requests get to finish at shutdown [default: 30].
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_timeout: Option<u64>,
    /// error, warn, info, debug, trace, or a filter like "info,peregrine=debug" [default: info].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// The model cache [default: $PEREGRINE_CACHE, else $XDG_CACHE_HOME/peregrine].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Speculative decoding: how drafts are proposed [default: no speculation].
    #[arg(long, value_name = "METHOD")]
    pub speculative_method: Option<SpeculativeMethod>,
    /// The draft model directory, for --speculative-method draft_model; the EAGLE-3 head's, for eagle3.
    #[arg(long, value_name = "DIR")]
    pub draft_model: Option<PathBuf>,
    /// The most draft tokens verified per request and step, 1 to 16 [default: 3].
    #[arg(long, value_name = "K")]
    pub num_speculative_tokens: Option<usize>,
    /// The shortest suffix the n-gram method matches [default: 2].
    #[arg(long, value_name = "N")]
    pub ngram_min: Option<usize>,
    /// The longest suffix the n-gram method matches [default: 4].
    #[arg(long, value_name = "N")]
    pub ngram_max: Option<usize>,
}

impl ServeArgs {
    /// The settings these flags give.
    pub(super) fn layer(&self) -> Layer {
        let ServeArgs {
            config: _,
            model,
            served_model_name,
            host,
            port,
            api_key,
            admin_token,
            device,
            dtype,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            block_size,
            kv_cache_memory,
            gpu_memory_utilization,
            no_prefix_caching,
            deterministic,
            enforce_eager,
            no_async_scheduling,
            cudagraph_sizes,
            max_waiting_requests,
            shutdown_timeout,
            log_level,
            cache_dir,
            speculative_method,
            draft_model,
            num_speculative_tokens,
            ngram_min,
            ngram_max,
        } = self.clone();
        Layer {
            model,
            served_model_name,
            host,
            port,
            api_keys: (!api_key.is_empty()).then_some(api_key),
            admin_token,
            device,
            dtype,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            block_size,
            kv_cache_memory,
            gpu_memory_utilization,
            enable_prefix_caching: no_prefix_caching.then_some(false),
            deterministic: deterministic.then_some(true),
            enforce_eager: enforce_eager.then_some(true),
            async_scheduling: no_async_scheduling.then_some(false),
            cudagraph_sizes,
            max_waiting_requests,
            shutdown_timeout,
            log_level,
            cache_dir,
            default_sampling: None,
            speculative_method,
            draft_model,
            num_speculative_tokens,
            ngram_min,
            ngram_max,
        }
    }
}

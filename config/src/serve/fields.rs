//! The one table of the server's fields: each one's name, whether it can change while the
//! server runs, and whether it is a secret. Reload and the masked view both read it.

use super::json::ToJson;
use super::ServeConfig;
use serde_json::Value;

/// Whether a field can change without a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reload {
    /// Applied to the running server by message.
    Live,
    /// Fixed at start-up (the model, the memory layout, the listening socket).
    Restart,
}

/// One field of a configuration.
pub(super) struct Field {
    /// The config file's key.
    pub name: &'static str,
    /// Whether it reloads.
    pub reload: Reload,
    /// Whether the masked view hides it.
    pub secret: bool,
    /// Its value.
    pub value: Value,
}

impl ServeConfig {
    /// Every field, classified. The destructuring names every field, so a new one does not
    /// compile until it is classified here.
    pub(super) fn fields(&self) -> Vec<Field> {
        use Reload::{Live, Restart};
        let ServeConfig {
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
        vec![
            field("model", Restart, model),
            field("served_model_name", Restart, served_model_name),
            field("host", Restart, host),
            field("port", Restart, port),
            secret("api_keys", Live, api_keys),
            secret("admin_token", Live, admin_token),
            field("device", Restart, device),
            field("dtype", Restart, dtype),
            field("max_num_seqs", Live, max_num_seqs),
            field("max_num_batched_tokens", Live, max_num_batched_tokens),
            field("max_model_len", Restart, max_model_len),
            field("block_size", Restart, block_size),
            field("kv_cache_memory", Restart, kv_cache_memory),
            field("gpu_memory_utilization", Restart, gpu_memory_utilization),
            field("enable_prefix_caching", Restart, enable_prefix_caching),
            field("deterministic", Restart, deterministic),
            field("enforce_eager", Live, enforce_eager),
            field("async_scheduling", Restart, async_scheduling),
            field("cudagraph_sizes", Live, cudagraph_sizes),
            field("max_waiting_requests", Live, max_waiting_requests),
            field("shutdown_timeout", Live, shutdown_timeout),
            field("log_level", Live, log_level),
            field("cache_dir", Restart, cache_dir),
            field("default_sampling", Live, default_sampling),
            field("speculative_method", Restart, speculative_method),
            field("draft_model", Restart, draft_model),
            field("num_speculative_tokens", Live, num_speculative_tokens),
            field("ngram_min", Restart, ngram_min),
            field("ngram_max", Restart, ngram_max),
        ]
    }
}

/// A field shown as it is.
fn field(name: &'static str, reload: Reload, value: &impl ToJson) -> Field {
    Field {
        name,
        reload,
        secret: false,
        value: value.to_json(),
    }
}

/// A field the masked view hides.
fn secret(name: &'static str, reload: Reload, value: &impl ToJson) -> Field {
    Field {
        secret: true,
        ..field(name, reload, value)
    }
}

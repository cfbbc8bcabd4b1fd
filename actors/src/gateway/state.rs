//! What every handler shares: the engine client, the model's tokenizer and template, the
//! live (hot-reloadable) configuration, the admin hooks and the metrics renderer.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use peregrine_models::chat_template::ChatTemplate;
use peregrine_models::tokenizer::Tokenizer;
use peregrine_ops::sampling::SamplingParams;
use peregrine_structured::GrammarCompiler;

use super::fingerprint::system_fingerprint;
use super::tools::ToolSettings;

use super::biases::Vocabulary;
use super::blocking::BlockingPool;
use super::engine_client::EngineClient;
use super::errors::ApiError;
use super::prompt::Prompter;

/// The part of the gateway's configuration that a reload may change.
#[derive(Clone)]
pub struct GatewayConfig {
    /// The only model name requests may ask for.
    pub served_model_name: String,
    /// Accepted Bearer keys for `/v1/*`, `/tokenize` and `/detokenize`; empty: no auth.
    pub api_keys: Vec<String>,
    /// The Bearer token of `/admin/*`; `None` turns the admin endpoints off.
    pub admin_token: Option<String>,
    /// Sampling parameters for the fields a request leaves out.
    pub default_sampling: SamplingParams,
    /// `max_tokens` for requests that leave it out (capped at what the context leaves);
    /// `None`: whatever the context leaves.
    pub default_max_tokens: Option<usize>,
    /// The largest request body, in bytes (else 413).
    pub max_request_body: usize,
    /// How long a request's body may take to arrive (else 408).
    pub request_body_timeout: Duration,
    /// The longest prompt in characters, checked before tokenizing (else 413); `None`:
    /// [`PROMPT_CHARS_PER_TOKEN`] per token of the model's `max_model_len`.
    pub max_prompt_chars: Option<usize>,
}

/// Characters per token of context a prompt may have when `max_prompt_chars` is not set:
/// far more than any tokenizer's average, so that only prompts that could never fit the
/// context are refused before they are tokenized.
pub const PROMPT_CHARS_PER_TOKEN: usize = 32;

/// The live configuration, shared between the gateway and whoever reloads it.
#[derive(Clone)]
pub struct SharedConfig(Arc<RwLock<Arc<GatewayConfig>>>);

impl SharedConfig {
    /// Starts with `config`.
    pub fn new(config: GatewayConfig) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(config))))
    }

    /// The configuration now; a request keeps the one it started with.
    pub fn get(&self) -> Arc<GatewayConfig> {
        let guard = self
            .0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&guard)
    }

    /// Replaces the configuration for requests that start from now on.
    pub fn set(&self, config: GatewayConfig) {
        let mut guard = self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *guard = Arc::new(config);
    }
}

/// A boxed future, as the object-safe [`AdminHooks`] return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What the admin endpoints do; the server implements it.
pub trait AdminHooks: Send + Sync {
    /// Reloads the configuration: `Ok` with a message listing what changed, or `Err` with
    /// why the new configuration was refused (the running one stays).
    fn reload(&self) -> BoxFuture<Result<String, String>>;

    /// The live configuration with secrets already masked.
    fn live_config(&self) -> serde_json::Value;
}

/// Renders the Prometheus exposition text of `/metrics`.
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// The served model, as far as the gateway needs it.
#[derive(Clone)]
pub struct ModelInfo {
    /// Where it was loaded from: the `--model` path as given, or the default model's name.
    pub root: String,
    /// Its tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Its chat template; `None`: chat completions are refused.
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// The most tokens (prompt plus output) one request may hold.
    pub max_model_len: usize,
    /// The tokens the whole KV cache holds, which may be fewer than `max_model_len`.
    pub kv_cache_tokens: usize,
    /// Compiles requests' output constraints; `Err`: why this model's tokenizer cannot
    /// constrain output (requests asking for it are refused with that reason).
    pub grammars: Result<Arc<GrammarCompiler>, String>,
    /// How the model writes tool calls, and whether `tool_choice: "auto"` is served.
    pub tools: ToolSettings,
}

impl ModelInfo {
    /// The served vocabulary: its size and end-of-sequence ids.
    pub fn vocabulary(&self) -> Vocabulary {
        Vocabulary {
            size: self.tokenizer.vocab_size(),
            eos_token_ids: self.tokenizer.eos_token_ids().to_vec(),
        }
    }

    /// How long one request's prompt plus output may be.
    pub fn sequence_limits(&self) -> SequenceLimits {
        SequenceLimits {
            max_model_len: self.max_model_len,
            kv_cache_tokens: self.kv_cache_tokens,
        }
    }
}

/// What bounds one request's prompt plus output: the context and the whole KV cache.
#[derive(Clone, Copy, Debug)]
pub struct SequenceLimits {
    /// The model's context, as served.
    pub max_model_len: usize,
    /// The tokens the whole KV cache holds.
    pub kv_cache_tokens: usize,
}

/// The gateway's shared state; wrap it in `actix_web::web::Data` and add it as app data.
pub struct GatewayState {
    /// The scheduler's handle.
    pub engine: EngineClient,
    /// The served model.
    pub model: ModelInfo,
    /// The live configuration.
    pub config: SharedConfig,
    /// The admin endpoints' implementation.
    pub admin: Arc<dyn AdminHooks>,
    /// The `/metrics` renderer.
    pub metrics: MetricsRenderer,
    /// Unix time the gateway started (the model's `created`).
    pub created: u64,
    /// The `system_fingerprint` of completion and chat responses.
    pub system_fingerprint: String,
    /// Where prompts are rendered and tokenized, off the HTTP worker threads.
    pub blocking: BlockingPool,
    accepting: AtomicBool,
}

impl GatewayState {
    /// State that accepts requests.
    pub fn new(
        engine: EngineClient,
        model: ModelInfo,
        config: SharedConfig,
        admin: Arc<dyn AdminHooks>,
        metrics: MetricsRenderer,
    ) -> Self {
        Self {
            engine,
            system_fingerprint: system_fingerprint(&model.root, model.max_model_len),
            model,
            config,
            admin,
            metrics,
            created: unix_now(),
            blocking: BlockingPool::per_core(),
            accepting: AtomicBool::new(true),
        }
    }

    /// What turns prompts into ids under `config`: the model's tokenizer and template,
    /// and `max_prompt_chars` (or [`PROMPT_CHARS_PER_TOKEN`] per token of the context).
    pub fn prompter(&self, config: &GatewayConfig) -> Prompter {
        Prompter {
            tokenizer: Arc::clone(&self.model.tokenizer),
            template: self.model.chat_template.clone(),
            max_chars: config
                .max_prompt_chars
                .unwrap_or(PROMPT_CHARS_PER_TOKEN.saturating_mul(self.model.max_model_len)),
            tool_style: self.model.tools.style,
        }
    }

    /// Whether new generation requests are taken (false once shutdown began).
    pub fn is_accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    /// 503 once shutdown began.
    pub fn ensure_accepting(&self) -> Result<(), ApiError> {
        if self.is_accepting() {
            Ok(())
        } else {
            Err(ApiError::unavailable(
                "the server is shutting down and takes no new requests",
            ))
        }
    }

    /// Refuses new generation requests with 503 from now on; running ones go on.
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Release);
    }
}

/// Seconds since the Unix epoch (0 on a clock set before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

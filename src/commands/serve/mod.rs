//! `peregrine serve`: loads the model, starts the engine's actors and the HTTP gateway,
//! reloads the configuration on SIGHUP, on a change of its file and on
//! `POST /admin/reload`, and drains in-flight requests on SIGTERM / SIGINT.

pub(crate) mod memory;
pub(crate) mod reload;
mod signals;
pub(crate) mod speculation;

use crate::commands::engine::{load_backend, start};
use crate::commands::model_dir;
use actix_web::web;
use anyhow::Context;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use peregrine_actors::gateway::{
    self, EngineClient, GatewayState, HttpSettings, ModelInfo, SharedConfig, ToolSettings,
};
use peregrine_actors::metrics::vllm::{with_vllm_names, CacheConfigInfo};
use peregrine_actors::metrics::{
    ACCEPTED_LENGTH_BUCKETS, GRAMMAR_BUCKETS, GRAMMAR_COMPILE_SECONDS, GRAMMAR_MASK_SECONDS,
    HISTOGRAMS, LATENCY_BUCKETS, SPEC_ACCEPTED_LENGTH,
};
use peregrine_config::{DeviceKind, ServeArgs, ServeConfig};
use peregrine_models::chat_template::ChatTemplate;
use peregrine_models::tokenizer::Tokenizer;
use peregrine_structured::tools::ToolCallFormat;
use peregrine_structured::{GrammarCompiler, GrammarLimits};
use reload::{gateway_config, Reloader};
use std::io::IsTerminal;
use std::sync::Arc;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload as log_reload, EnvFilter};

/// Runs the server until it is shut down.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = ServeConfig::load(&args)?;
    let (filter, log_level) = log_reload::Layer::new(EnvFilter::try_new(&config.log_level)?);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .init();
    let (dir, default_name) = model_dir(&config)?;
    let served_model_name = config
        .served_model_name
        .clone()
        .unwrap_or_else(|| default_name.clone());
    let model_root = default_name;
    let tokenizer = Arc::new(Tokenizer::from_dir(&dir)?);
    let chat_template = ChatTemplate::from_dir(&dir)?.map(Arc::new);
    let backend = load_backend(&config, &dir)?;
    let grammars = grammar_compiler(&config, &tokenizer, backend.target.config().vocab_size);
    let tools = ToolSettings::for_model(
        chat_template.as_deref(),
        config
            .tool_call_parser
            .and_then(|p| ToolCallFormat::from_parser_name(p.as_str())),
        config.enable_auto_tool_choice,
    );
    let footprint = (config.device == DeviceKind::Cpu)
        .then(|| memory::footprint(&config, backend.target.config()));
    let mut prometheus = PrometheusBuilder::new();
    for name in HISTOGRAMS {
        prometheus =
            prometheus.set_buckets_for_metric(Matcher::Full(name.into()), &LATENCY_BUCKETS)?;
    }
    prometheus = prometheus.set_buckets_for_metric(
        Matcher::Full(SPEC_ACCEPTED_LENGTH.into()),
        &ACCEPTED_LENGTH_BUCKETS,
    )?;
    for name in [GRAMMAR_COMPILE_SECONDS, GRAMMAR_MASK_SECONDS] {
        prometheus =
            prometheus.set_buckets_for_metric(Matcher::Full(name.into()), &GRAMMAR_BUCKETS)?;
    }
    let prometheus = prometheus.install_recorder()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut engine = start(&config, &dir, backend).await?;
        let stopped = engine.take_stopped();
        let shared = SharedConfig::new(gateway_config(&config, &served_model_name));
        let reloader = Reloader::new(
            args,
            config.clone(),
            served_model_name.clone(),
            shared.clone(),
            &engine,
            log_level,
            footprint,
        );
        // The vLLM copies of the series carry the served name given at start (a reload may
        // change the name the API answers to; dashboards keep the series they had).
        let metrics_model = served_model_name.clone();
        let cache_info = CacheConfigInfo {
            block_size: config.block_size,
            num_blocks: u64::from(engine.num_blocks),
        };
        let state = web::Data::new(GatewayState::new(
            EngineClient::new(engine.scheduler.clone(), engine.health.clone()),
            ModelInfo {
                root: model_root,
                tokenizer,
                chat_template,
                max_model_len: engine.max_model_len,
                kv_cache_tokens: engine.num_blocks as usize * config.block_size,
                grammars,
                tools,
            },
            shared,
            Arc::new(reloader.clone()),
            Arc::new(move || with_vllm_names(&prometheus.render(), &metrics_model, cache_info)),
        ));
        let settings = HttpSettings {
            host: config.host.clone(),
            port: config.port,
            workers: 2,
            header_timeout: config.request_header_timeout,
            max_connections: config.max_connections,
            allowed_origins: config.allowed_origins.clone(),
            allowed_hosts: config.allowed_hosts.clone(),
        };
        let bound = gateway::bind(state.clone(), &settings)?;
        for addr in &bound.addrs {
            tracing::info!(
                model = %served_model_name,
                max_connections = bound.max_connections,
                "serving on http://{addr}"
            );
            // A line for scripts that start the server on port 0.
            println!("peregrine: listening on http://{addr}");
        }
        let server = bound.server;
        let config_file = reloader.config_file();
        tokio::spawn(signals::watch(
            reloader,
            state,
            engine.scheduler,
            server.handle(),
            config_file,
        ));
        let served = server.await.context("HTTP server");
        // The runner's thread frees the model's device memory before the process exits
        // (within a bound, should a sender to the scheduler outlive the server).
        drop(engine.graphs);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), stopped.wait()).await;
        served
    })
}

/// The compiler of requests' output constraints over `tokenizer`, for logit rows of
/// `vocab` tokens, with the configured bounds; `Err` (logged, and given to requests that
/// ask for constrained output) where the tokenizer cannot be read by llguidance.
fn grammar_compiler(
    config: &ServeConfig,
    tokenizer: &Tokenizer,
    vocab: usize,
) -> Result<Arc<GrammarCompiler>, String> {
    let limits = GrammarLimits {
        max_bytes: usize::try_from(config.max_grammar_bytes).unwrap_or(usize::MAX),
        compile_timeout: config.grammar_compile_timeout,
        cache_entries: config.grammar_cache_entries,
    };
    GrammarCompiler::new(tokenizer, vocab, limits)
        .map(Arc::new)
        .map_err(|err| {
            tracing::warn!("structured output is off: {err:#}");
            format!("{err:#}")
        })
}

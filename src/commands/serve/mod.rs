//! `peregrine serve`: loads the model, starts the engine's actors and the HTTP gateway,
//! reloads the configuration on SIGHUP, on a change of its file and on
//! `POST /admin/reload`, and drains in-flight requests on SIGTERM / SIGINT.

mod reload;
mod signals;
pub(crate) mod speculation;

use crate::commands::DEFAULT_MODEL;
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use peregrine_actors::backend::{cpu_backend, ModelBackend};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::gateway::{
    self, routes, EngineClient, GatewayState, ModelInfo, SharedConfig,
};
use peregrine_actors::metrics::{
    ACCEPTED_LENGTH_BUCKETS, HISTOGRAMS, LATENCY_BUCKETS, SPEC_ACCEPTED_LENGTH,
};
use peregrine_config::{DeviceKind, ServeArgs, ServeConfig};
use peregrine_models::chat_template::ChatTemplate;
use peregrine_models::fetch::{default_cache_dir, fetch_model};
use peregrine_models::tokenizer::Tokenizer;
use peregrine_models::LlamaModel;
use reload::{gateway_config, graph_sizes, limits, Reloader};
use speculation::load_drafter;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload as log_reload, EnvFilter};

/// The model of `dir` with its KV pool on the configured device.
fn load_backend(config: &ServeConfig, dir: &Path) -> anyhow::Result<Box<dyn ModelBackend>> {
    match config.device {
        DeviceKind::Cpu => {
            let model =
                LlamaModel::load(dir).with_context(|| format!("loading {}", dir.display()))?;
            cpu_backend(model, config.kv_cache_memory, config.block_size)
        }
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => {
            let cache = default_cache_dir(config.cache_dir.as_deref())?;
            let settings = peregrine_actors::backend::GpuSettings {
                gpu_memory_utilization: config.gpu_memory_utilization,
                block_size: config.block_size,
                max_num_batched_tokens: config.max_num_batched_tokens,
                max_num_seqs: config.max_num_seqs,
                num_speculative_tokens: if config.speculative_method.is_some() {
                    config.num_speculative_tokens
                } else {
                    0
                },
                deterministic: config.deterministic,
                max_seq_len_to_capture: peregrine_actors::backend::MAX_SEQ_LEN_TO_CAPTURE,
                kernel_cache: cache.join("kernels"),
                // A draft model or EAGLE-3 head runs on the GPU beside the target.
                draft: speculation::gpu_draft(
                    config.speculative_method,
                    config.draft_model.as_deref(),
                ),
            };
            peregrine_actors::backend::cuda_backend(dir, &settings)
        }
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => anyhow::bail!(
            "device cuda is not built into this binary (build with --features cuda); use --device cpu"
        ),
    }
}

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
    let (dir, default_name) = match &config.model {
        Some(dir) => (dir.clone(), dir.display().to_string()),
        None => {
            let cache = default_cache_dir(config.cache_dir.as_deref())?;
            (
                fetch_model(DEFAULT_MODEL, &cache)?,
                DEFAULT_MODEL.to_string(),
            )
        }
    };
    let served_model_name = config.served_model_name.clone().unwrap_or(default_name);
    let tokenizer = Arc::new(Tokenizer::from_dir(&dir)?);
    let chat_template = ChatTemplate::from_dir(&dir)?.map(Arc::new);
    let mut backend = load_backend(&config, &dir)?;
    let mut prometheus = PrometheusBuilder::new();
    for name in HISTOGRAMS {
        prometheus =
            prometheus.set_buckets_for_metric(Matcher::Full(name.into()), &LATENCY_BUCKETS)?;
    }
    prometheus = prometheus.set_buckets_for_metric(
        Matcher::Full(SPEC_ACCEPTED_LENGTH.into()),
        &ACCEPTED_LENGTH_BUCKETS,
    )?;
    let prometheus = prometheus.install_recorder()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let settings = EngineSettings {
            block_size: config.block_size,
            prefix_caching: config.enable_prefix_caching,
            limits: limits(&config),
            max_model_len: config.max_model_len,
            async_scheduling: config.async_scheduling && backend.host_waits_on_device(),
        };
        let drafter = load_drafter(&config, backend.as_mut())?;
        let mut engine = start_engine(backend, &settings, drafter)?;
        let stopped = engine.take_stopped();
        engine
            .graphs
            .capture(graph_sizes(&config)?)
            .await
            .context("capturing graphs")?;
        let shared = SharedConfig::new(gateway_config(&config, &served_model_name));
        let reloader = Reloader::new(
            args,
            config.clone(),
            served_model_name.clone(),
            shared.clone(),
            &engine,
            log_level,
        );
        let state = web::Data::new(GatewayState::new(
            EngineClient::new(engine.scheduler.clone(), engine.health.clone()),
            ModelInfo {
                tokenizer,
                chat_template,
                max_model_len: engine.max_model_len,
                kv_cache_tokens: engine.num_blocks as usize * config.block_size,
            },
            shared,
            Arc::new(reloader.clone()),
            Arc::new(move || prometheus.render()),
        ));
        let app_state = state.clone();
        let server =
            HttpServer::new(move || App::new().app_data(app_state.clone()).configure(routes))
                .on_connect(gateway::on_connect)
                .workers(2)
                .disable_signals()
                .bind((config.host.as_str(), config.port))
                .with_context(|| format!("binding {}:{}", config.host, config.port))?;
        for addr in server.addrs() {
            tracing::info!(model = %served_model_name, "serving on http://{addr}");
            // A line for scripts that start the server on port 0.
            println!("peregrine: listening on http://{addr}");
        }
        let server = server.run();
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

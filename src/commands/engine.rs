//! The engine `serve` and `generate` both run, built from one configuration: the model
//! loaded on the configured device with its KV pool, the drafter, the actors, and the
//! graphs captured.

use crate::commands::kv_dtype::cpu_kv_dtype;
use crate::commands::serve::memory;
use crate::commands::serve::memory::graph_sizes;
use crate::commands::serve::reload::limits;
use crate::commands::serve::speculation::draft_spec;
use crate::commands::tensor_parallel;
use anyhow::Context;
use peregrine_actors::backend::{cpu_backend_with, Loaded};
use peregrine_actors::draft::cpu_drafter;
use peregrine_actors::engine::{start_engine, Engine, EngineSettings};
use peregrine_actors::kv_disk::model_fingerprint;
use peregrine_actors::kv_events::{start_publisher, KvEventSink, WireFormat};
use peregrine_config::{DeviceKind, ServeConfig};
use peregrine_models::LlamaModel;
use std::path::Path;

/// The model of `dir` with its KV pool on the configured device, and the configured
/// drafter built over it there.
pub fn load_backend(config: &ServeConfig, dir: &Path) -> anyhow::Result<Loaded> {
    tensor_parallel::check_start_up(config, dir)?;
    let spec = draft_spec(config)?;
    if let Some(spec) = &spec {
        tracing::info!(
            drafter = ?spec,
            num_speculative_tokens = config.num_speculative_tokens,
            "speculative decoding on"
        );
    }
    match config.device {
        DeviceKind::Cpu => {
            let model =
                LlamaModel::load(dir).with_context(|| format!("loading {}", dir.display()))?;
            let kv_dtype = cpu_kv_dtype(Some(config.kv_cache_dtype), model.kv_rows())?;
            let footprint = memory::footprint(config, model.config());
            let kv_cache_memory = memory::kv_cache_memory(config, &footprint);
            memory::check_start_up(config, &footprint, kv_cache_memory)?;
            let mut target = cpu_backend_with(model, kv_cache_memory, config.block_size, kv_dtype)?;
            let drafter = spec.map(|s| cpu_drafter(&s, target.as_mut())).transpose()?;
            Ok(Loaded { target, drafter })
        }
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => {
            crate::commands::kv_dtype::check_gpu_kv_dtype(Some(config.kv_cache_dtype))?;
            memory::check_gpu_start_up(config)?;
            let cache = peregrine_models::fetch::default_cache_dir(config.cache_dir.as_deref())?;
            let settings = peregrine_actors::backend::GpuSettings {
                gpu_memory_utilization: config.gpu_memory_utilization,
                kv_cache_memory: config.kv_cache_memory,
                block_size: config.block_size,
                max_num_batched_tokens: config.max_num_batched_tokens,
                max_num_seqs: config.max_num_seqs,
                num_speculative_tokens: config.drafts_per_step(),
                deterministic: config.deterministic,
                max_seq_len_to_capture: peregrine_actors::backend::MAX_SEQ_LEN_TO_CAPTURE,
                kernel_cache: cache.join("kernels"),
                // A draft model or head runs on the GPU beside the target.
                draft: spec,
            };
            peregrine_actors::backend::cuda_backend(dir, &settings)
        }
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => anyhow::bail!(
            "device cuda is not built into this binary (build with --features cuda); use --device cpu"
        ),
    }
}

/// The disk `kv_cache_dir`'s tier may take when `kv_disk_space` is not given.
const DEFAULT_KV_DISK_SPACE: u64 = 10 << 30;

/// Starts the engine's actors over the `loaded` target (the model of `model_dir`) with the
/// configured drafter (the proposer owns it) and tiers below its KV pool, and captures the
/// configured graphs. Call from inside a tokio runtime.
pub async fn start(
    config: &ServeConfig,
    model_dir: &Path,
    loaded: Loaded,
) -> anyhow::Result<Engine> {
    let Loaded {
        target: mut backend,
        drafter,
    } = loaded;
    let settings = EngineSettings {
        block_size: config.block_size,
        prefix_caching: config.enable_prefix_caching,
        limits: limits(config),
        max_model_len: config.max_model_len,
        async_scheduling: config.async_scheduling && backend.host_waits_on_device(),
        async_scheduling_constrained: config.async_scheduling_constrained,
        kv_events: kv_events(config).await?,
    };
    if let Some(bytes) = config.kv_host_memory {
        backend.keep_host_tier(bytes)?;
    }
    match (&config.kv_cache_dir, config.kv_disk_space) {
        (Some(dir), space) => {
            let model = model_fingerprint(model_dir)
                .with_context(|| format!("fingerprinting the model in {}", model_dir.display()))?;
            backend.keep_disk_tier(dir, space.unwrap_or(DEFAULT_KV_DISK_SPACE), &model)?;
        }
        (None, Some(_)) => anyhow::bail!(
            "kv_disk_space sizes the disk tier under kv_cache_dir: give kv_cache_dir too"
        ),
        (None, None) => {}
    }
    let engine = start_engine(backend, &settings, drafter)?;
    engine
        .graphs
        .capture(graph_sizes(config)?)
        .await
        .context("capturing graphs")?;
    Ok(engine)
}

/// Starts the KV-cache event publisher `--kv-events-config` asks for, if any.
async fn kv_events(config: &ServeConfig) -> anyhow::Result<Option<KvEventSink>> {
    let Some(events) = config.kv_events_config.as_ref().filter(|e| e.publishes()) else {
        return Ok(None);
    };
    if !config.enable_prefix_caching {
        anyhow::bail!(
            "--kv-events-config publishes the prefix cache's blocks, and --no-prefix-caching \
             turns the prefix cache off: drop one of them"
        );
    }
    let format = WireFormat::new(events.encoding, config.block_size);
    let sink = start_publisher(events, format).await?;
    tracing::info!(
        endpoint = %events.endpoint,
        replay_endpoint = events.replay_endpoint.as_deref().unwrap_or("none"),
        topic = %events.topic,
        "publishing KV-cache events"
    );
    Ok(Some(sink))
}

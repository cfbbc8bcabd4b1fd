//! The engine `serve` and `generate` both run, built from one configuration: the model
//! loaded on the configured device with its KV pool, the drafter, the actors, and the
//! graphs captured.

use crate::commands::serve::memory;
use crate::commands::serve::memory::graph_sizes;
use crate::commands::serve::reload::limits;
use crate::commands::serve::speculation::load_drafter;
use crate::commands::DEFAULT_MODEL;
use anyhow::Context;
use peregrine_actors::backend::{cpu_backend_with, Loaded};
use peregrine_actors::engine::{start_engine, Engine, EngineSettings};
use peregrine_actors::kv_disk::model_fingerprint;
use peregrine_actors::kv_events::{start_publisher, KvEventSink, WireFormat};
use peregrine_config::{DeviceKind, DtypeChoice, ServeConfig};
use peregrine_models::fetch::{default_cache_dir, fetch_model, model_folder};
use peregrine_models::LlamaModel;
use peregrine_ops::{KvDtype, KvRows};
use std::path::{Path, PathBuf};

/// The model directory `config` names (for a `.gguf` file, its folder in the cache), or
/// the default model (fetched on first use), with the name it is served under unless
/// `served_model_name` says otherwise.
pub fn model_dir(config: &ServeConfig) -> anyhow::Result<(PathBuf, String)> {
    let cache = default_cache_dir(config.cache_dir.as_deref())?;
    Ok(match &config.model {
        Some(path) => (model_folder(path, &cache)?, path.display().to_string()),
        None => (
            fetch_model(DEFAULT_MODEL, &cache)?,
            DEFAULT_MODEL.to_string(),
        ),
    })
}

/// The model of `dir` with its KV pool on the configured device, and the drafter loaded
/// beside it there.
pub fn load_backend(config: &ServeConfig, dir: &Path) -> anyhow::Result<Loaded> {
    match config.device {
        DeviceKind::Cpu => {
            let model =
                LlamaModel::load(dir).with_context(|| format!("loading {}", dir.display()))?;
            let kv_dtype = cpu_kv_dtype(Some(config.kv_cache_dtype), model.kv_rows())?;
            let footprint = memory::footprint(config, model.config());
            let kv_cache_memory = memory::kv_cache_memory(config, &footprint);
            memory::check_start_up(config, &footprint, kv_cache_memory)?;
            Ok(Loaded {
                target: cpu_backend_with(model, kv_cache_memory, config.block_size, kv_dtype)?,
                beside: None,
            })
        }
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => {
            check_gpu_kv_dtype(Some(config.kv_cache_dtype))?;
            memory::check_gpu_start_up(config)?;
            let cache = default_cache_dir(config.cache_dir.as_deref())?;
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
                // A draft model or EAGLE-3 head runs on the GPU beside the target.
                draft: crate::commands::serve::speculation::gpu_draft(
                    config.speculative_method,
                    crate::commands::heads::draft_dir(config)?.as_deref(),
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
        beside,
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
    let drafter = load_drafter(config, backend.as_mut(), beside)?;
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

/// The CPU KV cache's element for `--kv-cache-dtype` and a model whose tokens leave `rows`
/// (`None` or `auto`: bfloat16 for key and value caches, half float32's memory, with decode
/// steps 1.14-1.20x faster and prefill within 6%, docs/performance.md; float32 for a
/// latent-attention cache, which the MLA kernel reads in float32 only).
pub fn cpu_kv_dtype(choice: Option<DtypeChoice>, rows: KvRows) -> anyhow::Result<KvDtype> {
    match choice.unwrap_or(DtypeChoice::Auto) {
        DtypeChoice::Float32 => Ok(KvDtype::Float32),
        DtypeChoice::Auto if rows == KvRows::Latent => Ok(KvDtype::Float32),
        DtypeChoice::Auto | DtypeChoice::Bfloat16 => Ok(KvDtype::Bfloat16),
        DtypeChoice::Float16 => {
            anyhow::bail!("--kv-cache-dtype float16: the CPU's KV cache is float32 or bfloat16")
        }
    }
}

/// Refuses a `--kv-cache-dtype` other than `auto` or `bfloat16` on the GPU, whose KV cache
/// is bfloat16.
#[cfg(any(feature = "cuda", test))]
pub fn check_gpu_kv_dtype(choice: Option<DtypeChoice>) -> anyhow::Result<()> {
    match choice.unwrap_or(DtypeChoice::Auto) {
        DtypeChoice::Auto | DtypeChoice::Bfloat16 => Ok(()),
        other => anyhow::bail!(
            "--kv-cache-dtype {}: the GPU's KV cache is bfloat16 (auto)",
            other.as_str()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_gpu_kv_dtype, cpu_kv_dtype};
    use peregrine_config::DtypeChoice;
    use peregrine_ops::{KvDtype, KvRows};

    #[test]
    fn the_cpu_cache_is_bfloat16_unless_float32_is_asked_or_latent_and_float16_is_refused() {
        let kv = KvRows::KeysAndValues;
        assert_eq!(cpu_kv_dtype(None, kv).unwrap(), KvDtype::Bfloat16);
        let dtype = |choice| cpu_kv_dtype(Some(choice), kv).unwrap();
        assert_eq!(dtype(DtypeChoice::Auto), KvDtype::Bfloat16);
        assert_eq!(dtype(DtypeChoice::Float32), KvDtype::Float32);
        assert_eq!(dtype(DtypeChoice::Bfloat16), KvDtype::Bfloat16);
        let latent = cpu_kv_dtype(Some(DtypeChoice::Auto), KvRows::Latent).unwrap();
        assert_eq!(latent, KvDtype::Float32);
        let err = cpu_kv_dtype(Some(DtypeChoice::Float16), kv).unwrap_err();
        assert!(err.to_string().contains("float32 or bfloat16"), "{err}");
    }

    #[test]
    fn the_gpu_cache_takes_auto_or_bfloat16_only() {
        for ok in [None, Some(DtypeChoice::Auto), Some(DtypeChoice::Bfloat16)] {
            check_gpu_kv_dtype(ok).unwrap();
        }
        for refused in [DtypeChoice::Float32, DtypeChoice::Float16] {
            let err = check_gpu_kv_dtype(Some(refused)).unwrap_err().to_string();
            assert!(
                err.contains(refused.as_str()) && err.contains("bfloat16 (auto)"),
                "{err}"
            );
        }
    }
}

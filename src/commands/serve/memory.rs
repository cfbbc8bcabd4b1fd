//! The host memory a CPU configuration plans, checked before it is allocated: at start-up
//! the KV cache, the largest step's buffers and the decode graphs together; on a reload
//! what the new limits add. Too large is a refused configuration that names the setting,
//! the amount it asks for and the amount available.

use peregrine_actors::backend::{CpuFootprint, StepBounds};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_config::{ServeConfig, SpeculativeMethod};
use peregrine_models::ModelConfig;
use peregrine_ops::KvDtype;
use peregrine_runtime::host_memory::{available_bytes, check_host, MemoryNeed};

/// Layers whose inputs an EAGLE-3 head reads (a low, a middle and a high one).
const EAGLE3_AUX_LAYERS: usize = 3;

/// The CPU footprint of `model` served under `config`.
pub fn footprint(config: &ServeConfig, model: &ModelConfig) -> CpuFootprint {
    let max_model_len = config
        .max_model_len
        .unwrap_or(model.max_model_len)
        .min(model.max_model_len);
    let aux = match config.speculative_method {
        Some(SpeculativeMethod::Eagle3) => EAGLE3_AUX_LAYERS,
        _ => 0,
    };
    let kv_dtype =
        crate::commands::kv_dtype::cpu_kv_dtype(Some(config.kv_cache_dtype), model.kv_rows())
            .unwrap_or(KvDtype::Float32);
    CpuFootprint::new(model, kv_dtype, config.block_size, max_model_len, aux)
}

/// The bytes of the CPU's KV cache: `kv_cache_memory` where it is set, else the model's
/// default for `config`'s limits and the memory available now.
pub fn kv_cache_memory(config: &ServeConfig, footprint: &CpuFootprint) -> u64 {
    config
        .kv_cache_memory
        .unwrap_or_else(|| footprint.default_kv_cache_memory(bounds(config), available_bytes()))
}

/// Refuses a start-up whose KV cache (of `kv_cache_memory` bytes), largest step and graphs
/// do not fit in the host's memory together.
pub fn check_start_up(
    config: &ServeConfig,
    footprint: &CpuFootprint,
    kv_cache_memory: u64,
) -> anyhow::Result<()> {
    let mut needs = vec![
        footprint.kv_cache(kv_cache_memory)?,
        footprint.eager_step(bounds(config)),
    ];
    needs.extend(graphs(config, footprint)?);
    needs.extend(host_tier(config));
    check_host(&needs).map_err(|short| anyhow::anyhow!("{short}: lower it"))
}

/// Refuses a GPU start-up whose host tier (page-locked host memory) does not fit in the
/// host's memory.
#[cfg(feature = "cuda")]
pub fn check_gpu_start_up(config: &ServeConfig) -> anyhow::Result<()> {
    let needs: Vec<MemoryNeed> = host_tier(config).into_iter().collect();
    check_host(&needs).map_err(|short| anyhow::anyhow!("{short}: lower it"))
}

/// The host tier's memory, if one is kept: it takes its memory as it fills, counted whole
/// since it may fill.
fn host_tier(config: &ServeConfig) -> Option<MemoryNeed> {
    config.kv_host_memory.map(|bytes| MemoryNeed {
        what: format!("kv_host_memory {bytes} bytes"),
        bytes,
    })
}

/// Refuses a reload whose larger step buffers or new graphs (captured while the old ones
/// still run) do not fit in the host's memory now.
pub fn check_reload(
    old: &ServeConfig,
    new: &ServeConfig,
    footprint: &CpuFootprint,
) -> Result<(), String> {
    let mut needs = Vec::new();
    let step = footprint.eager_step(bounds(new));
    if step.bytes > footprint.eager_step(bounds(old)).bytes {
        needs.push(step);
    }
    let sizes = |c: &ServeConfig| graph_sizes(c).ok().flatten();
    if sizes(new) != sizes(old) {
        needs.extend(graphs(new, footprint).map_err(|e| e.to_string())?);
    }
    check_host(&needs).map_err(|short| format!("{short}; the running configuration stays"))
}

/// The step limits of `config`.
fn bounds(config: &ServeConfig) -> StepBounds {
    StepBounds {
        max_num_batched_tokens: config.max_num_batched_tokens,
        max_num_seqs: config.max_num_seqs,
        drafts: config.drafts_per_step(),
    }
}

/// The graphs `config` captures, named by the setting that chose their sizes.
fn graphs(config: &ServeConfig, footprint: &CpuFootprint) -> anyhow::Result<Option<MemoryNeed>> {
    let field = match config.cudagraph_sizes {
        Some(_) => "cudagraph_sizes",
        None => "max_num_seqs",
    };
    Ok(graph_sizes(config)?.map(|sizes| footprint.graphs(&sizes, field)))
}

/// The batch sizes a configuration captures graphs for: none with `enforce_eager`, else
/// `cudagraph_sizes`, else the default set for `max_num_seqs` (so a reload that changes
/// `max_num_seqs` captures again unless the sizes are listed).
pub fn graph_sizes(config: &ServeConfig) -> anyhow::Result<Option<CaptureSizes>> {
    CaptureSizes::configured(
        config.enforce_eager,
        config.cudagraph_sizes.as_deref(),
        config.max_num_seqs,
    )
    .map_err(anyhow::Error::msg)
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::check_gpu_start_up;
    use peregrine_config::ServeConfig;

    #[test]
    fn a_gpu_host_tier_past_the_host_is_refused_and_one_that_fits_passes() {
        let config = |bytes| ServeConfig {
            kv_host_memory: bytes,
            ..ServeConfig::default()
        };
        let err = check_gpu_start_up(&config(Some(u64::MAX / 2))).unwrap_err();
        assert!(err.to_string().contains("kv_host_memory"), "{err}");
        check_gpu_start_up(&config(Some(1 << 20))).unwrap();
        check_gpu_start_up(&config(None)).unwrap();
    }
}

//! Assembles the engine's actors for serving: the TargetRunner on its thread, the
//! KvAllocator and the Scheduler as tokio tasks.

use crate::kv_allocator::KvAllocator;
use crate::messages::{SchedulerLimits, SchedulerMsg};
use crate::scheduler::{Scheduler, SchedulerSetup};
use crate::target_runner::TargetRunner;
use anyhow::bail;
use peregrine_models::LlamaModel;
use tokio::sync::mpsc;
use tracing::info;

/// How the engine is cut.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    pub block_size: usize,
    /// Bytes the KV cache may take across all layers.
    pub kv_cache_memory: u64,
    pub prefix_caching: bool,
    pub limits: SchedulerLimits,
    /// Cap below the model's own maximum length.
    pub max_model_len: Option<usize>,
}

/// A running engine.
pub struct Engine {
    /// Where the gateway sends requests.
    pub scheduler: mpsc::Sender<SchedulerMsg>,
    pub num_blocks: u32,
    pub max_model_len: usize,
}

/// Sizes the pool, prints it, and starts the actors. Call from inside a tokio runtime.
pub fn start_engine(model: LlamaModel, settings: &EngineSettings) -> anyhow::Result<Engine> {
    let config = model.config();
    let max_model_len = match settings.max_model_len {
        Some(len) if len > config.max_model_len => bail!(
            "max_model_len {len} exceeds the model's maximum of {}",
            config.max_model_len
        ),
        Some(len) => len,
        None => config.max_model_len,
    };
    let bytes_per_token = model.kv_bytes_per_token();
    let block_bytes = bytes_per_token * settings.block_size as u64;
    let num_blocks = settings.kv_cache_memory / block_bytes;
    if num_blocks == 0 {
        bail!(
            "kv_cache_memory of {} bytes holds no block: one block of {} tokens takes {block_bytes} bytes",
            settings.kv_cache_memory,
            settings.block_size
        );
    }
    let num_blocks = u32::try_from(num_blocks).map_err(|_| {
        anyhow::anyhow!("kv_cache_memory makes {num_blocks} blocks, more than u32 block ids name")
    })?;
    let layout = model.kv_layout(num_blocks as u64, settings.block_size as u64);
    let audit = layout
        .audit(4)
        .map_err(|e| anyhow::anyhow!("address audit: {e}"))?;
    info!(
        kernels = "write_kv, paged_attention",
        largest_byte_offset = audit.largest_byte_offset,
        computed_in = "u64",
        limit = audit.limit,
        "address audit passed"
    );
    info!(
        blocks = num_blocks,
        block_size = settings.block_size,
        bytes_per_layer = 2 * layout.layer_elems() * 4,
        largest_block_id = num_blocks - 1,
        tokens = num_blocks as u64 * settings.block_size as u64,
        "KV pool"
    );
    let setup = SchedulerSetup {
        limits: settings.limits,
        max_model_len,
        block_size: settings.block_size,
        num_blocks: num_blocks as usize,
        eos_token_ids: config.eos_token_ids.clone(),
    };
    let kv = KvAllocator::spawn(num_blocks, settings.block_size, settings.prefix_caching);
    let runner = TargetRunner::spawn(model, num_blocks, settings.block_size);
    Ok(Engine {
        scheduler: Scheduler::spawn(setup, kv, runner),
        num_blocks,
        max_model_len,
    })
}

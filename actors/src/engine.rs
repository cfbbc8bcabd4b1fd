//! Assembles the engine's actors for serving: the TargetRunner and the DraftProposer (when
//! speculating) on their threads, the KvAllocator and the Scheduler as tokio tasks.

use crate::actor_thread::{Spin, Stopped};
use crate::backend::{ModelBackend, StepCapacity};
use crate::draft::{spawn_proposer, DraftMethod};
use crate::graphs::GraphCapture;
use crate::health::EngineHealth;
use crate::kv_allocator::{BlockManager, KvAllocator};
use crate::kv_events::KvEventSink;
use crate::messages::{SchedulerLimits, SchedulerMsg};
use crate::scheduler::{Scheduler, SchedulerSetup};
use crate::target_runner::{DecodeAhead, TargetRunner};
use anyhow::bail;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// How the engine is cut.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    pub block_size: usize,
    pub prefix_caching: bool,
    pub limits: SchedulerLimits,
    /// Cap below the model's own maximum length.
    pub max_model_len: Option<usize>,
    /// Each greedy decode step queues the step after it before its tokens reach the host
    /// (async scheduling, see `target_runner::decode_ahead`), also beside a drafter, whose
    /// steps that carry drafts drop it. It pays where the host waits on a device: on the
    /// CPU the queued step runs at once.
    pub async_scheduling: bool,
    /// With `async_scheduling`, a greedy batch holding constrained requests also queues
    /// its next step, their rows' argmax masked on the device (off by default: it measured
    /// slower than running such batches a step at a time, `docs/structured-output.md`).
    pub async_scheduling_constrained: bool,
    /// Where the prefix cache's changes are published for routers (`None`: nowhere).
    pub kv_events: Option<KvEventSink>,
}

/// A running engine.
pub struct Engine {
    /// Where the gateway sends requests.
    pub scheduler: mpsc::Sender<SchedulerMsg>,
    pub num_blocks: u32,
    pub max_model_len: usize,
    /// The largest step the backend can run, if it is bounded; a reload must stay within.
    pub capacity: Option<StepCapacity>,
    /// Captures the target's and the draft's graphs, at start-up and on reload.
    pub graphs: GraphCapture,
    /// The engine's liveness (its steps' outcomes, its threads), for `/health`.
    pub health: EngineHealth,
    /// Fires when the runner's and the proposer's threads have stopped.
    stopped: EngineStopped,
}

/// Fires when the engine's threads have stopped and dropped the models they drove: once
/// every sender to the scheduler is dropped, the scheduler stops, and with it the handles
/// it holds.
pub struct EngineStopped(Vec<Stopped>);

impl EngineStopped {
    /// Waits for every thread.
    pub async fn wait(self) {
        for stopped in self.0 {
            stopped.wait().await;
        }
    }
}

impl Engine {
    /// Drops the engine's handles and waits until its threads have stopped and dropped
    /// the models they drove (and their device memory): before a process exits, or before
    /// another engine is sized from the memory left. Any other sender to the scheduler
    /// must be dropped first.
    pub async fn shutdown(self) {
        let Engine {
            scheduler,
            graphs,
            stopped,
            ..
        } = self;
        drop((scheduler, graphs));
        stopped.wait().await;
    }

    /// Takes the signal of the threads' stop, for a caller that hands the engine's parts
    /// out and waits on it itself (a later [`Engine::shutdown`] then waits for nothing).
    pub fn take_stopped(&mut self) -> EngineStopped {
        std::mem::replace(&mut self.stopped, EngineStopped(Vec::new()))
    }
}

/// Refuses a tier below the pool (the setting `name`) where it cannot work: without prefix
/// caching (it keeps prefix-cache blocks), or beside a draft that keeps KV blocks of its
/// own (the tiers do not move those with the target's yet).
fn check_tier(
    name: &str,
    settings: &EngineSettings,
    drafter: Option<&dyn DraftMethod>,
) -> anyhow::Result<()> {
    if !settings.prefix_caching {
        bail!("{name} keeps prefix-cache blocks: it needs prefix caching on");
    }
    if drafter.is_some_and(|d| d.kv_bytes_per_block().is_some()) {
        bail!(
            "{name} does not move a draft's own KV blocks with the target's yet: use it \
             without speculative decoding or with speculative_method ngram"
        );
    }
    Ok(())
}

/// Prints the backend's pool and address audit, and starts the actors; with a `drafter`,
/// decoding requests are verified against up to `num_speculative_tokens` of its drafts
/// per step. Call from inside a tokio runtime.
pub fn start_engine(
    mut backend: Box<dyn ModelBackend>,
    settings: &EngineSettings,
    drafter: Option<Box<dyn DraftMethod>>,
) -> anyhow::Result<Engine> {
    if let Some(layers) = drafter.as_ref().and_then(|d| d.hidden_layers()) {
        backend.record_hidden(&layers)?;
    }
    let config = backend.config();
    let max_model_len = match settings.max_model_len {
        Some(len) if len > config.max_model_len => bail!(
            "max_model_len {len} exceeds the model's maximum of {}",
            config.max_model_len
        ),
        Some(len) => len,
        None => config.max_model_len,
    };
    let capacity = backend.capacity();
    if let Some(c) = capacity {
        let limits = &settings.limits;
        let drafts = if drafter.is_some() {
            limits.num_speculative_tokens
        } else {
            0
        };
        if let Some(why) = c.refuses(limits.max_num_batched_tokens, limits.max_num_seqs, drafts) {
            bail!("{why}");
        }
    }
    let pool = backend.pool();
    // The scratch block (where a graph's padded rows write) is no sequence's.
    let num_blocks = pool.usable_blocks() as u32;
    info!(
        kernels = pool.kernels,
        largest_byte_offset = pool.audit.largest_byte_offset,
        computed_in = pool.computed_in,
        limit = pool.audit.limit,
        "address audit passed"
    );
    info!(
        device = pool.device,
        blocks = num_blocks,
        block_size = settings.block_size,
        bytes_per_layer = pool.bytes_per_layer,
        largest_block_id = num_blocks - 1,
        scratch_block = ?pool.scratch_block,
        tokens = num_blocks as u64 * settings.block_size as u64,
        "KV pool"
    );
    let cache_tokens = num_blocks as usize * settings.block_size;
    if cache_tokens < max_model_len {
        warn!(
            cache_tokens,
            max_model_len,
            "the KV cache cannot hold one sequence of max_model_len tokens: a request's \
             prompt plus output is limited to what the cache holds (raise the KV memory \
             or lower --max-model-len)"
        );
    }
    let setup = SchedulerSetup {
        limits: settings.limits,
        max_model_len,
        block_size: settings.block_size,
        num_blocks: num_blocks as usize,
        eos_token_ids: config.eos_token_ids.clone(),
        draft_kv_bytes_per_block: drafter.as_ref().and_then(|d| d.kv_bytes_per_block()),
        max_logit_rows: capacity.map(|c| c.max_logit_rows),
    };
    let block_size = settings.block_size;
    let pool = backend.pool();
    let block_bytes =
        pool.bytes_per_layer / pool.layout.num_blocks.max(1) * config.num_layers as u64;
    let mut blocks = BlockManager::new(num_blocks, settings.block_size, settings.prefix_caching)
        .with_block_bytes(block_bytes);
    // An EAGLE-3 head drafts from the target's features at the position before the first
    // token the target computes: a prefix hit leaves its last block to compute again.
    if drafter
        .as_ref()
        .is_some_and(|d| d.hidden_layers().is_some())
    {
        blocks = blocks.recomputing_last_hit();
    }
    let host_slots = backend.host_tier_slots();
    if host_slots > 0 {
        check_tier("kv_host_memory", settings, drafter.as_deref())?;
        info!(blocks = host_slots, "KV host tier");
        blocks = blocks.with_host_tier(host_slots);
    }
    if let Some(disk) = backend.take_disk_tier() {
        check_tier("kv_cache_dir", settings, drafter.as_deref())?;
        info!(
            slots = disk.slots,
            blocks = disk.found.len(),
            "KV disk tier"
        );
        blocks = blocks
            .with_disk_tier(disk.slots, &disk.found)
            .with_failed_reads(disk.failed);
    }
    let kv = KvAllocator::spawn_over(blocks, settings.kv_events.clone());
    let spin = Spin::for_device(backend.host_waits_on_device());
    let decode_ahead = settings.async_scheduling;
    let ahead = DecodeAhead {
        free: decode_ahead,
        constrained: decode_ahead && settings.async_scheduling_constrained,
    };
    let (runner, runner_stopped) = TargetRunner::spawn(backend, block_size, spin, ahead);
    let health = EngineHealth::default();
    health.watch("target runner", runner_stopped.alive());
    let mut stopped = vec![runner_stopped];
    let proposer =
        drafter
            .map(|drafter| spawn_proposer(drafter, spin))
            .map(|(proposer, proposer_stopped)| {
                health.watch("draft proposer", proposer_stopped.alive());
                stopped.push(proposer_stopped);
                proposer
            });
    Ok(Engine {
        scheduler: Scheduler::spawn(setup, kv, runner.clone(), proposer.clone(), health.clone()),
        num_blocks,
        max_model_len,
        capacity,
        graphs: GraphCapture::new(runner, proposer),
        health,
        stopped: EngineStopped(stopped),
    })
}

//! The models `bench latency` can time: the CPU model, or (with the `cuda` feature) the GPU
//! model from a checkpoint or with random weights.

use crate::cli::BenchLatencyArgs;
use anyhow::bail;
use peregrine_models::LlamaModel;
use peregrine_ops::{AttentionPlan, KvCache};
use std::time::Instant;

/// One model and its KV cache, as the benchmark drives them.
pub trait LatencyModel {
    /// A line naming the model, the device and the precision.
    fn describe(&self) -> String;
    /// Vocabulary size.
    fn vocab_size(&self) -> usize;
    /// Blocks in the KV pool.
    fn num_blocks(&self) -> u64;
    /// Bytes of weights read per decode step.
    fn weight_bytes(&self) -> u64;
    /// The bandwidth floor of one decode step in ms, where it can be measured.
    fn decode_floor_ms(&mut self) -> anyhow::Result<Option<f64>>;
    /// For a mixture of experts, the bytes a decode step of `batch` sequences of `context`
    /// tokens reads at least (the experts its batch is expected to choose, the other
    /// weights and the KV rows), which replace the weights in its floor; `None` otherwise.
    fn routed_step_bytes(&self, _batch: usize, _context: usize) -> Option<u64> {
        None
    }
    /// The wall time in ms of a drafting round of the model's multi-token prediction
    /// layer for `batch` sequences of `context` tokens, where one is loaded
    /// (`--mtp-drafts`).
    fn draft_round_ms(&mut self, _batch: usize, _context: usize) -> anyhow::Result<Option<f64>> {
        Ok(None)
    }
    /// One forward; returns each logit row's greedy token.
    fn step(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<StepTokens>;
    /// Whether every step of `batch` sequences of `rows` rows each (1: decode), up to a
    /// context of `context` tokens, runs as one replayable unit (a captured graph: running
    /// it again writes the same KV slots and tokens), which [`LatencyModel::queue_step`]
    /// can queue.
    fn replays_step(&self, batch: usize, rows: usize, context: usize) -> bool;
    /// Queues the step that [`LatencyModel::step`] would run, without waiting for its
    /// tokens; an error for a step that [`LatencyModel::replays_step`] does not cover.
    fn queue_step(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<()>;
    /// Runs a greedy decode step of `batch` sequences (their tokens over their plan, or,
    /// with `None`, the step the call before queued) and returns its tokens, having first
    /// queued `next` where given: the same sequences one token further, fed this step's
    /// tokens on the device (the engine's async scheduling). Only where
    /// [`LatencyModel::replays_step`] holds for one row.
    fn step_ahead(
        &mut self,
        batch: usize,
        step: Option<(&[u32], &AttentionPlan)>,
        next: Option<&AttentionPlan>,
    ) -> anyhow::Result<Vec<u32>>;
    /// Waits for queued device work.
    fn synchronize(&mut self) -> anyhow::Result<()>;
}

/// What one step gave: the tokens, and when the host had queued all of the step's device
/// work (the end of the step on the CPU, which queues nothing).
pub struct StepTokens {
    /// Each logit row's greedy token.
    pub tokens: Vec<u32>,
    /// When the last of the step's work was queued.
    pub queued: Instant,
}

/// Blocks for `largest` sequences of the benchmark's lengths (plus the warm-up's), each
/// step keeping one position and the last writing `--verify-rows`.
pub fn blocks_needed(args: &BenchLatencyArgs, largest: usize) -> u64 {
    let tokens = args.input_len + args.output_len.max(4) + args.verify_rows;
    (largest * tokens.div_ceil(args.block_size)) as u64
}

/// The model on the CPU with a pool for the benchmark's largest batch.
pub struct CpuModel {
    model: LlamaModel,
    cache: KvCache,
}

impl CpuModel {
    /// The model `args` names, with a KV pool for batches of up to `largest` sequences.
    pub fn open(args: &BenchLatencyArgs, largest: usize) -> anyhow::Result<CpuModel> {
        if args.random_weights.is_some() {
            bail!("--random-weights makes its weights on the GPU: use it with --device cuda");
        }
        let dir = crate::commands::resolve_model(&args.model)?;
        let model = LlamaModel::load(&dir)?;
        let dtype = crate::commands::kv_dtype::cpu_kv_dtype(args.kv_cache_dtype, model.kv_rows())?;
        let layout = model.kv_layout(blocks_needed(args, largest), args.block_size as u64);
        let cache =
            KvCache::try_with_dtype(model.config().num_layers, layout, model.kv_rows(), dtype)?;
        Ok(CpuModel { model, cache })
    }
}

/// Greedy tokens of `rows` rows of logits.
pub fn argmax_rows(logits: &[f32], vocab: usize) -> Vec<u32> {
    logits
        .chunks(vocab)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect()
}

impl LatencyModel for CpuModel {
    fn describe(&self) -> String {
        let c = self.model.config();
        format!(
            "model: {:?}, {} layers, hidden {}, on the CPU ({} SIMD), weights {} ({:.0} MB)",
            c.architecture,
            c.num_layers,
            c.hidden_size,
            peregrine_kernels::cpu::quant::Simd::detected().name(),
            self.model.weight_storage(),
            self.model.weight_bytes() as f64 / 1e6
        )
    }

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn num_blocks(&self) -> u64 {
        self.cache.layout().num_blocks
    }

    fn weight_bytes(&self) -> u64 {
        self.model.weight_bytes()
    }

    fn decode_floor_ms(&mut self) -> anyhow::Result<Option<f64>> {
        Ok(None)
    }

    fn step(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<StepTokens> {
        let logits = self
            .model
            .forward(tokens, plan, &mut self.cache, logit_rows)?;
        Ok(StepTokens {
            tokens: argmax_rows(&logits, self.vocab_size()),
            queued: Instant::now(),
        })
    }

    fn replays_step(&self, _: usize, _: usize, _: usize) -> bool {
        false
    }

    fn queue_step(&mut self, _: &[u32], _: &AttentionPlan, _: &[usize]) -> anyhow::Result<()> {
        bail!("the CPU model replays no step")
    }

    fn step_ahead(
        &mut self,
        _: usize,
        _: Option<(&[u32], &AttentionPlan)>,
        _: Option<&AttentionPlan>,
    ) -> anyhow::Result<Vec<u32>> {
        bail!("the CPU model queues no step ahead")
    }

    fn synchronize(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

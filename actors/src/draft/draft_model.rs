//! Drafting with a smaller model of the same tokenizer, on the CPU, with its own KV cache
//! over the target's block ids: each sequence's draft cache lives in the same blocks as
//! its target cache, in a separate pool of the draft's shape. The drafting loop is
//! `DraftProgress`'s.
//!
//! The decode steps after the first (one row per sequence) replay captured graphs of the
//! draft model when graphs are captured and a size holds the batch, padded up to it; the
//! padded rows write their KV into the target pool's scratch block, which no sequence owns.
//! The catch-up step, and a batch past the largest size, run eagerly.

use super::progress::DraftProgress;
use super::DraftMethod;
use crate::backend::PoolInfo;
use crate::graphs::{CaptureSizes, CpuDecodeGraphs};
use crate::messages::{Drafted, ProposeSeq, RequestId};
use anyhow::Context;
use peregrine_models::{LlamaModel, ModelConfig};
use peregrine_ops::sampling::{Sampler, SamplingParams};
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};

/// The draft-model method.
pub struct DraftModel {
    forward: CpuDraftForward,
    progress: DraftProgress,
}

/// The draft model on the CPU with its cache and graphs.
struct CpuDraftForward {
    model: LlamaModel,
    cache: KvCache,
    block_size: usize,
    num_blocks: u64,
    /// Where the padded rows of a replayed graph write: the target pool's scratch slot.
    scratch_slot: Option<i64>,
    /// Block-table entries the graphs stage.
    graph_table_width: usize,
    /// The captured decode graphs, if any.
    graphs: Option<CpuDecodeGraphs>,
    argmax: Sampler,
    /// The fault hook's block id threshold.
    #[cfg(feature = "fault-hooks")]
    fault_above: Option<u32>,
}

impl DraftModel {
    /// The draft `model` for `target`, with a draft cache of as many blocks as the
    /// target's `pool` (its scratch block included), of the same size. Refused when the
    /// vocabularies differ or the draft's context is shorter than the target's.
    pub fn new(
        model: LlamaModel,
        target: &ModelConfig,
        pool: &PoolInfo,
    ) -> anyhow::Result<DraftModel> {
        let c = model.config();
        crate::backend::check_draft(c, target)?;
        let (num_blocks, block_size) = (pool.layout.num_blocks, pool.layout.block_size);
        let layout = model.kv_layout(num_blocks, block_size);
        layout
            .audit(4)
            .map_err(|e| anyhow::anyhow!("draft KV address audit: {e}"))?;
        let cache = model.new_cache(num_blocks, block_size);
        let forward = CpuDraftForward {
            model,
            cache,
            block_size: block_size as usize,
            num_blocks,
            scratch_slot: pool.scratch_slot(),
            graph_table_width: pool.graph_table_width(target.max_model_len),
            graphs: None,
            argmax: Sampler::new(&SamplingParams::greedy())?,
            #[cfg(feature = "fault-hooks")]
            fault_above: None,
        };
        Ok(DraftModel {
            forward,
            progress: DraftProgress::new(block_size as usize),
        })
    }

    /// Test hook (feature `fault-hooks`): after every draft forward, zero the draft KV of every block id above
    /// `block` that a sequence of the step uses, so that reads from those blocks return
    /// garbage (the failure of a kernel that reads the wrong block past an id limit).
    #[cfg(feature = "fault-hooks")]
    pub fn with_kv_fault_above(mut self, block: u32) -> DraftModel {
        self.forward.fault_above = Some(block);
        self
    }

    /// The draft KV cache, in the blocks of the target's pool.
    pub fn cache(&self) -> &KvCache {
        &self.forward.cache
    }
}

impl CpuDraftForward {
    /// One forward over `specs`/`tokens`, returning the greedy token of each row in `rows`;
    /// replayed through a captured graph when `replay` allows it and one serves the step,
    /// else eager.
    fn run(
        &mut self,
        specs: &[SeqSpec],
        tokens: &[u32],
        rows: &[usize],
        replay: bool,
    ) -> anyhow::Result<Vec<u32>> {
        let plan = AttentionPlan::new(specs, self.block_size, self.num_blocks)?;
        let vocab = self.model.config().vocab_size;
        let replayed = match &mut self.graphs {
            Some(graphs) if replay => graphs
                .replay(tokens, &plan, rows, &mut self.cache, vocab)
                .context("draft model graph replay")?,
            _ => None,
        };
        let logits = match replayed {
            Some(out) => out.logits,
            None => self
                .model
                .forward(tokens, &plan, &mut self.cache, rows)
                .context("draft model forward")?,
        };
        #[cfg(feature = "fault-hooks")]
        if let Some(above) = self.fault_above {
            self.corrupt(specs, above);
        }
        Ok(logits
            .chunks(vocab)
            .map(|row| self.argmax.sample(row, &[], &[]))
            .collect())
    }

    #[cfg(feature = "fault-hooks")]
    fn corrupt(&mut self, specs: &[SeqSpec], above: u32) {
        let bs = self.block_size;
        let layout = *self.cache.layout();
        let width = (layout.num_kv_heads * layout.head_dim) as usize;
        let mut slots: Vec<i64> = Vec::new();
        for spec in specs {
            for &b in spec.block_table.iter().filter(|&&b| b > above) {
                slots.extend((0..bs).map(|i| i64::from(b) * bs as i64 + i as i64));
            }
        }
        slots.sort_unstable();
        slots.dedup();
        let zeros = vec![0.0; slots.len() * width];
        for l in 0..self.model.config().num_layers {
            self.cache.write(l, &slots, &zeros, &zeros);
        }
    }
}

impl DraftMethod for DraftModel {
    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>> {
        let forward = &mut self.forward;
        let drafts = self
            .progress
            .propose(seqs, &mut |specs, tokens, rows, decode| {
                forward.run(specs, tokens, rows, decode)
            })?;
        Ok(drafts.into_iter().map(Drafted::greedy).collect())
    }

    fn release(&mut self, id: RequestId) {
        self.progress.release(id);
    }

    fn kv_bytes_per_block(&self) -> Option<u64> {
        // f32 elements; every layer of the draft's cache has this layout.
        Some(super::block_bytes(self.forward.cache.layout(), 4))
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        let Some(sizes) = sizes else {
            self.forward.graphs = None;
            return Ok(());
        };
        let scratch_slot = self.forward.scratch_slot.context(
            "the target pool has no scratch block for the padded rows of the draft's graphs",
        )?;
        let graphs = CpuDecodeGraphs::capture(
            &self.forward.model,
            sizes,
            self.forward.graph_table_width,
            scratch_slot,
            &[],
        )
        .context("capturing the draft model's graphs")?;
        self.forward.graphs = Some(graphs);
        Ok(())
    }
}

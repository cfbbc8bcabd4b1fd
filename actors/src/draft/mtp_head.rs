//! A DeepSeek-V3 multi-token prediction layer run as a draft head on the CPU: the head
//! the EAGLE-3 method drives (it reads the target's features the same way, step 0 pairing
//! the target's output at j with token j + 1, later steps chained on the head's own
//! output), drafting over the whole vocabulary, its one-layer cache over the target's
//! blocks. Its steps after the first replay captured graphs of its decode step when one
//! serves the batch, as an EAGLE-3 head's do.

use super::head_runner::{HeadRunner, HeadStep};
use crate::backend::PoolInfo;
use crate::graphs::{CaptureSizes, CpuHeadGraphs};
use anyhow::Context;
use peregrine_models::eagle3::{DraftVocab, HeadInput};
use peregrine_models::mtp::MtpHead;
use peregrine_models::ModelConfig;
#[cfg(feature = "fault-hooks")]
use peregrine_ops::KvRows;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};

/// An MTP head with its cache, on the CPU.
pub struct CpuMtpHead {
    head: MtpHead,
    cache: KvCache,
    /// Draft ids are target ids.
    vocab: DraftVocab,
    /// The one target "layer" the head reads: the last layer's output.
    aux: [usize; 1],
    /// Where the padded rows of a replayed graph write: the target pool's scratch slot.
    scratch_slot: Option<i64>,
    /// Block-table entries the graphs stage.
    graph_table_width: usize,
    /// The captured graphs of the head's decode step, if any.
    graphs: Option<CpuHeadGraphs<MtpHead>>,
}

impl CpuMtpHead {
    /// The `head` of `target` with a one-layer cache of as many blocks as the target's
    /// `pool` (its scratch block included), of the same size, audited first.
    pub fn new(head: MtpHead, target: &ModelConfig, pool: &PoolInfo) -> anyhow::Result<CpuMtpHead> {
        let vocab_size = target.vocab_size;
        let (num_blocks, block_size) = (pool.layout.num_blocks, pool.layout.block_size);
        head.kv_layout(num_blocks, block_size)
            .audit(4)
            .map_err(|e| anyhow::anyhow!("MTP KV address audit: {e}"))?;
        let identity = vec![0i64; vocab_size];
        let vocab = DraftVocab::from_d2t(&identity, vocab_size)?;
        Ok(CpuMtpHead {
            aux: [head.aux_layer()],
            cache: head.new_cache(num_blocks, block_size),
            head,
            vocab,
            scratch_slot: pool.scratch_slot(),
            graph_table_width: pool.graph_table_width(target.max_model_len),
            graphs: None,
        })
    }
}

impl HeadRunner for CpuMtpHead {
    fn vocab(&self) -> &DraftVocab {
        &self.vocab
    }

    fn aux_layers(&self) -> &[usize] {
        &self.aux
    }

    fn aux_width(&self) -> usize {
        self.head.hidden_size()
    }

    fn hidden_size(&self) -> usize {
        self.head.hidden_size()
    }

    fn block_size(&self) -> usize {
        self.cache.layout().block_size as usize
    }

    fn kv_bytes_per_block(&self) -> u64 {
        // f32 elements.
        super::block_bytes(self.cache.layout(), 4)
    }

    fn run(
        &mut self,
        specs: &[SeqSpec],
        tokens: &[u32],
        input: HeadInput,
        rows: &[usize],
        logits: bool,
    ) -> anyhow::Result<HeadStep> {
        let layout = self.cache.layout();
        let plan = &AttentionPlan::new(specs, layout.block_size as usize, layout.num_blocks)?;
        let replayed = match (&mut self.graphs, input) {
            (Some(graphs), HeadInput::Pre(pre)) => graphs
                .replay(tokens, pre, plan, rows, &mut self.cache)
                .context("MTP head graph replay")?,
            _ => None,
        };
        let out = match replayed {
            Some(out) => out,
            None => self
                .head
                .forward(tokens, input, plan, &mut self.cache, rows)
                .context("MTP head forward")?,
        };
        Ok(HeadStep {
            greedy: self.vocab.greedy(&out.logits),
            logits: logits.then_some(out.logits),
            pre: out.pre,
        })
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        let Some(sizes) = sizes else {
            self.graphs = None;
            return Ok(());
        };
        let scratch_slot = self.scratch_slot.context(
            "the target pool has no scratch block for the padded rows of the head's graphs",
        )?;
        let graphs =
            CpuHeadGraphs::capture(&self.head, sizes, self.graph_table_width, scratch_slot)
                .context("capturing the MTP head's graphs")?;
        self.graphs = Some(graphs);
        Ok(())
    }

    #[cfg(feature = "fault-hooks")]
    fn zero_kv_above(&mut self, specs: &[SeqSpec], above: u32) -> anyhow::Result<()> {
        let layout = *self.cache.layout();
        let bs = layout.block_size as i64;
        let slots: Vec<i64> = super::head_runner::blocks_above(specs, above)
            .into_iter()
            .flat_map(|b| (0..bs).map(move |i| i64::from(b) * bs + i))
            .collect();
        let zeros = vec![0.0; slots.len() * layout.slot_elems() as usize];
        match self.cache.rows() {
            KvRows::Latent => self.cache.write_latent(0, &slots, &zeros),
            KvRows::KeysAndValues => self.cache.write(0, &slots, &zeros, &zeros),
        }
        Ok(())
    }
}

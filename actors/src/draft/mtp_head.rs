//! A DeepSeek-V3 multi-token prediction layer run as a draft head on the CPU: the head
//! the EAGLE-3 method drives (it reads the target's features the same way, step 0 pairing
//! the target's output at j with token j + 1, later steps chained on the head's own
//! output), drafting over the whole vocabulary, its one-layer cache over the target's
//! blocks.

use super::head_runner::{HeadRunner, HeadStep};
use crate::backend::PoolInfo;
use crate::graphs::CaptureSizes;
use anyhow::Context;
use peregrine_models::eagle3::{DraftVocab, HeadInput};
use peregrine_models::mtp::MtpHead;
#[cfg(feature = "fault-hooks")]
use peregrine_ops::KvRows;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use tracing::info;

/// An MTP head with its cache, on the CPU.
pub struct CpuMtpHead {
    head: MtpHead,
    cache: KvCache,
    /// Draft ids are target ids.
    vocab: DraftVocab,
    /// The one target "layer" the head reads: the last layer's output.
    aux: [usize; 1],
}

impl CpuMtpHead {
    /// The `head` with a one-layer cache of as many blocks as the target's `pool` (its
    /// scratch block included), of the same size, audited first.
    pub fn new(head: MtpHead, pool: &PoolInfo, vocab_size: usize) -> anyhow::Result<CpuMtpHead> {
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
        let out = self
            .head
            .forward(tokens, input, plan, &mut self.cache, rows)
            .context("MTP head forward")?;
        Ok(HeadStep {
            greedy: self.vocab.greedy(&out.logits),
            logits: logits.then_some(out.logits),
            pre: out.pre,
        })
    }

    /// The MTP head's draft steps run eagerly: it captures no graphs.
    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        if sizes.is_some() {
            info!("the MTP head runs its draft steps eagerly (its graphs are not built yet)");
        }
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

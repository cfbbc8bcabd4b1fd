//! Where a draft head that reads the target's features runs (an EAGLE-3 head, or
//! DeepSeek-V3's MTP layer): its forwards over its own one-layer KV cache (in the blocks of
//! the target's pool) and the graphs of its decode step. [`CpuHead`] runs either head on
//! the CPU; the CUDA backend's runs an EAGLE-3 head on the GPU (`cuda_head`).

use crate::backend::PoolInfo;
use crate::graphs::{CaptureSizes, CpuHeadGraphs};
use crate::messages::Drafted;
use anyhow::Context;
use peregrine_kernels::cpu::KvLayout;
use peregrine_models::eagle3::{DraftVocab, Eagle3Head, HeadInput, HeadOutput};
use peregrine_models::graph::cpu::head::{forward_eagerly, GraphHead};
use peregrine_models::mtp::MtpHead;
use peregrine_models::{ForwardError, ModelConfig};
#[cfg(feature = "fault-hooks")]
use peregrine_ops::KvRows;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};

/// What one step of the head gives.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadStep {
    /// The greedy draft (a target id) of each logit row.
    pub greedy: Vec<u32>,
    /// The draft-vocabulary logits of each logit row (`[rows, V_d]`), where asked.
    pub logits: Option<Vec<f32>>,
    /// `pre` of every row (`[tokens, H]`).
    pub pre: Vec<f32>,
}

/// One forward of a head: `tokens` (those of `specs`, one after another) fed `input`, the
/// drafts of the logit rows `rows`.
#[derive(Clone, Copy)]
pub struct HeadCall<'a> {
    /// The sequences' rows.
    pub specs: &'a [SeqSpec<'a>],
    /// Their tokens.
    pub tokens: &'a [u32],
    /// What the head is fed beside them.
    pub input: HeadInput<'a>,
    /// The rows whose drafts are asked.
    pub rows: &'a [usize],
}

/// A draft head that reads the target's hidden states (an EAGLE-3 head, or an MTP layer)
/// with its KV cache, on some device.
pub trait HeadRunner: Send {
    /// Its draft vocabulary (draft id to target id).
    fn vocab(&self) -> &DraftVocab;
    /// The target layers whose inputs feed the head, in concatenation order.
    fn aux_layers(&self) -> &[usize];
    /// The width of one row of target features (the aux layers' inputs side by side).
    fn aux_width(&self) -> usize;
    /// The head's width H: one row of `pre`.
    fn hidden_size(&self) -> usize;
    /// Tokens per block of its cache (the target pool's).
    fn block_size(&self) -> usize;
    /// Bytes one block takes in the K or V tensor of its one-layer cache.
    fn kv_bytes_per_block(&self) -> u64;
    /// The forward of `tokens` (those of `specs`, one after another) fed `input`, writing
    /// the head's KV: the greedy draft of each row of `rows` (and its logits with
    /// `logits`), and `pre` of every row. A step fed `pre` replays a captured graph when
    /// one serves it.
    fn run(
        &mut self,
        specs: &[SeqSpec],
        tokens: &[u32],
        input: HeadInput,
        rows: &[usize],
        logits: bool,
    ) -> anyhow::Result<HeadStep>;
    /// A greedy proposal whole, where the runner queues its steps back to back without
    /// reading a step back before the next (the GPU's graphs): step 0 (`first`, whose
    /// logit rows are each sequence's last), then `later` draft steps of one row a
    /// sequence, each one position past the one before and fed the draft and `pre` of the
    /// step before. Each sequence's `1 + later` greedy drafts (left on the device where the
    /// runner hands them to the target there: [`Drafted::on_device`]), or `None`, with
    /// nothing run, where the runner cannot (then each step runs on its own).
    fn run_chain(
        &mut self,
        first: HeadCall<'_>,
        later: usize,
    ) -> anyhow::Result<Option<Vec<Drafted>>> {
        let _ = (first, later);
        Ok(None)
    }
    /// Captures the head's decode step for every size of `sizes`, replacing the graphs held
    /// (on failure they stay); `None` drops them.
    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()>;
    /// Whether the feature ring the head reads ([`HeadInput::Ring`]) still holds row `row`;
    /// false for a head that reads none.
    fn holds_ring_row(&self, row: u64) -> bool {
        let _ = row;
        false
    }
    /// Fault hook (feature `fault-hooks`): zeroes the head's KV in every block above
    /// `above` that a sequence of `specs` uses.
    #[cfg(feature = "fault-hooks")]
    fn zero_kv_above(&mut self, specs: &[SeqSpec], above: u32) -> anyhow::Result<()>;
}

/// The blocks above `above` that the sequences of `specs` use, each once, ascending.
#[cfg(feature = "fault-hooks")]
pub(super) fn blocks_above(specs: &[SeqSpec], above: u32) -> Vec<u32> {
    let mut blocks: Vec<u32> = specs
        .iter()
        .flat_map(|s| s.block_table.iter().copied())
        .filter(|&b| b > above)
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

impl HeadRunner for Box<dyn HeadRunner> {
    fn aux_width(&self) -> usize {
        (**self).aux_width()
    }

    fn hidden_size(&self) -> usize {
        (**self).hidden_size()
    }

    fn vocab(&self) -> &DraftVocab {
        (**self).vocab()
    }

    fn aux_layers(&self) -> &[usize] {
        (**self).aux_layers()
    }

    fn block_size(&self) -> usize {
        (**self).block_size()
    }

    fn kv_bytes_per_block(&self) -> u64 {
        (**self).kv_bytes_per_block()
    }

    fn run(
        &mut self,
        specs: &[SeqSpec],
        tokens: &[u32],
        input: HeadInput,
        rows: &[usize],
        logits: bool,
    ) -> anyhow::Result<HeadStep> {
        (**self).run(specs, tokens, input, rows, logits)
    }

    fn run_chain(
        &mut self,
        first: HeadCall<'_>,
        later: usize,
    ) -> anyhow::Result<Option<Vec<Drafted>>> {
        (**self).run_chain(first, later)
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        (**self).capture_graphs(sizes)
    }

    fn holds_ring_row(&self, row: u64) -> bool {
        (**self).holds_ring_row(row)
    }

    #[cfg(feature = "fault-hooks")]
    fn zero_kv_above(&mut self, specs: &[SeqSpec], above: u32) -> anyhow::Result<()> {
        (**self).zero_kv_above(specs, above)
    }
}

/// A draft head that runs on the CPU: an EAGLE-3 head or an MTP layer, each with its own
/// kind of one-layer cache, its forward and its graphs.
pub trait CpuDraftHead: GraphHead<Buffers: Send> + Send + Sized + 'static {
    /// What the head is called in errors.
    const NAME: &'static str;
    /// Its draft vocabulary (draft id to target id).
    fn vocab(&self) -> &DraftVocab;
    /// The target layers whose inputs feed it, in concatenation order.
    fn aux_layers(&self) -> &[usize];
    /// The width of one row of target features.
    fn aux_width(&self) -> usize;
    /// The head's width H: one row of `pre`.
    fn hidden_size(&self) -> usize;
    /// Its one-layer cache's layout over `num_blocks` blocks of `block_size` tokens.
    fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout;
    /// A one-layer cache of that layout, of the head's kind.
    fn new_cache(&self, num_blocks: u64, block_size: u64) -> KvCache;
    /// The target's vocabulary: the ids its tokens are drawn from.
    fn target_vocab(&self) -> usize;
    /// One eager forward of the head ([`forward_eagerly`]).
    fn forward(
        &self,
        tokens: &[u32],
        input: HeadInput,
        plan: &AttentionPlan,
        cache: &mut KvCache,
        logit_rows: &[usize],
    ) -> Result<HeadOutput, ForwardError> {
        let vocab = self.target_vocab();
        forward_eagerly(self, vocab, tokens, input, plan, cache, logit_rows)
    }
}

impl CpuDraftHead for Eagle3Head {
    const NAME: &'static str = "EAGLE-3 head";

    fn vocab(&self) -> &DraftVocab {
        Eagle3Head::vocab(self)
    }

    fn aux_layers(&self) -> &[usize] {
        Eagle3Head::aux_layers(self)
    }

    fn aux_width(&self) -> usize {
        Eagle3Head::aux_layers(self).len() * self.config().target_hidden_size
    }

    fn hidden_size(&self) -> usize {
        self.config().hidden_size
    }

    fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        Eagle3Head::kv_layout(self, num_blocks, block_size)
    }

    fn new_cache(&self, num_blocks: u64, block_size: u64) -> KvCache {
        KvCache::new(1, Eagle3Head::kv_layout(self, num_blocks, block_size))
    }

    fn target_vocab(&self) -> usize {
        self.config().vocab_size
    }
}

impl CpuDraftHead for MtpHead {
    const NAME: &'static str = "MTP head";

    fn vocab(&self) -> &DraftVocab {
        MtpHead::vocab(self)
    }

    fn aux_layers(&self) -> &[usize] {
        MtpHead::aux_layers(self)
    }

    fn aux_width(&self) -> usize {
        MtpHead::hidden_size(self)
    }

    fn hidden_size(&self) -> usize {
        MtpHead::hidden_size(self)
    }

    fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        MtpHead::kv_layout(self, num_blocks, block_size)
    }

    fn new_cache(&self, num_blocks: u64, block_size: u64) -> KvCache {
        MtpHead::new_cache(self, num_blocks, block_size)
    }

    fn target_vocab(&self) -> usize {
        MtpHead::vocab(self).len()
    }
}

/// A draft head on the CPU (an EAGLE-3 head by default), its one-layer cache of the head's
/// shape over as many blocks as the target's pool.
pub struct CpuHead<H: CpuDraftHead = Eagle3Head> {
    head: H,
    cache: KvCache,
    /// Where the padded rows of a replayed graph write: the target pool's scratch slot.
    scratch_slot: Option<i64>,
    /// Block-table entries the graphs stage.
    graph_table_width: usize,
    /// The captured graphs of the head's decode step, if any.
    graphs: Option<CpuHeadGraphs<H>>,
}

/// DeepSeek-V3's multi-token prediction layer run as a draft head on the CPU.
pub type CpuMtpHead = CpuHead<MtpHead>;

impl<H: CpuDraftHead> CpuHead<H> {
    /// The `head` for `target`, with a one-layer cache of as many blocks as the target's
    /// `pool` (its scratch block included), of the same size, audited first.
    pub fn new(head: H, target: &ModelConfig, pool: &PoolInfo) -> anyhow::Result<CpuHead<H>> {
        let (num_blocks, block_size) = (pool.layout.num_blocks, pool.layout.block_size);
        head.kv_layout(num_blocks, block_size)
            .audit(4)
            .map_err(|e| anyhow::anyhow!("{} KV address audit: {e}", H::NAME))?;
        Ok(CpuHead {
            cache: head.new_cache(num_blocks, block_size),
            head,
            scratch_slot: pool.scratch_slot(),
            graph_table_width: pool.graph_table_width(target.max_model_len),
            graphs: None,
        })
    }

    /// The head's KV cache, in the blocks of the target's pool.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }
}

impl<H: CpuDraftHead> HeadRunner for CpuHead<H> {
    fn aux_width(&self) -> usize {
        self.head.aux_width()
    }

    fn hidden_size(&self) -> usize {
        self.head.hidden_size()
    }

    fn vocab(&self) -> &DraftVocab {
        self.head.vocab()
    }

    fn aux_layers(&self) -> &[usize] {
        self.head.aux_layers()
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
                .with_context(|| format!("{} graph replay", H::NAME))?,
            _ => None,
        };
        let out = match replayed {
            Some(out) => out,
            None => self
                .head
                .forward(tokens, input, plan, &mut self.cache, rows)
                .with_context(|| format!("{} forward", H::NAME))?,
        };
        Ok(HeadStep {
            greedy: self.head.vocab().greedy(&out.logits),
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
                .with_context(|| format!("capturing the {}'s graphs", H::NAME))?;
        self.graphs = Some(graphs);
        Ok(())
    }

    #[cfg(feature = "fault-hooks")]
    fn zero_kv_above(&mut self, specs: &[SeqSpec], above: u32) -> anyhow::Result<()> {
        let layout = *self.cache.layout();
        let bs = layout.block_size as i64;
        let slots: Vec<i64> = blocks_above(specs, above)
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

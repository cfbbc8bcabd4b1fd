//! The model a TargetRunner drives, with its KV pool, on whichever device: the CPU model
//! in f32, or (with the `cuda` feature) the GPU model in bf16.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;

pub use cpu::{cpu_backend, cpu_backend_with, CpuFootprint, StepBounds};
#[cfg(feature = "cuda")]
pub use cuda::{cuda_backend, GpuSettings, MAX_SEQ_LEN_TO_CAPTURE};

use crate::graphs::CaptureSizes;
use crate::kv_disk::{ContentHash, DiskTierStart};
use crate::messages::{GeneratedToken, HiddenData, KvMove, LoadDone};
use anyhow::bail;
use peregrine_kernels::cpu::{AddressAudit, KvLayout, Matrix};
use peregrine_models::draft_head::HandedDraft;
use peregrine_models::ModelConfig;
use peregrine_ops::sampling::{accept_greedy, argmax, log_softmax, Sampler, TokenMask};
use peregrine_ops::{AttentionPlan, Linear};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// What the pool is and what the address audit (docs/architecture.md, rule 2) found for it.
#[derive(Clone, Debug)]
pub struct PoolInfo {
    /// One layer's layout.
    pub layout: KvLayout,
    /// Bytes of K plus V in one layer.
    pub bytes_per_layer: u64,
    /// The audit of the cache and attention kernels over this pool.
    pub audit: AddressAudit,
    /// The kernels the audit covers.
    pub kernels: &'static str,
    /// The type their offsets are computed in.
    pub computed_in: &'static str,
    /// The device, in words.
    pub device: String,
    /// A block no sequence owns, where the padded rows of a replayed graph write their
    /// keys and values: when `Some(b)`, `b` is the last block of `layout`, and the KV
    /// allocator hands out the `layout.num_blocks - 1` blocks before it.
    pub scratch_block: Option<u32>,
}

impl PoolInfo {
    /// The blocks sequences may own: the layout's, less the scratch block.
    pub fn usable_blocks(&self) -> u64 {
        self.layout.num_blocks - u64::from(self.scratch_block.is_some())
    }

    /// The first slot of the scratch block, where every padded row of a replayed graph
    /// writes its keys and values; `None` without a scratch block.
    pub fn scratch_slot(&self) -> Option<i64> {
        let block_size = self.layout.block_size as i64;
        self.scratch_block.map(|b| i64::from(b) * block_size)
    }

    /// Block-table entries a captured CPU graph stages: enough for a sequence of
    /// `max_model_len` tokens, within the blocks sequences may own (at least one).
    pub fn graph_table_width(&self, max_model_len: usize) -> usize {
        let longest = max_model_len.div_ceil(self.layout.block_size as usize);
        longest.min(self.usable_blocks() as usize).max(1)
    }
}

/// A target backend and the drafter built with it, for the draft proposer to own.
pub struct Loaded {
    pub target: Box<dyn ModelBackend>,
    /// The configured drafter (`None` without speculation), over the target's pool.
    pub drafter: Option<Box<dyn crate::draft::DraftMethod>>,
}

/// The steps a drafter loaded beside the target is sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadLimits {
    /// Tokens of one step.
    pub max_tokens: usize,
    /// Logit rows of one step (one per sequence).
    pub max_logit_rows: usize,
    /// The longest context a captured decode graph serves.
    pub max_seq_len_to_capture: usize,
    /// The most rows a sequence verifies: 1 + its drafts.
    pub verify_rows: usize,
}

/// Refuses a draft model whose vocabulary differs from the target's (they must share a
/// tokenizer) or whose context is shorter.
pub fn check_draft(draft: &ModelConfig, target: &ModelConfig) -> anyhow::Result<()> {
    if draft.vocab_size != target.vocab_size {
        bail!(
            "draft_model has a vocabulary of {} tokens, the target {}: they must share a tokenizer",
            draft.vocab_size,
            target.vocab_size
        );
    }
    if draft.max_model_len < target.max_model_len {
        bail!(
            "draft_model's context ({} tokens) is shorter than the target's ({})",
            draft.max_model_len,
            target.max_model_len
        );
    }
    Ok(())
}

/// The sampling state of the request a logit row belongs to.
pub struct RowSampling<'a> {
    /// Its parameters and seeded RNG.
    pub sampler: &'a mut Sampler,
    /// Its prompt (for the repetition penalty).
    pub prompt: &'a [u32],
    /// The tokens it has generated so far (for the penalties).
    pub output: &'a [u32],
    /// How many top logprobs to return with the chosen token, if any.
    pub logprobs: Option<usize>,
}

/// The grammar masks of a step's sampled rows, one entry per row (`None`: the row is not
/// constrained), possibly still being computed on another host thread while the forward
/// runs: a backend waits for them right before it samples, after it has queued the forward.
pub enum RowMasks<'a> {
    /// No row is constrained.
    None,
    /// The masks, computed.
    Ready(Vec<Option<TokenMask>>),
    /// The thread computing them.
    Pending(std::thread::ScopedJoinHandle<'a, anyhow::Result<Vec<Option<TokenMask>>>>),
}

impl RowMasks<'_> {
    /// The masks of `rows` rows, waiting for them where they are still being computed.
    pub fn wait(self, rows: usize) -> anyhow::Result<Vec<Option<TokenMask>>> {
        let masks = match self {
            RowMasks::None => return Ok(vec![None; rows]),
            RowMasks::Ready(masks) => masks,
            RowMasks::Pending(handle) => handle
                .join()
                .map_err(|_| anyhow::anyhow!("the thread computing grammar masks panicked"))??,
        };
        if masks.len() != rows {
            bail!("{} grammar masks for {rows} sampled rows", masks.len());
        }
        Ok(masks)
    }
}

/// The largest step a backend's buffers were sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepCapacity {
    /// Tokens of one step.
    pub max_tokens: usize,
    /// Sequences sampled in one step.
    pub max_seqs: usize,
    /// Rows of logits of one step: a row per sequence, plus one per draft when drafts are
    /// verified.
    pub max_logit_rows: usize,
}

impl StepCapacity {
    /// Why a step of `max_num_batched_tokens` tokens over `max_num_seqs` sequences, each
    /// verifying up to `drafts` drafts, does not fit, naming the field to lower; `None` when
    /// it fits.
    pub fn refuses(
        &self,
        max_num_batched_tokens: usize,
        max_num_seqs: usize,
        drafts: usize,
    ) -> Option<String> {
        let rows = max_num_seqs * (1 + drafts);
        [
            (
                "max_num_batched_tokens",
                max_num_batched_tokens,
                self.max_tokens,
            ),
            ("max_num_seqs", max_num_seqs, self.max_seqs),
            (
                "num_speculative_tokens",
                rows.min(max_num_batched_tokens),
                self.max_logit_rows,
            ),
        ]
        .into_iter()
        .find(|&(_, value, most)| value > most)
        .map(|(field, value, most)| match field {
            "num_speculative_tokens" => format!(
                "num_speculative_tokens {drafts} makes up to {value} logit rows a step, past the \
                 {most} the GPU buffers were sized for at start-up"
            ),
            _ => format!(
                "{field} {value} exceeds the {most} the GPU buffers were sized for at start-up"
            ),
        })
    }
}

/// Where a step's tokens come from.
#[derive(Clone, Copy, Debug)]
pub enum StepSource<'a> {
    /// These tokens (one per planned row) over this plan; the step's outputs are those of
    /// `logit_rows`.
    Fresh {
        tokens: &'a [u32],
        plan: &'a AttentionPlan,
        logit_rows: &'a [usize],
    },
    /// The step the call before queued ahead ([`Wanted::Argmax`]'s `next`): one row per
    /// sequence, each fed the argmax of its row in that call.
    Queued,
}

/// What a step gives back of each of its logit rows.
pub enum Wanted<'a, 's> {
    /// The token the row's sampler chooses (with logprobs where it asks), among the tokens
    /// its grammar mask allows where it has one.
    Sampled(&'a mut [RowSampling<'s>], RowMasks<'a>),
    /// The row's logits, on the host: speculative verification judges several rows per
    /// sequence there.
    Logits,
    /// The row's greedy token (the argmax, lowest id among ties): a device backend finds it
    /// where the logits are and moves only the ids. With `next`, planned over the same
    /// sequences in the same order, each one token further, the backend may first queue
    /// `next`, fed each sequence's token from this step's argmax without waiting for it on
    /// the host (async scheduling: the device runs `next` while the host plans the step
    /// after), and say so in [`StepOutput::queued_next`]. A queued step is read by the next
    /// call as [`StepSource::Queued`]; any other call drops it (the keys and values it
    /// wrote lie one position past each sequence's tokens, where that sequence's next step
    /// writes or its freed blocks' next owner does, later on the same device queue). Only
    /// a pure decode step (one token and one logit row per sequence) queues anything.
    /// A row with a grammar mask in `masks` (those of this step's rows: for a queued step,
    /// the queued rows) takes the argmax of the tokens its mask allows, before `next` is
    /// fed from it; the backend waits for the masks only once the step's forward is
    /// queued.
    Argmax {
        next: Option<&'a AttentionPlan>,
        masks: RowMasks<'a>,
    },
}

/// One step for [`ModelBackend::run`]: its tokens, and what to give back of them.
pub struct StepInput<'a, 's> {
    pub source: StepSource<'a>,
    pub wanted: Wanted<'a, 's>,
}

/// What a step gave back of its logit rows, in their order.
#[derive(Debug, PartialEq)]
pub enum RowOutputs {
    /// [`Wanted::Sampled`]: each row's chosen token.
    Sampled(Vec<GeneratedToken>),
    /// [`Wanted::Logits`]: `[rows, vocab]`.
    Logits(Vec<f32>),
    /// [`Wanted::Argmax`]: each row's greedy token.
    Argmax(Vec<u32>),
}

/// One step's outputs.
#[derive(Debug, PartialEq)]
pub struct StepOutput {
    /// What was wanted of each logit row.
    pub rows: RowOutputs,
    /// Whether the step after was queued ahead ([`Wanted::Argmax`]).
    pub queued_next: bool,
    /// The hidden states the forward recorded, `[rows, layers.len() * hidden]`, where
    /// [`ModelBackend::record_hidden`] asked for them: every planned row's, for a draft
    /// method to read (on the host, or in the CUDA backend's feature ring).
    pub hidden: Option<HiddenData>,
}

impl StepOutput {
    /// The sampled tokens; an error if the step gave back something else.
    pub fn sampled(self) -> anyhow::Result<Vec<GeneratedToken>> {
        match self.rows {
            RowOutputs::Sampled(tokens) => Ok(tokens),
            other => bail!("a sampled step gave back {other:?}"),
        }
    }

    /// The logits; an error if the step gave back something else.
    pub fn logits(self) -> anyhow::Result<Vec<f32>> {
        match self.rows {
            RowOutputs::Logits(logits) => Ok(logits),
            other => bail!("a step for logits gave back {other:?}"),
        }
    }

    /// The greedy tokens; an error if the step gave back something else.
    pub fn argmax(self) -> anyhow::Result<Vec<u32>> {
        match self.rows {
            RowOutputs::Argmax(ids) => Ok(ids),
            other => bail!("a greedy step gave back {other:?}"),
        }
    }
}

/// A model with its KV pool, ready to run steps. The runner calls [`ModelBackend::run`]
/// for every step, which picks one of the forwards (`sampled`, `logits`, `greedy`); a
/// backend implements those and what it supports of the rest.
pub trait ModelBackend: Send {
    /// The model's configuration.
    fn config(&self) -> &ModelConfig;
    /// The KV pool.
    fn pool(&self) -> &PoolInfo;
    /// Whether a step's work runs on a device while the host thread that queued it only
    /// waits for it (a GPU), so that waiting threads may spin rather than sleep; false on
    /// the CPU, whose steps need every core.
    fn host_waits_on_device(&self) -> bool {
        false
    }
    /// The largest step it can run, where its buffers are sized at start-up (`None`:
    /// any step).
    fn capacity(&self) -> Option<StepCapacity> {
        None
    }
    /// Runs one step: the tokens of `input.source` through the model, writing their keys
    /// and values into the pool, and gives back what `input.wanted` asks of its logit
    /// rows, with the hidden states it recorded: by default through the forward below
    /// that `input.wanted` names.
    fn run(&mut self, input: StepInput) -> anyhow::Result<StepOutput> {
        run_step(self, input)
    }
    /// The forward, each logit row's token chosen with the matching entry of `sampling`
    /// under its mask of `masks`.
    fn sampled(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        sampling: &mut [RowSampling],
        masks: RowMasks,
    ) -> anyhow::Result<Vec<GeneratedToken>>;
    /// The forward, the logits of `logit_rows` on the host, `[logit_rows.len(), vocab]`.
    fn logits(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Vec<f32>>;
    /// The vocabulary, to cut logits into rows.
    fn vocab(&self) -> usize;
    /// The forward, the argmax of each row of `logit_rows`.
    fn argmax(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Vec<u32>> {
        let logits = self.logits(tokens, plan, logit_rows)?;
        argmax_rows(&logits, self.vocab(), &[])
    }
    /// A greedy step ([`Wanted::Argmax`]) from `source`, each row's argmax among what its
    /// mask of `masks` allows, queuing `next` where it can; says whether it did. A backend
    /// that cannot queue ahead runs the step alone.
    fn greedy(
        &mut self,
        source: StepSource,
        next: Option<&AttentionPlan>,
        masks: RowMasks,
    ) -> anyhow::Result<(Vec<u32>, bool)> {
        let _ = next;
        match source {
            StepSource::Fresh {
                tokens,
                plan,
                logit_rows,
            } => Ok((self.masked_argmax(tokens, plan, logit_rows, masks)?, false)),
            StepSource::Queued => bail!("no step was queued ahead"),
        }
    }
    /// A greedy verification whose drafts a proposal left on the device: the token of
    /// each row `row` of `fed` (a placeholder in `tokens`) is `draft`. Each of `groups` (a
    /// sequence's logit rows, as indices into `logit_rows`: its last token, then its
    /// drafts) accepts its drafts while the argmax of the row before each is the draft.
    /// Returns the argmax of every logit row and each group's accepted drafts. Refused by
    /// a backend that holds no such drafts.
    fn verify_fed(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        fed: &[(usize, HandedDraft)],
        groups: &[Range<usize>],
    ) -> anyhow::Result<(Vec<u32>, Vec<usize>)> {
        let _ = (tokens, plan, logit_rows, fed, groups);
        bail!(
            "the {} backend holds no drafts on a device",
            self.pool().device
        )
    }
    /// The drafts `which`, left on the device by a proposal, on the host. Refused by a
    /// backend that holds no such drafts.
    fn fetch_drafts(&mut self, which: &[HandedDraft]) -> anyhow::Result<Vec<u32>> {
        let _ = which;
        bail!(
            "the {} backend holds no drafts on a device",
            self.pool().device
        )
    }
    /// [`ModelBackend::argmax`] among what each row's mask of `masks` allows (over the host
    /// logits where a row has one).
    fn masked_argmax(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        masks: RowMasks,
    ) -> anyhow::Result<Vec<u32>> {
        if let RowMasks::None = masks {
            return self.argmax(tokens, plan, logit_rows);
        }
        let logits = self.logits(tokens, plan, logit_rows)?;
        let masks = masks.wait(logit_rows.len())?;
        argmax_rows(&logits, self.vocab(), &masks)
    }
    /// The hidden states the last forward recorded, if it recorded any; taken.
    fn take_hidden(&mut self) -> Option<HiddenData> {
        None
    }
    /// From now on, every forward also records the input of each layer in `layers` for
    /// every row (concatenated in that order), returned in [`StepOutput::hidden`]: the
    /// target features of an EAGLE-3 head. Refused by a backend that cannot.
    fn record_hidden(&mut self, layers: &[usize]) -> anyhow::Result<()> {
        let _ = layers;
        bail!(
            "the {} backend cannot hand target hidden states to a draft method",
            self.pool().device
        )
    }
    /// The token embedding table on the host, `[vocab, hidden]`, where the backend holds
    /// one (an EAGLE-3 head without its own shares it).
    fn embedding_table(&self) -> Option<Arc<Matrix>> {
        None
    }
    /// The output projection on the host, where the backend holds one (an MTP layer
    /// without its own `shared_head.head` shares it).
    fn lm_head(&self) -> Option<Arc<Linear>> {
        None
    }
    /// Keeps a host tier of up to `bytes` below the pool, for prefix-cache blocks the pool
    /// reuses, and returns how many blocks it holds. Refused by a backend that cannot.
    fn keep_host_tier(&mut self, bytes: u64) -> anyhow::Result<u32> {
        let _ = bytes;
        bail!(
            "the {} backend keeps no host tier of KV blocks yet (kv_host_memory)",
            self.pool().device
        )
    }
    /// Blocks the host tier kept by [`ModelBackend::keep_host_tier`] holds (0: none).
    fn host_tier_slots(&self) -> u32 {
        0
    }
    /// Keeps a disk tier of up to `bytes` in `dir` below the pool (and the host tier), for
    /// prefix-cache blocks leaving memory, in the file of the model whose fingerprint is
    /// `model` ([`crate::kv_disk::model_fingerprint`]); the blocks it already holds come
    /// with [`ModelBackend::take_disk_tier`]. Refused by a backend that cannot.
    fn keep_disk_tier(
        &mut self,
        dir: &Path,
        bytes: u64,
        model: &ContentHash,
    ) -> anyhow::Result<()> {
        let _ = (dir, bytes, model);
        bail!(
            "the {} backend keeps no disk tier of KV blocks yet (kv_cache_dir)",
            self.pool().device
        )
    }
    /// The disk tier's slots, the checked blocks it held at start-up and where its failed
    /// reads are reported, once (later calls, and a backend without one, give `None`).
    fn take_disk_tier(&mut self) -> Option<DiskTierStart> {
        None
    }
    /// Makes the copies between the pool and the tiers below it that the KV allocator
    /// gave, in order, before the next forward, except that the loads into the pool may
    /// finish later (disk reads are queued to the disk tier's thread, in that order with
    /// its writes): every load is reported by [`ModelBackend::finish_loads`].
    fn move_kv(&mut self, moves: &[KvMove]) -> anyhow::Result<()> {
        if moves.is_empty() {
            return Ok(());
        }
        bail!(
            "the {} backend keeps no tier of KV blocks below its pool",
            self.pool().device
        )
    }
    /// The loads into the pool ([`KvMove::Load`], [`KvMove::DiskRead`]) finished since the
    /// last call, the finished disk reads copied into their pool blocks first (a block
    /// whose slot failed its checks is left as it was); with `wait`, waits for at least one
    /// while any is pending. The blocks belong to sequences the scheduler holds out of
    /// every step until it hears.
    fn finish_loads(&mut self, wait: bool) -> anyhow::Result<Vec<LoadDone>> {
        let _ = wait;
        Ok(Vec::new())
    }
    /// Captures the decode step for every size of `sizes`, replacing the graphs held (on
    /// failure the old ones stay); `None` drops every graph and runs eagerly. From then on
    /// a step replays a graph when it is pure decode (one new token and one logit row per
    /// sequence) and a captured size holds it, padding it up; any other step runs eagerly.
    /// Refused by a backend that cannot.
    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        let _ = sizes;
        bail!(
            "the {} backend cannot capture graphs; run with --enforce-eager",
            self.pool().device
        )
    }
}

/// [`ModelBackend::run`]: the step through the forward `input.wanted` names.
fn run_step<B: ModelBackend + ?Sized>(
    backend: &mut B,
    input: StepInput,
) -> anyhow::Result<StepOutput> {
    let fresh = match input.source {
        StepSource::Fresh {
            tokens,
            plan,
            logit_rows,
        } => Some((tokens, plan, logit_rows)),
        StepSource::Queued => None,
    };
    let (rows, queued_next) = match (input.wanted, fresh) {
        (Wanted::Argmax { next, masks }, _) => {
            let (ids, queued) = backend.greedy(input.source, next, masks)?;
            (RowOutputs::Argmax(ids), queued)
        }
        (Wanted::Sampled(sampling, masks), Some((tokens, plan, rows))) => {
            let sampled = backend.sampled(tokens, plan, rows, sampling, masks)?;
            (RowOutputs::Sampled(sampled), false)
        }
        (Wanted::Logits, Some((tokens, plan, rows))) => (
            RowOutputs::Logits(backend.logits(tokens, plan, rows)?),
            false,
        ),
        (_, None) => bail!("a step queued ahead gives back only its argmax"),
    };
    Ok(StepOutput {
        rows,
        queued_next,
        hidden: backend.take_hidden(),
    })
}

/// The drafts each of `groups` accepts (a sequence's logit rows, as indices into
/// `logit_rows` and `ids`: its last token, then its drafts), judged on the host: while the
/// argmax `ids` of the row before each draft is the draft (in `tokens`).
pub fn greedy_verdicts(
    ids: &[u32],
    tokens: &[u32],
    logit_rows: &[usize],
    groups: &[Range<usize>],
) -> Vec<usize> {
    groups
        .iter()
        .map(|g| {
            let drafts: Vec<u32> = (g.start + 1..g.end)
                .map(|i| tokens[logit_rows[i]])
                .collect();
            accept_greedy(&ids[g.clone()], &drafts).accepted
        })
        .collect()
}

/// The argmax of every row of host `logits` (`[rows, vocab]`) among the tokens its mask
/// of `masks` allows (the lowest id among ties, as [`argmax`]).
pub fn argmax_rows(
    logits: &[f32],
    vocab: usize,
    masks: &[Option<TokenMask>],
) -> anyhow::Result<Vec<u32>> {
    logits
        .chunks(vocab)
        .zip(masks.iter().chain(std::iter::repeat(&None)))
        .map(|(row, mask)| {
            let id = match mask {
                Some(mask) => argmax(&mask.applied(row)),
                None => argmax(row),
            };
            id.ok_or_else(|| anyhow::anyhow!("an empty logit row"))
        })
        .collect()
}

/// Samples every row of host `logits` (`[sampling.len(), vocab]`) among the tokens its
/// mask allows, with logprobs (of the unmasked row, as vLLM reports them) where asked.
pub fn sample_on_host(
    logits: &[f32],
    vocab: usize,
    sampling: &mut [RowSampling],
    masks: &[Option<TokenMask>],
) -> Vec<GeneratedToken> {
    logits
        .chunks(vocab)
        .zip(sampling)
        .zip(masks.iter().chain(std::iter::repeat(&None)))
        .map(|((row, s), mask)| {
            let id = match mask {
                Some(mask) => s.sampler.sample(&mask.applied(row), s.prompt, s.output),
                None => s.sampler.sample(row, s.prompt, s.output),
            };
            let logprobs = s.logprobs.and_then(|n| log_softmax(row, id, n));
            GeneratedToken { id, logprobs }
        })
        .collect()
}

/// How many blocks of `block_bytes` fit in `budget` bytes, refused when none does or when
/// their ids would not fit `u32`.
pub fn blocks_in(
    budget: u64,
    block_bytes: u64,
    block_size: usize,
    what: &str,
) -> anyhow::Result<u32> {
    let blocks = budget / block_bytes;
    if blocks == 0 {
        bail!(
            "{what} of {budget} bytes holds no KV block: one block of {block_size} tokens takes \
             {block_bytes} bytes"
        );
    }
    u32::try_from(blocks)
        .map_err(|_| anyhow::anyhow!("{what} makes {blocks} blocks, more than u32 block ids name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_verdicts_accept_each_draft_while_the_row_before_chose_it() {
        // Two sequences over logit rows 1..4 and 5..7 of a step of 8 tokens (row 0 and
        // row 4: another sequence's prompt): the first accepts its first draft (12, the
        // argmax after its row 1) and not its second; the second accepts both.
        let tokens = [9, 10, 12, 40, 7, 5, 30, 31];
        let logit_rows = [1, 2, 3, 5, 6, 7];
        let ids = [12, 41, 50, 30, 31, 77];
        let groups = [0..3, 3..6];
        assert_eq!(
            greedy_verdicts(&ids, &tokens, &logit_rows, &groups),
            vec![1, 2]
        );
        // A sequence without drafts accepts none.
        assert_eq!(
            greedy_verdicts(&ids, &tokens, &logit_rows, &[Range { start: 2, end: 3 }]),
            vec![0]
        );
    }
}

//! The typed messages between the actors. Data that crosses an actor boundary is plain
//! data: token ids, block ids, counts; never a handle to another actor's device memory.
//!
//! ```text
//! Gateway ──SchedulerMsg──> Scheduler ──AllocateStep──> KvAllocator
//!    ^                        │  ^  <──StepGrant──────────┘
//!    └──RequestEvent──────────┘  │
//!                    ScheduledBatch │ StepDone
//!                                v  │
//!                            TargetRunner        Scheduler ──Propose──> DraftProposer
//!                                                    ^ <──Drafts─────────────┘
//! ```
//! The scheduler sends one message per actor per step, whatever the number of requests.

use crate::graphs::CaptureSizes;
use crate::kv_disk::ContentHash;
use peregrine_config::MAX_SPECULATIVE_TOKENS;
use peregrine_models::draft_head::HandedDraft;
use peregrine_ops::sampling::{DraftDist, SamplingParams, TokenLogprobs};
use peregrine_structured::CompiledGrammar;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// Identifies a request inside the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// What a request asks for, validated and tokenized by the gateway.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSpec {
    pub prompt: Arc<[u32]>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    /// Tokens that end the request besides the model's end-of-sequence ids.
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Return the chosen token's logprob and this many top alternatives (None: no logprobs).
    pub logprobs: Option<usize>,
    /// Score the prompt: every prompt token's logprob given the tokens before it, with
    /// this many top alternatives (vLLM's `prompt_logprobs`; None: not scored). Such a
    /// request reads nothing from the prefix cache, so that every position is computed.
    pub prompt_logprobs: Option<usize>,
    /// Lower runs first (as vLLM); ties go to the earlier arrival.
    pub priority: i32,
    /// The grammar the output must match (structured output, an enforced tool call);
    /// `None`: free text.
    pub grammar: Option<Arc<CompiledGrammar>>,
}

/// A request as the scheduler receives it: what it asks for, its id, its arrival and the
/// channel its tokens go back on.
#[derive(Debug)]
pub struct GenerateRequest {
    pub id: RequestId,
    pub spec: RequestSpec,
    pub arrival: Instant,
    /// Where the request's tokens go. When the receiver is dropped (the client went
    /// away), the scheduler cancels the request and frees its blocks in its next step.
    pub events: mpsc::UnboundedSender<RequestEvent>,
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedToken {
    pub id: u32,
    pub logprobs: Option<TokenLogprobs>,
}

/// Token counts of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Speculative decoding: verification steps that carried drafts, draft tokens
    /// verified and draft tokens accepted (all 0 without speculation).
    pub num_drafts: usize,
    pub num_draft_tokens: usize,
    pub num_accepted_tokens: usize,
    /// Draft tokens accepted at each draft position (index 0: the first draft).
    pub accepted_per_position: [usize; MAX_SPECULATIVE_TOKENS],
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence or stop token, or a stop string the gateway found.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Cancelled: the client went away, or the server shut down.
    Abort,
    /// The engine failed while running it (a step failed or a runner thread died).
    Error,
}

impl FinishReason {
    /// The label used in responses and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}

/// Logprobs of consecutive prompt tokens, each given the tokens before it.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptLogprobs {
    pub id: RequestId,
    /// The position in the prompt of the token the first score is of (at least 1: the
    /// first token follows nothing).
    pub first: usize,
    /// One per token, in order: its logprob and rank, and the most likely tokens there.
    pub scores: Vec<TokenLogprobs>,
}

/// What the scheduler sends back about a request.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestEvent {
    /// Scores of the prompt's tokens (a request with `prompt_logprobs`), in order, each
    /// once, all before the first `Tokens`.
    PromptLogprobs(PromptLogprobs),
    /// Tokens generated this step, in order.
    Tokens(Vec<GeneratedToken>),
    /// The request ended; no event follows.
    Finished { reason: FinishReason, usage: Usage },
}

/// Why a submission was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the waiting queue is full ({limit} requests); retry later")]
    QueueFull { limit: usize },
    #[error("the prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the maximum model length of {max_model_len}")]
    TooLong {
        prompt: usize,
        max_tokens: usize,
        max_model_len: usize,
    },
    #[error("the prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds what the whole KV cache holds, {cache_tokens} tokens")]
    CacheTooSmall {
        prompt: usize,
        max_tokens: usize,
        cache_tokens: usize,
    },
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Limits the scheduler applies; hot-reloadable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerLimits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// The most requests waiting to start; one more gets `QueueFull`.
    pub max_waiting: usize,
    /// The most draft tokens verified per sequence and step, when a draft method runs.
    pub num_speculative_tokens: usize,
    /// Plan fewer drafts, or none, where measured step costs and acceptance say drafting
    /// does not pay (`scheduler::draft_control`); `false` always plans
    /// `num_speculative_tokens`.
    pub speculative_adaptive: bool,
}

/// Messages to the scheduler.
#[derive(Debug)]
pub enum SchedulerMsg {
    /// A new request; the reply says whether it was queued.
    Submit(GenerateRequest, oneshot::Sender<Result<(), SubmitError>>),
    /// End a request as `stop`: the gateway found one of its stop strings in the text.
    Stop(RequestId),
    /// New limits from a configuration reload.
    Reconfigure(SchedulerLimits, oneshot::Sender<()>),
    /// Stop accepting, let running requests finish until `deadline`, then cancel the rest;
    /// the reply comes once nothing is left.
    Drain {
        deadline: Instant,
        done: oneshot::Sender<()>,
    },
}

/// One sequence's work in a step. Its block table travels as a change to the one the
/// runner holds for it: the runner keeps the first `kept_blocks` and appends
/// `new_blocks`, so that a running sequence's step carries only the blocks it gained.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduledSeq {
    pub id: RequestId,
    /// Tokens to feed: a prompt chunk, a recompute after preemption, or the last token.
    pub tokens: Vec<u32>,
    /// Tokens already in the cache (computed earlier or found in the prefix cache).
    pub num_cached: usize,
    /// How many blocks of the table the runner holds for the sequence stay (0 the first
    /// time and after a preemption).
    pub kept_blocks: usize,
    /// The blocks after those: the table then covers `num_cached + tokens.len()`.
    pub new_blocks: Vec<u32>,
    /// Sample a token after this chunk (false for a prompt chunk that is not the last,
    /// and for a request of `max_tokens` 0).
    pub sample: bool,
    /// How many of the last `tokens` are draft tokens to verify (0: a plain chunk). The
    /// runner then takes logits at the last `num_drafts + 1` rows.
    pub num_drafts: usize,
    /// The distribution each draft was sampled from (`num_drafts` of them), for a sampled
    /// request's verification; `None` for greedy drafts.
    pub draft_dists: Option<Vec<DraftDist>>,
    /// Where each draft lies on the device, when the proposal left them there
    /// ([`Drafted::on_device`]): the last `num_drafts` of `tokens` are placeholders.
    pub drafts_on_device: Option<Vec<HandedDraft>>,
    /// Set the first time the runner sees the request (and again after a preemption it
    /// is not: the runner keeps the sampler state until the request is released).
    pub setup: Option<SamplingSetup>,
}

/// What the runner needs to sample for a request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingSetup {
    pub params: SamplingParams,
    pub prompt: Arc<[u32]>,
    pub logprobs: Option<usize>,
    /// Score the prompt's tokens, with this many alternatives each (`prompt_logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// The most tokens the request generates: the runner queues no step past its last.
    pub max_tokens: usize,
    /// The grammar its tokens must follow; the runner owns the request's matcher.
    pub grammar: Option<Arc<CompiledGrammar>>,
}

/// The scheduler's one message to the target runner per step.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduledBatch {
    pub step: u64,
    pub seqs: Vec<ScheduledSeq>,
    /// Requests that ended since the last step: the runner drops their sampler state.
    pub released: Vec<RequestId>,
    /// Copies between the pool and the tiers below it, in order: each is made before the
    /// forward, except the loads into the pool (from host memory or disk), which the
    /// backend may finish off the step's path and reports in [`StepDone::loads`]. A batch
    /// of no sequences only makes its moves and, while loads are pending, waits for one.
    pub kv_moves: Vec<KvMove>,
    /// Whether a greedy step may queue the step after it ahead: false where the scheduler
    /// expects that step to carry drafts, which would drop it.
    pub queue_ahead: bool,
}

/// What the runner produced for one sequence that asked for tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqOutput {
    pub id: RequestId,
    /// The accepted drafts, then the target's own token: at least one token.
    pub tokens: Vec<GeneratedToken>,
    /// Drafts the step verified for this sequence.
    pub num_drafts: usize,
    /// Drafts accepted (at most `tokens.len() - 1`: a constrained request's tokens end with
    /// those its grammar forced after the sampled one, which the next step computes).
    pub num_accepted: usize,
    /// Where the request's grammar stands after the step.
    pub grammar: GrammarStatus,
}

/// Where a constrained request's grammar stands after a step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum GrammarStatus {
    /// Unconstrained, or the grammar goes on.
    #[default]
    Open,
    /// The grammar is complete and consumed its end: the request stops.
    Complete,
    /// The grammar could not go on (llguidance's message): the request ends in error.
    Failed(String),
}

/// The runner's reply: the output of every sequence that asked for tokens, in batch
/// order.
#[derive(Clone, Debug, PartialEq)]
pub struct StepDone {
    pub step: u64,
    pub sampled: Vec<SeqOutput>,
    /// The target hidden states a draft method reads (EAGLE-3), of every row of every
    /// sequence this step fed, when the backend records them; empty otherwise.
    pub hidden: Vec<HiddenRows>,
    /// How the step the runner had queued ahead of this one served it.
    pub ahead: AheadUse,
    /// The prompt tokens this step scored, per sequence that asked (`prompt_logprobs`).
    pub prompt_logprobs: Vec<PromptLogprobs>,
    /// The loads into the pool ([`KvMove::Load`], [`KvMove::DiskRead`]) that finished
    /// since the runner's last reply.
    pub loads: Vec<LoadDone>,
}

/// A load into the pool the backend finished: pool block `block` now holds the block
/// loaded, or (`ok` false) its disk slot failed its checks and the block was left as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadDone {
    pub block: u32,
    pub ok: bool,
}

/// How the decode step a runner queued ahead (before the scheduler asked for it) served
/// the step that followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AheadUse {
    /// No step was queued ahead.
    None,
    /// It gave this many sequences their tokens.
    Served(usize),
    /// No sequence's next step was what it ran: its work was thrown away.
    Dropped,
}

/// One sequence's target hidden states for consecutive positions, handed from the target
/// runner to the draft proposer (through the scheduler) as plain data. Rows at positions
/// of drafts the target rejected are among them; the proposer drops those.
#[derive(Clone, Debug, PartialEq)]
pub struct HiddenRows {
    pub id: RequestId,
    /// The position of the first row.
    pub first_pos: usize,
    pub data: HiddenData,
}

/// Rows of recorded target hidden states: the values, or where on the device they wait.
#[derive(Clone, Debug, PartialEq)]
pub enum HiddenData {
    /// `[rows, width]` f32 on the host, row-major (the CPU backend).
    Host(Vec<f32>),
    /// Rows `first..first + rows` of the feature ring the CUDA backend stores them into,
    /// which an EAGLE-3 head on the same device gathers them from: numbers, not a handle.
    Ring { first: u64, rows: usize },
}

impl HiddenData {
    /// The number of rows, for rows of `width` values.
    pub fn rows(&self, width: usize) -> usize {
        match self {
            HiddenData::Host(values) => values.len() / width.max(1),
            HiddenData::Ring { rows, .. } => *rows,
        }
    }

    /// Rows `start..end` of these (each `width` values wide).
    pub fn slice(&self, start: usize, end: usize, width: usize) -> HiddenData {
        match self {
            HiddenData::Host(values) => {
                HiddenData::Host(values[start * width..end * width].to_vec())
            }
            HiddenData::Ring { first, .. } => HiddenData::Ring {
                first: first + start as u64,
                rows: end - start,
            },
        }
    }
}

/// Messages to the target runner (on its own thread), handled in order, so a capture runs
/// between two steps and no request in flight is dropped.
pub enum RunnerMsg {
    Step(ScheduledBatch, oneshot::Sender<anyhow::Result<StepDone>>),
    /// Capture graphs for these sizes, replacing the ones held (on failure they stay);
    /// `None` drops them all and runs eagerly.
    CaptureGraphs(Option<CaptureSizes>, oneshot::Sender<anyhow::Result<()>>),
}

/// A running sequence a draft method drafts for: the whole of it, as the draft proposer
/// holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProposeSeq {
    pub id: RequestId,
    /// Every token the sequence holds: its prompt, then its output.
    pub tokens: Vec<u32>,
    /// Its blocks, covering the drafts' positions too.
    pub block_table: Vec<u32>,
    /// The most drafts to propose.
    pub max_drafts: usize,
    /// How its drafts are drawn: `None` greedily.
    pub sampling: Option<DraftSampling>,
    /// It decodes, has room for drafts and was planned with none (drafting does not pay
    /// at this batch size): a method that follows the target's states may let them wait.
    pub drafts_paused: bool,
}

/// How a sampled request's drafts are drawn: from the drafter's distribution at the
/// request's temperature (a drafter that has one; the others draft greedily), with the
/// drafter's own random numbers, seeded from the request's seed where it has one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftSampling {
    pub temperature: f32,
    pub seed: Option<u64>,
}

/// One sequence's drafts as the drafter proposed them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Drafted {
    /// The draft tokens, in order.
    pub tokens: Vec<u32>,
    /// The distribution each draft was sampled from (`q` of verification), one per token;
    /// `None` for greedy drafts (a one-hot `q`).
    pub dists: Option<Vec<DraftDist>>,
    /// Where each draft lies on the device, for greedy drafts a chained proposal left
    /// there (CUDA): `tokens` then holds placeholders, and the runner feeds the
    /// verification the drafts themselves (and reads them back to judge them).
    pub on_device: Option<Vec<HandedDraft>>,
}

impl Drafted {
    /// Greedy drafts.
    pub fn greedy(tokens: Vec<u32>) -> Drafted {
        Drafted {
            tokens,
            dists: None,
            on_device: None,
        }
    }

    /// Greedy drafts left on the device at `places`, one a draft.
    pub fn on_device(places: Vec<HandedDraft>) -> Drafted {
        Drafted {
            tokens: vec![0; places.len()],
            dists: None,
            on_device: Some(places),
        }
    }

    /// Keeps the first `n` drafts (and their distributions or places).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        if let Some(dists) = &mut self.dists {
            dists.truncate(n);
        }
        if let Some(places) = &mut self.on_device {
            places.truncate(n);
        }
    }
}

/// A running sequence the draft proposer drafts for this step, as a change to what the
/// proposer holds of it (nothing the first time and after a preemption): it keeps the first
/// `kept_tokens` tokens and `kept_blocks` blocks and appends the new ones.
#[derive(Clone, Debug, PartialEq)]
pub struct ProposeDelta {
    pub id: RequestId,
    pub kept_tokens: usize,
    /// The tokens after those: the prompt's and the output's.
    pub new_tokens: Vec<u32>,
    pub kept_blocks: usize,
    /// The blocks after those: the table then covers the drafts' positions too.
    pub new_blocks: Vec<u32>,
    /// The most drafts to propose.
    pub max_drafts: usize,
    /// How its drafts are drawn: `None` greedily.
    pub sampling: Option<DraftSampling>,
    /// It decodes, has room for drafts and was planned with none (drafting does not pay
    /// at this batch size): a method that follows the target's states may let them wait.
    pub drafts_paused: bool,
}

/// The scheduler's one message to the draft proposer per step.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Propose {
    pub step: u64,
    pub seqs: Vec<ProposeDelta>,
    /// Requests that ended or were preempted since the last step: the proposer forgets
    /// their state (after taking `hidden`).
    pub released: Vec<RequestId>,
    /// The target hidden states of the steps since the last proposal, in step order.
    pub hidden: Vec<HiddenRows>,
}

/// The draft proposer's reply: per sequence of `Propose` with room for drafts, in order,
/// its drafts (possibly none). Sequences proposed with no room (prompt chunks, decodes
/// planned without drafts) are left out, so that their planned chunks stay.
#[derive(Clone, Debug, PartialEq)]
pub struct Drafts {
    pub step: u64,
    pub drafts: Vec<(RequestId, Drafted)>,
    /// The method also ran rows beyond those the last verifications added (EAGLE-3's step
    /// 0 catching up on rows that waited while drafts were paused, or on a prompt's): the
    /// step costs more than drafting at its batch size does.
    pub caught_up: bool,
}

/// Messages to the draft proposer (on its own thread), handled in order, so a capture runs
/// between two proposals.
pub enum ProposerMsg {
    Propose(Propose, oneshot::Sender<anyhow::Result<Drafts>>),
    /// Capture the draft's graphs for these sizes, replacing the ones held (on failure
    /// they stay); `None` drops them all and drafts eagerly.
    CaptureGraphs(Option<CaptureSizes>, oneshot::Sender<anyhow::Result<()>>),
}

/// A sequence the scheduler wants to start (or restart after preemption) this step.
#[derive(Clone, Debug, PartialEq)]
pub struct AdmitSeq {
    pub id: RequestId,
    /// Every token the sequence holds so far: the prompt, plus its generated tokens when it
    /// restarts after a preemption.
    pub tokens: Arc<[u32]>,
    /// It scores its prompt: it takes nothing from the prefix cache (every position is
    /// computed), and its chunk is also bounded by `AllocateStep::scoring_rows`.
    pub scores_prompt: bool,
}

/// A running sequence's need this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowSeq {
    pub id: RequestId,
    /// Tokens the sequence will hold in the cache after this step.
    pub tokens_after_step: usize,
}

/// Blocks a sequence has now filled in the cache, so that they can enter the prefix cache:
/// the tokens of its blocks from `first_block` on, whole blocks (the scheduler sends those
/// the allocator has not registered yet; blocks it has are skipped).
#[derive(Clone, Debug, PartialEq)]
pub struct ComputedSeq {
    pub id: RequestId,
    /// The block the first of `tokens` is in.
    pub first_block: usize,
    /// The tokens of the blocks from `first_block` on; a partial last block is left out.
    pub tokens: Vec<u32>,
}

/// The scheduler's one message to the KV allocator per step.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct AllocateStep {
    /// Sequences that ended: their blocks go back (cached blocks stay cached until evicted).
    pub free: Vec<RequestId>,
    /// Progress since the last step, for prefix caching.
    pub computed: Vec<ComputedSeq>,
    /// Running sequences, highest priority first. When blocks run out, the allocator
    /// preempts from the end of this list (freeing all its blocks) until the rest fit.
    pub grow: Vec<GrowSeq>,
    /// Sequences to start, in order. Each takes its cached prefix from the prefix cache and
    /// blocks for as much of the rest as `token_budget` allows; admission stops at the
    /// first that does not fit. Never preempts.
    pub admit: Vec<AdmitSeq>,
    /// Tokens this step may still compute for admitted sequences.
    pub token_budget: usize,
    /// The most tokens the admitted sequences that score their prompt may compute
    /// together: each such token is a logit row, of which a device step holds a bounded
    /// number (`None`: unbounded).
    pub scoring_rows: Option<usize>,
}

/// The KV allocator's reply to `AllocateStep`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct StepGrant {
    /// Block tables of the running sequences that kept their place, in `grow` order.
    pub grown: Vec<(RequestId, Vec<u32>)>,
    /// Running sequences preempted (their blocks freed), lowest priority first.
    pub preempted: Vec<RequestId>,
    /// Admitted sequences, in `admit` order (a prefix of it).
    pub admitted: Vec<AdmittedSeq>,
    /// Pool state after the step's allocation, for metrics.
    pub usage: KvUsage,
    /// Blocks to copy between the pool and the host tier before the next forward, in
    /// this order (a spill before the load that reuses its block).
    pub moves: Vec<KvMove>,
}

/// A copy of one KV block (every layer's keys and values) between the pool and a tier
/// below it (a slot of the host tier, a slot of the disk tier's file), which the backend
/// that owns the pool makes before its next forward, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvMove {
    /// Pool block `block` (about to be reused) into host slot `slot`.
    Spill { block: u32, slot: u32 },
    /// Host slot `slot` into pool block `block` (a prefix found in the tier).
    Load { slot: u32, block: u32 },
    /// The block in `from` (leaving memory) into disk slot `slot`, recorded as the block of
    /// `tokens` after the content chain `parent`.
    DiskWrite {
        from: KvSource,
        slot: u64,
        parent: ContentHash,
        tokens: Arc<[u32]>,
    },
    /// Disk slot `slot`, checked to hold the block ending the content chain `chain`, into
    /// pool block `block` (a prefix found on disk). A block that fails its checks is never
    /// copied: the move fails.
    DiskRead {
        slot: u64,
        chain: ContentHash,
        block: u32,
    },
}

/// Where a block written to disk is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSource {
    /// A pool block.
    Pool(u32),
    /// A host slot.
    Host(u32),
}

/// An admitted sequence's cache.
#[derive(Clone, Debug, PartialEq)]
pub struct AdmittedSeq {
    pub id: RequestId,
    /// Tokens found in the prefix cache (whole blocks, and never the last token).
    pub num_cached: usize,
    /// Tokens to compute this step (`num_cached + num_scheduled <= tokens.len()`).
    pub num_scheduled: usize,
    pub block_table: Vec<u32>,
}

/// The block pool's state.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct KvUsage {
    pub num_blocks: usize,
    /// Blocks owned by at least one sequence.
    pub used_blocks: usize,
    /// The largest block id owned by a sequence (the number to watch past 65,535).
    pub max_block_id_in_use: Option<u32>,
    /// Prefix-cache lookups (in tokens) and hits (tokens served from the cache), cumulative.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    /// Blocks holding a prefix-cache entry, owned or free.
    pub cached_blocks: usize,
    /// Prompt blocks found in the pool itself, cumulative (those found in the tiers below
    /// are `host_loaded` and `disk_read`).
    pub pool_hit_blocks: u64,
    /// Bytes of keys and values in one block over every layer (0 where unknown).
    pub block_bytes: u64,
    /// The host tier: blocks held, and blocks spilled into it, loaded back from it and
    /// dropped from it (cumulative); all 0 without one.
    pub host_blocks: usize,
    pub host_spilled: u64,
    pub host_loaded: u64,
    pub host_dropped: u64,
    /// The disk tier: blocks held, and blocks written to it, read back from it and dropped
    /// from it (cumulative).
    pub disk_blocks: usize,
    pub disk_written: u64,
    pub disk_read: u64,
    pub disk_dropped: u64,
}

/// Messages to the KV allocator.
#[derive(Debug)]
pub enum KvMsg {
    AllocateStep(AllocateStep, oneshot::Sender<StepGrant>),
}

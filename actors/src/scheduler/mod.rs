//! The Scheduler: owns the waiting and running queues and drives the engine one step at a
//! time. Each step it sends the KvAllocator one `AllocateStep` and the TargetRunner one
//! `ScheduledBatch`, then streams the sampled tokens to their requests.
//!
//! Policy: continuous batching under `max_num_seqs` and `max_num_batched_tokens`; running
//! decodes take the token budget first, then running prompt chunks, then new requests in
//! (priority, arrival) order, whose prompts are chunked to the budget that is left. When
//! blocks run out the lowest-priority running request is preempted and later recomputed
//! from its tokens; its sampler state stays with the runner, so its output is unchanged.
//!
//! With a draft proposer, each decoding request is planned (and given blocks) for its
//! last token plus up to `num_speculative_tokens` drafts; after the allocation the
//! proposer drafts for them, the target verifies, and the request advances by the
//! accepted drafts plus one. KV written at rejected positions is left behind the
//! sequence's length and overwritten next step; the blocks stay with the request.

mod seq;

use crate::draft::DraftProposerHandle;
use crate::health::EngineHealth;
use crate::kv_allocator::KvAllocatorHandle;
use crate::messages::{
    AdmitSeq, AllocateStep, ComputedSeq, FinishReason, GenerateRequest, GrowSeq, HiddenRows,
    KvUsage, Propose, ProposeSeq, RequestEvent, RequestId, SamplingSetup, ScheduledBatch,
    ScheduledSeq, SchedulerLimits, SchedulerMsg, StepDone, StepGrant, SubmitError,
};
use crate::metrics;
use crate::spec_stats::SpecStats;
use crate::target_runner::TargetRunnerHandle;
use seq::{Phase, Seq};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

/// Fixed facts about the model and the pool the scheduler plans for.
#[derive(Clone, Debug)]
pub struct SchedulerSetup {
    pub limits: SchedulerLimits,
    pub max_model_len: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    /// The model's end-of-sequence ids.
    pub eos_token_ids: Vec<u32>,
}

/// The scheduler's state.
pub struct Scheduler {
    setup: SchedulerSetup,
    kv: KvAllocatorHandle,
    runner: TargetRunnerHandle,
    proposer: Option<DraftProposerHandle>,
    seqs: HashMap<RequestId, Seq>,
    waiting: BTreeMap<(i32, u64), RequestId>,
    running: BTreeMap<(i32, u64), RequestId>,
    next_order: u64,
    step: u64,
    /// Ended since the last step: blocks to free, runner state to drop.
    to_free: Vec<RequestId>,
    to_release: Vec<RequestId>,
    /// Ended or preempted since the last proposal: the proposer forgets them.
    to_release_drafts: Vec<RequestId>,
    computed: Vec<ComputedSeq>,
    /// Target hidden states since the last proposal, for the proposer.
    hidden: Vec<HiddenRows>,
    spec: SpecStats,
    kv_seen: KvUsage,
    draining: Option<(Instant, oneshot::Sender<()>)>,
    /// Where each step's outcome goes, for `/health`.
    health: EngineHealth,
}

impl Scheduler {
    /// Starts the scheduler as a tokio task; returns the sender of its messages. Each
    /// step's outcome is recorded in `health`.
    pub fn spawn(
        setup: SchedulerSetup,
        kv: KvAllocatorHandle,
        runner: TargetRunnerHandle,
        proposer: Option<DraftProposerHandle>,
        health: EngineHealth,
    ) -> mpsc::Sender<SchedulerMsg> {
        let (tx, rx) = mpsc::channel(1024);
        let scheduler = Scheduler {
            setup,
            kv,
            runner,
            proposer,
            seqs: HashMap::new(),
            waiting: BTreeMap::new(),
            running: BTreeMap::new(),
            next_order: 0,
            step: 0,
            to_free: Vec::new(),
            to_release: Vec::new(),
            to_release_drafts: Vec::new(),
            computed: Vec::new(),
            hidden: Vec::new(),
            spec: SpecStats::new(),
            kv_seen: KvUsage::default(),
            draining: None,
            health,
        };
        tokio::spawn(scheduler.run(rx));
        tx
    }

    async fn run(mut self, mut inbox: mpsc::Receiver<SchedulerMsg>) {
        metrics::record_queues(0, 0);
        if self.proposer.is_some() {
            metrics::record_acceptance_alarm(false);
        }
        let idle = KvUsage {
            num_blocks: self.setup.num_blocks,
            ..KvUsage::default()
        };
        metrics::record_kv(&idle, &mut self.kv_seen);
        loop {
            if self.seqs.is_empty() {
                if let Err(e) = self.flush_frees().await {
                    warn!("kv allocator: {e:#}");
                }
                if let Some((_, done)) = self.draining.take() {
                    let _ = done.send(());
                    return;
                }
                match inbox.recv().await {
                    Some(msg) => self.handle(msg),
                    None => return,
                }
            }
            while let Ok(msg) = inbox.try_recv() {
                self.handle(msg);
            }
            self.cancel_disconnected();
            if let Some((deadline, _)) = &self.draining {
                if Instant::now() >= *deadline {
                    self.abort_all(FinishReason::Abort, "shutdown deadline reached");
                }
            }
            if self.seqs.is_empty() {
                continue;
            }
            match self.step().await {
                Ok(()) => self.health.step_succeeded(),
                Err(e) => {
                    warn!("engine step failed: {e:#}");
                    self.health.step_failed(format!("{e:#}"));
                    self.abort_all(FinishReason::Error, "engine step failed");
                }
            }
        }
    }

    fn handle(&mut self, msg: SchedulerMsg) {
        match msg {
            SchedulerMsg::Submit(req, reply) => {
                let _ = reply.send(self.submit(req));
            }
            SchedulerMsg::Stop(id) => self.finish(id, FinishReason::Stop),
            SchedulerMsg::Reconfigure(limits, reply) => {
                info!(?limits, "scheduler limits reloaded");
                self.setup.limits = limits;
                let _ = reply.send(());
            }
            SchedulerMsg::Drain { deadline, done } => {
                info!(
                    waiting = self.waiting.len(),
                    running = self.running.len(),
                    "draining"
                );
                self.draining = Some((deadline, done));
            }
        }
    }

    fn submit(&mut self, req: GenerateRequest) -> Result<(), SubmitError> {
        let s = &self.setup;
        if self.draining.is_some() {
            return Err(SubmitError::ShuttingDown);
        }
        let total = req.spec.prompt.len() + req.spec.max_tokens;
        if total > s.max_model_len {
            return Err(SubmitError::TooLong {
                prompt: req.spec.prompt.len(),
                max_tokens: req.spec.max_tokens,
                max_model_len: s.max_model_len,
            });
        }
        if total.div_ceil(s.block_size) > s.num_blocks {
            return Err(SubmitError::CacheTooSmall {
                prompt: req.spec.prompt.len(),
                max_tokens: req.spec.max_tokens,
                cache_tokens: s.num_blocks * s.block_size,
            });
        }
        if self.waiting.len() >= s.limits.max_waiting {
            return Err(SubmitError::QueueFull {
                limit: s.limits.max_waiting,
            });
        }
        let seq = Seq::new(req, self.next_order);
        self.next_order += 1;
        info!(request_id = %seq.req.id, prompt_tokens = seq.tokens.len(), "queued");
        self.waiting.insert(seq.key(), seq.req.id);
        self.seqs.insert(seq.req.id, seq);
        metrics::record_queues(self.running.len(), self.waiting.len());
        Ok(())
    }

    /// Ends a request: tells its client, frees its blocks and its runner state.
    fn finish(&mut self, id: RequestId, reason: FinishReason) {
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        match seq.phase {
            Phase::Waiting => self.waiting.remove(&seq.key()),
            Phase::Running => self.running.remove(&seq.key()),
        };
        self.to_free.push(id);
        self.to_release_drafts.push(id);
        if seq.setup_sent {
            self.to_release.push(id);
        }
        let usage = seq.usage();
        seq.send(RequestEvent::Finished { reason, usage });
        metrics::record_finish(reason, usage.prompt_tokens, seq.req.arrival.elapsed());
        info!(request_id = %id, reason = reason.as_str(), completion_tokens = usage.completion_tokens, "finished");
    }

    /// Ends every request with `reason`.
    fn abort_all(&mut self, reason: FinishReason, why: &str) {
        let ids: Vec<RequestId> = self.seqs.keys().copied().collect();
        if !ids.is_empty() {
            warn!(requests = ids.len(), "aborting: {why}");
        }
        for id in ids {
            self.finish(id, reason);
        }
    }

    /// Requests whose client went away are cancelled before the step is planned, so their
    /// blocks are freed in this step's allocation.
    fn cancel_disconnected(&mut self) {
        let gone: Vec<RequestId> = self
            .seqs
            .values()
            .filter(|s| s.req.events.is_closed())
            .map(|s| s.req.id)
            .collect();
        for id in gone {
            info!(request_id = %id, "client disconnected");
            self.finish(id, FinishReason::Abort);
        }
    }

    /// Gives freed blocks back when there is no step to carry them, so that the KV
    /// metrics return to their idle values.
    async fn flush_frees(&mut self) -> anyhow::Result<()> {
        if self.to_free.is_empty() {
            return Ok(());
        }
        let step = AllocateStep {
            free: std::mem::take(&mut self.to_free),
            computed: std::mem::take(&mut self.computed),
            ..AllocateStep::default()
        };
        let grant = self.kv.allocate_step(step).await?;
        metrics::record_kv(&grant.usage, &mut self.kv_seen);
        metrics::record_queues(self.running.len(), self.waiting.len());
        Ok(())
    }

    async fn step(&mut self) -> anyhow::Result<()> {
        let request = self.plan_allocation();
        let grant = self.kv.allocate_step(request).await?;
        self.apply_grant(&grant);
        metrics::record_kv(&grant.usage, &mut self.kv_seen);
        metrics::record_queues(self.running.len(), self.waiting.len());
        self.propose().await?;
        let batch = self.build_batch();
        if batch.seqs.is_empty() {
            tokio::task::yield_now().await;
            return Ok(());
        }
        let done = self.runner.step(batch).await?;
        self.apply_results(done);
        Ok(())
    }

    /// Decides each running request's chunk (decodes first) and asks for blocks for them
    /// and for the waiting requests that may start.
    fn plan_allocation(&mut self) -> AllocateStep {
        let mut budget = self.setup.limits.max_num_batched_tokens;
        let order: Vec<RequestId> = self.running.values().copied().collect();
        for decode_pass in [true, false] {
            for id in &order {
                let seq = self.seqs.get_mut(id).expect("running request");
                if (seq.remaining() == 1) == decode_pass {
                    let drafts = if decode_pass && self.proposer.is_some() {
                        let left = seq.req.spec.max_tokens.saturating_sub(seq.output_len() + 1);
                        self.setup.limits.num_speculative_tokens.min(left)
                    } else {
                        0
                    };
                    seq.chunk = (seq.remaining() + drafts).min(budget);
                    seq.drafts.clear();
                    budget -= seq.chunk;
                }
            }
        }
        let grow = order
            .iter()
            .map(|id| {
                let seq = &self.seqs[id];
                GrowSeq {
                    id: *id,
                    tokens_after_step: seq.num_computed + seq.chunk,
                }
            })
            .collect();
        let free_slots = self
            .setup
            .limits
            .max_num_seqs
            .saturating_sub(self.running.len());
        let admit = self
            .waiting
            .values()
            .take(if budget == 0 { 0 } else { free_slots })
            .map(|id| AdmitSeq {
                id: *id,
                tokens: Arc::from(self.seqs[id].tokens.as_slice()),
            })
            .collect();
        AllocateStep {
            free: std::mem::take(&mut self.to_free),
            computed: std::mem::take(&mut self.computed),
            grow,
            admit,
            token_budget: budget,
        }
    }

    fn apply_grant(&mut self, grant: &StepGrant) {
        for (id, table) in &grant.grown {
            if let Some(seq) = self.seqs.get_mut(id) {
                seq.block_table.clone_from(table);
            }
        }
        for id in &grant.preempted {
            let Some(seq) = self.seqs.get_mut(id) else {
                continue;
            };
            self.running.remove(&seq.key());
            seq.phase = Phase::Waiting;
            seq.num_computed = 0;
            seq.chunk = 0;
            seq.drafts.clear();
            seq.block_table.clear();
            self.to_release_drafts.push(*id);
            self.waiting.insert(seq.key(), *id);
            metrics::record_preemption();
            info!(request_id = %id, tokens = seq.tokens.len(), "preempted; will recompute");
        }
        for admitted in &grant.admitted {
            let Some(seq) = self.seqs.get_mut(&admitted.id) else {
                continue;
            };
            self.waiting.remove(&seq.key());
            self.running.insert(seq.key(), admitted.id);
            seq.phase = Phase::Running;
            seq.num_computed = admitted.num_cached;
            seq.chunk = admitted.num_scheduled;
            seq.block_table.clone_from(&admitted.block_table);
            if seq.cached_tokens.is_none() {
                seq.cached_tokens = Some(admitted.num_cached);
                metrics::record_queue_time(seq.req.arrival.elapsed());
            }
        }
    }

    /// Asks the proposer for the drafts of every decoding request planned with room for
    /// them; each request's chunk shrinks to its last token plus the drafts it got.
    async fn propose(&mut self) -> anyhow::Result<()> {
        let Some(proposer) = &self.proposer else {
            self.to_release_drafts.clear();
            self.hidden.clear();
            return Ok(());
        };
        let seqs: Vec<ProposeSeq> = self
            .running
            .values()
            .map(|id| &self.seqs[id])
            .filter(|s| s.remaining() == 1 && s.chunk > 1)
            .map(|s| ProposeSeq {
                id: s.req.id,
                tokens: Arc::from(s.tokens.as_slice()),
                block_table: s.block_table.clone(),
                max_drafts: s.chunk - 1,
            })
            .collect();
        if seqs.is_empty() && self.to_release_drafts.is_empty() && self.hidden.is_empty() {
            return Ok(());
        }
        let propose = Propose {
            step: self.step + 1,
            seqs,
            released: std::mem::take(&mut self.to_release_drafts),
            hidden: std::mem::take(&mut self.hidden),
        };
        let drafts = proposer.propose(propose).await?;
        for (id, drafts) in drafts.drafts {
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.chunk = 1 + drafts.len().min(seq.chunk - 1);
                seq.drafts = drafts;
                seq.drafts.truncate(seq.chunk - 1);
            }
        }
        Ok(())
    }

    fn build_batch(&mut self) -> ScheduledBatch {
        self.step += 1;
        let mut seqs = Vec::new();
        for id in self.running.values() {
            let seq = self.seqs.get_mut(id).expect("running request");
            if seq.chunk == 0 {
                continue;
            }
            let start = seq.num_computed;
            let setup = (!seq.setup_sent).then(|| SamplingSetup {
                params: seq.req.spec.params.clone(),
                prompt: seq.req.spec.prompt.clone(),
                logprobs: seq.req.spec.logprobs,
                max_tokens: seq.req.spec.max_tokens,
            });
            seq.setup_sent = true;
            let fed = seq.chunk - seq.drafts.len();
            let mut tokens = seq.tokens[start..start + fed].to_vec();
            tokens.extend_from_slice(&seq.drafts);
            seqs.push(ScheduledSeq {
                id: *id,
                tokens,
                num_cached: start,
                block_table: seq.block_table.clone(),
                sample: start + fed == seq.tokens.len(),
                num_drafts: seq.drafts.len(),
                setup,
            });
        }
        ScheduledBatch {
            step: self.step,
            seqs,
            released: std::mem::take(&mut self.to_release),
        }
    }

    /// Appends each request's new tokens (up to its first stop), advances what is in the
    /// cache by the tokens fed minus the rejected drafts, and ends finished requests.
    fn apply_results(&mut self, mut done: StepDone) {
        metrics::record_ahead(done.ahead);
        if self.proposer.is_some() {
            self.hidden.append(&mut done.hidden);
        }
        let mut ended = Vec::new();
        let mut rejected: HashMap<RequestId, usize> = HashMap::new();
        for out in done.sampled {
            if out.num_drafts > 0 {
                self.spec
                    .record(out.num_drafts, out.num_accepted, &self.kv_seen);
            }
            rejected.insert(out.id, out.num_drafts - out.num_accepted);
            let Some(seq) = self.seqs.get_mut(&out.id) else {
                continue;
            };
            if out.num_drafts > 0 {
                seq.spec[0] += 1;
                seq.spec[1] += out.num_drafts;
                seq.spec[2] += out.num_accepted;
            }
            let mut tokens = Vec::with_capacity(out.tokens.len());
            let mut reason = None;
            for token in out.tokens {
                let now = Instant::now();
                let first = seq.last_token_at.is_none();
                let since = now - seq.last_token_at.unwrap_or(seq.req.arrival);
                seq.last_token_at = Some(now);
                metrics::record_token(first, since);
                seq.tokens.push(token.id);
                let stop = seq.req.spec.stop_token_ids.contains(&token.id)
                    || (!seq.req.spec.ignore_eos && self.setup.eos_token_ids.contains(&token.id));
                tokens.push(token);
                if stop {
                    reason = Some(FinishReason::Stop);
                } else if seq.output_len() >= seq.req.spec.max_tokens {
                    reason = Some(FinishReason::Length);
                }
                if reason.is_some() {
                    break;
                }
            }
            if !seq.send(RequestEvent::Tokens(tokens)) {
                reason = Some(FinishReason::Abort);
            }
            if let Some(reason) = reason {
                ended.push((out.id, reason));
            }
        }
        let bs = self.setup.block_size;
        for seq in self.seqs.values_mut().filter(|s| s.chunk > 0) {
            let before = seq.num_computed / bs;
            let fed = std::mem::take(&mut seq.chunk) - rejected.get(&seq.req.id).unwrap_or(&0);
            seq.num_computed = (seq.num_computed + fed).min(seq.tokens.len());
            seq.drafts.clear();
            if seq.num_computed / bs > before {
                self.computed.push(ComputedSeq {
                    id: seq.req.id,
                    tokens: Arc::from(&seq.tokens[..seq.num_computed]),
                    num_computed: seq.num_computed,
                });
            }
        }
        for (id, reason) in ended {
            self.finish(id, reason);
        }
    }
}

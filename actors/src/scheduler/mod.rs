//! The Scheduler: owns the waiting and running queues and drives the engine one step at a
//! time. Each step it sends the KvAllocator one `AllocateStep`, the DraftProposer (when
//! speculating) one `Propose` and the TargetRunner one `ScheduledBatch`, then streams the
//! sampled tokens to their requests.
//!
//! A step is one value passed along ([`Scheduler::step`]): the policy's [`Schedule`]
//! (`policy.rs`, a plain function of the queues), the [`StepPlan`] the KV allocator's grant
//! makes of it, narrowed by the drafts, and the `StepDone` applied to the queues
//! (`queues.rs`). When blocks run out the lowest-priority running request is preempted and
//! later recomputed from its tokens; its sampler state stays with the runner, so its output
//! is unchanged.
//!
//! With a draft proposer, each decoding request is planned (and given blocks) for its
//! last token plus up to `num_speculative_tokens` drafts; after the allocation the
//! proposer drafts for them, the target verifies, and the request advances by the
//! accepted drafts plus one. KV written at rejected positions is left behind the
//! sequence's length and overwritten next step; the blocks stay with the request.
//!
//! At trace level for this module (`--log-level info,peregrine_actors::scheduler=trace`)
//! each step is logged as `step requests=N planned=K only_decodes= caught_up= accepted=
//! ahead= allocate_us= propose_us= forward_us= total_us=` (`ahead`: how the step queued
//! before it served it), and each plan of the draft controller
//! as `draft plan` (`draft_control.rs`): what adaptive drafting saw and chose, step by
//! step.

mod draft_control;
mod plan;
mod policy;
mod queues;
mod seq;
pub mod spec;
#[cfg(test)]
mod tests;
mod tier_loads;

use crate::draft::{DraftProposerHandle, ProposalReply};
use crate::health::EngineHealth;
use crate::kv_allocator::KvAllocatorHandle;
use crate::messages::{
    AllocateStep, ComputedSeq, FinishReason, GenerateRequest, HiddenRows, KvMove, KvUsage, Propose,
    RequestEvent, RequestId, SchedulerLimits, SchedulerMsg, SubmitError,
};
use crate::metrics;
use crate::scheduler::spec::stats::SpecStats;
use crate::target_runner::TargetRunnerHandle;
use draft_control::{size_class, size_class_label, DecodeStep, DraftControl};
use plan::StepPlan;
use policy::schedule;
use queues::{Queues, SubmitLimits};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, trace, warn};

/// Fixed facts about the model and the pool the scheduler plans for.
#[derive(Clone, Debug)]
pub struct SchedulerSetup {
    pub limits: SchedulerLimits,
    pub max_model_len: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    /// The model's end-of-sequence ids.
    pub eos_token_ids: Vec<u32>,
    /// Bytes one block takes in each K or V tensor of the draft's layer, when a draft
    /// method with KV says (the band alarm's byte-offset bands).
    pub draft_kv_bytes_per_block: Option<u64>,
    /// The most logit rows the backend gives back of one step, where it is bounded (a
    /// GPU's buffers): the prompt chunks of requests that score their prompt stay within.
    pub max_logit_rows: Option<usize>,
}

/// What the next messages carry of the steps since they were last sent: the requests that
/// ended or were preempted, and the progress and hidden states the other actors need.
#[derive(Default)]
struct Pending {
    /// Ended: their blocks go back with the next `AllocateStep`.
    free: Vec<RequestId>,
    /// Cached tokens that filled blocks, for the next `AllocateStep`'s prefix cache.
    computed: Vec<ComputedSeq>,
    /// Ended with sampling state in the runner: dropped with the next `ScheduledBatch`.
    runner_release: Vec<RequestId>,
    /// Ended or preempted: the proposer forgets them with the next `Propose`.
    draft_release: Vec<RequestId>,
    /// Target hidden states since the last proposal, for the next `Propose`.
    hidden: Vec<HiddenRows>,
    /// Copies between the pool and the tiers below it, for the next `ScheduledBatch` (made
    /// before its forward, which may write into the blocks they empty; loads finish
    /// later, while their requests are held: `tier_loads.rs`).
    kv_moves: Vec<KvMove>,
    /// The last proposal, when it asked no drafts: it runs on the proposer's thread beside
    /// the step, and is waited for before the next one is sent.
    unanswered: Option<ProposalReply>,
}

/// The scheduler's state.
pub struct Scheduler {
    setup: SchedulerSetup,
    kv: KvAllocatorHandle,
    runner: TargetRunnerHandle,
    proposer: Option<DraftProposerHandle>,
    queues: Queues,
    pending: Pending,
    step: u64,
    spec: SpecStats,
    /// How many drafts each decode is planned for.
    drafts: DraftControl,
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
        let limits = setup.limits;
        let scheduler = Scheduler {
            queues: Queues::new(setup.block_size),
            spec: SpecStats::new(setup.num_blocks, setup.draft_kv_bytes_per_block),
            drafts: DraftControl::new(limits.num_speculative_tokens, limits.speculative_adaptive),
            setup,
            kv,
            runner,
            proposer,
            pending: Pending::default(),
            step: 0,
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
            // Ended requests' frees may wait on loads that a step collects.
            let idle = self.queues.is_empty() && !self.queues.loads_pending();
            if idle {
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
            for id in self.queues.disconnected() {
                info!(request_id = %id, "client disconnected");
                self.finish(id, FinishReason::Abort);
            }
            if let Some((deadline, _)) = &self.draining {
                if Instant::now() >= *deadline {
                    self.abort_all(FinishReason::Abort, "shutdown deadline reached");
                }
            }
            if self.queues.is_empty() && !self.queues.loads_pending() {
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
                self.drafts
                    .reconfigure(limits.num_speculative_tokens, limits.speculative_adaptive);
                self.setup.limits = limits;
                let _ = reply.send(());
            }
            SchedulerMsg::Drain { deadline, done } => {
                let (running, waiting) = self.queues.lengths();
                info!(waiting, running, "draining");
                self.draining = Some((deadline, done));
            }
        }
    }

    fn submit(&mut self, req: GenerateRequest) -> Result<(), SubmitError> {
        if self.draining.is_some() {
            return Err(SubmitError::ShuttingDown);
        }
        let limits = SubmitLimits {
            max_model_len: self.setup.max_model_len,
            num_blocks: self.setup.num_blocks,
            max_waiting: self.setup.limits.max_waiting,
        };
        self.queues.submit(req, &limits)?;
        self.record_queues();
        Ok(())
    }

    /// Ends a request: tells its client, frees its blocks and its runner state.
    fn finish(&mut self, id: RequestId, reason: FinishReason) {
        let Some(seq) = self.queues.remove(id) else {
            return;
        };
        if self.queues.free_now(&seq) {
            self.pending.free.push(id);
        }
        self.pending.draft_release.push(id);
        if seq.setup_sent {
            self.pending.runner_release.push(id);
        }
        let usage = seq.usage();
        // Counted before the client hears of it, so /metrics never lags what a client saw.
        metrics::record_finish(reason, usage.prompt_tokens, seq.req.arrival.elapsed());
        seq.send(RequestEvent::Finished { reason, usage });
        info!(request_id = %id, reason = reason.as_str(), completion_tokens = usage.completion_tokens, "finished");
    }

    /// Ends every request with `reason`.
    fn abort_all(&mut self, reason: FinishReason, why: &str) {
        let ids = self.queues.ids();
        if !ids.is_empty() {
            warn!(requests = ids.len(), "aborting: {why}");
        }
        for id in ids {
            self.finish(id, reason);
        }
    }

    fn record_queues(&self) {
        let (running, waiting) = self.queues.lengths();
        metrics::record_queues(running, waiting);
    }

    /// Gives freed blocks back when there is no step to carry them, so that the KV
    /// metrics return to their idle values.
    async fn flush_frees(&mut self) -> anyhow::Result<()> {
        if self.pending.free.is_empty() {
            return Ok(());
        }
        let step = AllocateStep {
            free: std::mem::take(&mut self.pending.free),
            computed: std::mem::take(&mut self.pending.computed),
            ..AllocateStep::default()
        };
        let grant = self.kv.allocate_step(step).await?;
        metrics::record_kv(&grant.usage, &mut self.kv_seen);
        self.record_queues();
        Ok(())
    }

    /// One step: the policy's schedule, the KV allocator's grant, the drafts, the target's
    /// forward, and its results applied.
    async fn step(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let planned = match self.proposer {
            Some(_) => {
                let decoding = self.queues.running().filter(|s| s.is_decoding()).count();
                self.drafts.plan(decoding)
            }
            None => 0,
        };
        let limits = &self.setup.limits;
        let schedule = schedule(&self.queues, limits, planned, self.setup.max_logit_rows);
        let (grow, admit) = self.queues.allocation(&schedule);
        let request = AllocateStep {
            free: std::mem::take(&mut self.pending.free),
            computed: std::mem::take(&mut self.pending.computed),
            grow,
            admit,
            token_budget: schedule.token_budget,
            scoring_rows: schedule.scoring_rows,
        };
        let mut times = metrics::StepTimes::default();
        let allocating = Instant::now();
        let grant = self.kv.allocate_step(request).await?;
        times.allocate = allocating.elapsed();
        self.pending.kv_moves.extend_from_slice(&grant.moves);
        self.queues.start_loads(&grant.moves);
        let (plan, preempted) = self.queues.apply_grant(schedule, &grant);
        self.pending.draft_release.extend(preempted);
        metrics::record_kv(&grant.usage, &mut self.kv_seen);
        self.record_queues();
        let proposing = Instant::now();
        let (plan, caught_up) = self.propose(plan).await?;
        times.propose = proposing.elapsed();
        // With every running request held for a load, the batch carries no sequence: the
        // runner makes the moves and waits for a load.
        if plan.is_empty() && self.pending.kv_moves.is_empty() && !self.queues.loads_pending() {
            tokio::task::yield_now().await;
            return Ok(());
        }
        self.step += 1;
        let (decoding, only_decodes) = self.queues.decodes(&plan);
        let released = std::mem::take(&mut self.pending.runner_release);
        let moves = std::mem::take(&mut self.pending.kv_moves);
        let mut batch = self.queues.batch(&plan, self.step, released, moves);
        batch.queue_ahead = self.proposer.is_none() || !self.drafts.expects_drafts_next(decoding);
        let forwarding = Instant::now();
        let mut done = self.runner.step(batch).await?;
        times.forward = forwarding.elapsed();
        let ahead = done.ahead;
        metrics::record_ahead(ahead);
        if self.proposer.is_some() {
            self.pending.hidden.append(&mut done.hidden);
        }
        let waited = plan.is_empty() && done.loads.is_empty();
        let load_frees = self.queues.finish_loads(&done.loads);
        self.pending.free.extend(load_frees);
        if waited {
            // The runner waits for a load while any is pending: none will come.
            let given_up = self.queues.abandon_loads();
            self.pending.free.extend(given_up);
        }
        let applied = self
            .queues
            .apply_done(&plan, done, &self.setup.eos_token_ids);
        let accepted: Vec<usize> = applied.verified.iter().map(|v| v.1).collect();
        if self.proposer.is_some() && decoding > 0 {
            self.drafts.record(&DecodeStep {
                requests: decoding,
                planned,
                elapsed: only_decodes.then(|| started.elapsed()),
                caught_up,
                accepted: &accepted,
            });
            metrics::record_planned_drafts(&size_class_label(size_class(decoding)), planned);
        }
        for (drafts, accepted, place) in applied.verified {
            self.spec.record(drafts, accepted, place, &self.kv_seen);
        }
        self.spec.end_step(&self.kv_seen);
        self.pending.computed.extend(applied.computed);
        for (id, reason) in applied.ended {
            self.finish(id, reason);
        }
        times.total = started.elapsed();
        metrics::record_step_times(&times);
        trace!(
            requests = decoding,
            planned,
            only_decodes,
            caught_up,
            accepted = accepted.iter().sum::<usize>(),
            ?ahead,
            allocate_us = times.allocate.as_micros() as u64,
            propose_us = times.propose.as_micros() as u64,
            forward_us = times.forward.as_micros() as u64,
            total_us = times.total.as_micros() as u64,
            "step"
        );
        Ok(())
    }

    /// Sends the proposer every planned request (prompt chunks and decodes without room
    /// too: EAGLE-3 takes in their hidden states) and asks drafts of the decodes with room;
    /// their chunks shrink to the drafts each got. A proposal that asks no drafts is not
    /// waited for: the proposer takes in the states beside the step (on the GPU the step
    /// queues at once), and its reply is waited for before the next proposal is sent, so
    /// that one proposal at most runs beside the target. Also says whether the proposer
    /// caught up on rows that waited while drafts were paused
    /// ([`crate::messages::Drafts::caught_up`]), in this proposal or the one before it.
    async fn propose(&mut self, plan: StepPlan) -> anyhow::Result<(StepPlan, bool)> {
        let Some(proposer) = &self.proposer else {
            self.pending.draft_release.clear();
            return Ok((plan, false));
        };
        let pending = &mut self.pending;
        let caught_up_before = match pending.unanswered.take() {
            Some(reply) => {
                let answered = reply.wait().await?;
                anyhow::ensure!(
                    answered.drafts.is_empty(),
                    "the draft proposer drafted for a proposal that asked none"
                );
                answered.caught_up
            }
            None => false,
        };
        let seqs = self.queues.proposals(&plan);
        if seqs.is_empty() && pending.draft_release.is_empty() && pending.hidden.is_empty() {
            return Ok((plan, caught_up_before));
        }
        let asks_drafts = seqs.iter().any(|s| s.max_drafts > 0);
        let propose = Propose {
            step: self.step + 1,
            seqs,
            released: std::mem::take(&mut pending.draft_release),
            hidden: std::mem::take(&mut pending.hidden),
        };
        let reply = proposer.send(propose)?;
        if !asks_drafts {
            pending.unanswered = Some(reply);
            return Ok((plan, caught_up_before));
        }
        let drafts = reply.wait().await?;
        Ok((
            plan.with_drafts(drafts.drafts),
            drafts.caught_up || caught_up_before,
        ))
    }
}

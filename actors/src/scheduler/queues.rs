//! The scheduler's requests and the transitions of one step over them, as plain functions
//! of the state and the messages (no channels, no engine): submitting, the KV allocator's
//! grant applied to a [`Schedule`], the batch and the proposal a [`StepPlan`] makes, and a
//! `StepDone` applied.

use super::plan::{PlannedSeq, Schedule, StepPlan};
use super::seq::{Phase, Seq};
use super::tier_loads::PendingLoads;
use crate::messages::{
    AdmitSeq, ComputedSeq, DraftSampling, FinishReason, GenerateRequest, GrammarStatus, GrowSeq,
    KvMove, LoadDone, ProposeDelta, RequestEvent, RequestId, SamplingSetup, ScheduledBatch,
    ScheduledSeq, StepDone, StepGrant, SubmitError,
};
use crate::metrics;
use crate::scheduler::spec::stats::Place;
use peregrine_ops::sampling::SamplingParams;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;
use tracing::{info, warn};

/// What bounds a submission: the model's context, the pool, and the waiting queue.
#[derive(Clone, Copy, Debug)]
pub struct SubmitLimits {
    pub max_model_len: usize,
    pub num_blocks: usize,
    /// The most requests waiting to start.
    pub max_waiting: usize,
}

/// Every request the scheduler holds, and the waiting and running queues in (priority,
/// arrival) order, over KV blocks of `block_size` tokens.
pub struct Queues {
    block_size: usize,
    seqs: HashMap<RequestId, Seq>,
    waiting: BTreeMap<(i32, u64), RequestId>,
    running: BTreeMap<(i32, u64), RequestId>,
    next_order: u64,
    /// The loads from the tiers the running sequences wait on.
    loads: PendingLoads,
}

/// What applying a step's results did.
#[derive(Debug, Default, PartialEq)]
pub struct Applied {
    /// Requests that ended with the step, and why.
    pub ended: Vec<(RequestId, FinishReason)>,
    /// Sequences whose cached tokens filled a new block, for the prefix cache.
    pub computed: Vec<ComputedSeq>,
    /// Each verification with drafts: (drafts, accepted, where the request's KV lives).
    pub verified: Vec<(usize, usize, Place)>,
}

impl Queues {
    /// No requests, over KV blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> Queues {
        Queues {
            block_size,
            seqs: HashMap::new(),
            waiting: BTreeMap::new(),
            running: BTreeMap::new(),
            next_order: 0,
            loads: PendingLoads::default(),
        }
    }

    /// Whether no request is held.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The request `id`.
    pub fn get(&self, id: RequestId) -> Option<&Seq> {
        self.seqs.get(&id)
    }

    /// Requests running (holding blocks) and waiting.
    pub fn lengths(&self) -> (usize, usize) {
        (self.running.len(), self.waiting.len())
    }

    /// Every request's id.
    pub fn ids(&self) -> Vec<RequestId> {
        self.seqs.keys().copied().collect()
    }

    /// The running requests, highest priority first.
    pub fn running(&self) -> impl Iterator<Item = &Seq> + '_ {
        self.running.values().map(|id| &self.seqs[id])
    }

    /// The running requests a step may compute, highest priority first: those not held
    /// for a load from a tier (`tier_loads.rs`).
    pub fn schedulable(&self) -> impl Iterator<Item = &Seq> + '_ {
        self.running().filter(|seq| !self.is_held(seq))
    }

    /// Whether `seq` waits on a load into one of its blocks.
    pub fn is_held(&self, seq: &Seq) -> bool {
        seq.read_failed || self.loads.holds(&seq.block_table)
    }

    /// Whether a load is pending, or a free waits for one.
    pub fn loads_pending(&self) -> bool {
        self.loads.any()
    }

    /// Notes the loads a grant's `moves` start; call before applying the grant, so that
    /// the sequences admitted onto those blocks are held.
    pub fn start_loads(&mut self, moves: &[KvMove]) {
        self.loads.start(moves);
    }

    /// Whether ended request `seq`'s blocks may go back now; otherwise they go once no
    /// load into them is pending (from [`Queues::finish_loads`]).
    pub fn free_now(&mut self, seq: &Seq) -> bool {
        self.loads.free_now(seq.req.id, &seq.block_table)
    }

    /// Takes the runner's report of finished loads in. A sequence holding a block whose
    /// disk read failed is sent back to wait (to be admitted again, missing that block)
    /// once no load into its blocks is pending. Returns the requests whose blocks go back
    /// now: those sent back, and ended ones whose free waited.
    pub fn finish_loads(&mut self, loads: &[LoadDone]) -> Vec<RequestId> {
        // Nothing a report did not change can have changed.
        if loads.is_empty() {
            return Vec::new();
        }
        let mut free = self.loads.finish(loads);
        let running: Vec<RequestId> = self.running.values().copied().collect();
        for id in running {
            let seq = self.seqs.get_mut(&id).expect("a running request");
            if let Some(at) = self.loads.first_failed(&seq.block_table) {
                seq.read_failed = true;
                // Only the blocks before it came from the cache.
                let served = at * self.block_size;
                seq.cached_tokens = seq.cached_tokens.map(|c| c.min(served));
            }
            if !seq.read_failed || self.loads.holds(&seq.block_table) {
                continue;
            }
            self.running.remove(&seq.key());
            seq.read_failed = false;
            seq.reset_to_waiting();
            self.waiting.insert(seq.key(), id);
            warn!(request_id = %id, "a prefix block failed its load; will compute it");
            free.push(id);
        }
        self.loads.clear_failed();
        free
    }

    /// Gives up the loads still pending, as failed, after the runner waited for one and had
    /// none pending (so none will come); returns what [`Queues::finish_loads`] does.
    pub fn abandon_loads(&mut self) -> Vec<RequestId> {
        let abandoned = self.loads.abandoned();
        if abandoned.is_empty() {
            return Vec::new();
        }
        warn!(
            blocks = abandoned.len(),
            "loads the runner never started are given up"
        );
        self.finish_loads(&abandoned)
    }

    /// The waiting requests, highest priority first.
    pub fn waiting(&self) -> impl Iterator<Item = &Seq> + '_ {
        self.waiting.values().map(|id| &self.seqs[id])
    }

    /// Requests whose client has gone (their events receiver is dropped).
    pub fn disconnected(&self) -> Vec<RequestId> {
        self.seqs
            .values()
            .filter(|s| s.req.events.is_closed())
            .map(|s| s.req.id)
            .collect()
    }

    /// Queues `req` unless it cannot fit the context or the whole pool, or the waiting
    /// queue is full.
    pub fn submit(
        &mut self,
        req: GenerateRequest,
        limits: &SubmitLimits,
    ) -> Result<(), SubmitError> {
        let (prompt, max_tokens) = (req.spec.prompt.len(), req.spec.max_tokens);
        let total = prompt + max_tokens;
        if total > limits.max_model_len {
            return Err(SubmitError::TooLong {
                prompt,
                max_tokens,
                max_model_len: limits.max_model_len,
            });
        }
        if total.div_ceil(self.block_size) > limits.num_blocks {
            return Err(SubmitError::CacheTooSmall {
                prompt,
                max_tokens,
                cache_tokens: limits.num_blocks * self.block_size,
            });
        }
        if self.waiting.len() >= limits.max_waiting {
            return Err(SubmitError::QueueFull {
                limit: limits.max_waiting,
            });
        }
        let seq = Seq::new(req, self.next_order);
        self.next_order += 1;
        info!(request_id = %seq.req.id, prompt_tokens = seq.tokens.len(), "queued");
        self.waiting.insert(seq.key(), seq.req.id);
        self.seqs.insert(seq.req.id, seq);
        Ok(())
    }

    /// Takes request `id` out of the queues.
    pub fn remove(&mut self, id: RequestId) -> Option<Seq> {
        let seq = self.seqs.remove(&id)?;
        match seq.phase {
            Phase::Waiting => self.waiting.remove(&seq.key()),
            Phase::Running => self.running.remove(&seq.key()),
        };
        Some(seq)
    }

    /// The KV allocator's view of `schedule`: each running sequence's size after the step
    /// (highest priority first), and the waiting ones to admit with their tokens.
    pub fn allocation(&self, schedule: &Schedule) -> (Vec<GrowSeq>, Vec<AdmitSeq>) {
        let grow = schedule
            .running
            .iter()
            .map(|planned| GrowSeq {
                id: planned.id,
                tokens_after_step: self.seqs[&planned.id].num_computed + planned.chunk,
            })
            .collect();
        let admit = schedule
            .admit
            .iter()
            .map(|id| AdmitSeq {
                id: *id,
                tokens: Arc::from(self.seqs[id].tokens.as_slice()),
                scores_prompt: self.seqs[id].scores_prompt(),
            })
            .collect();
        (grow, admit)
    }

    /// Applies the KV allocator's grant to `schedule`: the kept sequences' new tables, the
    /// preempted ones back to waiting (to recompute from their tokens), the admitted ones
    /// running. Returns the step's plan and the preempted ids.
    pub fn apply_grant(
        &mut self,
        schedule: Schedule,
        grant: &StepGrant,
    ) -> (StepPlan, Vec<RequestId>) {
        for (id, table) in &grant.grown {
            if let Some(seq) = self.seqs.get_mut(id) {
                // The allocator only appends to a running sequence's table; should a grant
                // ever change a block the runner or the proposer holds, they get it whole.
                if !table.starts_with(&seq.block_table) {
                    seq.blocks_sent = 0;
                    seq.proposed.1 = 0;
                }
                seq.block_table.clone_from(table);
            }
        }
        for id in &grant.preempted {
            let Some(seq) = self.seqs.get_mut(id) else {
                continue;
            };
            self.running.remove(&seq.key());
            seq.reset_to_waiting();
            self.waiting.insert(seq.key(), *id);
            metrics::record_preemption();
            info!(request_id = %id, tokens = seq.tokens.len(), "preempted; will recompute");
        }
        let mut chunks: HashMap<RequestId, usize> = schedule
            .running
            .iter()
            .filter(|planned| !grant.preempted.contains(&planned.id))
            .map(|planned| (planned.id, planned.chunk))
            .collect();
        for admitted in &grant.admitted {
            let Some(seq) = self.seqs.get_mut(&admitted.id) else {
                continue;
            };
            self.waiting.remove(&seq.key());
            self.running.insert(seq.key(), admitted.id);
            seq.phase = Phase::Running;
            seq.num_computed = admitted.num_cached;
            seq.blocks_registered = admitted.num_cached / self.block_size;
            seq.block_table.clone_from(&admitted.block_table);
            if seq.cached_tokens.is_none() {
                seq.cached_tokens = Some(admitted.num_cached);
                metrics::record_queue_time(seq.req.arrival.elapsed());
            }
            // Admitted onto blocks still being loaded: it computes once they are in.
            let held = self.loads.holds(&admitted.block_table);
            chunks.insert(admitted.id, if held { 0 } else { admitted.num_scheduled });
        }
        let seqs = self
            .running
            .values()
            .filter_map(|id| {
                let chunk = *chunks.get(id)?;
                (chunk > 0).then(|| PlannedSeq {
                    id: *id,
                    chunk,
                    drafts: Vec::new(),
                    draft_dists: None,
                    drafts_on_device: None,
                })
            })
            .collect();
        (StepPlan { seqs }, grant.preempted.clone())
    }

    /// How many sequences of `plan` decode, and whether that is all it computes.
    pub fn decodes(&self, plan: &StepPlan) -> (usize, bool) {
        let decoding = plan
            .seqs
            .iter()
            .filter(|planned| self.seqs.get(&planned.id).is_some_and(Seq::is_decoding))
            .count();
        (decoding, decoding == plan.seqs.len())
    }

    /// Every sequence of `plan`, with the tokens and blocks the proposer does not hold yet
    /// and its room for drafts: none for a prompt chunk, nor for a decode planned without.
    /// A method that follows the target's states (EAGLE-3) takes in the step before from
    /// each of them, so that those states wait one step at most.
    pub fn proposals(&mut self, plan: &StepPlan) -> Vec<ProposeDelta> {
        plan.seqs
            .iter()
            .map(|planned| {
                let seq = self.seqs.get_mut(&planned.id).expect("a planned request");
                let max_drafts = if seq.is_decoding() {
                    planned.chunk - 1
                } else {
                    0
                };
                let kept_tokens = seq.proposed.0.min(seq.tokens.len());
                let kept_blocks = seq.proposed.1.min(seq.block_table.len());
                seq.proposed = (seq.tokens.len(), seq.block_table.len());
                ProposeDelta {
                    id: planned.id,
                    kept_tokens,
                    new_tokens: seq.tokens[kept_tokens..].to_vec(),
                    kept_blocks,
                    new_blocks: seq.block_table[kept_blocks..].to_vec(),
                    max_drafts,
                    sampling: draft_sampling(&seq.req.spec.params),
                    drafts_paused: seq.is_decoding()
                        && max_drafts == 0
                        && seq.req.spec.max_tokens > seq.output_len() + 1,
                }
            })
            .collect()
    }

    /// The target runner's batch of `plan` as step `step`: per sequence the tokens to feed
    /// and the drafts after them, the blocks the runner does not hold yet, and (the first
    /// time) its sampling setup; `released` are the requests whose runner state may go,
    /// `kv_moves` the copies the allocator asked for since the last batch.
    pub fn batch(
        &mut self,
        plan: &StepPlan,
        step: u64,
        released: Vec<RequestId>,
        kv_moves: Vec<KvMove>,
    ) -> ScheduledBatch {
        let seqs = plan
            .seqs
            .iter()
            .map(|planned| {
                let seq = self.seqs.get_mut(&planned.id).expect("a planned request");
                let start = seq.num_computed;
                let fed = planned.chunk - planned.drafts.len();
                let mut tokens = seq.tokens[start..start + fed].to_vec();
                tokens.extend_from_slice(&planned.drafts);
                let setup = (!seq.setup_sent).then(|| SamplingSetup {
                    params: seq.req.spec.params.clone(),
                    prompt: seq.req.spec.prompt.clone(),
                    logprobs: seq.req.spec.logprobs,
                    prompt_logprobs: seq.req.spec.prompt_logprobs,
                    max_tokens: seq.req.spec.max_tokens,
                    grammar: seq.req.spec.grammar.clone(),
                });
                seq.setup_sent = true;
                let kept_blocks = seq.blocks_sent.min(seq.block_table.len());
                let new_blocks = seq.block_table[kept_blocks..].to_vec();
                seq.blocks_sent = seq.block_table.len();
                ScheduledSeq {
                    id: planned.id,
                    tokens,
                    num_cached: start,
                    kept_blocks,
                    new_blocks,
                    sample: start + fed == seq.tokens.len() && seq.req.spec.max_tokens > 0,
                    num_drafts: planned.drafts.len(),
                    draft_dists: planned.draft_dists.clone(),
                    drafts_on_device: planned.drafts_on_device.clone(),
                    setup,
                }
            })
            .collect();
        ScheduledBatch {
            step,
            seqs,
            released,
            kv_moves,
            queue_ahead: true,
        }
    }

    /// Applies the runner's results for `plan`: streams each request's prompt scores, then
    /// appends its new tokens (up to its first stop: a stop token, an end-of-sequence id
    /// unless `ignore_eos`, or `max_tokens`) and streams them; advances what is in the
    /// cache by the tokens fed less the rejected drafts, and ends a request of
    /// `max_tokens` 0 once its prompt is computed. A request that ended while the step ran
    /// is passed over.
    pub fn apply_done(&mut self, plan: &StepPlan, done: StepDone, eos: &[u32]) -> Applied {
        let mut applied = Applied::default();
        let mut rejected: HashMap<RequestId, usize> = HashMap::new();
        for scored in done.prompt_logprobs {
            if let Some(seq) = self.seqs.get(&scored.id) {
                // A client that went away is noticed before the next step.
                seq.send(RequestEvent::PromptLogprobs(scored));
            }
        }
        for out in done.sampled {
            if out.num_drafts > 0 {
                let seq = self.seqs.get(&out.id);
                let place = Place {
                    request: out.id,
                    max_block_id: seq.and_then(|s| s.block_table.iter().max().copied()),
                    tokens: seq.map_or(0, |s| s.tokens.len()),
                };
                applied
                    .verified
                    .push((out.num_drafts, out.num_accepted, place));
            }
            rejected.insert(out.id, out.num_drafts - out.num_accepted);
            let Some(seq) = self.seqs.get_mut(&out.id) else {
                continue;
            };
            if let GrammarStatus::Failed(why) = &out.grammar {
                // The step's tokens were not chosen under the grammar: none is sent.
                warn!(request_id = %out.id, "the request's grammar cannot go on: {why}");
                applied.ended.push((out.id, FinishReason::Error));
                continue;
            }
            if out.num_drafts > 0 {
                seq.spec[0] += 1;
                seq.spec[1] += out.num_drafts;
                seq.spec[2] += out.num_accepted;
                for accepted in seq.accepted_per_position.iter_mut().take(out.num_accepted) {
                    *accepted += 1;
                }
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
                let spec = &seq.req.spec;
                let stop = spec.stop_token_ids.contains(&token.id)
                    || (!spec.ignore_eos && eos.contains(&token.id));
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
            if reason.is_none() && out.grammar == GrammarStatus::Complete {
                reason = Some(FinishReason::Stop);
            }
            if !seq.send(RequestEvent::Tokens(tokens)) {
                reason = Some(FinishReason::Abort);
            }
            if let Some(reason) = reason {
                applied.ended.push((out.id, reason));
            }
        }
        for planned in &plan.seqs {
            let Some(seq) = self.seqs.get_mut(&planned.id) else {
                continue;
            };
            let fed = planned.chunk - rejected.get(&planned.id).unwrap_or(&0);
            seq.num_computed = (seq.num_computed + fed).min(seq.tokens.len());
            if seq.req.spec.max_tokens == 0 && seq.remaining() == 0 {
                applied.ended.push((planned.id, FinishReason::Length));
            }
            let full = seq.num_computed / self.block_size;
            if full > seq.blocks_registered {
                let bs = self.block_size;
                applied.computed.push(ComputedSeq {
                    id: planned.id,
                    first_block: seq.blocks_registered,
                    tokens: seq.tokens[seq.blocks_registered * bs..full * bs].to_vec(),
                });
                seq.blocks_registered = full;
            }
        }
        applied
    }
}

/// How a request with sampling `params` has its drafts drawn: greedily when it decodes
/// greedily, else sampled at its temperature (seeded from its seed).
fn draft_sampling(params: &SamplingParams) -> Option<DraftSampling> {
    (!params.is_greedy()).then_some(DraftSampling {
        temperature: params.temperature,
        seed: params.seed,
    })
}

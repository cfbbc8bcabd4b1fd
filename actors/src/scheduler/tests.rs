//! The scheduling policy and the step's transitions, driven by hand: queues built from
//! requests, the real block manager answering the allocation (no actor, no runner), and
//! each step's results written out as the runner would send them.

use super::plan::StepPlan;
use super::policy::schedule;
use super::queues::{Queues, SubmitLimits};
use crate::kv_allocator::BlockManager;
use crate::kv_disk::{chain_hash, FailedRead, FailedReads, FoundBlock, ROOT_HASH};
use crate::messages::{
    AheadUse, AllocateStep, ComputedSeq, DraftSampling, Drafted, FinishReason, GenerateRequest,
    GeneratedToken, KvMove, LoadDone, PromptLogprobs, RequestEvent, RequestId, RequestSpec,
    SchedulerLimits, SeqOutput, StepDone, SubmitError,
};
use crate::scheduler::spec::stats::Place;
use peregrine_models::draft_head::HandedDraft;
use peregrine_ops::sampling::DraftDist;
use peregrine_ops::sampling::{SamplingParams, TokenLogprobs};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

const BLOCK: usize = 4;
const EOS: u32 = 999;

/// The queues, a block manager of `num_blocks` blocks, and every request's event stream;
/// what the scheduler's next `AllocateStep` would carry.
struct Harness {
    queues: Queues,
    kv: BlockManager,
    free: Vec<RequestId>,
    computed: Vec<ComputedSeq>,
    events: Vec<(RequestId, mpsc::UnboundedReceiver<RequestEvent>)>,
    limits: SchedulerLimits,
    /// The backend's bound on a step's logit rows, if any.
    max_logit_rows: Option<usize>,
    speculating: bool,
    /// Every verification the steps applied.
    verified: Vec<(usize, usize, Place)>,
    /// Every move the grants gave, in order.
    moves: Vec<KvMove>,
}

impl Harness {
    /// 64 blocks, 8 sequences and 100 tokens a step, speculating with up to 3 drafts.
    fn drafting() -> Harness {
        let mut h = Harness::new(64, 8, 100);
        h.speculating = true;
        h.limits.num_speculative_tokens = 3;
        h
    }

    fn new(num_blocks: u32, max_num_seqs: usize, max_num_batched_tokens: usize) -> Harness {
        Harness {
            queues: Queues::new(BLOCK),
            kv: BlockManager::new(num_blocks, BLOCK, true),
            free: Vec::new(),
            computed: Vec::new(),
            events: Vec::new(),
            limits: SchedulerLimits {
                max_num_seqs,
                max_num_batched_tokens,
                max_waiting: 4,
                num_speculative_tokens: 0,
                speculative_adaptive: false,
            },
            max_logit_rows: None,
            speculating: false,
            verified: Vec::new(),
            moves: Vec::new(),
        }
    }

    /// The same harness over a pool whose disk tier holds `prefix`'s whole blocks (as a
    /// restart finds them), and where its failed reads are reported.
    fn with_disk(mut self, num_blocks: u32, prefix: &[u32]) -> (Harness, Arc<FailedReads>) {
        let mut parent = ROOT_HASH;
        let found: Vec<FoundBlock> = prefix
            .chunks_exact(BLOCK)
            .enumerate()
            .map(|(slot, tokens)| {
                let chain = chain_hash(&parent, tokens);
                let block = FoundBlock {
                    slot: slot as u64,
                    chain,
                    parent,
                    tokens: tokens.to_vec(),
                };
                parent = chain;
                block
            })
            .collect();
        let failed = FailedReads::shared();
        self.kv = BlockManager::new(num_blocks, BLOCK, true)
            .with_disk_tier(64, &found)
            .with_failed_reads(failed.clone());
        (self, failed)
    }

    /// The disk reads the grants gave since the last call: (slot, pool block).
    fn take_reads(&mut self) -> Vec<(u64, u32)> {
        std::mem::take(&mut self.moves)
            .into_iter()
            .filter_map(|m| match m {
                KvMove::DiskRead { slot, block, .. } => Some((slot, block)),
                _ => None,
            })
            .collect()
    }

    /// Applies the runner's report of finished loads, freeing what it says.
    fn loads_done(&mut self, loads: &[LoadDone]) {
        let free = self.queues.finish_loads(loads);
        self.free.extend(free);
    }

    fn submit_limits(&self) -> SubmitLimits {
        SubmitLimits {
            max_model_len: 256,
            num_blocks: 64,
            max_waiting: self.limits.max_waiting,
        }
    }

    /// Submits greedy request `id` with `prompt`, `max_tokens` and `priority`.
    fn submit(
        &mut self,
        id: u64,
        prompt: &[u32],
        max_tokens: usize,
        priority: i32,
    ) -> Result<(), SubmitError> {
        self.submit_sampled(id, prompt, max_tokens, priority, SamplingParams::greedy())
    }

    /// [`Harness::submit`] with sampling `params`.
    fn submit_sampled(
        &mut self,
        id: u64,
        prompt: &[u32],
        max_tokens: usize,
        priority: i32,
        params: SamplingParams,
    ) -> Result<(), SubmitError> {
        self.submit_spec(id, prompt, max_tokens, priority, params, None)
    }

    /// Submits greedy request `id` that scores its prompt with `top` alternatives.
    fn submit_scoring(&mut self, id: u64, prompt: &[u32], max_tokens: usize, top: usize) {
        let params = SamplingParams::greedy();
        self.submit_spec(id, prompt, max_tokens, 0, params, Some(top))
            .unwrap();
    }

    /// [`Harness::submit_sampled`] that scores its prompt where `prompt_logprobs` says.
    fn submit_spec(
        &mut self,
        id: u64,
        prompt: &[u32],
        max_tokens: usize,
        priority: i32,
        params: SamplingParams,
        prompt_logprobs: Option<usize>,
    ) -> Result<(), SubmitError> {
        let (events, rx) = mpsc::unbounded_channel();
        let req = GenerateRequest {
            id: RequestId(id),
            spec: RequestSpec {
                prompt: Arc::from(prompt),
                params,
                max_tokens,
                stop_token_ids: vec![],
                ignore_eos: false,
                logprobs: None,
                prompt_logprobs,
                priority,
                grammar: None,
            },
            arrival: Instant::now(),
            events,
        };
        let limits = self.submit_limits();
        self.queues.submit(req, &limits)?;
        self.events.push((RequestId(id), rx));
        Ok(())
    }

    /// Plans a step and has the block manager grant it; returns the plan and who was
    /// preempted.
    fn plan(&mut self) -> (StepPlan, Vec<u64>) {
        let drafts = if self.speculating {
            self.limits.num_speculative_tokens
        } else {
            0
        };
        let schedule = schedule(&self.queues, &self.limits, drafts, self.max_logit_rows);
        let (grow, admit) = self.queues.allocation(&schedule);
        let grant = self.kv.allocate_step(AllocateStep {
            free: std::mem::take(&mut self.free),
            computed: std::mem::take(&mut self.computed),
            grow,
            admit,
            token_budget: schedule.token_budget,
            scoring_rows: schedule.scoring_rows,
        });
        self.moves.extend_from_slice(&grant.moves);
        self.queues.start_loads(&grant.moves);
        let (plan, preempted) = self.queues.apply_grant(schedule, &grant);
        (plan, preempted.iter().map(|id| id.0).collect())
    }

    /// Applies `plan`'s results, each sampled sequence getting the tokens `out` gives it
    /// (the runner answers for a sequence the scheduler has ended meanwhile too); ends the
    /// requests that ended, as the scheduler does.
    fn done(&mut self, plan: &StepPlan, out: impl Fn(u64) -> Vec<u32>) -> Vec<(u64, FinishReason)> {
        let sampled = plan
            .seqs
            .iter()
            .filter(|planned| {
                self.queues.get(planned.id).is_none_or(|seq| {
                    seq.num_computed + planned.chunk - planned.drafts.len() == seq.tokens.len()
                        && seq.req.spec.max_tokens > 0
                })
            })
            .map(|planned| {
                let tokens: Vec<GeneratedToken> = out(planned.id.0)
                    .into_iter()
                    .map(|id| GeneratedToken { id, logprobs: None })
                    .collect();
                // More tokens than the drafts allow stand for accepted drafts (a runner
                // returns at most its drafts plus one).
                let num_drafts = planned.drafts.len().max(tokens.len() - 1);
                SeqOutput {
                    id: planned.id,
                    num_accepted: tokens.len() - 1,
                    tokens,
                    num_drafts,
                    grammar: Default::default(),
                }
            })
            .collect();
        let done = StepDone {
            step: 1,
            sampled,
            hidden: Vec::new(),
            ahead: AheadUse::None,
            prompt_logprobs: Vec::new(),
            loads: Vec::new(),
        };
        let applied = self.queues.apply_done(plan, done, &[EOS]);
        self.computed.extend(applied.computed);
        self.verified.extend(applied.verified);
        for (id, _) in &applied.ended {
            self.queues.remove(*id);
            self.free.push(*id);
        }
        applied
            .ended
            .into_iter()
            .map(|(id, reason)| (id.0, reason))
            .collect()
    }
}

/// `(id, chunk)` of each planned sequence, in batch order.
fn chunks(plan: &StepPlan) -> Vec<(u64, usize)> {
    plan.seqs.iter().map(|s| (s.id.0, s.chunk)).collect()
}

fn prompt(first: u32, len: usize) -> Vec<u32> {
    (first..first + len as u32).collect()
}

#[test]
fn continuous_batching_stops_at_max_num_seqs() {
    let mut h = Harness::new(64, 2, 100);
    for id in 1..=3 {
        h.submit(id, &prompt(10 * id as u32, 5), 8, 0).unwrap();
    }
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(1, 5), (2, 5)],
        "two slots: the third waits"
    );
    h.done(&plan, |_| vec![1]);
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(1, 1), (2, 1)],
        "still full: the third waits on"
    );
    assert_eq!(h.queues.lengths(), (2, 1));
    h.done(&plan, |id| if id == 1 { vec![EOS] } else { vec![2] });
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(2, 1), (3, 5)],
        "a slot freed: the third joins"
    );
}

#[test]
fn the_token_budget_goes_to_decodes_first_then_chunks_prefills() {
    let mut h = Harness::new(64, 8, 6);
    h.submit(1, &prompt(0, 3), 8, 0).unwrap();
    h.submit(2, &prompt(50, 3), 8, 0).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 3), (2, 3)]);
    h.done(&plan, |_| vec![7]);
    // A long prompt arrives: the two decodes take 2 of the 6 tokens, it gets 4 per step.
    h.submit(3, &prompt(100, 10), 8, 0).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 1), (2, 1), (3, 4)]);
    let seq3 = h.queues.get(RequestId(3)).unwrap();
    assert_eq!(seq3.num_computed, 0);
    h.done(&plan, |_| vec![8]);
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(1, 1), (2, 1), (3, 4)],
        "a running prompt chunk after the decodes"
    );
    h.done(&plan, |_| vec![9]);
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(1, 1), (2, 1), (3, 2)],
        "the prompt's last 2"
    );
    let batch = h.queues.batch(&plan, 3, Vec::new(), Vec::new());
    assert_eq!(batch.seqs[2].tokens, prompt(108, 2));
    assert!(batch.seqs[2].sample, "the last chunk samples");
    assert_eq!(batch.seqs[2].num_cached, 8);
}

#[test]
fn a_prompt_chunk_that_is_not_the_last_does_not_sample() {
    let mut h = Harness::new(64, 8, 4);
    h.submit(1, &prompt(0, 10), 8, 0).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 4)]);
    let batch = h.queues.batch(&plan, 1, Vec::new(), Vec::new());
    assert!(!batch.seqs[0].sample);
    assert!(
        batch.seqs[0].setup.is_some(),
        "the first step carries the setup"
    );
    assert!(h
        .done(&plan, |_| unreachable!("nothing sampled"))
        .is_empty());
    let (plan, _) = h.plan();
    let batch = h.queues.batch(&plan, 2, Vec::new(), Vec::new());
    assert!(batch.seqs[0].setup.is_none(), "sent once");
    assert_eq!(batch.seqs[0].num_cached, 4);
}

#[test]
fn waiting_requests_start_in_priority_then_arrival_order() {
    let mut h = Harness::new(64, 2, 100);
    h.submit(1, &prompt(0, 2), 4, 5).unwrap();
    h.submit(2, &prompt(10, 2), 4, -1).unwrap();
    h.submit(3, &prompt(20, 2), 4, 5).unwrap();
    h.submit(4, &prompt(30, 2), 4, -1).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(2, 2), (4, 2)],
        "lower priority values first"
    );
    let waiting: Vec<u64> = h.queues.waiting().map(|s| s.req.id.0).collect();
    assert_eq!(waiting, [1, 3], "then arrival");
}

#[test]
fn the_waiting_queue_is_bounded() {
    let mut h = Harness::new(64, 1, 100);
    for id in 1..=4 {
        h.submit(id, &prompt(0, 2), 4, 0).unwrap();
    }
    assert_eq!(
        h.submit(5, &prompt(0, 2), 4, 0),
        Err(SubmitError::QueueFull { limit: 4 })
    );
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 2)]);
    h.submit(5, &prompt(0, 2), 4, 0)
        .expect("one started: room in the queue");
    let too_long = h.submit(6, &prompt(0, 200), 100, 0);
    assert!(
        matches!(too_long, Err(SubmitError::TooLong { .. })),
        "{too_long:?}"
    );
}

#[test]
fn preemption_takes_the_lowest_priority_and_it_recomputes_from_its_tokens() {
    // Six blocks of 4 tokens, filled by three prompts of 8; the next step's growth must
    // take one request's blocks.
    let mut h = Harness::new(6, 8, 100);
    h.submit(1, &prompt(0, 8), 16, 0).unwrap();
    h.submit(2, &prompt(50, 8), 16, 2).unwrap();
    h.submit(3, &prompt(90, 8), 16, 1).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(1, 8), (3, 8), (2, 8)],
        "batch order is priority"
    );
    let _ = h.queues.batch(&plan, 1, Vec::new(), Vec::new());
    h.done(&plan, |_| vec![7]);
    let (plan, preempted) = h.plan();
    assert_eq!(preempted, [2], "the lowest priority goes first");
    assert_eq!(chunks(&plan), [(1, 1), (3, 1)]);
    let seq2 = h.queues.get(RequestId(2)).unwrap();
    assert_eq!(
        seq2.num_computed, 0,
        "preempted: recomputed from its tokens"
    );
    assert_eq!(seq2.tokens.len(), 9, "it keeps what it generated");
    assert!(seq2.block_table.is_empty());
    let waiting: Vec<u64> = h.queues.waiting().map(|s| s.req.id.0).collect();
    assert_eq!(waiting, [2]);
    // 1 and 3 end: 2 comes back, its whole table sent again, all 9 tokens recomputed.
    let batch = h.queues.batch(&plan, 2, Vec::new(), Vec::new());
    assert!(batch.seqs.iter().all(|s| s.id != RequestId(2)));
    h.done(&plan, |_| vec![EOS]);
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(2, 9)]);
    let batch = h.queues.batch(&plan, 3, Vec::new(), Vec::new());
    let seq = &batch.seqs[0];
    assert_eq!((seq.kept_blocks, seq.new_blocks.len()), (0, 3));
    assert!(seq.setup.is_none(), "the runner kept its sampler state");
    assert_eq!(seq.tokens[8], 7);
}

#[test]
fn a_preempted_sequence_sends_the_runner_its_whole_new_table() {
    let mut h = Harness::new(64, 8, 100);
    h.submit(1, &prompt(0, 6), 16, 0).unwrap();
    let (plan, _) = h.plan();
    let batch = h.queues.batch(&plan, 1, Vec::new(), Vec::new());
    assert_eq!(
        (batch.seqs[0].kept_blocks, batch.seqs[0].new_blocks.len()),
        (0, 2)
    );
    h.done(&plan, |_| vec![1]);
    let (plan, _) = h.plan();
    let batch = h.queues.batch(&plan, 2, Vec::new(), Vec::new());
    assert_eq!(
        (batch.seqs[0].kept_blocks, batch.seqs[0].new_blocks.len()),
        (2, 0),
        "a decode inside its blocks sends none"
    );
    h.done(&plan, |_| vec![2]);
    let (plan, _) = h.plan();
    let _ = h.queues.batch(&plan, 3, Vec::new(), Vec::new());
    h.done(&plan, |_| vec![3]);
    let (plan, _) = h.plan();
    let batch = h.queues.batch(&plan, 4, Vec::new(), Vec::new());
    assert_eq!(
        (batch.seqs[0].kept_blocks, batch.seqs[0].new_blocks.len()),
        (2, 1),
        "crossing into a third block sends that one"
    );
}

#[test]
fn a_prefix_hit_starts_the_second_request_past_the_cached_blocks() {
    let mut h = Harness::new(64, 8, 100);
    let shared = prompt(0, 10);
    h.submit(1, &shared, 4, 0).unwrap();
    let (plan, _) = h.plan();
    h.done(&plan, |_| vec![EOS]);
    // The next allocation frees the first request's blocks, which stay in the cache.
    let mut second = shared.clone();
    second.push(77);
    h.submit(2, &second, 4, 0).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(2, 3)],
        "8 of 11 tokens (two blocks) came cached"
    );
    let batch = h.queues.batch(&plan, 2, Vec::new(), Vec::new());
    assert_eq!(batch.seqs[0].num_cached, 8);
    assert_eq!(batch.seqs[0].tokens, [8, 9, 77]);
    assert_eq!(h.queues.get(RequestId(2)).unwrap().cached_tokens, Some(8));
    // Its progress report then starts after the cached blocks: block 2 once it fills.
    h.done(&plan, |_| vec![5]);
    assert!(h.computed.is_empty(), "block 2 holds 3 of 4 tokens");
    let (plan, _) = h.plan();
    h.done(&plan, |_| vec![6]);
    let report: Vec<(usize, Vec<u32>)> = h
        .computed
        .iter()
        .map(|c| (c.first_block, c.tokens.clone()))
        .collect();
    assert_eq!(report, [(2, vec![8, 9, 77, 5])]);
}

#[test]
fn speculation_plans_room_for_drafts_within_max_tokens() {
    let mut h = Harness::drafting();
    h.submit(1, &prompt(0, 4), 3, 0).unwrap();
    h.submit(2, &prompt(40, 4), 10, 0).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 4), (2, 4)], "prefills get no drafts");
    h.done(&plan, |_| vec![5]);
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(1, 2), (2, 4)],
        "1 has 1 output of 3: room for one draft past its next token"
    );
    let proposals = h.queues.proposals(&plan);
    let room: Vec<(u64, usize)> = proposals.iter().map(|p| (p.id.0, p.max_drafts)).collect();
    assert_eq!(room, [(1, 1), (2, 3)]);
    let first = &proposals[0];
    assert_eq!(
        (
            first.kept_tokens,
            first.new_tokens.clone(),
            first.kept_blocks
        ),
        (0, vec![0, 1, 2, 3, 5], 0),
        "the proposer is sent the whole sequence the first time"
    );
    let plan = plan.with_drafts(vec![
        (RequestId(1), Drafted::greedy(vec![6, 6, 6])),
        (RequestId(2), Drafted::greedy(vec![])),
    ]);
    assert_eq!(chunks(&plan), [(1, 2), (2, 1)], "drafts shrink the chunks");
    let batch = h.queues.batch(&plan, 2, Vec::new(), Vec::new());
    assert_eq!(
        (batch.seqs[0].tokens.clone(), batch.seqs[0].num_drafts),
        (vec![5, 6], 1)
    );
    // Request 1's draft is rejected: it advances by its fed token only.
    let ended = h.done(&plan, |id| if id == 1 { vec![8] } else { vec![9] });
    assert!(ended.is_empty());
    let seq1 = h.queues.get(RequestId(1)).unwrap();
    assert_eq!(
        seq1.num_computed, 5,
        "the rejected draft's slot is not cached"
    );
    assert_eq!(seq1.tokens[4..], [5, 8]);
    let (plan, _) = h.plan();
    let proposals = h.queues.proposals(&plan);
    let delta: Vec<(u64, usize, Vec<u32>)> = proposals
        .iter()
        .map(|p| (p.id.0, p.kept_tokens, p.new_tokens.clone()))
        .collect();
    assert_eq!(
        delta,
        [(1, 5, vec![8]), (2, 5, vec![9])],
        "then only what they gained (1 too, with no room left for a draft: EAGLE-3 takes in \
         the target's states of every step)"
    );
    assert_eq!(proposals[0].max_drafts, 0);
    let paused: Vec<bool> = proposals.iter().map(|p| p.drafts_paused).collect();
    assert_eq!(paused, [false, false], "1's last token is due; 2 drafts");
}

#[test]
fn a_decode_planned_without_drafts_where_it_has_room_is_paused() {
    let mut h = Harness::new(64, 8, 100);
    h.speculating = true;
    // The controller found drafting does not pay: none planned.
    h.limits.num_speculative_tokens = 0;
    h.submit(1, &prompt(0, 4), 2, 0).unwrap();
    h.submit(2, &prompt(40, 4), 10, 0).unwrap();
    let (plan, _) = h.plan();
    let paused = |h: &mut Harness, plan: &StepPlan| -> Vec<(u64, bool)> {
        let proposals = h.queues.proposals(plan);
        proposals
            .iter()
            .map(|p| (p.id.0, p.drafts_paused))
            .collect()
    };
    assert_eq!(paused(&mut h, &plan), [(1, false), (2, false)], "prefills");
    h.done(&plan, |_| vec![5]);
    let (plan, _) = h.plan();
    assert_eq!(
        paused(&mut h, &plan),
        [(1, false), (2, true)],
        "1's last token is due; 2 has room"
    );
}

#[test]
fn a_request_cancelled_while_its_step_ran_is_passed_over() {
    let mut h = Harness::new(64, 8, 100);
    h.submit(1, &prompt(0, 4), 8, 0).unwrap();
    h.submit(2, &prompt(20, 4), 8, 0).unwrap();
    let (plan, _) = h.plan();
    let _ = h.queues.batch(&plan, 1, Vec::new(), Vec::new());
    // The client of 1 went away during the step: the scheduler ended it.
    h.queues.remove(RequestId(1)).unwrap();
    let ended = h.done(&plan, |_| vec![3]);
    assert!(ended.is_empty());
    assert!(h.queues.get(RequestId(1)).is_none());
    let seq2 = h.queues.get(RequestId(2)).unwrap();
    assert_eq!((seq2.num_computed, seq2.tokens.len()), (4, 5));
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(2, 1)]);
}

#[test]
fn a_request_ends_at_its_stop_its_length_or_a_closed_stream() {
    let mut h = Harness::new(64, 8, 100);
    h.submit(1, &prompt(0, 2), 8, 0).unwrap();
    h.submit(2, &prompt(10, 2), 2, 0).unwrap();
    h.submit(3, &prompt(20, 2), 8, 0).unwrap();
    let (plan, _) = h.plan();
    h.events.retain(|(id, _)| *id != RequestId(3));
    let mut ended = h.done(&plan, |id| match id {
        1 => vec![EOS],
        _ => vec![4],
    });
    ended.sort_by_key(|(id, _)| *id);
    assert_eq!(ended, [(1, FinishReason::Stop), (3, FinishReason::Abort)]);
    let (plan, _) = h.plan();
    let ended = h.done(&plan, |_| vec![5, 6]);
    assert_eq!(ended, [(2, FinishReason::Length)], "max_tokens 2 reached");
    let (_, rx) = h
        .events
        .iter_mut()
        .find(|(id, _)| *id == RequestId(2))
        .unwrap();
    let mut got = Vec::new();
    while let Ok(RequestEvent::Tokens(tokens)) = rx.try_recv() {
        got.extend(tokens.iter().map(|t| t.id));
    }
    assert_eq!(got, [4, 5], "the token past max_tokens is not streamed");
}

#[test]
fn a_grant_that_changes_a_held_block_resends_the_whole_table() {
    let mut h = Harness::new(64, 8, 100);
    h.submit(1, &prompt(0, 6), 16, 0).unwrap();
    let (plan, _) = h.plan();
    let _ = h.queues.batch(&plan, 1, Vec::new(), Vec::new());
    h.done(&plan, |_| vec![1]);
    let schedule = schedule(&h.queues, &h.limits, 0, None);
    let mut grant = crate::messages::StepGrant::default();
    grant.grown.push((RequestId(1), vec![40, 41]));
    let (plan, _) = h.queues.apply_grant(schedule, &grant);
    let batch = h.queues.batch(&plan, 2, Vec::new(), Vec::new());
    assert_eq!(
        (batch.seqs[0].kept_blocks, batch.seqs[0].new_blocks.clone()),
        (0, vec![40, 41])
    );
}

#[test]
fn prompt_chunks_are_proposed_with_no_room_for_drafts() {
    let mut h = Harness::new(64, 8, 6);
    h.speculating = true;
    h.limits.num_speculative_tokens = 3;
    h.submit(1, &prompt(0, 4), 8, 0).unwrap();
    h.submit(2, &prompt(40, 9), 8, 0).unwrap();
    let (plan, _) = h.plan();
    h.done(&plan, |_| vec![5]);
    // 1 decodes; 2's prompt is in its second chunk.
    let (plan, _) = h.plan();
    let room: Vec<(u64, usize)> = h
        .queues
        .proposals(&plan)
        .iter()
        .map(|p| (p.id.0, p.max_drafts))
        .collect();
    assert_eq!(room, [(1, 3), (2, 0)]);
}

#[test]
fn usage_counts_the_accepted_drafts_at_each_position() {
    let mut h = Harness::drafting();
    h.submit(1, &prompt(0, 4), 50, 0).unwrap();
    let (plan, _) = h.plan();
    h.done(&plan, |_| vec![5]);
    for accepted in [2, 0, 3] {
        let (plan, _) = h.plan();
        let plan = plan.with_drafts(vec![(RequestId(1), Drafted::greedy(vec![6, 6, 6]))]);
        h.done(&plan, |_| vec![7; accepted + 1]);
    }
    let usage = h.queues.get(RequestId(1)).unwrap().usage();
    assert_eq!(
        (
            usage.num_drafts,
            usage.num_draft_tokens,
            usage.num_accepted_tokens
        ),
        (3, 9, 5)
    );
    assert_eq!(usage.accepted_per_position[..4], [2, 2, 1, 0]);
}

#[test]
fn a_sampled_request_asks_sampled_drafts_and_sends_their_distributions_to_verification() {
    let mut h = Harness::drafting();
    let sampled = SamplingParams {
        temperature: 0.8,
        seed: Some(3),
        ..SamplingParams::default()
    };
    h.submit_sampled(1, &prompt(0, 4), 3, 0, sampled).unwrap();
    h.submit(2, &prompt(40, 4), 10, 0).unwrap();
    let (plan, _) = h.plan();
    h.done(&plan, |_| vec![5]);
    let (plan, _) = h.plan();
    let proposals = h.queues.proposals(&plan);
    let want = DraftSampling {
        temperature: 0.8,
        seed: Some(3),
    };
    assert_eq!(proposals[0].sampling, Some(want));
    assert_eq!(
        proposals[1].sampling, None,
        "a greedy request drafts greedily"
    );
    // Request 1 has room for one draft: the second draft and its distribution go.
    let dist = |t| DraftDist::from_pairs(vec![(t, 0.75), (t + 1, 0.25)]);
    let sampled_drafts = Drafted {
        tokens: vec![6, 8],
        dists: Some(vec![dist(6), dist(8)]),
        on_device: None,
    };
    let drafts = vec![
        (RequestId(1), sampled_drafts),
        (RequestId(2), Drafted::greedy(vec![6, 6])),
    ];
    let plan = plan.with_drafts(drafts);
    let batch = h.queues.batch(&plan, 2, Vec::new(), Vec::new());
    assert_eq!(batch.seqs[0].num_drafts, 1);
    assert_eq!(batch.seqs[0].draft_dists, Some(vec![dist(6)]));
    assert_eq!(
        (batch.seqs[1].num_drafts, &batch.seqs[1].draft_dists),
        (2, &None)
    );
}

#[test]
fn drafts_left_on_the_device_reach_the_runner_by_place_cut_to_the_room_of_each_request() {
    let mut h = Harness::drafting();
    // Request 1 may emit 2 more tokens after its first (room for one draft), request 2 many.
    h.submit(1, &prompt(0, 4), 3, 0).unwrap();
    h.submit(2, &prompt(40, 4), 10, 0).unwrap();
    let (plan, _) = h.plan();
    h.done(&plan, |_| vec![5]);
    let (plan, _) = h.plan();
    let at = |index| HandedDraft {
        generation: 4,
        index,
    };
    let drafts = vec![
        (RequestId(1), Drafted::on_device(vec![at(0), at(2), at(4)])),
        (RequestId(2), Drafted::on_device(vec![at(1), at(3), at(5)])),
    ];
    let batch = h
        .queues
        .batch(&plan.with_drafts(drafts), 2, Vec::new(), Vec::new());
    let sent: Vec<_> = batch
        .seqs
        .iter()
        .map(|s| (s.num_drafts, s.tokens.len(), s.drafts_on_device.clone()))
        .collect();
    assert_eq!(
        sent,
        vec![
            (1, 2, Some(vec![at(0)])),
            (3, 4, Some(vec![at(1), at(3), at(5)]))
        ]
    );
}

#[test]
fn each_verification_names_its_request_and_the_largest_block_id_it_read() {
    let mut h = Harness::drafting();
    h.submit(1, &prompt(0, 6), 50, 0).unwrap();
    h.submit(2, &prompt(20, 9), 50, 0).unwrap();
    let (plan, _) = h.plan();
    h.done(&plan, |_| vec![5]);
    assert!(h.verified.is_empty(), "a prefill verifies no drafts");
    let (plan, _) = h.plan();
    let drafts = vec![
        (RequestId(1), Drafted::greedy(vec![6, 6, 6])),
        (RequestId(2), Drafted::greedy(vec![6, 6])),
    ];
    h.done(&plan.with_drafts(drafts), |id| vec![7; id as usize + 1]);
    let largest = |id| {
        let seq = h.queues.get(RequestId(id)).unwrap();
        seq.block_table.iter().max().copied()
    };
    // Each request emitted id + 1 tokens in the step.
    let before = |id| h.queues.get(RequestId(id)).unwrap().tokens.len() - (id as usize + 1);
    let place = |id| Place {
        request: RequestId(id),
        max_block_id: largest(id),
        tokens: before(id),
    };
    assert!(largest(2) > largest(1), "request 2's blocks come after 1's");
    let mut verified = h.verified.clone();
    verified.sort_by_key(|v| v.2.request);
    assert_eq!(verified, [(3, 1, place(1)), (2, 2, place(2))]);
}

#[test]
fn a_scored_prompt_skips_the_prefix_cache_and_its_chunks_fit_the_logit_rows() {
    let mut h = Harness::new(64, 8, 100);
    h.max_logit_rows = Some(6);
    let shared = prompt(0, 9);
    h.submit(1, &shared, 16, 0).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(1, 9)],
        "no scoring: the token budget alone"
    );
    h.done(&plan, |_| vec![1]);
    // Request 1 decodes (one row): five of the six rows are left for request 2's prompt,
    // which takes nothing from the cache although its first two blocks are there.
    h.submit_scoring(2, &shared, 4, 2);
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 1), (2, 5)]);
    assert_eq!(h.queues.get(RequestId(2)).unwrap().cached_tokens, Some(0));
    h.done(&plan, |_| vec![2]);
    // A request that does not score is served from the cache, and its chunk's one row
    // comes out of the scored chunk's.
    h.submit(3, &shared, 4, 0).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 1), (2, 4), (3, 1)]);
    assert_eq!(h.queues.get(RequestId(3)).unwrap().cached_tokens, Some(8));
    let batch = h.queues.batch(&plan, 3, Vec::new(), Vec::new());
    let setup = batch.seqs[1].setup.as_ref().unwrap();
    assert_eq!(setup.prompt_logprobs, Some(2));
    assert!(
        batch.seqs[1].sample,
        "the scored prompt's last chunk samples"
    );
    // Without a bound on the rows, the scored prompt takes the token budget.
    let mut h = Harness::new(64, 8, 100);
    h.submit_scoring(4, &shared, 4, 0);
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(4, 9)]);
}

#[test]
fn max_tokens_zero_ends_once_the_prompt_is_computed_after_its_scores() {
    let mut h = Harness::new(64, 8, 4);
    h.submit_scoring(1, &prompt(0, 6), 0, 1);
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 4)]);
    assert!(!h.queues.batch(&plan, 1, Vec::new(), Vec::new()).seqs[0].sample);
    let scored = |first, len| PromptLogprobs {
        id: RequestId(1),
        first,
        scores: vec![
            TokenLogprobs {
                logprob: -1.0,
                rank: 2,
                top: vec![(5, -0.5)]
            };
            len
        ],
    };
    let done = StepDone {
        step: 1,
        sampled: Vec::new(),
        hidden: Vec::new(),
        ahead: AheadUse::None,
        prompt_logprobs: vec![scored(1, 4)],
        loads: Vec::new(),
    };
    assert!(h.queues.apply_done(&plan, done, &[EOS]).ended.is_empty());
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 2)]);
    let batch = h.queues.batch(&plan, 2, Vec::new(), Vec::new());
    assert!(!batch.seqs[0].sample, "nothing to sample at max_tokens 0");
    let done = StepDone {
        step: 2,
        sampled: Vec::new(),
        hidden: Vec::new(),
        ahead: AheadUse::None,
        prompt_logprobs: vec![scored(5, 1)],
        loads: Vec::new(),
    };
    let applied = h.queues.apply_done(&plan, done, &[EOS]);
    assert_eq!(applied.ended, [(RequestId(1), FinishReason::Length)]);
    let (_, rx) = &mut h.events[0];
    let mut firsts = Vec::new();
    while let Ok(event) = rx.try_recv() {
        match event {
            RequestEvent::PromptLogprobs(p) => firsts.push((p.first, p.scores.len())),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(firsts, [(1, 4), (5, 1)], "each step's scores, in order");
    assert_eq!(
        h.queues
            .get(RequestId(1))
            .unwrap()
            .usage()
            .completion_tokens,
        0
    );
}

#[test]
fn a_request_reading_its_prefix_from_disk_waits_while_the_others_step() {
    // Request 2's first two blocks are on disk: it is admitted with their reads and held
    // (no chunk, not grown, so never preempted) while request 1 decodes; request 3, sharing
    // the prefix, is admitted onto the blocks being read and held too. Once the runner
    // reports the reads, both compute from the cached blocks on.
    let shared = prompt(0, 8);
    let (mut h, _) = Harness::new(64, 8, 100).with_disk(64, &shared);
    h.submit(1, &prompt(100, 3), 16, 0).unwrap();
    let (plan, _) = h.plan();
    h.done(&plan, |_| vec![5]);
    let mut second = shared.clone();
    second.extend([70, 71]);
    h.submit(2, &second, 4, 0).unwrap();
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 1)], "request 2 waits on its reads");
    let reads = h.take_reads();
    assert_eq!(reads.len(), 2, "both prefix blocks are read");
    let held = h.queues.get(RequestId(2)).unwrap();
    assert!(h.queues.is_held(held));
    assert_eq!(held.num_computed, 8);
    assert_eq!(held.block_table[..2], [reads[0].1, reads[1].1]);
    h.done(&plan, |_| vec![6]);
    let mut third = shared.clone();
    third.extend([90, 91, 92]);
    h.submit(3, &third, 4, 0).unwrap();
    let schedule = schedule(&h.queues, &h.limits, 0, None);
    let planned: Vec<u64> = schedule.running.iter().map(|p| p.id.0).collect();
    assert_eq!(planned, [1], "a held request is neither planned nor grown");
    let (plan, _) = h.plan();
    assert_eq!(
        chunks(&plan),
        [(1, 1)],
        "request 3 shares the blocks being read"
    );
    assert!(h.take_reads().is_empty(), "one read a block");
    assert_eq!(
        h.queues.get(RequestId(3)).unwrap().block_table[..2],
        [reads[0].1, reads[1].1]
    );
    h.done(&plan, |_| vec![7]);
    // One read in: both still wait for the other.
    h.loads_done(&[LoadDone {
        block: reads[0].1,
        ok: true,
    }]);
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 1)]);
    h.done(&plan, |_| vec![8]);
    h.loads_done(&[LoadDone {
        block: reads[1].1,
        ok: true,
    }]);
    assert!(!h.queues.loads_pending());
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(1, 1), (2, 2), (3, 3)]);
    let batch = h.queues.batch(&plan, 9, Vec::new(), Vec::new());
    assert_eq!(batch.seqs[1].num_cached, 8);
    assert_eq!(batch.seqs[1].tokens, [70, 71]);
    assert_eq!(batch.seqs[1].new_blocks[..2], [reads[0].1, reads[1].1]);
    assert_eq!(h.queues.get(RequestId(2)).unwrap().cached_tokens, Some(8));
}

#[test]
fn a_failed_disk_read_sends_its_request_back_to_compute_the_block() {
    // Request 2's first block fails its checks while its second is still being read: it
    // stays held (its blocks may not go back while a read fills one), then once the
    // second is in it goes back to wait, its blocks freed; the allocator has forgotten the
    // failed block, so it is admitted again missing it and computes its whole prompt.
    let shared = prompt(0, 8);
    let (mut h, failed) = Harness::new(64, 8, 100).with_disk(64, &shared);
    let mut second = shared.clone();
    second.extend([70, 71]);
    h.submit(2, &second, 4, 0).unwrap();
    let (plan, _) = h.plan();
    assert!(plan.is_empty());
    let reads = h.take_reads();
    failed.report(FailedRead {
        slot: reads[0].0,
        block: reads[0].1,
    });
    h.loads_done(&[LoadDone {
        block: reads[0].1,
        ok: false,
    }]);
    assert!(h.free.is_empty(), "a read into its second block is pending");
    let seq = h.queues.get(RequestId(2)).unwrap();
    assert!(h.queues.is_held(seq));
    assert_eq!(
        seq.cached_tokens,
        Some(0),
        "nothing before the failed block"
    );
    let (plan, _) = h.plan();
    assert!(plan.is_empty());
    h.loads_done(&[LoadDone {
        block: reads[1].1,
        ok: true,
    }]);
    assert_eq!(h.free, [RequestId(2)]);
    assert!(h.queues.get(RequestId(2)).unwrap().block_table.is_empty());
    let (plan, _) = h.plan();
    assert_eq!(chunks(&plan), [(2, 10)], "computed from its first token");
    assert!(h.take_reads().is_empty());
    let batch = h.queues.batch(&plan, 3, Vec::new(), Vec::new());
    assert_eq!(batch.seqs[0].num_cached, 0);
}

#[test]
fn a_request_ended_while_its_blocks_are_read_frees_them_after_the_reads() {
    let shared = prompt(0, 8);
    let (mut h, _) = Harness::new(64, 8, 100).with_disk(64, &shared);
    let mut second = shared.clone();
    second.push(70);
    h.submit(2, &second, 4, 0).unwrap();
    let (plan, _) = h.plan();
    assert!(plan.is_empty());
    let reads = h.take_reads();
    let seq = h.queues.remove(RequestId(2)).unwrap();
    assert!(!h.queues.free_now(&seq), "its blocks are being read into");
    assert!(h.queues.loads_pending());
    h.loads_done(&[LoadDone {
        block: reads[0].1,
        ok: true,
    }]);
    assert!(h.free.is_empty());
    h.loads_done(&[LoadDone {
        block: reads[1].1,
        ok: true,
    }]);
    assert_eq!(h.free, [RequestId(2)]);
    assert!(!h.queues.loads_pending());
}

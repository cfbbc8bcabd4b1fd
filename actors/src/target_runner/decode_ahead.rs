//! Greedy decode with the next step queued ahead (vLLM's async scheduling, SGLang's
//! overlap scheduler), decided inside the runner so that the scheduler stays one step at a
//! time: after a pure greedy decode step, the runner queues the step that would follow it
//! if every sequence went on (each one position further, fed its token on the device)
//! before it reads this step's tokens, so the device runs it while the host streams the
//! tokens and plans. When the scheduler's next batch asks for a sequence exactly as it was
//! queued, its token comes from the queued step; every other sequence of the batch runs in
//! a step of its own after it. A constrained sequence's token is the argmax under its
//! grammar's mask, applied before the queued step is fed from it; the mask of a queued
//! step is computed from the token the step before gave, while the device runs it.
//!
//! Beside a drafter that reads the target's hidden states (EAGLE-3), a greedy step hands
//! the states it recorded on (into the feature ring, on the device's queue) before the step
//! queued after it overwrites them, and a queued step serves only a batch that is just what
//! was queued, since its states come back in its rows' order. A step that carries drafts
//! drops the one queued before it (a verification's first row computes that row again), so
//! each batch says whether its step may queue the next (`ScheduledBatch::queue_ahead`: not
//! where the draft controller expects the next step to draft).
//!
//! A queued row whose sequence did not go on (it stopped, was preempted or aborted) wrote
//! its keys and values one position past its tokens, in a block it owned when the step was
//! queued and that holds no complete prefix: the block's next owner writes there only
//! later on the same device queue.

use super::grammar::masks_of;
use super::{RunSeq, SeqSampling, TargetRunner};
use crate::backend::{StepInput, StepSource, Wanted};
use crate::messages::{AheadUse, GeneratedToken, RequestId, SeqOutput};
use anyhow::anyhow;
use peregrine_ops::AttentionPlan;
use peregrine_structured::GrammarMatcher;
use std::collections::HashMap;

/// The decode step the runner queued ahead: these sequences, in this order, each fed the
/// token its last step chose.
pub(super) struct AheadStep {
    seqs: Vec<AheadSeq>,
    /// Whether its forward records hidden states (for a drafter): they come back in its
    /// rows' order, so it serves only a batch that is just what was queued.
    records_hidden: bool,
}

/// One sequence of a step queued ahead.
struct AheadSeq {
    id: RequestId,
    /// Tokens in the cache before the queued step: the queued token's position.
    num_cached: usize,
    /// How many blocks of the sequence's table the queued step read and wrote.
    num_blocks: usize,
}

impl AheadSeq {
    /// Whether the scheduler's `seq` asks for just what was queued: one token, this
    /// token's position, a table that keeps the blocks used, and as its token the one the
    /// runner returned last (`last`).
    fn queued_as(&self, seq: &RunSeq, last: Option<u32>) -> bool {
        seq.id == self.id
            && seq.sample
            && seq.num_drafts == 0
            && seq.num_cached == self.num_cached
            && seq.tokens.len() == 1
            && Some(seq.tokens[0]) == last
            && seq.kept_blocks >= self.num_blocks
    }
}

impl TargetRunner {
    /// Runs a greedy step (every sampled sequence [`super::greedy_under_masks`]): the
    /// sequences `ahead` queued as the batch asks from it, the rest in a step of their own;
    /// then queues the step after this one where the whole batch is pure decode and every
    /// sequence wants another token with room for it. A constrained sequence takes the
    /// argmax of what its grammar allows: its mask, computed on the mask threads from the
    /// token the last step gave it while the device runs the step queued for it, is applied
    /// on the device before the step queued next is fed from that argmax. Nothing is queued
    /// unless `queue_next` (false where the scheduler expects the next step to carry
    /// drafts).
    pub(super) fn greedy_ahead_step(
        &mut self,
        seqs: &[RunSeq],
        states: &mut [(&RunSeq, SeqSampling)],
        ahead: Option<AheadStep>,
        queue_next: bool,
    ) -> anyhow::Result<(Vec<SeqOutput>, AheadUse)> {
        // Each sampled sequence's last token, and whether it wants one after this step's.
        let mut last: HashMap<RequestId, Option<u32>> = HashMap::new();
        let mut wants_more: HashMap<RequestId, bool> = HashMap::new();
        for (s, state) in states.iter() {
            last.insert(s.id, state.output.last().copied());
            wants_more.insert(s.id, state.output.len() + 1 < state.max_tokens);
        }
        // The grammars of the constrained sequences, each lent to the part of the step
        // that samples its row.
        let mut grammars: HashMap<RequestId, &mut GrammarMatcher> = states
            .iter_mut()
            .filter_map(|(s, state)| Some((s.id, state.grammar.as_mut()?)))
            .collect();
        let all: Vec<&RunSeq> = seqs.iter().collect();
        let mut tokens: HashMap<RequestId, u32> = HashMap::new();
        let mut used = AheadUse::None;
        let mut queued_next = false;
        if let Some(ahead) = ahead {
            let served: Vec<usize> = (0..ahead.seqs.len())
                .filter(|&j| {
                    let a = &ahead.seqs[j];
                    seqs.iter()
                        .any(|s| a.queued_as(s, last.get(&s.id).copied().flatten()))
                })
                .collect();
            // The queued step goes on only if the batch is exactly what was queued: a
            // sequence that stopped after it was queued (on a stop token, which the runner
            // does not see coming) leaves the batch shorter than its rows.
            let same = served.len() == seqs.len()
                && ahead.seqs.len() == seqs.len()
                && seqs.iter().zip(&ahead.seqs).all(|(s, a)| s.id == a.id);
            if served.is_empty() || (ahead.records_hidden && !same) {
                used = AheadUse::Dropped;
            } else {
                let next = if same && queue_next {
                    self.next_plan(&all, &wants_more)?
                } else {
                    None
                };
                // A row queued for a sequence the batch does not ask for keeps its argmax.
                let row_grammars: Vec<Option<&mut GrammarMatcher>> = (0..ahead.seqs.len())
                    .map(|j| match served.contains(&j) {
                        true => grammars.remove(&ahead.seqs[j].id),
                        false => None,
                    })
                    .collect();
                let ids = std::thread::scope(|scope| {
                    let input = StepInput {
                        source: StepSource::Queued,
                        wanted: Wanted::Argmax {
                            next: next.as_ref(),
                            masks: masks_of(scope, row_grammars),
                        },
                    };
                    let output = self.forward(input)?;
                    queued_next = output.queued_next;
                    output.argmax()
                })?;
                if ids.len() != ahead.seqs.len() {
                    return Err(anyhow!(
                        "{} tokens from a queued step of {} sequences",
                        ids.len(),
                        ahead.seqs.len()
                    ));
                }
                tokens.extend(served.iter().map(|&j| (ahead.seqs[j].id, ids[j])));
                used = AheadUse::Served(served.len());
            }
        }
        let rest: Vec<&RunSeq> = seqs
            .iter()
            .filter(|s| !tokens.contains_key(&s.id))
            .collect();
        if !rest.is_empty() {
            let next = if rest.len() == seqs.len() && queue_next {
                self.next_plan(&all, &wants_more)?
            } else {
                None
            };
            let sampled: Vec<RequestId> = rest.iter().filter(|s| s.sample).map(|s| s.id).collect();
            let row_grammars = sampled.iter().map(|id| grammars.remove(id)).collect();
            let (ids, queued) = self.fresh_greedy(&rest, next.as_ref(), row_grammars)?;
            if ids.len() != sampled.len() {
                return Err(anyhow!(
                    "{} tokens for {} sampled sequences",
                    ids.len(),
                    sampled.len()
                ));
            }
            tokens.extend(sampled.into_iter().zip(ids));
            queued_next = queued;
        }
        let records_hidden = self.hidden.is_some();
        self.ahead = queued_next.then(|| ahead_of(seqs, records_hidden));
        // Where steps queued ahead run on a device, a constrained row takes the tokens its
        // grammar forces one decode step each (its mask allows only the forced one), riding
        // the batch's decode graph: taken at once, they would make the row's next step one
        // of several tokens, which runs eagerly and drops the step queued ahead for every
        // row of the batch. Where the host runs them (the CPU), it takes them at once.
        let take_forced = !self.model.host_waits_on_device();
        let outputs = states
            .iter_mut()
            .map(|(s, state)| {
                let id = *tokens
                    .get(&s.id)
                    .ok_or_else(|| anyhow!("no token for {}", s.id))?;
                let mut tokens = vec![GeneratedToken { id, logprobs: None }];
                let grammar = state.chose(&mut tokens, 0, 0, take_forced);
                Ok(SeqOutput {
                    id: s.id,
                    tokens,
                    num_drafts: 0,
                    num_accepted: 0,
                    grammar,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok((outputs, used))
    }

    /// Runs `seqs` (their tokens from the host) and returns the argmax of each sampled
    /// sequence's last row, among what its grammar of `grammars` allows (one entry per
    /// sampled sequence), queuing `next` after it where the backend can.
    fn fresh_greedy(
        &mut self,
        seqs: &[&RunSeq],
        next: Option<&AttentionPlan>,
        grammars: Vec<Option<&mut GrammarMatcher>>,
    ) -> anyhow::Result<(Vec<u32>, bool)> {
        let (plan, tokens, rows) = self.step_inputs(seqs)?;
        std::thread::scope(|scope| {
            let input = StepInput {
                source: StepSource::Fresh {
                    tokens: &tokens,
                    plan: &plan,
                    logit_rows: &rows,
                },
                wanted: Wanted::Argmax {
                    next,
                    masks: masks_of(scope, grammars),
                },
            };
            let output = self.forward(input)?;
            let queued = output.queued_next;
            Ok((output.argmax()?, queued))
        })
    }

    /// The plan of the step after `seqs` if each went on by one token, when each is a
    /// greedy decode that `wants_more` tokens, with a block and room in the model for the
    /// next; `None` otherwise.
    fn next_plan(
        &self,
        seqs: &[&RunSeq],
        wants_more: &HashMap<RequestId, bool>,
    ) -> anyhow::Result<Option<AttentionPlan>> {
        let max_model_len = self.model.config().max_model_len;
        let goes_on = |s: &&RunSeq| {
            let position = s.num_cached + 1;
            s.sample
                && s.num_drafts == 0
                && s.tokens.len() == 1
                && wants_more.get(&s.id) == Some(&true)
                && position < max_model_len
                && position / self.block_size < s.block_table.len()
        };
        if !seqs.iter().all(goes_on) {
            return Ok(None);
        }
        Ok(Some(self.plan_of(seqs, |s| s.num_cached + 1)?))
    }
}

/// What is queued after `seqs`: each one position further, over the same blocks, its
/// forward recording hidden states where `records_hidden`.
fn ahead_of(seqs: &[RunSeq], records_hidden: bool) -> AheadStep {
    AheadStep {
        records_hidden,
        seqs: seqs
            .iter()
            .map(|s| AheadSeq {
                id: s.id,
                num_cached: s.num_cached + 1,
                num_blocks: s.block_table.len(),
            })
            .collect(),
    }
}

//! The scheduling policy: a plain function of the queues and the limits that says what each
//! sequence computes in the next step ([`schedule`]), and the step's plan as a value
//! ([`Schedule`] before the KV allocator's grant, [`StepPlan`] after it).
//!
//! Continuous batching under `max_num_seqs` and `max_num_batched_tokens`: running decodes
//! take the token budget first (with room for drafts when speculating), then running
//! prompt chunks, then waiting requests in (priority, arrival) order, whose prompts the KV
//! allocator chunks to the budget that is left. The running sequences are listed highest
//! priority first, so that the allocator, when blocks run out, preempts from the back.

use super::queues::Queues;
use crate::messages::{Drafted, RequestId, SchedulerLimits};
use peregrine_ops::sampling::DraftDist;

/// One sequence's work in a step.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedSeq {
    pub id: RequestId,
    /// Tokens to compute: a prompt chunk, a recompute after preemption, or the last token
    /// (plus, before the proposal, room for up to `chunk - 1` drafts; after it, the drafts).
    pub chunk: usize,
    /// Draft tokens to verify after the fed tokens (`chunk - drafts.len()` are fed).
    pub drafts: Vec<u32>,
    /// The distribution each draft was sampled from; `None` for greedy drafts.
    pub draft_dists: Option<Vec<DraftDist>>,
}

/// What the policy asks of the KV allocator for one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    /// Every running sequence, highest priority first, with its chunk (0 when the budget
    /// ran out before it).
    pub running: Vec<PlannedSeq>,
    /// Waiting sequences that may start, in order.
    pub admit: Vec<RequestId>,
    /// Tokens the step may still compute for them.
    pub token_budget: usize,
}

/// The step's plan once blocks are granted: the sequences that compute something, in batch
/// order (priority, then arrival).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepPlan {
    pub seqs: Vec<PlannedSeq>,
}

impl StepPlan {
    /// Whether the step computes nothing.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Each sequence's chunk shrinks to its fed token plus the drafts it got (at most the
    /// room it was planned with); sequences missing from `drafts` verify none.
    pub fn with_drafts(mut self, drafts: Vec<(RequestId, Drafted)>) -> StepPlan {
        for (id, mut got) in drafts {
            if let Some(seq) = self.seqs.iter_mut().find(|s| s.id == id) {
                got.truncate(seq.chunk.saturating_sub(1));
                seq.chunk = 1 + got.tokens.len();
                seq.drafts = got.tokens;
                seq.draft_dists = got.dists;
            }
        }
        self
    }
}

/// The next step's schedule over `queues` under `limits`, planning each decode for its
/// last token plus up to `drafts` drafts (never past its `max_tokens`; 0 without a
/// drafter).
pub fn schedule(queues: &Queues, limits: &SchedulerLimits, drafts: usize) -> Schedule {
    let mut budget = limits.max_num_batched_tokens;
    let mut running: Vec<PlannedSeq> = queues
        .running()
        .map(|seq| PlannedSeq {
            id: seq.req.id,
            chunk: 0,
            drafts: Vec::new(),
            draft_dists: None,
        })
        .collect();
    for decode_pass in [true, false] {
        for planned in &mut running {
            let seq = queues.get(planned.id).expect("a running request");
            if seq.is_decoding() != decode_pass {
                continue;
            }
            let room = if decode_pass {
                let left = seq.req.spec.max_tokens.saturating_sub(seq.output_len() + 1);
                drafts.min(left)
            } else {
                0
            };
            planned.chunk = (seq.remaining() + room).min(budget);
            budget -= planned.chunk;
        }
    }
    let free_slots = limits.max_num_seqs.saturating_sub(running.len());
    let admit = queues
        .waiting()
        .take(if budget == 0 { 0 } else { free_slots })
        .map(|seq| seq.req.id)
        .collect();
    Schedule {
        running,
        admit,
        token_budget: budget,
    }
}

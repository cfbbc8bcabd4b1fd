//! The scheduling policy: a plain function of the queues and the limits that says what each
//! sequence computes in the next step ([`schedule`]), as a [`Schedule`] (`super::plan`).
//!
//! Continuous batching under `max_num_seqs` and `max_num_batched_tokens`: running decodes
//! take the token budget first (with room for drafts when speculating), then running
//! prompt chunks, then waiting requests in (priority, arrival) order, whose prompts the KV
//! allocator chunks to the budget that is left. The running sequences are listed highest
//! priority first, so that the allocator, when blocks run out, preempts from the back;
//! those held for a disk read are not listed (they take a seat, not a step).
//!
//! A request that scores its prompt (`prompt_logprobs`) wants the logits of every row of
//! its prompt chunks. Where the backend holds fewer logit rows a step than it computes
//! tokens (`max_logit_rows`, a GPU's), those chunks share what the other sequences leave
//! of the rows ([`scoring_rows`]).

use super::plan::{PlannedSeq, Schedule};
use super::queues::Queues;
use super::seq::Seq;
use crate::messages::SchedulerLimits;

/// The next step's schedule over `queues` under `limits`, planning each decode for its
/// last token plus up to `drafts` drafts (never past its `max_tokens`; 0 without a
/// drafter), within `max_logit_rows` logit rows a step where the backend has such a bound.
pub fn schedule(
    queues: &Queues,
    limits: &SchedulerLimits,
    drafts: usize,
    max_logit_rows: Option<usize>,
) -> Schedule {
    let mut budget = limits.max_num_batched_tokens;
    let free_slots = limits.max_num_seqs.saturating_sub(queues.running().count());
    let mut rows = scoring_rows(queues, limits, drafts, max_logit_rows, free_slots);
    let mut running: Vec<PlannedSeq> = queues
        .schedulable()
        .map(|seq| PlannedSeq {
            id: seq.req.id,
            chunk: 0,
            drafts: Vec::new(),
            draft_dists: None,
            drafts_on_device: None,
        })
        .collect();
    for decode_pass in [true, false] {
        for planned in &mut running {
            let seq = queues.get(planned.id).expect("a running request");
            if seq.is_decoding() != decode_pass {
                continue;
            }
            let room = if decode_pass {
                decode_room(seq, drafts)
            } else {
                0
            };
            let mut chunk = (seq.remaining() + room).min(budget);
            if let Some(rows) = rows.as_mut().filter(|_| seq.scores_prompt()) {
                chunk = chunk.min(*rows);
                *rows -= chunk;
            }
            planned.chunk = chunk;
            budget -= chunk;
        }
    }
    let admit = queues
        .waiting()
        .take(if budget == 0 { 0 } else { free_slots })
        .map(|seq| seq.req.id)
        .collect();
    Schedule {
        running,
        admit,
        token_budget: budget,
        scoring_rows: rows,
    }
}

/// The drafts a decoding `seq` is planned for: up to `drafts`, never past its
/// `max_tokens`.
fn decode_room(seq: &Seq, drafts: usize) -> usize {
    let left = seq.req.spec.max_tokens.saturating_sub(seq.output_len() + 1);
    drafts.min(left)
}

/// The logit rows a step leaves to the chunks of the sequences that score their prompt
/// (each of whose tokens is a row): `max_logit_rows` less what every other sequence may
/// take (a decode its chunk, another running prompt chunk one row, a request that may be
/// admitted one). `None` where the rows need no bound: there is none, or the step's token
/// budget is no larger (every row is a token).
fn scoring_rows(
    queues: &Queues,
    limits: &SchedulerLimits,
    drafts: usize,
    max_logit_rows: Option<usize>,
    free_slots: usize,
) -> Option<usize> {
    let most = max_logit_rows.filter(|&rows| rows < limits.max_num_batched_tokens)?;
    let running: usize = queues
        .schedulable()
        .map(|seq| match (seq.is_decoding(), seq.scores_prompt()) {
            (true, _) => 1 + decode_room(seq, drafts),
            (false, true) => 0,
            (false, false) => 1,
        })
        .sum();
    let admitted = queues
        .waiting()
        .take(free_slots)
        .filter(|seq| !seq.scores_prompt())
        .count();
    Some(most.saturating_sub(running + admitted))
}

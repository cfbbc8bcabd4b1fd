//! Scoring a request's prompt (vLLM's `prompt_logprobs`): which rows of a step give a
//! prompt token's logprob (each row of a prompt chunk whose next token is a prompt token
//! not scored yet), the step's logit rows with them, and their scores from the step's host
//! logits. What a request has had scored stays with its state, so that a prompt computed
//! again after a preemption is not scored twice.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use anyhow::anyhow;
use peregrine_ops::sampling::log_softmax;

use super::{RunSeq, SeqSampling};
use crate::messages::{PromptLogprobs, RequestId};

/// The rows of one sequence of a step that score its prompt.
pub(super) struct Scoring {
    id: RequestId,
    /// The rows, in the step's token order.
    rows: Range<usize>,
    /// The position in the prompt of the token the first row scores.
    first: usize,
    /// Alternatives per score.
    top: usize,
    prompt: Arc<[u32]>,
}

impl Scoring {
    /// The prompt tokens scored once the step is done: every one before this position.
    fn scored_through(&self) -> usize {
        self.first + self.rows.len()
    }
}

/// The rows of the step over `seqs` that score a prompt token, per sequence whose state
/// in `states` asks for it; an error where a prompt position to score is not computed (it
/// was taken from the prefix cache, which such a request must not read).
pub(super) fn scoring(
    seqs: &[RunSeq],
    states: &HashMap<RequestId, SeqSampling>,
) -> anyhow::Result<Vec<Scoring>> {
    let mut scoring = Vec::new();
    let mut start = 0;
    for s in seqs {
        let offset = start;
        start += s.tokens.len();
        let Some(state) = states.get(&s.id) else {
            continue;
        };
        let (Some(top), prompt) = (state.prompt_logprobs, &state.prompt) else {
            continue;
        };
        // Row `i` is at position `num_cached + i` and scores the token after it.
        let next = state.scored;
        let end = prompt.len().min(s.num_cached + s.tokens.len() + 1);
        if next >= end {
            continue;
        }
        if next <= s.num_cached {
            return Err(anyhow!(
                "{}: prompt token {next} is to be scored but the step starts at position {}",
                s.id,
                s.num_cached
            ));
        }
        let rows = offset + next - 1 - s.num_cached..offset + end - 1 - s.num_cached;
        scoring.push(Scoring {
            id: s.id,
            rows,
            first: next,
            top,
            prompt: Arc::clone(prompt),
        });
    }
    Ok(scoring)
}

/// The step's logit rows: the sampled rows `rows` and every row of `scoring`, in order.
pub(super) fn logit_rows(rows: &[usize], scoring: &[Scoring]) -> Vec<usize> {
    let mut all: Vec<usize> = rows
        .iter()
        .copied()
        .chain(scoring.iter().flat_map(|s| s.rows.clone()))
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// The scores of `scoring`'s prompt tokens, `row` giving the host logits of a step row.
pub(super) fn scores<'a>(
    scoring: &[Scoring],
    row: impl Fn(usize) -> anyhow::Result<&'a [f32]>,
) -> anyhow::Result<Vec<PromptLogprobs>> {
    scoring
        .iter()
        .map(|s| {
            let scores = s
                .rows
                .clone()
                .zip(s.first..)
                .map(|(at, position)| {
                    let token = s.prompt[position];
                    log_softmax(row(at)?, token, s.top).ok_or_else(|| {
                        anyhow!("{}: prompt token {token} is not in the vocabulary", s.id)
                    })
                })
                .collect::<anyhow::Result<_>>()?;
            Ok(PromptLogprobs {
                id: s.id,
                first: s.first,
                scores,
            })
        })
        .collect()
}

/// Records in `states` what `scoring` scored.
pub(super) fn record(scoring: &[Scoring], states: &mut HashMap<RequestId, SeqSampling>) {
    for s in scoring {
        if let Some(state) = states.get_mut(&s.id) {
            state.scored = s.scored_through();
        }
    }
}

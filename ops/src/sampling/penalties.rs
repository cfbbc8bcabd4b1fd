//! Repetition, frequency and presence penalties, applied to the logits as vLLM applies them.

use std::collections::{BTreeMap, BTreeSet};

use super::SamplingParams;

/// Applies the request's penalties to `logits` in place, in vLLM's order: the repetition
/// penalty over every token of the prompt and the output (positive logits divided by it,
/// the others multiplied), then `frequency_penalty × count` and `presence_penalty` (once)
/// subtracted for every token of the output. Token ids outside the vocabulary are ignored.
pub fn apply_penalties(
    params: &SamplingParams,
    logits: &mut [f32],
    prompt_tokens: &[u32],
    output_tokens: &[u32],
) {
    let vocab = logits.len();
    let in_vocab = |token: &&u32| (**token as usize) < vocab;
    let penalty = params.repetition_penalty;
    if penalty != 1.0 {
        let seen: BTreeSet<u32> = prompt_tokens
            .iter()
            .chain(output_tokens)
            .filter(in_vocab)
            .copied()
            .collect();
        for token in seen {
            let logit = &mut logits[token as usize];
            *logit = if *logit > 0.0 {
                *logit / penalty
            } else {
                *logit * penalty
            };
        }
    }
    if params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        for &token in output_tokens.iter().filter(in_vocab) {
            *counts.entry(token).or_default() += 1;
        }
        for (token, count) in counts {
            let logit = &mut logits[token as usize];
            *logit -= params.frequency_penalty * count as f32;
            *logit -= params.presence_penalty;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::testing::random_logits;

    #[test]
    fn penalties_match_a_hand_computation() {
        let mut logits = random_logits(11, 8, 3.0);
        logits[1] = logits[1].abs() + 0.5;
        logits[3] = -logits[3].abs() - 0.5;
        logits[5] = logits[5].abs() + 0.5;
        logits[6] = -logits[6].abs() - 0.5;
        let raw = logits.clone();
        let params = SamplingParams {
            repetition_penalty: 1.3,
            presence_penalty: 0.4,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        // Prompt: 1, 3 (twice), plus an id past the vocabulary; output: 3 once, 5 three
        // times, 6 once.
        apply_penalties(&params, &mut logits, &[1, 3, 3, 1000], &[3, 5, 5, 5, 6]);

        assert_eq!(logits[0], raw[0]);
        assert_eq!(logits[1], raw[1] / 1.3, "positive prompt logit divided");
        assert_eq!(logits[2], raw[2]);
        assert_eq!(logits[3], raw[3] * 1.3 - 0.25 - 0.4, "negative: multiplied");
        assert_eq!(logits[4], raw[4]);
        assert_eq!(logits[5], raw[5] / 1.3 - 0.25 * 3.0 - 0.4);
        assert_eq!(logits[6], raw[6] * 1.3 - 0.25 - 0.4);
        assert_eq!(logits[7], raw[7]);
    }

    #[test]
    fn frequency_and_presence_ignore_the_prompt() {
        let mut logits = random_logits(12, 6, 3.0);
        let raw = logits.clone();
        let params = SamplingParams {
            presence_penalty: -1.5,
            frequency_penalty: 0.75,
            ..Default::default()
        };
        apply_penalties(&params, &mut logits, &[0, 1, 2], &[4, 4]);
        assert_eq!(&logits[..4], &raw[..4]);
        assert_eq!(logits[4], raw[4] - 0.75 * 2.0 + 1.5);
        assert_eq!(logits[5], raw[5]);
    }

    #[test]
    fn default_params_leave_logits_unchanged() {
        let mut logits = random_logits(13, 32, 5.0);
        let raw = logits.clone();
        apply_penalties(&SamplingParams::default(), &mut logits, &[1, 2, 3], &[3, 4]);
        assert_eq!(logits, raw);
    }
}

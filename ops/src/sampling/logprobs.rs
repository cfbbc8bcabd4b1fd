//! Log-probabilities of the raw model output, for the API's `logprobs`.

use std::cmp::Ordering;

/// The log-probability of one token and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The token's log-probability.
    pub logprob: f32,
    /// The token's 1-based rank: how many tokens are at least as likely (vLLM's definition).
    pub rank: usize,
    /// The `top_n` most likely tokens and their log-probabilities, most likely first
    /// (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// Log-softmax of the raw `logits` (before penalties and temperature, as vLLM's default
/// `raw_logprobs` mode), computed in f64: the log-probability and rank of `token` and the
/// `top_n` most likely tokens. `None` if `token` is not in the vocabulary. The logits are
/// expected to be numbers: a NaN makes every result NaN.
pub fn log_softmax(logits: &[f32], token: u32, top_n: usize) -> Option<TokenLogprobs> {
    let token_logit = *logits.get(token as usize)?;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let max = f64::from(max);
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    let log_total = max + sum.ln();
    let logprob = |logit: f32| (f64::from(logit) - log_total) as f32;

    let rank = logits.iter().filter(|&&l| l >= token_logit).count();
    let most_likely_first = |a: &u32, b: &u32| -> Ordering {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let top_n = top_n.min(ids.len());
    if top_n > 0 && top_n < ids.len() {
        ids.select_nth_unstable_by(top_n - 1, most_likely_first);
    }
    ids.truncate(top_n);
    ids.sort_unstable_by(most_likely_first);
    Some(TokenLogprobs {
        logprob: logprob(token_logit),
        rank,
        top: ids
            .into_iter()
            .map(|id| (id, logprob(logits[id as usize])))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::testing::{random_logits, softmax};

    #[test]
    fn logprobs_match_the_log_of_the_softmax() {
        let logits = random_logits(31, 200, 8.0);
        let probs = softmax(&logits, 1.0);
        let mut order: Vec<u32> = (0..200).collect();
        order.sort_by(|&a, &b| probs[b as usize].partial_cmp(&probs[a as usize]).unwrap());
        let mut total = 0.0;
        for token in 0..200u32 {
            let got = log_softmax(&logits, token, 5).unwrap();
            let want = probs[token as usize].ln();
            assert!(
                (f64::from(got.logprob) - want).abs() < 1e-5,
                "token {token}"
            );
            let position = order.iter().position(|&t| t == token).unwrap();
            assert_eq!(got.rank, position + 1, "token {token}");
            let top_ids: Vec<u32> = got.top.iter().map(|&(t, _)| t).collect();
            assert_eq!(top_ids, order[..5]);
            total += f64::from(got.logprob).exp();
        }
        assert!((total - 1.0).abs() < 1e-5);
    }

    #[test]
    fn top_n_is_clamped_and_unknown_tokens_are_none() {
        let logits = random_logits(32, 4, 2.0);
        assert_eq!(log_softmax(&logits, 1, 10).unwrap().top.len(), 4);
        assert!(log_softmax(&logits, 1, 0).unwrap().top.is_empty());
        assert_eq!(log_softmax(&logits, 4, 1), None);
    }
}

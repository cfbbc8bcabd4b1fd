//! Logit biases and `min_tokens`, applied to the logits before the penalties as vLLM
//! applies its logit-bias and min-tokens processors: each `logit_bias` entry is added to its
//! token's logit, and while fewer than `min_tokens` tokens have been generated the stop ids
//! are set to −∞, unless that would leave no token to sample (a grammar that allows only a
//! stop id, or stop ids covering the vocabulary): then they are left as they are, since a
//! row must always give a token. The CPU and GPU samplers take the same adjustments from
//! [`logit_adjustments`], so a request is biased alike on either backend.

use super::{SamplingParams, TokenMask};

/// Whether banning the stop ids still leaves a token that `mask` allows (every token when
/// `None`) in a vocabulary of `vocab`: the condition under which `min_tokens` applies.
pub fn bans_apply(params: &SamplingParams, mask: Option<&TokenMask>, vocab: usize) -> bool {
    let banned = |id: u32| params.min_tokens_stop_ids.contains(&id);
    match mask {
        Some(mask) => mask.allowed().any(|id| !banned(id)),
        None => (0..vocab as u32).any(|id| !banned(id)),
    }
}

/// The additions to a row's logits after `generated` tokens, ascending by token and one
/// per token: each `logit_bias` entry within `vocab` (the last one where an id repeats),
/// and −∞ for each stop id `min_tokens` holds back when `ban` (see [`bans_apply`]).
pub fn logit_adjustments(
    params: &SamplingParams,
    generated: usize,
    vocab: usize,
    ban: bool,
) -> Vec<(u32, f32)> {
    let mut adds = std::collections::BTreeMap::new();
    for &(id, bias) in &params.logit_bias {
        if (id as usize) < vocab {
            adds.insert(id, bias);
        }
    }
    if ban && params.holds_back_stops(generated) {
        for &id in &params.min_tokens_stop_ids {
            if (id as usize) < vocab {
                adds.insert(id, f32::NEG_INFINITY);
            }
        }
    }
    adds.into_iter().collect()
}

/// Applies [`logit_adjustments`] to `logits` in place after `generated` tokens; the stop
/// ids are banned only where a finite logit outside them remains (the CPU's reading of
/// [`bans_apply`]: a masked logit is −∞).
pub fn apply_biases(params: &SamplingParams, logits: &mut [f32], generated: usize) {
    if !params.biases_after(generated) {
        return;
    }
    let ban = params.holds_back_stops(generated)
        && logits
            .iter()
            .enumerate()
            .any(|(id, l)| l.is_finite() && !params.min_tokens_stop_ids.contains(&(id as u32)));
    for (id, add) in logit_adjustments(params, generated, logits.len(), ban) {
        logits[id as usize] += add;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::testing::random_logits;

    fn params(bias: &[(u32, f32)], min_tokens: usize, stops: &[u32]) -> SamplingParams {
        SamplingParams {
            logit_bias: bias.to_vec(),
            min_tokens,
            min_tokens_stop_ids: stops.to_vec(),
            ..SamplingParams::greedy()
        }
    }

    #[test]
    fn biases_add_and_stop_ids_are_banned_until_min_tokens() {
        let raw = random_logits(5, 12, 2.0);
        // Id 40 lies past the vocabulary: ignored. Id 3 is biased and a stop id: banned.
        let p = params(&[(1, 5.5), (3, -2.0), (40, 9.0)], 3, &[3, 7]);
        for generated in 0..5 {
            let mut got = raw.clone();
            apply_biases(&p, &mut got, generated);
            let mut want = raw.clone();
            want[1] += 5.5;
            want[3] -= 2.0;
            if generated < 3 {
                want[3] = f32::NEG_INFINITY;
                want[7] = f32::NEG_INFINITY;
            }
            assert_eq!(got, want, "after {generated} tokens");
        }
    }

    #[test]
    fn biases_end_with_min_tokens_unless_logit_bias_is_set() {
        let min_only = params(&[], 3, &[2]);
        assert!(min_only.biases_after(2));
        assert!(!min_only.biases_after(3));
        assert!(!params(&[], 3, &[]).biases_after(0));
        assert!(params(&[(1, 0.5)], 0, &[]).biases_after(100));
    }

    #[test]
    fn a_ban_that_would_leave_nothing_is_not_applied() {
        let mut logits = vec![f32::NEG_INFINITY; 6];
        logits[2] = 0.3;
        let p = params(&[], 4, &[2]);
        let mut got = logits.clone();
        apply_biases(&p, &mut got, 0);
        assert_eq!(got, logits);
        let only_stop = TokenMask::allowing([2], 6);
        assert!(!bans_apply(&p, Some(&only_stop), 6));
        assert!(bans_apply(&p, Some(&TokenMask::allowing([2, 4], 6)), 6));
        assert!(bans_apply(&p, None, 6));
        assert!(!bans_apply(&params(&[], 4, &[0, 1, 2]), None, 3));
    }

    #[test]
    fn adjustments_are_sorted_with_the_last_bias_of_a_repeated_id() {
        let p = params(&[(9, 1.0), (2, -1.0), (9, 3.0)], 1, &[4]);
        assert_eq!(
            logit_adjustments(&p, 0, 10, true),
            vec![(2, -1.0), (4, f32::NEG_INFINITY), (9, 3.0)]
        );
        assert_eq!(
            logit_adjustments(&p, 1, 10, true),
            vec![(2, -1.0), (9, 3.0)]
        );
        assert_eq!(
            logit_adjustments(&p, 0, 10, false),
            vec![(2, -1.0), (9, 3.0)]
        );
    }
}

//! The distribution a token is drawn from, built from penalised logits: the argmax when
//! greedy, else temperature, top-k, top-p, min-p and renormalisation, in f64.

use std::cmp::Ordering;

use super::SamplingParams;

/// The final distribution over `logits` (already penalised) as `(token, probability)`
/// pairs, most likely first (ties: lower id first), without zero-probability tokens;
/// probabilities sum to 1. Greedy params give the argmax alone (ties: lowest id).
/// NaN logits count as -inf and never win. Empty logits give an empty list.
///
/// Order of the filters, as in vLLM's v0 sampler: divide by the temperature, keep the
/// `top_k` largest (ties at the boundary: lower ids), keep the smallest prefix whose
/// cumulative probability reaches `top_p` (at least one token), drop tokens whose
/// probability is below `min_p` times the largest, renormalise.
pub(super) fn distribution(params: &SamplingParams, logits: &[f32]) -> Vec<(u32, f64)> {
    if params.is_greedy() {
        return argmax(logits)
            .map(|token| (token, 1.0))
            .into_iter()
            .collect();
    }
    let temperature = f64::from(params.temperature);
    let mut candidates: Vec<(u32, f64)> = (0u32..)
        .zip(logits)
        .map(|(token, &logit)| (token, scale(logit, temperature)))
        .collect();
    let top_k = usize::try_from(params.top_k).unwrap_or(0);
    if top_k > 0 && top_k < candidates.len() {
        candidates.select_nth_unstable_by(top_k - 1, most_likely_first);
        candidates.truncate(top_k);
    }
    candidates.sort_unstable_by(most_likely_first);
    let Some(&(_, max)) = candidates.first() else {
        return candidates;
    };
    if max == f64::NEG_INFINITY {
        // Every logit is -inf or NaN: fall back to the lowest id, as greedy would.
        candidates.truncate(1);
        candidates[0].1 = 1.0;
        return candidates;
    }
    for candidate in &mut candidates {
        candidate.1 = (candidate.1 - max).exp();
    }
    candidates.retain(|&(_, p)| p > 0.0);
    normalise(&mut candidates);
    if params.top_p < 1.0 {
        let top_p = f64::from(params.top_p);
        let mut cumulative = 0.0;
        let keep = candidates
            .iter()
            .position(|&(_, p)| {
                cumulative += p;
                cumulative >= top_p
            })
            .map_or(candidates.len(), |last| last + 1);
        candidates.truncate(keep);
    }
    if params.min_p > 0.0 {
        let threshold = f64::from(params.min_p) * candidates[0].1;
        candidates.retain(|&(_, p)| p >= threshold);
    }
    normalise(&mut candidates);
    candidates
}

/// The id of the largest logit, the lowest id among ties; NaN counts as -inf (the greedy
/// choice). `None` for an empty row.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let key = |logit: f32| {
        if logit.is_nan() {
            f32::NEG_INFINITY
        } else {
            logit
        }
    };
    let mut best: Option<(u32, f32)> = None;
    for (token, &logit) in (0u32..).zip(logits) {
        match best {
            Some((_, top)) if key(logit) <= top => {}
            _ => best = Some((token, key(logit))),
        }
    }
    best.map(|(token, _)| token)
}

/// `logit / temperature` in f64, NaN as -inf and +inf capped so that softmax stays finite.
fn scale(logit: f32, temperature: f64) -> f64 {
    if logit.is_nan() {
        f64::NEG_INFINITY
    } else {
        (f64::from(logit) / temperature).min(f64::MAX)
    }
}

/// Orders candidates by descending value, then ascending id.
fn most_likely_first(a: &(u32, f64), b: &(u32, f64)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Divides every probability by their sum, accumulated in list order.
fn normalise(candidates: &mut [(u32, f64)]) {
    let total: f64 = candidates.iter().map(|&(_, p)| p).sum();
    for candidate in candidates {
        candidate.1 /= total;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::sampling::testing::{random_logits, softmax};

    const TOLERANCE: f64 = 1e-12;

    /// Token ids ordered by descending probability, by a full sort.
    fn ranked(probs: &[f64]) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..probs.len() as u32).collect();
        ids.sort_by(|&a, &b| probs[b as usize].partial_cmp(&probs[a as usize]).unwrap());
        ids
    }

    /// Asserts `got` holds exactly the tokens of `kept`, with `probs` renormalised over them.
    fn assert_kept(got: &[(u32, f64)], kept: &[u32], probs: &[f64]) {
        let got_map: BTreeMap<u32, f64> = got.iter().copied().collect();
        let mut want: Vec<u32> = kept.to_vec();
        want.sort_unstable();
        assert_eq!(got_map.keys().copied().collect::<Vec<_>>(), want);
        let total: f64 = kept.iter().map(|&t| probs[t as usize]).sum();
        for &token in kept {
            let want_p = probs[token as usize] / total;
            assert!(
                (got_map[&token] - want_p).abs() < TOLERANCE,
                "token {token}"
            );
        }
    }

    #[test]
    fn greedy_is_the_argmax() {
        for seed in 0..20 {
            let logits = random_logits(seed, 1000, 10.0);
            let max = logits.iter().copied().fold(f32::MIN, f32::max);
            let want = logits.iter().position(|&l| l == max).unwrap() as u32;
            let got = distribution(&SamplingParams::greedy(), &logits);
            assert_eq!(got, vec![(want, 1.0)], "seed {seed}");
        }
    }

    #[test]
    fn greedy_ties_go_to_the_lowest_id_and_nan_never_wins() {
        let mut logits = random_logits(1, 64, 1.0);
        logits[40] = 3.0;
        logits[17] = 3.0;
        logits[0] = f32::NAN;
        logits[63] = f32::NAN;
        assert_eq!(argmax(&logits), Some(17));
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), Some(0));
        assert_eq!(argmax(&[]), None);
    }

    #[test]
    fn temperature_alone_gives_the_softmax() {
        let logits = random_logits(2, 300, 4.0);
        let params = SamplingParams {
            temperature: 0.6,
            ..Default::default()
        };
        let probs = softmax(&logits, 0.6);
        let all: Vec<u32> = (0..300).collect();
        let got = distribution(&params, &logits);
        assert_kept(&got, &all, &probs);
        assert!(got.windows(2).all(|w| w[0].1 >= w[1].1), "sorted");
    }

    #[test]
    fn top_k_keeps_exactly_the_k_largest() {
        for (seed, k) in [(3, 1), (4, 7), (5, 49), (6, 50), (7, 80)] {
            let logits = random_logits(seed, 50, 4.0);
            let params = SamplingParams {
                temperature: 0.7,
                top_k: k,
                ..Default::default()
            };
            let probs = softmax(&logits, 0.7);
            // A token is kept iff fewer than k tokens have a larger logit.
            let kept: Vec<u32> = (0..50u32)
                .filter(|&t| {
                    logits.iter().filter(|&&l| l > logits[t as usize]).count() < k as usize
                })
                .collect();
            assert_eq!(kept.len(), (k as usize).min(50));
            assert_kept(&distribution(&params, &logits), &kept, &probs);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        for (seed, top_p) in [(8, 0.05), (9, 0.5), (10, 0.9), (11, 0.999)] {
            let logits = random_logits(seed, 40, 3.0);
            let params = SamplingParams {
                temperature: 1.3,
                top_p,
                ..Default::default()
            };
            let probs = softmax(&logits, 1.3);
            let order = ranked(&probs);
            // Brute force: the first prefix length whose mass reaches top_p.
            let size = (1..=order.len())
                .find(|&n| {
                    order[..n].iter().map(|&t| probs[t as usize]).sum::<f64>() >= f64::from(top_p)
                })
                .unwrap();
            assert_kept(&distribution(&params, &logits), &order[..size], &probs);
        }
    }

    #[test]
    fn min_p_drops_tokens_below_the_scaled_maximum() {
        for (seed, min_p) in [(12, 0.01), (13, 0.2), (14, 0.7), (15, 1.0)] {
            let logits = random_logits(seed, 60, 3.0);
            let params = SamplingParams {
                temperature: 0.9,
                min_p,
                ..Default::default()
            };
            let probs = softmax(&logits, 0.9);
            let max = probs.iter().copied().fold(0.0, f64::max);
            let kept: Vec<u32> = (0..60u32)
                .filter(|&t| probs[t as usize] >= f64::from(min_p) * max)
                .collect();
            assert_kept(&distribution(&params, &logits), &kept, &probs);
        }
    }

    #[test]
    fn filters_combine_to_their_intersection_in_order() {
        let logits = random_logits(16, 100, 3.0);
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 30,
            top_p: 0.8,
            min_p: 0.05,
            ..Default::default()
        };
        let probs = softmax(&logits, 0.8);
        let order = ranked(&probs);
        // top-k, then top-p on the distribution renormalised over the top k.
        let top_k_mass: f64 = order[..30].iter().map(|&t| probs[t as usize]).sum();
        let size = (1..=30)
            .find(|&n| {
                order[..n].iter().map(|&t| probs[t as usize]).sum::<f64>() / top_k_mass >= 0.8
            })
            .unwrap();
        let max = probs[order[0] as usize];
        let kept: Vec<u32> = order[..size]
            .iter()
            .copied()
            .filter(|&t| probs[t as usize] >= 0.05 * max)
            .collect();
        assert_kept(&distribution(&params, &logits), &kept, &probs);
    }

    #[test]
    fn non_finite_logits_are_handled() {
        let mut logits = random_logits(17, 10, 2.0);
        logits[2] = f32::NAN;
        logits[5] = f32::NEG_INFINITY;
        let got = distribution(&SamplingParams::default(), &logits);
        assert_eq!(got.len(), 8);
        assert!(got.iter().all(|&(t, p)| t != 2 && t != 5 && p > 0.0));
        logits[7] = f32::INFINITY;
        assert_eq!(
            distribution(&SamplingParams::default(), &logits),
            vec![(7, 1.0)]
        );
        let masked = [f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY];
        assert_eq!(
            distribution(&SamplingParams::default(), &masked),
            vec![(0, 1.0)]
        );
        assert!(distribution(&SamplingParams::default(), &[]).is_empty());
    }
}

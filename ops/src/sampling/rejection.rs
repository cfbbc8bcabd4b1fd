//! Lossless verification of draft tokens against the target's logits (Leviathan et al.,
//! arXiv 2211.17192; vLLM's `RejectionSampler`). The target's distributions come from the
//! request's own [`Sampler`] (penalties, temperature, top-k, top-p, min-p), and so do the
//! uniforms, so a seeded request is reproducible with speculation on.
//!
//! Greedy requests accept drafts while each equals the target's argmax and then emit the
//! target's own token, so their output is exactly what decoding without drafts gives.
//! Sampled requests accept draft `d_i` with probability `min(1, p_i(d_i) / q_i(d_i))`; on
//! the first rejection they emit a token drawn from `normalise(max(0, p_i − q_i))`; when
//! every draft is accepted they emit a bonus token drawn from `p_{n+1}`. Greedy drafters
//! (n-gram, draft models decoding greedily) pass no `q`: it is one-hot on the draft.

use super::{DraftDist, Sampler};

/// What verification emitted for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The tokens to append, in order: the accepted drafts, then one token from the target
    /// (the correction at the first rejection, or the bonus token).
    pub tokens: Vec<u32>,
    /// How many drafts were accepted (`tokens.len() - 1`).
    pub accepted: usize,
}

/// Verifies `drafts` with the target's logit rows: `rows[i]` are the logits after the
/// context plus `drafts[..i]`, so `rows[i]` judges `drafts[i]` and `rows[drafts.len()]`
/// gives the bonus token. `draft_probs[i]` is the drafter's distribution `drafts[i]` was
/// drawn from; `None` means a greedy drafter (one-hot `q`).
/// `output` is what the request generated before this step (for the penalties).
///
/// # Panics
/// If `rows.len() != drafts.len() + 1` or `draft_probs` has another length than `drafts`
/// (a caller bug, never user input), or if a row is empty.
pub fn verify(
    sampler: &mut Sampler,
    rows: &[&[f32]],
    drafts: &[u32],
    draft_probs: Option<&[DraftDist]>,
    prompt: &[u32],
    output: &[u32],
) -> Verdict {
    assert_eq!(
        rows.len(),
        drafts.len() + 1,
        "one logit row per draft, plus one"
    );
    if let Some(q) = draft_probs {
        assert_eq!(q.len(), drafts.len(), "one draft distribution per draft");
    }
    let mut history = output.to_vec();
    let mut tokens = Vec::with_capacity(rows.len());
    for (i, (&row, &draft)) in rows.iter().zip(drafts).enumerate() {
        let token = if sampler.params().is_greedy() {
            sampler.sample(row, prompt, &history)
        } else {
            let q = draft_probs.map(|q| &q[i]);
            judge(sampler, row, draft, q, prompt, &history)
        };
        tokens.push(token);
        if token != draft {
            let accepted = tokens.len() - 1;
            return Verdict { tokens, accepted };
        }
        history.push(token);
    }
    tokens.push(sampler.sample(rows[drafts.len()], prompt, &history));
    Verdict {
        accepted: drafts.len(),
        tokens,
    }
}

/// Greedy verification from the target's choice at each row alone (its argmax, when no
/// penalty depends on the tokens accepted before it): `targets[i]` judges `drafts[i]` and
/// `targets[drafts.len()]` is the bonus token. The same verdict as [`verify`] for a greedy
/// sampler without penalties.
///
/// # Panics
/// If `targets.len() != drafts.len() + 1` (a caller bug).
pub fn accept_greedy(targets: &[u32], drafts: &[u32]) -> Verdict {
    assert_eq!(
        targets.len(),
        drafts.len() + 1,
        "one target token per draft, plus one"
    );
    let accepted = drafts
        .iter()
        .zip(targets)
        .take_while(|(draft, target)| draft == target)
        .count();
    Verdict {
        tokens: targets[..=accepted].to_vec(),
        accepted,
    }
}

/// One sampled position: the draft if accepted, else a token from the residual.
fn judge(
    sampler: &mut Sampler,
    row: &[f32],
    draft: u32,
    q: Option<&DraftDist>,
    prompt: &[u32],
    history: &[u32],
) -> u32 {
    let p = sampler.probabilities(row, prompt, history);
    let q_of = |token: u32| match q {
        None => f64::from(u8::from(token == draft)),
        Some(q) => q.prob(token),
    };
    let p_draft = p
        .iter()
        .find(|&&(t, _)| t == draft)
        .map_or(0.0, |&(_, v)| v);
    let q_draft = q_of(draft);
    let u = sampler.next_uniform().unwrap_or(0.0);
    if q_draft > 0.0 && u < p_draft / q_draft {
        return draft;
    }
    // Rejected: draw from max(0, p - q), renormalised, by inverse CDF in p's order.
    let residual: Vec<(u32, f64)> = p
        .iter()
        .map(|&(t, pv)| (t, (pv - q_of(t)).max(0.0)))
        .filter(|&(_, r)| r > 0.0)
        .collect();
    let total: f64 = residual.iter().map(|&(_, r)| r).sum();
    let Some(&(last, _)) = residual.last() else {
        // p <= q everywhere means p == q, where rejection cannot happen except through
        // rounding; the target's own most likely token is then the exact choice.
        return p[0].0;
    };
    let draw = sampler.next_uniform().unwrap_or(0.0) * total;
    let mut cumulative = 0.0;
    for &(token, r) in &residual {
        cumulative += r;
        if draw < cumulative {
            return token;
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::testing::{random_logits, softmax};
    use crate::sampling::SamplingParams;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const VOCAB: usize = 5;

    /// The toy target: logits depend on the last context token.
    fn target_logits(context: &[u32]) -> Vec<f32> {
        random_logits(100 + u64::from(*context.last().unwrap()), VOCAB, 2.0)
    }

    /// The toy drafter's distribution: different from the target's, also by last token.
    fn draft_dist(context: &[u32]) -> DraftDist {
        let logits = random_logits(900 + u64::from(*context.last().unwrap()), VOCAB, 1.5);
        DraftDist::from_logits(&logits, 1.0, |i| i as u32)
    }

    fn draw(dist: &DraftDist, rng: &mut ChaCha8Rng) -> u32 {
        dist.sample(rng.random())
    }

    /// The first two tokens a request generates with `k` drafts per step, sampled (or
    /// greedy, `one_hot`) from the toy drafter and verified against the toy target.
    fn first_two(sampler: &mut Sampler, rng: &mut ChaCha8Rng, k: usize, one_hot: bool) -> [u32; 2] {
        let prompt = vec![0u32];
        let mut out: Vec<u32> = Vec::new();
        while out.len() < 2 {
            let mut context: Vec<u32> = prompt.iter().chain(&out).copied().collect();
            let mut drafts = Vec::new();
            let mut qs = Vec::new();
            let mut rows = vec![target_logits(&context)];
            for _ in 0..k {
                let q = draft_dist(&context);
                let d = if one_hot {
                    let pairs = q.pairs();
                    pairs.iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap().0
                } else {
                    draw(&q, rng)
                };
                drafts.push(d);
                qs.push(q);
                context.push(d);
                rows.push(target_logits(&context));
            }
            let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            let q = (!one_hot).then_some(qs.as_slice());
            let v = verify(sampler, &rows, &drafts, q, &prompt, &out);
            assert_eq!(v.tokens.len(), v.accepted + 1);
            out.extend(v.tokens);
        }
        [out[0], out[1]]
    }

    /// Pearson's chi-square of the joint counts of the first two tokens against the
    /// target's own `p(t1) * p(t2 | t1)` at temperature 0.9.
    fn chi_square(counts: &[[usize; VOCAB]; VOCAB], draws: usize) -> f64 {
        let p1 = softmax(&target_logits(&[0]), 0.9);
        let mut chi2 = 0.0;
        for (a, row) in counts.iter().enumerate() {
            let p2 = softmax(&target_logits(&[0, a as u32]), 0.9);
            for (b, &n) in row.iter().enumerate() {
                let expected = draws as f64 * p1[a] * p2[b];
                assert!(expected >= 5.0, "test setup: expected count {expected} < 5");
                chi2 += (n as f64 - expected).powi(2) / expected;
            }
        }
        chi2
    }

    /// Upper 0.001 quantile of chi-square with 24 degrees of freedom (25 cells, NIST
    /// e-Handbook table 1.3.6.7.4): a correct sampler fails this test once in 1,000 seeds.
    const CHI2_24_DF_0_001: f64 = 51.179;

    fn check_distribution(k: usize, one_hot: bool) {
        const DRAWS: usize = 40_000;
        let params = SamplingParams {
            temperature: 0.9,
            seed: Some(7),
            ..Default::default()
        };
        let mut sampler = Sampler::new(&params).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut counts = [[0usize; VOCAB]; VOCAB];
        for _ in 0..DRAWS {
            let [a, b] = first_two(&mut sampler, &mut rng, k, one_hot);
            counts[a as usize][b as usize] += 1;
        }
        let chi2 = chi_square(&counts, DRAWS);
        assert!(
            chi2 < CHI2_24_DF_0_001,
            "chi-square {chi2} >= {CHI2_24_DF_0_001} (24 df, alpha 0.001)"
        );
    }

    #[test]
    fn sampled_drafts_keep_the_target_distribution() {
        check_distribution(3, false);
    }

    #[test]
    fn greedy_drafts_keep_the_target_distribution() {
        check_distribution(2, true);
    }

    #[test]
    fn the_test_can_fail_when_drafts_are_taken_unchecked() {
        // Emitting the drafter's tokens as they are must fail the same statistic.
        const DRAWS: usize = 40_000;
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let mut counts = [[0usize; VOCAB]; VOCAB];
        for _ in 0..DRAWS {
            let a = draw(&draft_dist(&[0]), &mut rng);
            let b = draw(&draft_dist(&[0, a]), &mut rng);
            counts[a as usize][b as usize] += 1;
        }
        assert!(chi_square(&counts, DRAWS) > CHI2_24_DF_0_001);
    }

    #[test]
    fn greedy_accepts_the_argmax_prefix_then_corrects() {
        let rows: Vec<Vec<f32>> = (0..4).map(|i| random_logits(40 + i, 50, 3.0)).collect();
        let argmax = |r: &[f32]| {
            let max = r.iter().copied().fold(f32::MIN, f32::max);
            r.iter().position(|&l| l == max).unwrap() as u32
        };
        let want: Vec<u32> = rows.iter().map(|r| argmax(r)).collect();
        let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let mut sampler = Sampler::new(&SamplingParams::greedy()).unwrap();
        let all = verify(&mut sampler, &refs, &want[..3], None, &[], &[]);
        assert_eq!(
            all,
            Verdict {
                tokens: want.clone(),
                accepted: 3
            }
        );
        let wrong = (want[1] + 1) % 50;
        let drafts = [want[0], wrong, want[2]];
        let some = verify(&mut sampler, &refs, &drafts, None, &[], &[]);
        assert_eq!(
            some,
            Verdict {
                tokens: want[..2].to_vec(),
                accepted: 1
            }
        );
        let none = verify(&mut sampler, &refs[..1], &[], None, &[], &[]);
        assert_eq!(none.tokens, vec![want[0]]);
        // From the rows' argmaxes alone, the same verdicts.
        assert_eq!(accept_greedy(&want, &want[..3]), all);
        assert_eq!(accept_greedy(&want, &drafts), some);
        assert_eq!(accept_greedy(&want[..1], &[]), none);
        let first_wrong = [(want[0] + 1) % 50, want[1], want[2]];
        assert_eq!(
            accept_greedy(&want, &first_wrong),
            verify(&mut sampler, &refs, &first_wrong, None, &[], &[])
        );
    }

    #[test]
    fn greedy_verification_sees_the_accepted_drafts_in_the_penalties() {
        // Two equal rows; a strong frequency penalty makes the second argmax differ once
        // the first token is in the history.
        let row = random_logits(50, 30, 0.5);
        let params = SamplingParams {
            frequency_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        let mut sampler = Sampler::new(&params).unwrap();
        let first = sampler.sample(&row, &[], &[]);
        let second = sampler.sample(&row, &[], &[first]);
        assert_ne!(first, second);
        let rows = [row.as_slice(), row.as_slice()];
        let v = verify(&mut sampler, &rows, &[first], None, &[], &[]);
        assert_eq!(v.tokens, vec![first, second]);
    }
}

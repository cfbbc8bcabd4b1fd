//! A drafter's distribution for one draft token, `q` of lossless verification (Leviathan et
//! al., arXiv 2211.17192): the draft is drawn from it and verification accepts the draft
//! with `min(1, p / q)`, so any `q` keeps the target's distribution; the closer it is to
//! the target's `p`, the more drafts are accepted. A sampled request's drafts come from
//! the drafter's logits at the request's temperature over its most likely tokens.

use super::SamplingError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// The most tokens a draft distribution keeps: the drafter's most likely ones. Verification
/// looks up `q` for every token the target keeps, so `q` stays small; the mass past a
/// drafter's top 32 tokens is small next to what it shares with the target.
pub const DRAFT_DIST_TOKENS: usize = 32;

/// `q` for one draft: `(token, probability)` pairs, ascending by token, with positive
/// probabilities summing to 1.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftDist {
    pairs: Vec<(u32, f64)>,
}

impl DraftDist {
    /// The softmax at `temperature` (> 0) of the [`DRAFT_DIST_TOKENS`] largest of
    /// `logits` (the first among equal ones), logit `i` standing for token `token(i)`
    /// (distinct tokens). Sums run in f64 in descending logit order.
    ///
    /// # Panics
    /// If `logits` is empty or `temperature` is not positive (caller bugs).
    pub fn from_logits(
        logits: &[f32],
        temperature: f64,
        token: impl Fn(usize) -> u32,
    ) -> DraftDist {
        assert!(!logits.is_empty(), "a draft distribution needs logits");
        assert!(
            temperature > 0.0,
            "a sampled draft needs a positive temperature"
        );
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let keep = DRAFT_DIST_TOKENS.min(logits.len());
        let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        if keep < order.len() {
            order.select_nth_unstable_by(keep - 1, by_logit);
            order.truncate(keep);
        }
        order.sort_by(by_logit);
        let top = f64::from(logits[order[0]]);
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| ((f64::from(logits[i]) - top) / temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut pairs: Vec<(u32, f64)> = order
            .iter()
            .zip(&weights)
            .filter(|(_, &w)| w > 0.0)
            .map(|(&i, &w)| (token(i), w / total))
            .collect();
        pairs.sort_by_key(|&(t, _)| t);
        DraftDist { pairs }
    }

    /// The distribution of `pairs` (`(token, probability)`), for tests and drafters that
    /// build their own: sorted by token here.
    ///
    /// # Panics
    /// If a token repeats, a probability is not positive, or they do not sum to 1 within
    /// 1e-6.
    pub fn from_pairs(mut pairs: Vec<(u32, f64)>) -> DraftDist {
        pairs.sort_by_key(|&(t, _)| t);
        assert!(
            pairs.windows(2).all(|w| w[0].0 != w[1].0),
            "a token twice in a draft distribution"
        );
        assert!(
            pairs.iter().all(|&(_, p)| p > 0.0),
            "a probability of 0 or less"
        );
        let total: f64 = pairs.iter().map(|&(_, p)| p).sum();
        assert!(
            (total - 1.0).abs() < 1e-6,
            "draft probabilities sum to {total}"
        );
        DraftDist { pairs }
    }

    /// `q(token)`: 0 for a token the distribution does not hold.
    pub fn prob(&self, token: u32) -> f64 {
        self.pairs
            .binary_search_by_key(&token, |&(t, _)| t)
            .map_or(0.0, |i| self.pairs[i].1)
    }

    /// The token at uniform `u` (in `[0, 1)`) by inverse CDF in ascending token order.
    pub fn sample(&self, u: f64) -> u32 {
        let mut cumulative = 0.0;
        for &(token, p) in &self.pairs {
            cumulative += p;
            if u < cumulative {
                return token;
            }
        }
        self.pairs[self.pairs.len() - 1].0
    }

    /// The pairs, ascending by token.
    pub fn pairs(&self) -> &[(u32, f64)] {
        &self.pairs
    }
}

/// Mixed into a request's seed for its drafts' random numbers, so that they are a stream
/// apart from the target sampler's (which is seeded with the seed itself).
const DRAFT_STREAM: u64 = 0x9e37_79b9_7f4a_7c15;

/// Draws one sampled request's drafts from a drafter's logits: [`DraftDist::from_logits`]
/// at the request's temperature, then one uniform of the drafter's own ChaCha20 stream.
pub struct DraftSampler {
    rng: ChaCha20Rng,
    temperature: f64,
}

impl DraftSampler {
    /// A sampler at `temperature` (> 0), its stream seeded from `seed` (apart from the
    /// target's) or, without one, from OS entropy.
    pub fn new(temperature: f32, seed: Option<u64>) -> Result<DraftSampler, SamplingError> {
        let rng = match seed {
            Some(seed) => ChaCha20Rng::seed_from_u64(seed ^ DRAFT_STREAM),
            None => ChaCha20Rng::try_from_os_rng()
                .map_err(|err| SamplingError::Entropy(err.to_string()))?,
        };
        Ok(DraftSampler {
            rng,
            temperature: f64::from(temperature),
        })
    }

    /// A draft drawn from `logits` (logit `i` for token `token(i)`), with the distribution
    /// it was drawn from.
    pub fn draw(&mut self, logits: &[f32], token: impl Fn(usize) -> u32) -> (u32, DraftDist) {
        let dist = DraftDist::from_logits(logits, self.temperature, token);
        (dist.sample(self.rng.random()), dist)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_top_tokens_at_the_temperature() {
        // 40 logits: token 100 + i has logit i / 4, so the top 32 are i = 8..40.
        let logits: Vec<f32> = (0..40).map(|i| i as f32 / 4.0).collect();
        let q = DraftDist::from_logits(&logits, 0.5, |i| 100 + i as u32);
        assert_eq!(q.pairs().len(), DRAFT_DIST_TOKENS);
        assert_eq!(q.pairs()[0].0, 108);
        assert_eq!(q.prob(107), 0.0);
        let total: f64 = q.pairs().iter().map(|&(_, p)| p).sum();
        assert!((total - 1.0).abs() < 1e-12);
        // The ratio of neighbours is e^((1/4) / 0.5).
        let ratio = q.prob(139) / q.prob(138);
        assert!((ratio - (0.5f64).exp()).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn a_seeded_sampler_draws_the_same_drafts_again() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 / 3.0).collect();
        let draws = |seed| {
            let mut s = DraftSampler::new(0.8, Some(seed)).unwrap();
            (0..20)
                .map(|_| s.draw(&logits, |i| i as u32).0)
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(5), draws(5));
        assert_ne!(draws(5), draws(6));
    }

    #[test]
    fn draws_follow_the_distribution() {
        let q = DraftDist::from_pairs(vec![(9, 0.5), (2, 0.25), (5, 0.25)]);
        assert_eq!(q.pairs(), [(2, 0.25), (5, 0.25), (9, 0.5)]);
        assert_eq!(q.sample(0.0), 2);
        assert_eq!(q.sample(0.3), 5);
        assert_eq!(q.sample(0.49), 5);
        assert_eq!(q.sample(0.5), 9);
        assert_eq!(q.sample(0.999_999), 9);
        // Equal logits keep the first ones and split the mass evenly.
        let flat = DraftDist::from_logits(&[1.0; 40], 1.0, |i| i as u32);
        assert_eq!(flat.pairs().last().unwrap().0, 31);
        assert!((flat.prob(0) - 1.0 / 32.0).abs() < 1e-12);
    }
}

//! The per-request sampler: validated parameters and a ChaCha RNG.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::distribution::distribution;
use super::{apply_biases, apply_penalties, SamplingError, SamplingParams};

/// Chooses the next token of one request. Seeded requests draw the same tokens from the
/// same logits, always: the RNG is ChaCha20 seeded from `seed`, and unseeded requests seed
/// it from OS entropy.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
}

impl Sampler {
    /// A sampler for `params`, which are validated first.
    pub fn new(params: &SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        let rng = match params.seed {
            Some(seed) => ChaCha20Rng::seed_from_u64(seed),
            None => ChaCha20Rng::try_from_os_rng()
                .map_err(|err| SamplingError::Entropy(err.to_string()))?,
        };
        Ok(Self {
            params: params.clone(),
            rng,
        })
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The distribution [`Sampler::sample`] draws from: biases (`logit_bias`, and
    /// `min_tokens` while fewer than that many `output_tokens`), then penalties applied to
    /// `logits`, then
    /// greedy or temperature / top-k / top-p / min-p, as `(token, probability)` pairs,
    /// most likely first (ties: lower id), zero-probability tokens left out, summing to 1.
    pub fn probabilities(
        &self,
        logits: &[f32],
        prompt_tokens: &[u32],
        output_tokens: &[u32],
    ) -> Vec<(u32, f64)> {
        let mut penalised = logits.to_vec();
        apply_biases(&self.params, &mut penalised, output_tokens.len());
        apply_penalties(&self.params, &mut penalised, prompt_tokens, output_tokens);
        distribution(&self.params, &penalised)
    }

    /// The uniform in `[0, 1)` of this request's next draw, taken from its RNG; `None`, and
    /// nothing drawn, when greedy. [`Sampler::sample`] draws through this, so a GPU sampler
    /// that inverts the CDF with this value consumes the RNG exactly as the CPU does: a
    /// seeded request draws the same uniforms on either backend.
    pub fn next_uniform(&mut self) -> Option<f64> {
        if self.params.is_greedy() {
            None
        } else {
            Some(self.rng.random())
        }
    }

    /// The next token: the argmax when greedy (no random number drawn), else one uniform
    /// draw from [`Sampler::probabilities`] by inverse CDF in its order.
    ///
    /// # Panics
    /// If `logits` is empty (a model bug, never user input).
    pub fn sample(&mut self, logits: &[f32], prompt_tokens: &[u32], output_tokens: &[u32]) -> u32 {
        let candidates = self.probabilities(logits, prompt_tokens, output_tokens);
        let (first, _) = *candidates
            .first()
            .expect("sampling needs at least one logit");
        let Some(draw) = self.next_uniform() else {
            return first;
        };
        let mut cumulative = 0.0;
        for &(token, probability) in &candidates {
            cumulative += probability;
            if draw < cumulative {
                return token;
            }
        }
        // Rounding left the total just below `draw`: the last token takes the remainder.
        candidates[candidates.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::testing::{random_logits, random_tokens, softmax};

    /// Upper 0.001 quantiles of the chi-square distribution for 1..=19 degrees of freedom
    /// (standard tables, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4).
    const CHI2_CRITICAL_0_001: [f64; 19] = [
        10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264,
        32.909, 34.528, 36.123, 37.697, 39.252, 40.790, 42.312, 43.820,
    ];

    #[test]
    fn draws_fit_the_expected_distribution() {
        const DRAWS: usize = 20_000;
        let logits = random_logits(21, 20, 2.0);
        let params = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            seed: Some(1234),
            ..Default::default()
        };
        // Expected: softmax(logits / 0.8), cut to the smallest most-likely set reaching 0.9.
        let probs = softmax(&logits, 0.8);
        let mut order: Vec<usize> = (0..20).collect();
        order.sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap());
        let mut mass = 0.0;
        let mut kept = Vec::new();
        for &token in &order {
            kept.push(token);
            mass += probs[token];
            if mass >= 0.9 {
                break;
            }
        }
        assert!(kept.len() >= 3, "test setup: too few tokens kept");

        let mut sampler = Sampler::new(&params).unwrap();
        let mut counts = [0usize; 20];
        for _ in 0..DRAWS {
            counts[sampler.sample(&logits, &[], &[]) as usize] += 1;
        }
        let mut chi2 = 0.0;
        for &token in &kept {
            let expected = DRAWS as f64 * probs[token] / mass;
            assert!(expected >= 5.0, "test setup: expected count {expected} < 5");
            chi2 += (counts[token] as f64 - expected).powi(2) / expected;
        }
        let drawn_outside: usize = (0..20)
            .filter(|t| !kept.contains(t))
            .map(|t| counts[t])
            .sum();
        assert_eq!(drawn_outside, 0, "drew a token that top-p removes");
        let critical = CHI2_CRITICAL_0_001[kept.len() - 2];
        assert!(
            chi2 < critical,
            "chi-square {chi2} >= {critical} with {} degrees of freedom",
            kept.len() - 1
        );
    }

    fn draws(seed: u64, logits: &[f32], n: usize) -> Vec<u32> {
        let params = SamplingParams {
            seed: Some(seed),
            ..Default::default()
        };
        let mut sampler = Sampler::new(&params).unwrap();
        (0..n).map(|_| sampler.sample(logits, &[], &[])).collect()
    }

    #[test]
    fn same_seed_same_draws_different_seed_different_draws() {
        let logits = random_logits(22, 64, 1.0);
        let first = draws(5, &logits, 200);
        assert_eq!(first, draws(5, &logits, 200));
        assert_ne!(first, draws(6, &logits, 200));
    }

    #[test]
    fn unseeded_samplers_differ() {
        let logits = random_logits(23, 64, 1.0);
        let mut a = Sampler::new(&SamplingParams::default()).unwrap();
        let mut b = Sampler::new(&SamplingParams::default()).unwrap();
        let a_draws: Vec<u32> = (0..200).map(|_| a.sample(&logits, &[], &[])).collect();
        let b_draws: Vec<u32> = (0..200).map(|_| b.sample(&logits, &[], &[])).collect();
        assert_ne!(a_draws, b_draws);
    }

    #[test]
    fn greedy_sampling_applies_penalties_first() {
        let logits = random_logits(24, 500, 5.0);
        let output = random_tokens(25, 40, 500);
        let params = SamplingParams {
            repetition_penalty: 1.7,
            frequency_penalty: 0.6,
            presence_penalty: 0.3,
            ..SamplingParams::greedy()
        };
        let mut penalised = logits.clone();
        apply_penalties(&params, &mut penalised, &[], &output);
        let max = penalised.iter().copied().fold(f32::MIN, f32::max);
        let want = penalised.iter().position(|&l| l == max).unwrap() as u32;
        let mut sampler = Sampler::new(&params).unwrap();
        assert_eq!(sampler.sample(&logits, &[], &output), want);
        assert_eq!(
            sampler.probabilities(&logits, &[], &output),
            vec![(want, 1.0)]
        );
    }

    #[test]
    fn invalid_params_are_refused() {
        let params = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        let err = Sampler::new(&params).unwrap_err();
        assert!(err.to_string().contains("top_p"), "{err}");
    }
}

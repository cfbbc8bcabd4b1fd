//! Helpers shared by the sampling tests.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `n` logits drawn uniformly from [-spread, spread) with a seeded RNG.
pub fn random_logits(seed: u64, n: usize, spread: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-spread..spread)).collect()
}

/// `n` token ids below `vocab`, drawn with a seeded RNG.
pub fn random_tokens(seed: u64, n: usize, vocab: u32) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..vocab)).collect()
}

/// Softmax of `logits / temperature` in f64, computed directly from the definition.
pub fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let exps: Vec<f64> = logits
        .iter()
        .map(|&l| (f64::from(l) / f64::from(temperature)).exp())
        .collect();
    let total: f64 = exps.iter().sum();
    exps.iter().map(|e| e / total).collect()
}

//! Tests of the sharding: shards reassemble into the full weights, a tensor-parallel
//! forward simulated on the CPU equals the unsharded one, bad sizes are refused.

mod forward;
mod math;
mod reassemble;
mod reference;
mod validate;

use super::TpShape;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `n` seeded random values in [-1, 1), never all zeros.
fn random(seed: u64, n: usize) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// SmolLM2-135M's shape.
fn smollm2() -> TpShape {
    TpShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        hidden_size: 576,
        intermediate_size: 1536,
        vocab_size: 49152,
    }
}

/// Llama-3.2-1B's shape.
fn llama_1b() -> TpShape {
    TpShape {
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 64,
        hidden_size: 2048,
        intermediate_size: 8192,
        vocab_size: 128256,
    }
}

//! Token sampling on the CPU over the f32 logits of one sequence, following vLLM: logit
//! biases and `min_tokens`, then penalties, then greedy argmax or temperature, top-k, top-p and min-p, and a draw from a per-request
//! ChaCha RNG; and lossless verification of speculative drafts. Probabilities are accumulated in f64 in a fixed order, so a seeded request
//! draws the same tokens whatever the thread count.

mod bias;
mod distribution;
mod draft_dist;
mod logprobs;
mod mask;
mod params;
mod penalties;
mod rejection;
mod sampler;
#[cfg(test)]
mod testing;

pub use bias::{apply_biases, bans_apply, logit_adjustments};
pub use distribution::argmax;
pub use draft_dist::{DraftDist, DraftSampler, DRAFT_DIST_TOKENS};
pub use logprobs::{log_softmax, TokenLogprobs};
pub use mask::TokenMask;
pub use params::{SamplingError, SamplingParams};
pub use penalties::apply_penalties;
pub use rejection::{accept_greedy, verify, Verdict};
pub use sampler::Sampler;

//! The distribution check of sampled speculation: the first two tokens of many seeded
//! requests against the target's own distribution, by Pearson's chi-square.

use peregrine_actors::messages::Usage;
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::Sampler;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};

/// Upper 0.001 quantile of chi-square with 8 degrees of freedom (NIST e-Handbook table
/// 1.3.6.7.4): a correct sampler fails once in 1,000 seeds.
pub const CHI2_8_DF_0_001: f64 = 26.124;

/// Blocks in the pool of a distribution forward.
pub const DIST_POOL_BLOCKS: u64 = 8;
/// Tokens per block of a distribution forward.
pub const DIST_BLOCK_SIZE: usize = 16;

/// The plan of one fresh sequence of `tokens` tokens in blocks 0..4 of a pool of
/// [`DIST_POOL_BLOCKS`] blocks of [`DIST_BLOCK_SIZE`] tokens.
pub fn one_sequence_plan(tokens: usize) -> AttentionPlan {
    let table = [0u32, 1, 2, 3];
    let spec = SeqSpec {
        num_cached: 0,
        num_new: tokens,
        block_table: &table,
    };
    AttentionPlan::new(&[spec], DIST_BLOCK_SIZE, DIST_POOL_BLOCKS).unwrap()
}

/// The CPU `model`'s distribution of the token after `tokens` (which start with `prompt`),
/// as `sampler` keeps it (`Sampler::probabilities`).
pub fn cpu_distribution(
    model: &LlamaModel,
    sampler: &Sampler,
    prompt: &[u32],
    tokens: &[u32],
) -> Vec<(u32, f64)> {
    let mut cache = KvCache::new(
        model.config().num_layers,
        model.kv_layout(DIST_POOL_BLOCKS, DIST_BLOCK_SIZE as u64),
    );
    let plan = one_sequence_plan(tokens.len());
    let logits = model
        .forward(tokens, &plan, &mut cache, &[tokens.len() - 1])
        .unwrap();
    sampler.probabilities(&logits, prompt, &tokens[prompt.len()..])
}

/// A distribution over tokens: `(token, probability)` pairs.
pub type Dist = Vec<(u32, f64)>;

/// The target's distributions of the first two tokens after `prompt`, from `dist` (the
/// distribution after a token sequence): p(t1) and, for each of its tokens in order,
/// p(t2 | t1).
pub fn first_two_distributions(
    prompt: &[u32],
    mut dist: impl FnMut(&[u32]) -> Dist,
) -> (Dist, Vec<Dist>) {
    let first = dist(prompt);
    let second = first
        .iter()
        .map(|&(t1, _)| dist(&prompt.iter().copied().chain([t1]).collect::<Vec<_>>()))
        .collect();
    (first, second)
}

/// Asserts that the first two tokens of `outs` follow `first` (p(t1)) and, for each of its
/// tokens in order, `second[i]` (p(t2 | t1)): top-k 3 over both, so 9 cells, each expected
/// at least 5 times, and Pearson's chi-square under the 0.001 quantile. `note` goes into
/// the failure's message.
pub fn assert_first_two_follow(
    outs: &[(Vec<u32>, Usage)],
    first: &[(u32, f64)],
    second: &[Vec<(u32, f64)>],
    note: &str,
) {
    let draws = outs.len() as f64;
    let (mut chi2, mut cells) = (0.0, 0);
    for (&(t1, p1), next) in first.iter().zip(second) {
        for &(t2, p2) in next {
            let expected = draws * p1 * p2;
            assert!(expected >= 5.0, "test setup: expected count {expected} < 5");
            let seen = outs.iter().filter(|(t, _)| t[..2] == [t1, t2]).count();
            chi2 += (seen as f64 - expected).powi(2) / expected;
            cells += 1;
        }
    }
    assert_eq!(cells, 9, "top-k 3 over two tokens");
    assert!(
        chi2 < CHI2_8_DF_0_001,
        "chi-square {chi2} >= {CHI2_8_DF_0_001} (8 df, alpha 0.001){note}"
    );
}

/// Asserts that about one draft per request of `outs` was verified (within 10%: how the
/// requests fell into steps is a matter of timing, and a step's token budget may leave a
/// request no room for its draft or, rarely, plan it a second one), and that the drafts,
/// each drawn uniformly from the 32 tokens `q_tokens` for the second token, were accepted
/// as often as sum_t min(p(t), q(t)) given the first says: within 5 standard deviations.
/// (Verifying as if q were one-hot on the draft keeps the distribution too, but accepts
/// sum_t q(t) p(t) = 1/32.) Returns the drafts accepted and verified.
pub fn assert_uniform_drafts_accepted(
    outs: &[(Vec<u32>, Usage)],
    first: &[(u32, f64)],
    second: &[Vec<(u32, f64)>],
    q_tokens: &[u32],
) -> (usize, usize) {
    assert_eq!(q_tokens.len(), 32, "q is uniform on 32 tokens");
    let requests = outs.len();
    let drafts: usize = outs.iter().map(|(_, u)| u.num_draft_tokens).sum();
    let accepted: usize = outs.iter().map(|(_, u)| u.num_accepted_tokens).sum();
    assert!(
        drafts > requests * 9 / 10 && drafts < requests * 11 / 10,
        "{drafts} drafts for {requests} requests"
    );
    let q = |t: u32| {
        if q_tokens.contains(&t) {
            1.0 / 32.0
        } else {
            0.0
        }
    };
    let rate: f64 = first
        .iter()
        .zip(second)
        .map(|(&(_, p1), next)| p1 * next.iter().map(|&(t, p)| p.min(q(t))).sum::<f64>())
        .sum();
    let n = drafts as f64;
    let (mean, sd) = (n * rate, (n * rate * (1.0 - rate)).sqrt());
    eprintln!("{accepted} of {drafts} drafts accepted, expected {mean:.0} +- {sd:.0}");
    assert!(
        (accepted as f64 - mean).abs() < 5.0 * sd,
        "{accepted} of {drafts} drafts accepted, expected {mean:.0} +- {sd:.0}"
    );
    (accepted, drafts)
}

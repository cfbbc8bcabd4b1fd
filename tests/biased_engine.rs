//! `logit_bias` and `min_tokens` through the serving engine on the tiny random Llama: every
//! output equals a plain step-by-step loop written here (the model's eager forward; a
//! grammar's mask, then the biases added and the end-of-sequence id set to −∞ before
//! `min_tokens` by this file's own code; then the request's sampler without them), for
//! greedy and seeded sampled requests batched with free and constrained ones; and
//! speculation (n-gram drafts, a draft model) leaves greedy biased outputs as they are.

mod common;

use common::served::{
    compile, compiler, model_dir, runtime, served, step_by_step, Drafts, Request, EOS,
};
use peregrine_actors::messages::FinishReason;
use peregrine_ops::sampling::SamplingParams;
use peregrine_structured::Constraint;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The tiny Llama's vocabulary.
const VOCAB: u32 = 300;

/// `n` random prompts (4 to 20 ids), alternately greedy and seeded sampled, each with its
/// own biases (a few dozen tokens in [-6, 6], a few banned at -100, the end-of-sequence id
/// pulled up by 9 so that requests end soon after `min_tokens`) and `min_tokens` of 0 to 12
/// holding back the end-of-sequence id.
fn biased_requests(n: usize, seed: u64) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let len = rng.random_range(4..20);
            let prompt = (0..len).map(|_| rng.random_range(3..VOCAB)).collect();
            let mut logit_bias: Vec<(u32, f32)> = Vec::new();
            for k in 0..34 {
                let bias = if k < 30 {
                    rng.random_range(-6.0..6.0)
                } else {
                    -100.0
                };
                logit_bias.push((rng.random_range(3..VOCAB), bias));
            }
            logit_bias.sort_by_key(|&(id, _)| id);
            logit_bias.dedup_by_key(|&mut (id, _)| id);
            logit_bias.push((EOS, 9.0));
            let base = match i % 2 {
                0 => SamplingParams::greedy(),
                _ => SamplingParams {
                    temperature: 1.0,
                    top_k: 40,
                    seed: Some(70 + i as u64),
                    ..SamplingParams::default()
                },
            };
            let params = SamplingParams {
                logit_bias,
                min_tokens: rng.random_range(0..13),
                min_tokens_stop_ids: vec![EOS],
                ..base
            };
            (prompt, params, None)
        })
        .collect()
}

#[test]
fn biased_outputs_equal_step_by_step_decoding() {
    let dir = model_dir(21);
    let compiler = compiler(dir.path());
    let mut reqs = biased_requests(14, 1);
    // Free requests in the same batches.
    for (prompt, params, _) in biased_requests(4, 2) {
        let free = SamplingParams {
            logit_bias: Vec::new(),
            min_tokens: 0,
            min_tokens_stop_ids: Vec::new(),
            ..params
        };
        reqs.push((prompt, free, None));
    }
    // Constrained and biased: the biases apply among the tokens the grammar allows.
    let grammar = compile(&compiler, Constraint::Regex("[a-z ]{2,30}QZX".into()));
    for (prompt, params, _) in biased_requests(4, 3) {
        reqs.push((prompt, params, Some(grammar.clone())));
    }
    let want = step_by_step(dir.path(), &reqs, 40);
    let got = runtime().block_on(served(dir.path(), &reqs, 40, Drafts::Off));
    let mut ended_by_eos = 0;
    for (i, ((tokens, reason, _), want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(tokens, want, "request {i}");
        let params = &reqs[i].1;
        let held = tokens.len().min(params.min_tokens);
        assert!(
            !tokens[..held].contains(&EOS),
            "request {i}: EOS within min_tokens {}",
            params.min_tokens
        );
        for &(id, bias) in &params.logit_bias {
            if bias == -100.0 {
                assert!(!tokens.contains(&id), "request {i}: banned token {id}");
            }
        }
        if tokens.last() == Some(&EOS) {
            ended_by_eos += 1;
            assert_eq!(*reason, FinishReason::Stop, "request {i}");
        }
    }
    // The pull toward EOS ends most biased requests right after their `min_tokens`.
    assert!(
        ended_by_eos >= 8,
        "only {ended_by_eos} requests ended at EOS"
    );
}

#[test]
fn speculation_keeps_greedy_biased_outputs() {
    let dir = model_dir(22);
    let other = model_dir(23);
    // Greedy only, prompts that repeat themselves so that n-gram drafts are proposed.
    let reqs: Vec<Request> = biased_requests(10, 4)
        .into_iter()
        .map(|(prompt, params, grammar)| {
            let repeated = [prompt.as_slice(), &prompt, &prompt].concat();
            let greedy = SamplingParams {
                temperature: 0.0,
                ..params
            };
            (repeated, greedy, grammar)
        })
        .collect();
    let rt = runtime();
    let plain = rt.block_on(served(dir.path(), &reqs, 40, Drafts::Off));
    assert_eq!(
        plain.iter().map(|(t, ..)| t.clone()).collect::<Vec<_>>(),
        step_by_step(dir.path(), &reqs, 40)
    );
    for (name, drafts) in [
        ("n-gram", Drafts::Ngram),
        ("draft model", Drafts::Model(other.path())),
    ] {
        let got = rt.block_on(served(dir.path(), &reqs, 40, drafts));
        let drafted: usize = got.iter().map(|(.., usage)| usage.num_draft_tokens).sum();
        assert!(drafted > 0, "{name}: nothing was drafted");
        for (i, (a, b)) in got.iter().zip(&plain).enumerate() {
            assert_eq!(a.0, b.0, "{name}: request {i}");
            assert_eq!(a.1, b.1, "{name}: request {i}");
        }
    }
}

//! Scoring prompts through the serving engine (vLLM's `prompt_logprobs`, OpenAI's `echo`
//! with `logprobs`): every prompt token's logprob, rank and most likely alternatives must
//! be those of the dense float64 reference forward, each position reported once, whether
//! the prompt is computed in one chunk or several, taken from the prefix cache by others,
//! or preempted and computed again; and the requests' tokens, and those of the requests
//! beside them, must be what each gets alone.

mod common;

use common::engine::{requests, solo, tiny_backend};
use common::reference::logits_f64;
use common::served::submit;
use common::tiny_model::{TinyModel, TinySpec};
use metrics_util::debugging::DebuggingRecorder;
use peregrine_actors::draft::{DraftMethod, Ngram};
use peregrine_actors::engine::{start_engine, Engine, EngineSettings};
use peregrine_actors::messages::{FinishReason, RequestEvent, RequestSpec, SchedulerLimits, Usage};
use peregrine_ops::sampling::{SamplingParams, TokenLogprobs};
use std::path::Path;
use std::sync::Arc;

const MAX_TOKENS: usize = 6;
/// Alternatives per scored token.
const TOP: usize = 3;
/// How far a logprob may be from the reference's: the engine's f32 logits are within
/// about 1e-6 of the logit scale (`reference_forward.rs`).
const TOLERANCE: f64 = 1e-4;

/// What a request sent back.
struct Scored {
    /// Prompt positions 1.. (the first token follows nothing).
    scores: Vec<TokenLogprobs>,
    tokens: Vec<u32>,
    reason: FinishReason,
    usage: Usage,
}

/// An engine over the tiny model in `dir`: `kv_blocks` blocks of 16, up to 8 sequences
/// and `max_num_batched_tokens` tokens a step.
fn engine(dir: &Path, kv_blocks: u64, max_num_batched_tokens: usize) -> Engine {
    drafting_engine(dir, kv_blocks, max_num_batched_tokens, None)
}

/// [`engine`] with `drafter`'s drafts, up to 3 a step.
fn drafting_engine(
    dir: &Path,
    kv_blocks: u64,
    max_num_batched_tokens: usize,
    drafter: Option<Box<dyn DraftMethod>>,
) -> Engine {
    let settings = EngineSettings {
        block_size: 16,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: 8,
            max_num_batched_tokens,
            max_waiting: 1000,
            num_speculative_tokens: 3,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: true,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    start_engine(tiny_backend(dir, kv_blocks), &settings, drafter).unwrap()
}

/// Submits request `id`: `prompt` with `params`, `max_tokens` past EOS, scoring its prompt
/// where `scored`.
async fn send(
    engine: &Engine,
    id: u64,
    (prompt, params): &(Vec<u32>, SamplingParams),
    max_tokens: usize,
    scored: bool,
) -> tokio::sync::mpsc::UnboundedReceiver<RequestEvent> {
    let spec = RequestSpec {
        prompt: Arc::from(prompt.as_slice()),
        params: params.clone(),
        max_tokens,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        logprobs: None,
        prompt_logprobs: scored.then_some(TOP),
        priority: 0,
        grammar: None,
    };
    submit(&engine.scheduler, id, spec).await
}

/// Reads a request to its end, checking that its prompt's scores come in order, each
/// position once, all before its first tokens.
async fn read(mut rx: tokio::sync::mpsc::UnboundedReceiver<RequestEvent>) -> Scored {
    let (mut scores, mut tokens) = (Vec::new(), Vec::new());
    loop {
        match rx.recv().await.expect("the request ended without Finished") {
            RequestEvent::PromptLogprobs(got) => {
                assert!(tokens.is_empty(), "prompt scores after tokens");
                assert_eq!(got.first, scores.len() + 1, "positions in order, once");
                scores.extend(got.scores);
            }
            RequestEvent::Tokens(t) => tokens.extend(t.iter().map(|t| t.id)),
            RequestEvent::Finished { reason, usage } => {
                return Scored {
                    scores,
                    tokens,
                    reason,
                    usage,
                }
            }
        }
    }
}

/// Checks `scores` (positions 1..) against the float64 reference forward of `prompt`.
fn check_scores(dir: &Path, prompt: &[u32], scores: &[TokenLogprobs], label: &str) {
    assert_eq!(
        scores.len(),
        prompt.len() - 1,
        "{label}: one score a position"
    );
    let reference = logits_f64(dir, prompt);
    for (at, score) in scores.iter().enumerate() {
        // The logits at position `at` give the token at `at + 1`.
        let row = &reference[at];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let total = max + row.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
        let logprobs: Vec<f64> = row.iter().map(|l| l - total).collect();
        let want = logprobs[prompt[at + 1] as usize];
        let place = format!("{label}, position {}", at + 1);
        assert!(
            (f64::from(score.logprob) - want).abs() < TOLERANCE,
            "{place}: {} against {want}",
            score.logprob
        );
        // The rank, where no other token is within the tolerance of it.
        let above = logprobs.iter().filter(|&&l| l > want + TOLERANCE).count();
        let level = logprobs.iter().filter(|&&l| l >= want - TOLERANCE).count();
        assert!(
            above < score.rank && score.rank <= level,
            "{place}: rank {}",
            score.rank
        );
        let mut sorted = logprobs.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(score.top.len(), TOP, "{place}");
        for (k, &(id, logprob)) in score.top.iter().enumerate() {
            let logprob = f64::from(logprob);
            assert!((logprob - sorted[k]).abs() < TOLERANCE, "{place}: top {k}");
            assert!(
                (logprob - logprobs[id as usize]).abs() < TOLERANCE,
                "{place}: top {k}'s id"
            );
        }
    }
}

fn model(seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), seed).write_hf(dir.path());
    dir
}

/// Scored requests beside unscored ones, greedy and sampled, their prompts computed in
/// chunks of up to 24 tokens shared by the batch: every score matches the reference, and
/// every request's tokens are what it gets alone. A prompt of 70 tokens spans several
/// chunks; `max_tokens` 0 scores a prompt and ends.
#[tokio::test]
async fn scores_match_the_reference_across_chunks_beside_other_requests() {
    let dir = model(91);
    let mut reqs = requests(300, 6, 17);
    reqs.push((
        (0..70).map(|i| (i * 13 + 7) % 300).collect(),
        SamplingParams::greedy(),
    ));
    let alone = solo(dir.path(), &reqs, MAX_TOKENS);
    let engine = engine(dir.path(), 64, 24);
    let mut streams = Vec::new();
    for (i, req) in reqs.iter().enumerate() {
        // Every other request scores its prompt, and the long one does.
        let scored = i % 2 == 1 || i == reqs.len() - 1;
        streams.push((
            scored,
            send(&engine, i as u64, req, MAX_TOKENS, scored).await,
        ));
    }
    let only_scores = (reqs[0].0.clone(), SamplingParams::greedy());
    let zero = send(&engine, 100, &only_scores, 0, true).await;
    for (i, (scored, rx)) in streams.into_iter().enumerate() {
        let got = read(rx).await;
        let label = format!("request {i}");
        assert_eq!(got.reason, FinishReason::Length, "{label}");
        assert_eq!(got.tokens, alone[i], "{label}");
        match scored {
            true => check_scores(dir.path(), &reqs[i].0, &got.scores, &label),
            false => assert!(got.scores.is_empty(), "{label}: not asked for"),
        }
    }
    let got = read(zero).await;
    assert_eq!((got.reason, got.tokens.len()), (FinishReason::Length, 0));
    assert_eq!(got.usage.completion_tokens, 0);
    check_scores(dir.path(), &only_scores.0, &got.scores, "max_tokens 0");
}

/// A prompt others have left in the prefix cache is computed again when scored (every
/// position needs its logits), and the scores are those of the reference.
#[tokio::test]
async fn a_scored_prompt_reads_nothing_from_the_prefix_cache() {
    let dir = model(92);
    let req = (
        (0..40).map(|i| (i * 7 + 3) % 300).collect(),
        SamplingParams::greedy(),
    );
    let engine = engine(dir.path(), 64, 64);
    let first = read(send(&engine, 1, &req, MAX_TOKENS, false).await).await;
    let again = read(send(&engine, 2, &req, MAX_TOKENS, false).await).await;
    assert_eq!(
        again.usage.cached_tokens, 32,
        "the cache holds the prompt's blocks"
    );
    let scored = read(send(&engine, 3, &req, MAX_TOKENS, true).await).await;
    assert_eq!(
        scored.usage.cached_tokens, 0,
        "a scored prompt is computed whole"
    );
    check_scores(
        dir.path(),
        &req.0,
        &scored.scores,
        "after the cache was filled",
    );
    assert_eq!(scored.tokens, first.tokens);
}

/// In a pool too small for the batch, scored requests are preempted (some in the middle
/// of their prompt) and computed again: each prompt position is still reported once,
/// with the reference's score, and the tokens are unchanged.
#[tokio::test]
async fn preempted_and_recomputed_prompts_are_scored_once() {
    let dir = model(93);
    let reqs = requests(300, 10, 23);
    let alone = solo(dir.path(), &reqs, 12);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    // Nine blocks for ten requests of up to 56 tokens each.
    let engine = engine(dir.path(), 9, 32);
    let mut streams = Vec::new();
    for (i, req) in reqs.iter().enumerate() {
        streams.push(send(&engine, i as u64, req, 12, true).await);
    }
    for (i, rx) in streams.into_iter().enumerate() {
        let got = read(rx).await;
        let label = format!("request {i}");
        assert_eq!(got.tokens, alone[i], "{label}");
        check_scores(dir.path(), &reqs[i].0, &got.scores, &label);
    }
    let snapshot = snapshotter.snapshot().into_vec();
    assert!(
        common::engine::counter(&snapshot, "peregrine:num_preemptions_total") > 0,
        "no preemption happened"
    );
}

/// With n-gram drafts, steps verify some requests' drafts while they score others'
/// prompts: the scores are the reference's and the greedy tokens what each gets alone.
#[tokio::test]
async fn scores_match_the_reference_beside_verified_drafts() {
    let dir = model(94);
    // Repeating prompts, whose continuations the n-gram drafter finds.
    let reqs: Vec<(Vec<u32>, SamplingParams)> = (0..6u32)
        .map(|r| {
            let cycle: Vec<u32> = (0..5).map(|i| (r * 40 + i * 7 + 3) % 300).collect();
            let prompt = cycle
                .iter()
                .cycle()
                .take(20 + 3 * r as usize)
                .copied()
                .collect();
            (prompt, SamplingParams::greedy())
        })
        .collect();
    let alone = solo(dir.path(), &reqs, 16);
    let drafter = Box::new(Ngram::new(1, 3).unwrap());
    let engine = drafting_engine(dir.path(), 64, 32, Some(drafter));
    let mut streams = Vec::new();
    for (i, req) in reqs.iter().enumerate() {
        streams.push(send(&engine, i as u64, req, 16, i % 2 == 0).await);
    }
    let mut drafts = 0;
    for (i, rx) in streams.into_iter().enumerate() {
        let got = read(rx).await;
        let label = format!("request {i}");
        assert_eq!(got.tokens, alone[i], "{label}");
        drafts += got.usage.num_drafts;
        match i % 2 == 0 {
            true => check_scores(dir.path(), &reqs[i].0, &got.scores, &label),
            false => assert!(got.scores.is_empty(), "{label}"),
        }
    }
    assert!(drafts > 0, "no drafts were verified");
}

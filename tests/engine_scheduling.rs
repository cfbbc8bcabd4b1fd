//! The serving engine (scheduler, KV allocator, target runner) against the single-request
//! generator: continuous batching, chunked prefill, preemption under a tiny pool and the
//! prefix cache must leave every request's tokens unchanged.

mod common;

use common::engine::{collect, counter, requests, run_all, solo, submit, tiny_backend};
use common::tiny_model::{TinyModel, TinySpec};
use metrics_util::debugging::DebuggingRecorder;
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::messages::{FinishReason, SchedulerLimits, Usage};
use peregrine_ops::sampling::SamplingParams;
use std::path::Path;

const MAX_TOKENS: usize = 12;

/// All requests at once through the serving engine; returns each one's tokens and usage.
async fn served(
    dir: &Path,
    reqs: &[(Vec<u32>, SamplingParams)],
    (settings, kv_blocks): (EngineSettings, u64),
) -> Vec<(Vec<u32>, Usage)> {
    let engine = start_engine(tiny_backend(dir, kv_blocks), &settings, None).unwrap();
    run_all(&engine.scheduler, reqs, MAX_TOKENS).await
}

fn settings(
    kv_blocks: u64,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
) -> (EngineSettings, u64) {
    let settings = EngineSettings {
        block_size: 16,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs,
            max_num_batched_tokens,
            max_waiting: 1000,
            num_speculative_tokens: 0,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: false,
    };
    (settings, kv_blocks)
}

#[tokio::test]
async fn batching_chunking_and_preemption_leave_outputs_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 77).write_hf(dir.path());
    let reqs = requests(300, 12, 5);
    let alone = solo(dir.path(), &reqs, MAX_TOKENS);

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    // Everyone fits: one batch of 12, prompts chunked at 32 tokens a step.
    let roomy = served(dir.path(), &reqs, settings(64, 16, 32)).await;
    // Nine blocks for twelve requests of up to 57 tokens (4 blocks each): requests wait,
    // and running ones are preempted and recomputed.
    let tight = served(dir.path(), &reqs, settings(9, 16, 48)).await;
    let snapshot = snapshotter.snapshot().into_vec();
    for (i, want) in alone.iter().enumerate() {
        assert_eq!(&roomy[i].0, want, "request {i}, roomy pool");
        assert_eq!(&tight[i].0, want, "request {i}, tight pool");
    }
    assert!(
        counter(&snapshot, "peregrine:num_preemptions_total") > 0,
        "no preemption happened"
    );
}

#[tokio::test]
async fn a_repeated_prompt_hits_the_prefix_cache_with_identical_output() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 78).write_hf(dir.path());
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 300).collect();
    let req = vec![(prompt, SamplingParams::greedy())];
    let (engine_settings, kv_blocks) = settings(64, 4, 64);
    let engine = start_engine(tiny_backend(dir.path(), kv_blocks), &engine_settings, None).unwrap();
    let mut runs = Vec::new();
    for i in 0..2 {
        let rx = submit(&engine.scheduler, i, &req[0].0, &req[0].1, MAX_TOKENS).await;
        let (tokens, _, usage) = collect(rx).await;
        runs.push((tokens, usage));
    }
    assert_eq!(runs[0].1.cached_tokens, 0);
    // 40 prompt tokens: two full blocks of 16 can be served from the cache.
    assert_eq!(runs[1].1.cached_tokens, 32);
    assert_eq!(runs[0].0, runs[1].0);
    assert_eq!(runs[0].0, solo(dir.path(), &req, MAX_TOKENS)[0]);
}

/// A step that fails ends its requests with `Error` (not a shutdown's `Abort`) and makes
/// the engine not live until a later step succeeds. A request whose sampling parameters
/// the runner cannot set up (the gateway would have refused them) fails the step.
#[tokio::test]
async fn a_failed_step_ends_its_requests_with_error_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 79).write_hf(dir.path());
    let (settings, kv_blocks) = settings(64, 4, 64);
    let engine = start_engine(tiny_backend(dir.path(), kv_blocks), &settings, None).unwrap();
    assert_eq!(engine.health.check(), Ok(()));
    let broken = SamplingParams {
        temperature: -1.0,
        ..SamplingParams::greedy()
    };
    let prompt: Vec<u32> = (0..20).collect();
    let rx = submit(&engine.scheduler, 1, &prompt, &broken, 4).await;
    let (tokens, reason, _) = collect(rx).await;
    assert_eq!((tokens.len(), reason), (0, FinishReason::Error));
    let why = engine.health.check().unwrap_err();
    assert!(why.contains("last step failed"), "{why}");
    let rx = submit(&engine.scheduler, 2, &prompt, &SamplingParams::greedy(), 4).await;
    let (tokens, reason, _) = collect(rx).await;
    assert_eq!((tokens.len(), reason), (4, FinishReason::Length));
    assert_eq!(engine.health.check(), Ok(()), "a step succeeded since");
}

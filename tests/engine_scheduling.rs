//! The serving engine (scheduler, KV allocator, target runner) against the single-request
//! generator: continuous batching, chunked prefill, preemption under a tiny pool and the
//! prefix cache must leave every request's tokens unchanged.

mod common;

use common::engine::{collect, counter, gauge, requests, run_all, solo, submit, tiny_backend};
use common::tiny_model::{TinyModel, TinySpec};
use metrics_util::debugging::DebuggingRecorder;
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::messages::{FinishReason, RequestEvent, SchedulerLimits, Usage};
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
        async_scheduling_constrained: false,
        kv_events: None,
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

/// Choice groups as the gateway forms them for `n` (a group's first request, then its
/// siblings once it has its first tokens, choice `i` seeded with the group's seed plus
/// `i`), three groups at once: the siblings find the first one's full prompt blocks in the
/// prefix cache; in a pool too small for the groups, members are preempted and recomputed
/// with shared blocks; every choice gets the tokens it gets alone, and once all have
/// ended no block is held.
#[tokio::test]
async fn choice_groups_share_prompt_blocks_and_survive_preemption() {
    const GROUPS: usize = 3;
    const CHOICES: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 80).write_hf(dir.path());
    let prompts: Vec<Vec<u32>> = (0..GROUPS)
        .map(|g| {
            (0..40)
                .map(|i| ((i * 11 + g * 37 + 5) % 300) as u32)
                .collect()
        })
        .collect();
    let choice = |g: usize, i: usize| SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(100 * g as u64 + i as u64),
        ..SamplingParams::default()
    };
    let flat: Vec<(Vec<u32>, SamplingParams)> = (0..GROUPS)
        .flat_map(|g| (0..CHOICES).map(move |i| (g, i)))
        .map(|(g, i)| (prompts[g].clone(), choice(g, i)))
        .collect();
    let alone = solo(dir.path(), &flat, MAX_TOKENS);

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let mut preemptions = 0;
    // Roomy: every group fits. Tight: ten blocks, where each group needs its two shared
    // prompt blocks and two of each choice's own.
    for (kv_blocks, label) in [(64, "roomy pool"), (10, "tight pool")] {
        let (engine_settings, _) = settings(kv_blocks, 16, 48);
        let backend = tiny_backend(dir.path(), kv_blocks);
        let engine = start_engine(backend, &engine_settings, None).unwrap();
        let mut firsts = Vec::new();
        for (g, prompt) in prompts.iter().enumerate() {
            let id = (g * CHOICES) as u64;
            firsts.push(submit(&engine.scheduler, id, prompt, &choice(g, 0), MAX_TOKENS).await);
        }
        // Each group's first tokens, then its siblings.
        let mut early = Vec::new();
        let mut streams = Vec::new();
        for (g, mut first) in firsts.into_iter().enumerate() {
            match first.recv().await.unwrap() {
                RequestEvent::Tokens(t) => early.push(t.iter().map(|t| t.id).collect()),
                other => panic!("{label}: group {g} began with {other:?}"),
            }
            streams.push(first);
            for i in 1..CHOICES {
                let id = (g * CHOICES + i) as u64;
                let params = choice(g, i);
                streams.push(submit(&engine.scheduler, id, &prompts[g], &params, MAX_TOKENS).await);
                early.push(Vec::new());
            }
        }
        for (k, rx) in streams.into_iter().enumerate() {
            let (tokens, reason, usage) = collect(rx).await;
            let tokens: Vec<u32> = early[k].iter().copied().chain(tokens).collect();
            assert_eq!(reason, FinishReason::Length, "{label}, choice {k}");
            assert_eq!(tokens, alone[k], "{label}, choice {k}");
            if kv_blocks == 64 && k % CHOICES > 0 {
                assert_eq!(
                    usage.cached_tokens, 32,
                    "{label}, choice {k}: the shared blocks"
                );
            }
        }
        // Every block is back once the requests have ended (the scheduler gives them
        // back on its own when no step carries them).
        let mut held = f64::NAN;
        for _ in 0..200 {
            let snapshot = snapshotter.snapshot().into_vec();
            preemptions += counter(&snapshot, "peregrine:num_preemptions_total");
            held = gauge(&snapshot, "peregrine:kv_cache_usage_perc");
            if held == 0.0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(held, 0.0, "{label}: blocks still held");
    }
    assert!(preemptions > 0, "no preemption happened");
}

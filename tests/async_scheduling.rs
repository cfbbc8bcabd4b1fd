//! Async scheduling through the serving engine on the CPU: the target runner queues each
//! greedy decode step's successor before the scheduler asks for it (the CPU runs it at
//! once, where a GPU would run it while the host plans). Requests that finish at different
//! steps, arrive mid-decode, are preempted or dropped by their client, with graphs
//! captured again in between, must still get the generator's tokens.

mod common;

use common::engine::{collect, counter, requests, solo, submit, submit_stopping, tiny_backend};
use common::tiny_model::{TinyModel, TinySpec};
use metrics_util::debugging::DebuggingRecorder;
use peregrine_actors::backend::ModelBackend;
use peregrine_actors::engine::{start_engine, Engine, EngineSettings};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_actors::messages::{FinishReason, RequestEvent, SchedulerLimits};
use peregrine_ops::sampling::SamplingParams;
use std::path::Path;

/// A request: its prompt, sampling and `max_tokens`.
type Request = (Vec<u32>, SamplingParams, usize);

fn engine(dir: &Path, kv_blocks: u64, async_scheduling: bool) -> Engine {
    engine_over(tiny_backend(dir, kv_blocks), async_scheduling)
}

fn engine_over(backend: Box<dyn ModelBackend>, async_scheduling: bool) -> Engine {
    let settings = EngineSettings {
        block_size: 16,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: 8,
            max_num_batched_tokens: 48,
            max_waiting: 100,
            num_speculative_tokens: 0,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    start_engine(backend, &settings, None).unwrap()
}

/// `n` requests of `requests`' prompts and sampling (even ones greedy, odd ones sampled),
/// each with its own `max_tokens` so that they finish at different steps: 3 to 14, or
/// with `greedy_last` 9 to 14 for the greedy ones and 3 to 5 for the sampled ones (the
/// greedy ones then also run without them).
fn varied(n: usize, seed: u64, greedy_last: bool) -> Vec<Request> {
    requests(300, n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, (prompt, params))| {
            let max_tokens = match (greedy_last, i % 2) {
                (false, _) => 3 + (i * 5) % 12,
                (true, 0) => 9 + i % 6,
                (true, _) => 3 + i % 3,
            };
            (prompt, params, max_tokens)
        })
        .collect()
}

/// Each request alone through the single-request generator.
fn alone(dir: &Path, reqs: &[Request]) -> Vec<Vec<u32>> {
    reqs.iter()
        .map(|(prompt, params, max_tokens)| {
            let req = [(prompt.clone(), params.clone())];
            solo(dir, &req, *max_tokens).remove(0)
        })
        .collect()
}

/// Submits the first half of `reqs`, and the rest once request 0 has its first tokens
/// (after capturing graphs again, dropping them and capturing them back); the client of
/// request `dropped` (one of the first half) goes away after its first tokens. Returns
/// each request's tokens (`None` for the dropped one).
async fn staggered(engine: &Engine, reqs: &[Request], dropped: usize) -> Vec<Option<Vec<u32>>> {
    let sizes = |n| Some(CaptureSizes::for_max_num_seqs(n));
    engine.graphs.capture(sizes(8)).await.unwrap();
    let half = reqs.len() / 2;
    let mut streams = Vec::new();
    for (i, (prompt, params, max_tokens)) in reqs.iter().enumerate().take(half) {
        let rx = submit(&engine.scheduler, i as u64, prompt, params, *max_tokens).await;
        streams.push(Some(rx));
    }
    let first: Vec<u32> = match streams[0].as_mut().unwrap().recv().await {
        Some(RequestEvent::Tokens(t)) => t.iter().map(|t| t.id).collect(),
        other => panic!("a first event of {other:?}"),
    };
    if let Some(mut rx) = streams.get_mut(dropped).and_then(Option::take) {
        rx.recv().await.expect("a first event");
    }
    for size in [sizes(4), None, sizes(8)] {
        engine.graphs.capture(size).await.unwrap();
    }
    for (i, (prompt, params, max_tokens)) in reqs.iter().enumerate().skip(half) {
        let rx = submit(&engine.scheduler, i as u64, prompt, params, *max_tokens).await;
        streams.push(Some(rx));
    }
    let mut outputs = Vec::new();
    for (i, rx) in streams.into_iter().enumerate() {
        let Some(rx) = rx else {
            outputs.push(None);
            continue;
        };
        let mut tokens: Vec<u32> = if i == 0 { first.clone() } else { Vec::new() };
        tokens.extend(collect(rx).await.0);
        outputs.push(Some(tokens));
    }
    outputs
}

fn check(outputs: &[Option<Vec<u32>>], alone: &[Vec<u32>], label: &str) {
    for (i, (got, want)) in outputs.iter().zip(alone).enumerate() {
        if let Some(got) = got {
            assert_eq!(got, want, "request {i}, {label}");
        }
    }
}

#[tokio::test]
async fn greedy_requests_get_the_generators_tokens_with_steps_queued_ahead() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 93).write_hf(dir.path());
    let reqs: Vec<Request> = varied(10, 11, false)
        .into_iter()
        .map(|(prompt, _, max_tokens)| (prompt, SamplingParams::greedy(), max_tokens))
        .collect();
    let alone = alone(dir.path(), &reqs);

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    // Room for everyone, then nine blocks for ten requests of up to 58 tokens: requests
    // wait, and running ones are preempted and recomputed.
    for (kv_blocks, label) in [(64, "roomy pool"), (9, "tight pool")] {
        let outputs = staggered(&engine(dir.path(), kv_blocks, true), &reqs, 3).await;
        check(&outputs, &alone, label);
        let snapshot = snapshotter.snapshot().into_vec();
        assert!(
            counter(&snapshot, "peregrine:decode_ahead_tokens_total") > 0,
            "no token came from a step queued ahead, {label}"
        );
        if kv_blocks == 9 {
            let preempted = counter(&snapshot, "peregrine:num_preemptions_total");
            assert!(preempted > 0, "no preemption happened");
        }
    }
}

#[tokio::test]
async fn sampled_requests_beside_greedy_ones_are_unchanged_and_off_queues_nothing() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 94).write_hf(dir.path());
    // Even requests greedy, odd ones sampled with their own seeds: a batch holding a
    // sampled request runs alone, and queues nothing ahead.
    let reqs = varied(8, 12, true);
    let alone = alone(dir.path(), &reqs);

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    for on in [false, true] {
        let outputs = staggered(&engine(dir.path(), 64, on), &reqs, usize::MAX).await;
        check(&outputs, &alone, &format!("async scheduling {on}"));
        let snapshot = snapshotter.snapshot().into_vec();
        let served = counter(&snapshot, "peregrine:decode_ahead_tokens_total");
        assert_eq!(
            served > 0,
            on,
            "{served} tokens from steps queued ahead, async {on}"
        );
    }
}

#[tokio::test]
async fn a_batch_whose_last_request_stops_on_a_token_goes_on_queued_ahead() {
    // Three greedy requests decoding together, the last one of the batch stopping on a
    // stop token (which, unlike its length, the runner cannot see coming): the queued step
    // ran three rows, the batch after it has two, and the step queued after that must not
    // go on from the three. (On the GPU the decode graph refused it, failing the requests.)
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 95).write_hf(dir.path());
    // Prompts of 3 tokens and 10 tokens each: every position within the first block of
    // 16, so each step can queue the next (it needs the next position's block).
    let reqs: Vec<Request> = requests(300, 3, 13)
        .into_iter()
        .map(|(prompt, _)| (prompt[..3].to_vec(), SamplingParams::greedy(), 10))
        .collect();
    let alone = alone(dir.path(), &reqs);
    // The last request stops at a token of its output that it did not emit before, from
    // its fourth on; at each of the first three such.
    let stops: Vec<usize> = (3..10)
        .filter(|&j| !alone[2][..j].contains(&alone[2][j]))
        .take(3)
        .collect();
    assert!(
        !stops.is_empty(),
        "no new token in the last request's output"
    );

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    for stop_at in stops {
        let stop = alone[2][stop_at];
        let engine = engine(dir.path(), 64, true);
        engine
            .graphs
            .capture(Some(CaptureSizes::for_max_num_seqs(8)))
            .await
            .unwrap();
        let mut streams = Vec::new();
        for (i, (prompt, params, max_tokens)) in reqs.iter().enumerate() {
            let stops = if i == 2 { vec![stop] } else { vec![] };
            let rx = submit_stopping(
                &engine.scheduler,
                i as u64,
                prompt,
                params,
                *max_tokens,
                stops,
            );
            streams.push(rx.await);
        }
        for (i, (rx, want)) in streams.into_iter().zip(&alone).enumerate() {
            let (got, reason, _) = collect(rx).await;
            match i {
                2 => {
                    assert_eq!(reason, FinishReason::Stop, "request 2, stop at {stop_at}");
                    assert_eq!(got[..], want[..=stop_at], "request 2, stop at {stop_at}");
                }
                _ => assert_eq!(&got, want, "request {i}, stop at {stop_at}"),
            }
        }
    }
    let snapshot = snapshotter.snapshot().into_vec();
    assert!(counter(&snapshot, "peregrine:decode_ahead_tokens_total") > 0);
}

#[tokio::test]
async fn a_prefix_loaded_from_the_host_tier_beside_a_decode_queued_ahead_keeps_every_token() {
    // A prompt's blocks go down to the host tier; while request A decodes with steps
    // queued ahead, request B brings them back. B is held for its loads, so the batch
    // that carries them is A's alone, the one the runner queued: it must drop that step
    // with the backend, which moved blocks, and both get the generator's tokens.
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 95).write_hf(dir.path());
    let prefix: Vec<u32> = (0..64).map(|i| (i * 7 + 3) % 300).collect();
    let other: Vec<u32> = (0..180).map(|i| (i * 11 + 5) % 300).collect();
    let decoding: Vec<u32> = vec![17, 4, 99, 250, 31];
    let mut with_prefix = prefix.clone();
    with_prefix.push(42);
    let greedy = SamplingParams::greedy;
    let reqs = [
        (with_prefix.clone(), greedy(), 1),
        (other.clone(), greedy(), 1),
        (decoding.clone(), greedy(), 40),
        (with_prefix.clone(), greedy(), 6),
    ];
    let alone: Vec<Vec<u32>> = reqs
        .iter()
        .map(|(prompt, params, max_tokens)| {
            solo(dir.path(), &[(prompt.clone(), params.clone())], *max_tokens).remove(0)
        })
        .collect();

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    // Twelve blocks of 16 tokens: the other prompt takes them all, the prefix goes down.
    let mut backend = tiny_backend(dir.path(), 12);
    let block_bytes = backend.pool().bytes_per_layer / backend.pool().layout.num_blocks
        * backend.config().num_layers as u64;
    assert!(backend.keep_host_tier(16 * block_bytes).unwrap() >= 16);
    let engine = engine_over(backend, true);
    engine
        .graphs
        .capture(Some(CaptureSizes::for_max_num_seqs(8)))
        .await
        .unwrap();
    let mut outputs = Vec::new();
    for (i, (prompt, params, max_tokens)) in reqs.iter().enumerate().take(2) {
        let rx = submit(&engine.scheduler, i as u64, prompt, params, *max_tokens).await;
        outputs.push(collect(rx).await.0);
    }
    let (prompt, params, max_tokens) = &reqs[2];
    let mut a = submit(&engine.scheduler, 2, prompt, params, *max_tokens).await;
    let mut a_tokens: Vec<u32> = Vec::new();
    while a_tokens.len() < 4 {
        match a.recv().await {
            Some(RequestEvent::Tokens(t)) => a_tokens.extend(t.iter().map(|t| t.id)),
            other => panic!("{other:?}"),
        }
    }
    let (prompt, params, max_tokens) = &reqs[3];
    let b = submit(&engine.scheduler, 3, prompt, params, *max_tokens).await;
    let (a_rest, a_reason, _) = collect(a).await;
    a_tokens.extend(a_rest);
    let (b_tokens, b_reason, b_usage) = collect(b).await;
    outputs.push(a_tokens);
    outputs.push(b_tokens);
    assert_eq!(
        (a_reason, b_reason),
        (FinishReason::Length, FinishReason::Length)
    );
    assert_eq!(outputs, alone);
    assert_eq!(
        b_usage.cached_tokens, 64,
        "the prefix's four blocks came back"
    );
    let snapshot = snapshotter.snapshot().into_vec();
    assert!(counter(&snapshot, "peregrine:kv_host_loaded_blocks_total") >= 4);
    assert!(counter(&snapshot, "peregrine:decode_ahead_tokens_total") > 0);
}

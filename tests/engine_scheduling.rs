//! The serving engine (scheduler, KV allocator, target runner) against the single-request
//! generator: continuous batching, chunked prefill, preemption under a tiny pool and the
//! prefix cache must leave every request's tokens unchanged.

mod common;

use common::tiny_model::{TinyModel, TinySpec};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::messages::{
    FinishReason, GenerateRequest, RequestEvent, RequestId, RequestSpec, SchedulerLimits,
    SchedulerMsg, Usage,
};
use peregrine_actors::{GenerationRequest, Generator};
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::SamplingParams;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

const MAX_TOKENS: usize = 12;

fn requests(vocab: u32, n: usize, seed: u64) -> Vec<(Vec<u32>, SamplingParams)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let len = rng.random_range(5..45);
            let prompt = (0..len).map(|_| rng.random_range(3..vocab)).collect();
            let params = if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    temperature: 0.9,
                    top_p: 0.95,
                    seed: Some(1000 + i as u64),
                    ..SamplingParams::default()
                }
            };
            (prompt, params)
        })
        .collect()
}

/// Each request alone through the single-request generator.
fn solo(dir: &Path, reqs: &[(Vec<u32>, SamplingParams)]) -> Vec<Vec<u32>> {
    let mut generator = Generator::new(LlamaModel::load(dir).unwrap(), 64, 16);
    reqs.iter()
        .map(|(prompt, params)| {
            let request = GenerationRequest {
                prompt: prompt.clone(),
                params: params.clone(),
                max_tokens: MAX_TOKENS,
                stop_token_ids: vec![],
                ignore_eos: true,
            };
            generator.generate(&request, |_| {}).unwrap().0
        })
        .collect()
}

/// All requests at once through the serving engine; returns each one's tokens and usage.
async fn served(
    dir: &Path,
    reqs: &[(Vec<u32>, SamplingParams)],
    settings: EngineSettings,
) -> Vec<(Vec<u32>, Usage)> {
    let engine = start_engine(LlamaModel::load(dir).unwrap(), &settings).unwrap();
    let mut streams = Vec::new();
    for (i, (prompt, params)) in reqs.iter().enumerate() {
        streams.push(submit(&engine.scheduler, i as u64, prompt, params).await);
    }
    let mut out = Vec::new();
    for rx in streams {
        let (tokens, reason, usage) = collect(rx).await;
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(usage.completion_tokens, tokens.len());
        out.push((tokens, usage));
    }
    out
}

/// Submits one request (max `MAX_TOKENS`, past EOS) and returns its event stream.
async fn submit(
    scheduler: &mpsc::Sender<SchedulerMsg>,
    id: u64,
    prompt: &[u32],
    params: &SamplingParams,
) -> mpsc::UnboundedReceiver<RequestEvent> {
    let (events, rx) = mpsc::unbounded_channel();
    let request = GenerateRequest {
        id: RequestId(id),
        spec: RequestSpec {
            prompt: Arc::from(prompt),
            params: params.clone(),
            max_tokens: MAX_TOKENS,
            stop_token_ids: vec![],
            ignore_eos: true,
            logprobs: None,
            priority: 0,
        },
        arrival: Instant::now(),
        events,
    };
    let (reply, accepted) = oneshot::channel();
    scheduler
        .send(SchedulerMsg::Submit(request, reply))
        .await
        .unwrap();
    accepted.await.unwrap().unwrap();
    rx
}

/// A request's tokens, finish reason and usage.
async fn collect(mut rx: mpsc::UnboundedReceiver<RequestEvent>) -> (Vec<u32>, FinishReason, Usage) {
    let mut tokens = Vec::new();
    loop {
        match rx.recv().await.expect("the request ended without Finished") {
            RequestEvent::Tokens(t) => tokens.extend(t.iter().map(|t| t.id)),
            RequestEvent::Finished { reason, usage } => return (tokens, reason, usage),
        }
    }
}

fn settings(kv_blocks: u64, max_num_seqs: usize, max_num_batched_tokens: usize) -> EngineSettings {
    let spec = TinySpec::llama_tiny();
    let bytes_per_token = (2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 4) as u64;
    EngineSettings {
        block_size: 16,
        kv_cache_memory: kv_blocks * 16 * bytes_per_token,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs,
            max_num_batched_tokens,
            max_waiting: 1000,
        },
        max_model_len: None,
    }
}

fn counter(
    snapshot: &[(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )],
    name: &str,
) -> u64 {
    snapshot
        .iter()
        .filter(|(key, ..)| key.key().name() == name)
        .map(|(.., value)| match value {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

#[tokio::test]
async fn batching_chunking_and_preemption_leave_outputs_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 77).write_hf(dir.path());
    let reqs = requests(300, 12, 5);
    let alone = solo(dir.path(), &reqs);

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
    let engine_settings = settings(64, 4, 64);
    let engine = start_engine(LlamaModel::load(dir.path()).unwrap(), &engine_settings).unwrap();
    let mut runs = Vec::new();
    for i in 0..2 {
        let rx = submit(&engine.scheduler, i, &req[0].0, &req[0].1).await;
        let (tokens, _, usage) = collect(rx).await;
        runs.push((tokens, usage));
    }
    assert_eq!(runs[0].1.cached_tokens, 0);
    // 40 prompt tokens: two full blocks of 16 can be served from the cache.
    assert_eq!(runs[1].1.cached_tokens, 32);
    assert_eq!(runs[0].0, runs[1].0);
    assert_eq!(runs[0].0, solo(dir.path(), &req)[0]);
}

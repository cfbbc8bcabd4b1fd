//! Driving the serving engine directly (no HTTP): submitting requests to its scheduler and
//! collecting their events.

use super::tiny_model::TinySpec;
use peregrine_actors::backend::{cpu_backend, ModelBackend};
use peregrine_actors::messages::{FinishReason, RequestEvent, RequestSpec, SchedulerMsg, Usage};
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::{Sampler, SamplingParams};
use peregrine_ops::{AttentionPlan, SeqSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Submits one request (`max_tokens`, past EOS) and returns its event stream.
pub async fn submit(
    scheduler: &mpsc::Sender<SchedulerMsg>,
    id: u64,
    prompt: &[u32],
    params: &SamplingParams,
    max_tokens: usize,
) -> mpsc::UnboundedReceiver<RequestEvent> {
    submit_stopping(scheduler, id, prompt, params, max_tokens, vec![]).await
}

/// Submits one request that also stops at any of `stop_token_ids` (past EOS otherwise) and
/// returns its event stream.
pub async fn submit_stopping(
    scheduler: &mpsc::Sender<SchedulerMsg>,
    id: u64,
    prompt: &[u32],
    params: &SamplingParams,
    max_tokens: usize,
    stop_token_ids: Vec<u32>,
) -> mpsc::UnboundedReceiver<RequestEvent> {
    let spec = RequestSpec {
        stop_token_ids,
        ..request_spec(prompt, params, max_tokens)
    };
    super::served::submit(scheduler, id, spec).await
}

/// The request [`submit`] sends: `prompt` for `max_tokens` tokens past EOS, sampled by
/// `params`, no logprobs, stop ids or grammar.
pub fn request_spec(prompt: &[u32], params: &SamplingParams, max_tokens: usize) -> RequestSpec {
    RequestSpec {
        prompt: Arc::from(prompt),
        params: params.clone(),
        max_tokens,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        logprobs: None,
        prompt_logprobs: None,
        priority: 0,
        grammar: None,
    }
}

/// Submits every request of `reqs` at once (ids 0, 1, ...; `max_tokens` each, past EOS)
/// and returns each one's tokens and usage, checking that each ran to its length and that
/// its usage counts the tokens it streamed.
pub async fn run_all(
    scheduler: &mpsc::Sender<SchedulerMsg>,
    reqs: &[(Vec<u32>, SamplingParams)],
    max_tokens: usize,
) -> Vec<(Vec<u32>, Usage)> {
    let mut streams = Vec::new();
    for (i, (prompt, params)) in reqs.iter().enumerate() {
        streams.push(submit(scheduler, i as u64, prompt, params, max_tokens).await);
    }
    let mut out = Vec::new();
    for (i, rx) in streams.into_iter().enumerate() {
        let (tokens, reason, usage) = collect(rx).await;
        assert_eq!(reason, FinishReason::Length, "request {i}");
        assert_eq!(usage.completion_tokens, tokens.len(), "request {i}");
        out.push((tokens, usage));
    }
    out
}

/// A request's tokens, finish reason and usage (its prompt's scores, if any, left out).
pub async fn collect(
    mut rx: mpsc::UnboundedReceiver<RequestEvent>,
) -> (Vec<u32>, FinishReason, Usage) {
    let mut tokens = Vec::new();
    loop {
        match rx.recv().await.expect("the request ended without Finished") {
            RequestEvent::Tokens(t) => tokens.extend(t.iter().map(|t| t.id)),
            RequestEvent::PromptLogprobs(_) => {}
            RequestEvent::Finished { reason, usage } => return (tokens, reason, usage),
        }
    }
}

/// `n` requests of random prompts (5 to 44 ids below `vocab`): even ones greedy, odd ones
/// sampled at temperature 0.9 / top-p 0.95 with their own seed.
pub fn requests(vocab: u32, n: usize, seed: u64) -> Vec<(Vec<u32>, SamplingParams)> {
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

/// One sequence at a time through the plainest loop there is (no engine, no batch, no
/// graph): the model's eager forward over a cache of 64 blocks of 16, from position 0.
pub struct Solo {
    model: LlamaModel,
    cache: peregrine_ops::KvCache,
    cached: usize,
}

impl Solo {
    const BLOCK: usize = 16;

    /// The model of `dir`, its cache empty.
    pub fn load(dir: &Path) -> Solo {
        let model = LlamaModel::load(dir).unwrap();
        let cache = model.new_cache(64, Self::BLOCK as u64);
        Solo {
            model,
            cache,
            cached: 0,
        }
    }

    /// Starts a new sequence (its positions from 0 again).
    pub fn restart(&mut self) {
        self.cached = 0;
    }

    /// The logits after `fed`, the sequence's next tokens.
    pub fn next_logits(&mut self, fed: &[u32]) -> Vec<f32> {
        let blocks: Vec<u32> =
            (0..(self.cached + fed.len()).div_ceil(Self::BLOCK) as u32).collect();
        let spec = SeqSpec {
            num_cached: self.cached,
            num_new: fed.len(),
            block_table: &blocks,
        };
        let plan = AttentionPlan::new(&[spec], Self::BLOCK, 64).unwrap();
        let logits = self
            .model
            .forward(fed, &plan, &mut self.cache, &[fed.len() - 1])
            .unwrap();
        self.cached += fed.len();
        logits
    }
}

/// Each request alone, its `max_tokens` tokens past EOS, through [`Solo`], one token a
/// step: what the engine must give it whatever else runs.
pub fn solo(dir: &Path, reqs: &[(Vec<u32>, SamplingParams)], max_tokens: usize) -> Vec<Vec<u32>> {
    let mut solo = Solo::load(dir);
    reqs.iter()
        .map(|(prompt, params)| {
            solo.restart();
            let mut sampler = Sampler::new(params).unwrap();
            let mut output = Vec::with_capacity(max_tokens);
            let mut fed = prompt.clone();
            while output.len() < max_tokens {
                let logits = solo.next_logits(&fed);
                let token = sampler.sample(&logits, prompt, &output);
                output.push(token);
                fed = vec![token];
            }
            output
        })
        .collect()
}

/// The tiny Llama model of `dir` on the CPU with a pool of `kv_blocks` blocks of 16 tokens.
pub fn tiny_backend(dir: &Path, kv_blocks: u64) -> Box<dyn ModelBackend> {
    let spec = TinySpec::llama_tiny();
    let bytes_per_token = (2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 4) as u64;
    cpu_backend(
        LlamaModel::load(dir).unwrap(),
        kv_blocks * 16 * bytes_per_token,
        16,
    )
    .unwrap()
}

/// One sample of a metrics snapshot (`DebuggingRecorder`'s).
pub type Sample = (
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    metrics_util::debugging::DebugValue,
);

/// The count of counter `name` in a metrics snapshot (a snapshot takes the counts it
/// reports).
pub fn counter(snapshot: &[Sample], name: &str) -> u64 {
    snapshot
        .iter()
        .filter(|(key, ..)| key.key().name() == name)
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

/// The value of gauge `name` in `snapshot` (NaN when it was never set).
pub fn gauge(snapshot: &[Sample], name: &str) -> f64 {
    snapshot
        .iter()
        .filter(|(key, ..)| key.key().name() == name)
        .find_map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Gauge(g) => Some(g.into_inner()),
            _ => None,
        })
        .unwrap_or(f64::NAN)
}

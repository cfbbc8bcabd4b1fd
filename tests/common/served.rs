//! Serving requests (constrained, biased or free) through the whole engine on the CPU, with
//! any speculative method, for the engine-level tests; and the tiny models they run.

use super::engine::{collect, Solo};
use super::tiny_model::{TinyModel, TinySpec};
use super::tiny_tokenizer::write_tokenizer;
use peregrine_actors::backend::cpu_backend;
use peregrine_actors::draft::{CpuMtpHead, DraftMethod, DraftModel, Eagle3, Ngram};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::messages::{
    FinishReason, GenerateRequest, RequestEvent, RequestId, RequestSpec, SchedulerLimits,
    SchedulerMsg, Usage,
};
use peregrine_models::eagle3::{Eagle3Config, Eagle3Head};
use peregrine_models::mtp::MtpHead;
use peregrine_models::tokenizer::Tokenizer;
use peregrine_models::{LlamaModel, Weights};
use peregrine_ops::sampling::{Sampler, SamplingParams};
use peregrine_structured::{CompiledGrammar, Constraint, GrammarCompiler, GrammarLimits};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// The tiny tokenizer's end-of-sequence id (`<|im_end|>`).
pub const EOS: u32 = 2;

/// A constrained (or free) request: prompt, sampling, grammar.
pub type Request = (Vec<u32>, SamplingParams, Option<Arc<CompiledGrammar>>);

/// A served request's tokens, finish reason and usage.
pub type Served = (Vec<u32>, FinishReason, Usage);

/// The tiny Llama with its tokenizer, written into a temporary folder.
pub fn model_dir(seed: u64) -> tempfile::TempDir {
    write_model(&TinyModel::random(TinySpec::llama_tiny(), seed))
}

/// `model` (a tiny Llama) with its tokenizer, written into a temporary folder.
pub fn write_model(model: &TinyModel) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    model.write_hf(dir.path());
    write_tokenizer(dir.path(), model.spec.vocab_size);
    dir
}

/// The vocabulary size in the config.json of the model in `dir`.
pub fn vocab_size(dir: &Path) -> usize {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["vocab_size"].as_u64().unwrap() as usize
}

/// A grammar compiler over the model's tokenizer and vocabulary.
pub fn compiler(dir: &Path) -> GrammarCompiler {
    let tokenizer = Tokenizer::from_dir(dir).unwrap();
    GrammarCompiler::new(&tokenizer, vocab_size(dir), GrammarLimits::default()).unwrap()
}

/// `constraint` compiled (it must compile).
pub fn compile(compiler: &GrammarCompiler, constraint: Constraint) -> Arc<CompiledGrammar> {
    compiler.compile(&constraint).unwrap().0
}

/// How a run drafts.
#[derive(Clone, Copy)]
pub enum Drafts<'a> {
    /// No speculation.
    Off,
    /// N-gram drafts from each request's own tokens.
    Ngram,
    /// The draft model (a tiny Llama) in this folder.
    Model(&'a Path),
    /// The EAGLE-3 head in this folder, fed the target's hidden states.
    Eagle3(&'a Path),
    /// The target's own MTP layer (a DeepSeek-V3 target), run as a head.
    Mtp,
}

/// Every request of `reqs` at once through the engine of the model in `dir` (eight
/// sequences a step, a roomy pool of 256 blocks of 16); each one's tokens, finish reason
/// and usage.
pub async fn served(
    dir: &Path,
    reqs: &[Request],
    max_tokens: usize,
    drafts: Drafts<'_>,
) -> Vec<Served> {
    let model = LlamaModel::load(dir).unwrap();
    let (embed, lm_head) = (model.embedding_table(), model.lm_head());
    let memory = 256 * 16 * model.kv_bytes_per_token();
    let target = cpu_backend(model, memory, 16).unwrap();
    let drafter: Option<Box<dyn DraftMethod>> = match drafts {
        Drafts::Off => None,
        Drafts::Ngram => Some(Box::new(Ngram::new(1, 3).unwrap())),
        Drafts::Model(draft) => Some(Box::new(
            DraftModel::new(
                LlamaModel::load(draft).unwrap(),
                target.config(),
                target.pool(),
            )
            .unwrap(),
        )),
        Drafts::Eagle3(head) => {
            let head = Eagle3Head::from_weights(
                Eagle3Config::from_dir(head).unwrap(),
                &Weights::open(head).unwrap(),
                target.config(),
                embed,
            )
            .unwrap();
            Some(Box::new(
                Eagle3::new(head, target.config(), target.pool()).unwrap(),
            ))
        }
        Drafts::Mtp => {
            let weights = Weights::open(dir).unwrap();
            let mtp = MtpHead::from_weights(target.config(), &weights, embed, lm_head).unwrap();
            let runner = CpuMtpHead::new(mtp, target.config(), target.pool()).unwrap();
            Some(Box::new(Eagle3::with_runner(runner)))
        }
    };
    let settings = EngineSettings {
        block_size: 16,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: 8,
            max_num_batched_tokens: 96,
            max_waiting: 1000,
            num_speculative_tokens: 3,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: true,
        // Constrained batches queue ahead too, so that the masked path is tested.
        async_scheduling_constrained: true,
        kv_events: None,
    };
    let engine = start_engine(target, &settings, drafter).unwrap();
    let mut streams = Vec::new();
    for (i, (prompt, params, grammar)) in reqs.iter().enumerate() {
        let spec = RequestSpec {
            prompt: Arc::from(prompt.as_slice()),
            params: params.clone(),
            max_tokens,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            priority: 0,
            grammar: grammar.clone(),
        };
        streams.push(submit(&engine.scheduler, i as u64, spec).await);
    }
    let mut out = Vec::new();
    for rx in streams {
        let (tokens, reason, usage) = collect(rx).await;
        assert_eq!(usage.completion_tokens, tokens.len());
        out.push((tokens, reason, usage));
    }
    out
}

/// Submits `spec` as request `id`; its event stream.
pub async fn submit(
    scheduler: &mpsc::Sender<SchedulerMsg>,
    id: u64,
    spec: RequestSpec,
) -> mpsc::UnboundedReceiver<RequestEvent> {
    let (events, rx) = mpsc::unbounded_channel();
    let request = GenerateRequest {
        id: RequestId(id),
        spec,
        arrival: std::time::Instant::now(),
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

/// A two-thread runtime for the engine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `tokens` decoded by the tokenizer in `dir`, special tokens skipped.
pub fn text(dir: &Path, tokens: &[u32]) -> String {
    Tokenizer::from_dir(dir)
        .unwrap()
        .decode(tokens, true)
        .unwrap()
}

/// Step-by-step decoding, one request at a time, the independent reference of the engine
/// tests: the model's eager forward, one token a step; the row masked by the request's
/// grammar, its `logit_bias` added and, before `min_tokens`, its stop ids set to −∞ (by this
/// code, not the sampler's); then its sampler (without the biases) draws, no token forced.
/// It ends at EOS, where the grammar is complete, or at `max_tokens`.
pub fn step_by_step(dir: &Path, reqs: &[Request], max_tokens: usize) -> Vec<Vec<u32>> {
    let mut solo = Solo::load(dir);
    reqs.iter()
        .map(|(prompt, params, grammar)| {
            solo.restart();
            let mut matcher = grammar.as_ref().map(|g| g.matcher());
            let mut sampler = Sampler::new(&SamplingParams {
                logit_bias: Vec::new(),
                min_tokens: 0,
                min_tokens_stop_ids: Vec::new(),
                ..params.clone()
            })
            .unwrap();
            let mut output = Vec::new();
            let mut fed = prompt.clone();
            while output.len() < max_tokens {
                let mut logits = solo.next_logits(&fed);
                if let Some(matcher) = matcher.as_mut() {
                    matcher.mask().unwrap().apply(&mut logits);
                }
                for &(id, bias) in &params.logit_bias {
                    logits[id as usize] += bias;
                }
                if output.len() < params.min_tokens {
                    for &id in &params.min_tokens_stop_ids {
                        logits[id as usize] = f32::NEG_INFINITY;
                    }
                }
                let token = sampler.sample(&logits, prompt, &output);
                output.push(token);
                fed = vec![token];
                let complete = match matcher.as_mut() {
                    Some(matcher) => {
                        matcher.consume(&[token]).unwrap();
                        matcher.is_stopped()
                    }
                    None => false,
                };
                if token == EOS || complete {
                    break;
                }
            }
            output
        })
        .collect()
}

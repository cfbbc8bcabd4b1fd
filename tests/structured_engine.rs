//! Constrained requests through the serving engine on the tiny random Llama: each output
//! equals what step-by-step constrained decoding gives (a plain loop here: the model's
//! eager forward, the grammar's mask applied to each row before its sampler, no token
//! forced), with the grammar's forced tokens taken without a step each; unconstrained
//! requests beside them are untouched; speculation (n-gram, a draft model that agrees with
//! the target, one that does not) leaves greedy constrained outputs as they are; and
//! outputs of JSON schemas validate.

mod common;

use common::engine::{collect, solo, tiny_backend};
use common::tiny_model::{TinyModel, TinySpec};
use common::tiny_tokenizer::write_tokenizer;
use peregrine_actors::draft::{DraftMethod, DraftModel, Ngram};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::messages::{
    FinishReason, GenerateRequest, RequestEvent, RequestId, RequestSpec, SchedulerLimits,
    SchedulerMsg,
};
use peregrine_models::tokenizer::Tokenizer;
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::{Sampler, SamplingParams};
use peregrine_ops::{AttentionPlan, SeqSpec};
use peregrine_structured::{CompiledGrammar, Constraint, GrammarCompiler, GrammarLimits};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// The tiny tokenizer's end-of-sequence id (`<|im_end|>`).
const EOS: u32 = 2;

/// A constrained (or free) request: prompt, sampling, grammar.
type Request = (Vec<u32>, SamplingParams, Option<Arc<CompiledGrammar>>);

/// The tiny Llama with its tokenizer, written into a temporary folder.
fn model_dir(seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), seed).write_hf(dir.path());
    write_tokenizer(dir.path(), TinySpec::llama_tiny().vocab_size);
    dir
}

/// A grammar compiler over the model's tokenizer.
fn compiler(dir: &Path) -> GrammarCompiler {
    let tokenizer = Tokenizer::from_dir(dir).unwrap();
    let vocab = TinySpec::llama_tiny().vocab_size;
    GrammarCompiler::new(&tokenizer, vocab, GrammarLimits::default()).unwrap()
}

fn compile(compiler: &GrammarCompiler, constraint: Constraint) -> Arc<CompiledGrammar> {
    compiler.compile(&constraint).unwrap().0
}

/// `n` random prompts of 4 to 20 ids, alternately greedy and seeded sampled, each with
/// one of `grammars` in turn.
fn requests(n: usize, seed: u64, grammars: &[Arc<CompiledGrammar>]) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let len = rng.random_range(4..20);
            let prompt = (0..len).map(|_| rng.random_range(3..300)).collect();
            let params = match i % 2 {
                0 => SamplingParams::greedy(),
                _ => SamplingParams {
                    temperature: 1.0,
                    top_k: 40,
                    seed: Some(7 + i as u64),
                    ..SamplingParams::default()
                },
            };
            (prompt, params, Some(grammars[i % grammars.len()].clone()))
        })
        .collect()
}

/// Step-by-step constrained decoding, one request at a time: the model's eager forward,
/// one token a step, the row masked by the grammar before the sampler draws; it ends at
/// EOS, where the grammar is complete, or at `max_tokens`.
fn step_by_step(dir: &Path, reqs: &[Request], max_tokens: usize) -> Vec<Vec<u32>> {
    const BLOCK: usize = 16;
    let model = LlamaModel::load(dir).unwrap();
    let mut cache = model.new_cache(64, BLOCK as u64);
    reqs.iter()
        .map(|(prompt, params, grammar)| {
            let mut matcher = grammar.as_ref().map(|g| g.matcher());
            let mut sampler = Sampler::new(params).unwrap();
            let mut output = Vec::new();
            let (mut fed, mut cached) = (prompt.clone(), 0);
            while output.len() < max_tokens {
                let blocks: Vec<u32> = (0..(cached + fed.len()).div_ceil(BLOCK) as u32).collect();
                let spec = SeqSpec {
                    num_cached: cached,
                    num_new: fed.len(),
                    block_table: &blocks,
                };
                let plan = AttentionPlan::new(&[spec], BLOCK, 64).unwrap();
                let mut logits = model
                    .forward(&fed, &plan, &mut cache, &[fed.len() - 1])
                    .unwrap();
                cached += fed.len();
                if let Some(matcher) = matcher.as_mut() {
                    matcher.mask().unwrap().apply(&mut logits);
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

/// How a run drafts.
#[derive(Clone, Copy)]
enum Drafts<'a> {
    Off,
    Ngram,
    Model(&'a Path),
}

/// Every request of `reqs` at once through the engine (eight sequences a step, a roomy
/// pool); each one's tokens and finish reason.
async fn served(
    dir: &Path,
    reqs: &[Request],
    max_tokens: usize,
    drafts: Drafts<'_>,
) -> Vec<(Vec<u32>, FinishReason)> {
    let target = tiny_backend(dir, 256);
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
            priority: 0,
            grammar: grammar.clone(),
        };
        streams.push(submit(&engine.scheduler, i as u64, spec).await);
    }
    let mut out = Vec::new();
    for rx in streams {
        let (tokens, reason, usage) = collect(rx).await;
        assert_eq!(usage.completion_tokens, tokens.len());
        out.push((tokens, reason));
    }
    out
}

async fn submit(
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn text(dir: &Path, tokens: &[u32]) -> String {
    Tokenizer::from_dir(dir)
        .unwrap()
        .decode(tokens, true)
        .unwrap()
}

/// Grammars whose forced text has one tokenization in the tiny vocabulary (upper-case
/// letters, digits and punctuation have no merges), so that the tokens the grammar forces
/// are the only ones its masks allow one at a time: a regex with a forced run, a choice,
/// and a JSON schema with forced keys.
fn forced_grammars(compiler: &GrammarCompiler) -> Vec<Arc<CompiledGrammar>> {
    let schema = json!({"type": "object", "properties": {
        "ID": {"type": "integer", "minimum": 0, "maximum": 999},
        "QZ": {"enum": ["AB", "XY", "K9"]},
        "LS": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
        "required": ["ID", "QZ", "LS"], "additionalProperties": false});
    vec![
        compile(
            compiler,
            Constraint::Regex("[a-z ]{0,6}QZX[0-9]{1,4}".into()),
        ),
        compile(
            compiler,
            Constraint::Choice(vec!["NORTH".into(), "SOUTH".into(), "WEST-1".into()]),
        ),
        compile(compiler, Constraint::JsonSchema(schema)),
    ]
}

#[test]
fn constrained_outputs_equal_step_by_step_decoding_with_forced_tokens_taken_at_once() {
    let dir = model_dir(11);
    let compiler = compiler(dir.path());
    let grammars = forced_grammars(&compiler);
    let mut reqs = requests(12, 3, &grammars);
    // Unconstrained requests in the same batches.
    for (prompt, params, _) in requests(4, 4, &grammars) {
        reqs.push((prompt, params, None));
    }
    let want = step_by_step(dir.path(), &reqs, 60);
    let got = runtime().block_on(served(dir.path(), &reqs, 60, Drafts::Off));
    for (i, ((tokens, reason), want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(tokens, want, "request {i}: {:?}", text(dir.path(), tokens));
        if reqs[i].2.is_some() {
            assert_eq!(
                *reason,
                FinishReason::Stop,
                "request {i} completes its grammar"
            );
        }
    }
    // The free requests are also exactly what they give alone (past EOS they would go on:
    // compare up to the engine's end).
    let free: Vec<(Vec<u32>, SamplingParams)> = reqs[12..]
        .iter()
        .map(|(p, s, _)| (p.clone(), s.clone()))
        .collect();
    for (i, alone) in solo(dir.path(), &free, 60).iter().enumerate() {
        let served = &got[12 + i].0;
        assert_eq!(
            &alone[..served.len()],
            served.as_slice(),
            "free request {i}"
        );
    }
    // The texts match their grammars.
    for (i, (tokens, _)) in got.iter().take(12).enumerate() {
        let out = text(dir.path(), tokens);
        match i % 3 {
            0 => assert!(out.contains("QZX"), "{out:?}"),
            1 => assert!(
                ["NORTH", "SOUTH", "WEST-1"].contains(&out.as_str()),
                "{out:?}"
            ),
            _ => assert!(serde_json::from_str::<Value>(&out).is_ok(), "{out:?}"),
        }
    }
}

#[test]
fn forced_tokens_save_steps() {
    let dir = model_dir(12);
    let compiler = compiler(dir.path());
    let choice = compile(
        &compiler,
        Constraint::Choice(vec!["ABCDEFGHIJKLMNOP".into()]),
    );
    let reqs = vec![(vec![5, 6, 7], SamplingParams::greedy(), Some(choice))];
    let got = runtime().block_on(served(dir.path(), &reqs, 40, Drafts::Off));
    let (tokens, reason) = &got[0];
    assert_eq!(text(dir.path(), tokens), "ABCDEFGHIJKLMNOP");
    assert_eq!(*reason, FinishReason::Stop);
}

#[test]
fn speculation_keeps_greedy_constrained_outputs() {
    let dir = model_dir(13);
    let other = model_dir(14);
    let compiler = compiler(dir.path());
    let grammars = forced_grammars(&compiler);
    // Greedy only; prompts that repeat themselves, so that n-gram drafts are proposed.
    let reqs: Vec<Request> = requests(9, 5, &grammars)
        .into_iter()
        .map(|(prompt, _, grammar)| {
            let repeated = prompt
                .iter()
                .chain(&prompt)
                .chain(&prompt)
                .copied()
                .collect();
            (repeated, SamplingParams::greedy(), grammar)
        })
        .collect();
    let want = step_by_step(dir.path(), &reqs, 50);
    let rt = runtime();
    for (what, drafts) in [
        ("n-gram", Drafts::Ngram),
        ("an agreeing draft model", Drafts::Model(dir.path())),
        ("a disagreeing draft model", Drafts::Model(other.path())),
    ] {
        let got = rt.block_on(served(dir.path(), &reqs, 50, drafts));
        for (i, ((tokens, _), want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(tokens, want, "{what}, request {i}");
        }
    }
}

#[test]
fn sampled_constrained_outputs_with_speculation_match_their_grammar() {
    let dir = model_dir(15);
    let compiler = compiler(dir.path());
    let grammars = forced_grammars(&compiler);
    let reqs: Vec<Request> = requests(12, 6, &grammars)
        .into_iter()
        .map(|(prompt, _, grammar)| {
            let params = SamplingParams {
                temperature: 0.9,
                seed: Some(prompt.len() as u64),
                ..SamplingParams::default()
            };
            (prompt, params, grammar)
        })
        .collect();
    let got = runtime().block_on(served(dir.path(), &reqs, 60, Drafts::Model(dir.path())));
    for (i, (tokens, reason)) in got.iter().enumerate() {
        assert_eq!(*reason, FinishReason::Stop, "request {i}");
        let out = text(dir.path(), tokens);
        let mut matcher = reqs[i].2.as_ref().unwrap().matcher();
        matcher
            .consume(tokens)
            .unwrap_or_else(|err| panic!("request {i}: {out:?} breaks its grammar: {err}"));
        assert!(matcher.is_stopped(), "request {i}: {out:?} is incomplete");
    }
}

/// Schemas of the shapes real ones have: nested objects, arrays, enums, `anyOf`, numbers
/// with bounds, strings with patterns.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 8},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
            "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"], "additionalProperties": false}},
            "required": ["name", "tags", "inner"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "value": {"anyOf": [{"type": "integer", "minimum": -5, "maximum": 5},
                {"type": "string", "pattern": "^[A-F]{2}$"}, {"type": "null"}]}},
            "required": ["value"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "x": {"type": "number", "minimum": 1.5, "exclusiveMaximum": 9},
            "code": {"type": "string", "pattern": "^[0-9]{3}-[a-z]{2}$"}},
            "required": ["x", "code"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": 10, "maximum": 20},
            "minItems": 2, "maxItems": 3}),
    ]
}

#[test]
fn json_schema_outputs_validate() {
    let dir = model_dir(16);
    let compiler = compiler(dir.path());
    let schemas = schemas();
    let grammars: Vec<Arc<CompiledGrammar>> = schemas
        .iter()
        .map(|schema| compile(&compiler, Constraint::JsonSchema(schema.clone())))
        .collect();
    let reqs = requests(16, 8, &grammars);
    let got = runtime().block_on(served(dir.path(), &reqs, 120, Drafts::Off));
    let mut stopped = 0;
    for (i, (tokens, reason)) in got.iter().enumerate() {
        if *reason != FinishReason::Stop {
            continue;
        }
        stopped += 1;
        let out = text(dir.path(), tokens);
        let value: Value = serde_json::from_str(&out)
            .unwrap_or_else(|err| panic!("request {i}: {out:?} is not JSON: {err}"));
        let schema = &schemas[i % schemas.len()];
        assert!(
            jsonschema::is_valid(schema, &value),
            "request {i}: {out} breaks {schema}"
        );
    }
    assert!(stopped >= 12, "only {stopped} of 16 finished");
}

#[test]
fn eos_waits_for_the_grammar() {
    let dir = model_dir(17);
    let compiler = compiler(dir.path());
    let regex = compile(&compiler, Constraint::Regex("(ab|cd){3,5}".into()));
    let reqs = requests(8, 9, &[regex]);
    let got = runtime().block_on(served(dir.path(), &reqs, 40, Drafts::Off));
    for (i, (tokens, reason)) in got.iter().enumerate() {
        assert_eq!(*reason, FinishReason::Stop, "request {i}");
        let body: Vec<u32> = tokens.iter().copied().filter(|&t| t != EOS).collect();
        assert!(
            tokens
                .iter()
                .position(|&t| t == EOS)
                .is_none_or(|at| at == tokens.len() - 1),
            "request {i}: EOS before the end"
        );
        let out = text(dir.path(), &body);
        let pairs = out.len() / 2;
        assert!(
            out.len().is_multiple_of(2)
                && (3..=5).contains(&pairs)
                && out.as_bytes().chunks(2).all(|p| p == b"ab" || p == b"cd"),
            "request {i}: {out:?}"
        );
    }
}

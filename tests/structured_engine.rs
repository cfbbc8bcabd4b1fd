//! Constrained requests through the serving engine on the tiny random Llama: each output
//! equals what step-by-step constrained decoding gives (a plain loop here: the model's
//! eager forward, the grammar's mask applied to each row before its sampler, no token
//! forced), with the grammar's forced tokens taken without a step each; unconstrained
//! requests beside them are untouched; speculation (n-gram, a draft model that agrees with
//! the target, one that does not, a random EAGLE-3 head, one whose drafts the grammar
//! accepts) leaves greedy constrained outputs as they are, and sampled ones with drafts
//! still complete their grammars; on a tiny DeepSeek-V3 with an MTP layer, MTP drafting
//! leaves greedy constrained outputs as the same engine gives them without drafts, every
//! output completing its grammar; greedy constrained rows keep async scheduling; and
//! outputs of JSON schemas validate.

mod common;

use common::eagle3_head::{HeadSpec, RandomHead};
use common::engine::{counter, solo};
use common::served::{
    compile, compiler, model_dir, runtime, served, step_by_step, text, write_model, Drafts,
    Request, Served, EOS,
};
use common::tiny_model::{TinyModel, TinySpec};
use common::tiny_tokenizer::write_tokenizer;
use metrics_util::debugging::DebuggingRecorder;
use peregrine_actors::messages::FinishReason;
use peregrine_models::tokenizer::Tokenizer;
use peregrine_ops::sampling::SamplingParams;
use peregrine_structured::{CompiledGrammar, Constraint, GrammarCompiler};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// A random EAGLE-3 head for the tiny Llama of [`model_dir`]: a `midlayer.` head reading
/// the inputs of both of the target's layers (the default aux layers need a deeper target).
fn random_head(seed: u64) -> RandomHead {
    let spec = HeadSpec {
        aux_ids: Some(vec![0, 1]),
        ..HeadSpec::midlayer()
    };
    RandomHead::new(&spec, &TinySpec::llama_tiny(), seed)
}

/// `head` written into a temporary folder.
fn head_dir(head: &RandomHead) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    head.write(dir.path());
    dir
}

/// The tiny DeepSeek-V3 with a random MTP layer (`common::mtp_checkpoint`) and the tiny
/// Llama's tokenizer, written into a temporary folder. The tokenizer's merges run out
/// before the checkpoint's 320 ids, so its 300 tokens are the first 300 of them and the
/// rest are padding, as in real checkpoints whose vocabulary is rounded up: the grammar
/// compiler masks rows of the checkpoint's width ([`compiler`]), never allowing them.
fn mtp_model_dir(seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    common::mtp_checkpoint::write(dir.path(), seed);
    write_tokenizer(dir.path(), TinySpec::llama_tiny().vocab_size);
    dir
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

/// Asserts that `tokens` (decoded by the tokenizer in `dir` for the message) complete
/// `grammar`: its matcher takes every one of them and then stops.
fn assert_completes(what: &str, dir: &Path, tokens: &[u32], grammar: &CompiledGrammar) {
    let out = text(dir, tokens);
    let mut matcher = grammar.matcher();
    matcher
        .consume(tokens)
        .unwrap_or_else(|err| panic!("{what}: {out:?} breaks its grammar: {err}"));
    assert!(matcher.is_stopped(), "{what}: {out:?} is incomplete");
}

/// The draft tokens the engine verified over all of `served`.
fn drafted(served: &[Served]) -> usize {
    served
        .iter()
        .map(|(.., usage)| usage.num_draft_tokens)
        .sum()
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
    for (i, ((tokens, reason, _), want)) in got.iter().zip(&want).enumerate() {
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
    for (i, (tokens, ..)) in got.iter().take(12).enumerate() {
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
    let (tokens, reason, _) = &got[0];
    assert_eq!(text(dir.path(), tokens), "ABCDEFGHIJKLMNOP");
    assert_eq!(*reason, FinishReason::Stop);
}

#[test]
fn speculation_keeps_greedy_constrained_outputs() {
    let dir = model_dir(13);
    let other = model_dir(14);
    let head = head_dir(&random_head(18));
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
        ("an EAGLE-3 head", Drafts::Eagle3(head.path())),
    ] {
        let got = rt.block_on(served(dir.path(), &reqs, 50, drafts));
        for (i, ((tokens, ..), want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(tokens, want, "{what}, request {i}");
        }
        assert!(drafted(&got) > 0, "{what}: no drafts were verified");
    }
}

/// Accepted drafts under a grammar: a target whose logits are all equal (its final norm
/// zeroed, so that a masked row's argmax is the lowest id its grammar allows) and an
/// EAGLE-3 head that always drafts `A` (its draft logits all equal: draft id 0, mapped to
/// `A`). Where the grammar allows `A` the drafts are accepted, the masks of the rows after
/// them following the grammar past them; where it does not they are rejected; and the
/// outputs equal step-by-step decoding's.
#[test]
fn accepted_eagle3_drafts_keep_greedy_constrained_outputs() {
    let mut target = TinyModel::random(TinySpec::llama_tiny(), 20);
    let norm = target.tensors.get_mut("model.norm.weight").unwrap();
    norm.1.iter_mut().for_each(|w| *w = 0.0);
    let dir = write_model(&target);
    let a = Tokenizer::from_dir(dir.path())
        .unwrap()
        .token_to_id("A")
        .unwrap();
    let mut head = random_head(21);
    let lm_head = head.tensors.get_mut("lm_head.weight").unwrap();
    lm_head.1.iter_mut().for_each(|w| *w = 0.0);
    // Draft ids map to `A` first, then to the other ids in order.
    let order: Vec<u32> = std::iter::once(a)
        .chain((0..target.spec.vocab_size as u32).filter(|&t| t != a))
        .collect();
    for (draft, offset) in head.d2t.iter_mut().enumerate() {
        *offset = i64::from(order[draft]) - draft as i64;
    }
    let head = head_dir(&head);
    let compiler = compiler(dir.path());
    // Each grammar with the one output that the lowest allowed ids give.
    let grammars = [
        ("([A-C]{2}[X-Z]){3}", "AAXAAXAAX"),
        ("[A-C]{7}[X-Z]{2}", "AAAAAAAXX"),
    ];
    let compiled: Vec<Arc<CompiledGrammar>> = grammars
        .iter()
        .map(|(regex, _)| compile(&compiler, Constraint::Regex(regex.to_string())))
        .collect();
    let reqs: Vec<Request> = requests(6, 11, &compiled)
        .into_iter()
        .map(|(prompt, _, grammar)| (prompt, SamplingParams::greedy(), grammar))
        .collect();
    let want = step_by_step(dir.path(), &reqs, 30);
    let got = runtime().block_on(served(dir.path(), &reqs, 30, Drafts::Eagle3(head.path())));
    for (i, ((tokens, reason, _), want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(tokens, want, "request {i}");
        assert_eq!(*reason, FinishReason::Stop, "request {i}");
        assert_eq!(text(dir.path(), tokens), grammars[i % 2].1, "request {i}");
    }
    let accepted: usize = got
        .iter()
        .map(|(.., usage)| usage.num_accepted_tokens)
        .sum();
    assert!(accepted > 0, "no draft was accepted");
}

#[test]
fn sampled_constrained_outputs_with_speculation_match_their_grammar() {
    let dir = model_dir(15);
    let head = head_dir(&random_head(19));
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
    let rt = runtime();
    for (what, drafts) in [
        ("a draft model", Drafts::Model(dir.path())),
        ("an EAGLE-3 head", Drafts::Eagle3(head.path())),
    ] {
        let got = rt.block_on(served(dir.path(), &reqs, 60, drafts));
        for (i, (tokens, reason, _)) in got.iter().enumerate() {
            let what = format!("{what}, request {i}");
            assert_eq!(*reason, FinishReason::Stop, "{what}");
            assert_completes(&what, dir.path(), tokens, reqs[i].2.as_ref().unwrap());
        }
        assert!(drafted(&got) > 0, "{what}: no drafts were verified");
    }
}

/// On the tiny DeepSeek-V3, MTP drafting (its own random MTP layer, nearly every draft
/// rejected) keeps each greedy constrained output as the same engine gives it without
/// drafts (the eager Llama loop of [`step_by_step`] does not run this model), and every
/// output, greedy or sampled, with drafts or without, completes its grammar.
#[test]
fn mtp_drafting_keeps_greedy_constrained_outputs_and_their_grammars() {
    let dir = mtp_model_dir(31);
    let compiler = compiler(dir.path());
    let grammars = forced_grammars(&compiler);
    let reqs = requests(12, 10, &grammars);
    let rt = runtime();
    let plain = rt.block_on(served(dir.path(), &reqs, 60, Drafts::Off));
    let mtp = rt.block_on(served(dir.path(), &reqs, 60, Drafts::Mtp));
    for (i, (want, got)) in plain.iter().zip(&mtp).enumerate() {
        if reqs[i].1.is_greedy() {
            assert_eq!(got.0, want.0, "request {i}: {:?}", text(dir.path(), &got.0));
        }
        let grammar = reqs[i].2.as_ref().unwrap();
        for (what, (tokens, reason, _)) in [("without drafts", want), ("with MTP", got)] {
            let what = format!("{what}, request {i}");
            assert_eq!(*reason, FinishReason::Stop, "{what}");
            assert_completes(&what, dir.path(), tokens, grammar);
        }
    }
    assert!(drafted(&mtp) > 0, "MTP: no drafts were verified");
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
    for (i, (tokens, reason, _)) in got.iter().enumerate() {
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
    for (i, (tokens, reason, _)) in got.iter().enumerate() {
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

/// Greedy requests, constrained and free, decoding together keep async scheduling where
/// it is asked for them (`served` sets `async_scheduling_constrained`): the runner queues
/// each step's successor before it reads the step's tokens, a constrained
/// row's argmax taken under its grammar's mask before the queued step is fed from it, so
/// that tokens come from queued steps; where a grammar forces tokens, its queued row is
/// dropped. Every output equals step-by-step constrained decoding's.
#[test]
fn greedy_constrained_rows_keep_decode_ahead() {
    let dir = model_dir(19);
    let compiler = compiler(dir.path());
    let mut grammars = forced_grammars(&compiler);
    grammars.push(compile(
        &compiler,
        Constraint::Regex("[a-z ]{12,40}".into()),
    ));
    let greedy = |reqs: Vec<Request>| -> Vec<Request> {
        reqs.into_iter()
            .map(|(prompt, _, grammar)| (prompt, SamplingParams::greedy(), grammar))
            .collect()
    };
    let constrained = greedy(requests(8, 21, &grammars));
    let mut mixed = constrained.clone();
    mixed.extend(
        greedy(requests(4, 22, &grammars))
            .into_iter()
            .map(|(prompt, params, _)| (prompt, params, None)),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    for (what, reqs) in [("constrained", constrained), ("mixed", mixed)] {
        let want = step_by_step(dir.path(), &reqs, 48);
        let got = rt.block_on(served(dir.path(), &reqs, 48, Drafts::Off));
        for (i, ((tokens, ..), want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(tokens, want, "{what}, request {i}");
        }
        let snapshot = snapshotter.snapshot().into_vec();
        let ahead = counter(&snapshot, "peregrine:decode_ahead_tokens_total");
        assert!(ahead > 0, "{what}: no token came from a step queued ahead");
    }
}

//! The engine's paged forward against the dense float64 reference, for tiny random models
//! of each architecture: prefill logits at every prompt position, then 20 decode steps,
//! with the sequence's blocks scattered across the pool.

use peregrine_models::LlamaModel;
use peregrine_ops::{AttentionPlan, KvCache, KvDtype, SeqSpec};
use peregrine_testkit::reference::logits_f64;
use peregrine_testkit::tiny_model::{TinyModel, TinySpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::Dtype;
use serde_json::json;

const BLOCK_SIZE: usize = 16;
const PROMPT: usize = 23;
const DECODE_STEPS: usize = 20;

/// Engine logits for `tokens`: the first `PROMPT` in one prefill, then one token a step.
fn engine_logits(model: &LlamaModel, tokens: &[u32], blocks: &[u32], pool: u64) -> Vec<Vec<f32>> {
    engine_logits_in(model, tokens, blocks, pool, KvDtype::Float32)
}

/// [`engine_logits`] with a KV cache of `dtype` elements.
fn engine_logits_in(
    model: &LlamaModel,
    tokens: &[u32],
    blocks: &[u32],
    pool: u64,
    dtype: KvDtype,
) -> Vec<Vec<f32>> {
    let mut cache = KvCache::try_with_dtype(
        model.config().num_layers,
        model.kv_layout(pool, BLOCK_SIZE as u64),
        model.kv_rows(),
        dtype,
    )
    .unwrap();
    let vocab = model.config().vocab_size;
    let mut rows = Vec::new();
    let mut cached = 0;
    let mut feed = |new: &[u32], cached: usize, rows: &mut Vec<Vec<f32>>| {
        let spec = SeqSpec {
            num_cached: cached,
            num_new: new.len(),
            block_table: blocks,
        };
        let plan = AttentionPlan::new(&[spec], BLOCK_SIZE, pool).unwrap();
        let all: Vec<usize> = (0..new.len()).collect();
        let logits = model.forward(new, &plan, &mut cache, &all).unwrap();
        rows.extend(logits.chunks(vocab).map(<[f32]>::to_vec));
    };
    feed(&tokens[..PROMPT], 0, &mut rows);
    cached += PROMPT;
    for t in &tokens[PROMPT..] {
        feed(std::slice::from_ref(t), cached, &mut rows);
        cached += 1;
    }
    rows
}

/// Largest |engine - reference| over all logits, relative to the largest |reference|.
fn relative_error(engine: &[Vec<f32>], reference: &[Vec<f64>]) -> f64 {
    let scale = reference.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    let diff = engine
        .iter()
        .flatten()
        .zip(reference.iter().flatten())
        .fold(0f64, |m, (e, r)| m.max((*e as f64 - r).abs()));
    diff / scale
}

/// A random model of `spec` written with `dtype` weights, random tokens for it, their
/// float64 reference logits and the engine's model.
struct Run {
    dir: tempfile::TempDir,
    model: TinyModel,
    tokens: Vec<u32>,
    reference: Vec<Vec<f64>>,
    engine: LlamaModel,
}

impl Run {
    fn new(spec: TinySpec, dtype: Dtype, seed: u64) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let model = TinyModel::random(spec, seed);
        model.write_hf_as(dir.path(), dtype);
        let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
        let vocab = model.spec.vocab_size as u32;
        let tokens: Vec<u32> = (0..PROMPT + DECODE_STEPS)
            .map(|_| rng.random_range(0..vocab))
            .collect();
        let reference = logits_f64(dir.path(), &tokens);
        let engine = LlamaModel::load(dir.path()).unwrap();
        Run {
            dir,
            model,
            tokens,
            reference,
            engine,
        }
    }
}

/// 43 tokens take 3 blocks of 16; placed out of order, far apart, in a pool of 64.
const BLOCKS: [u32; 3] = [41, 7, 63];

fn check(spec: TinySpec, dtype: Dtype, seed: u64) {
    let Run {
        dir,
        model,
        tokens,
        reference,
        engine,
    } = Run::new(spec, dtype, seed);
    let logits = engine_logits(&engine, &tokens, &BLOCKS, 64);
    assert_eq!(logits.len(), PROMPT + DECODE_STEPS);
    let err = relative_error(&logits, &reference);
    // float32 rounding: within 8 ulps (2^-23 each) of the logit scale; seen: 1.3e-7 to 1.6e-7.
    assert!(err < 1e-6, "{:?}: relative error {err:e}", model.spec.arch);
    // The reference is sensitive enough to notice a wrong model: shifting the sequence by
    // one position changes the logits far beyond the tolerance.
    let shifted = logits_f64(dir.path(), &tokens[1..]);
    assert!(relative_error(&logits[1..], &shifted) > 1e-2);
}

#[test]
fn llama_matches_the_float64_reference() {
    check(TinySpec::llama_tiny(), Dtype::F32, 10);
}

#[test]
fn qwen3_with_qk_norm_and_tied_embeddings_matches_the_reference() {
    check(TinySpec::qwen3_tiny(), Dtype::F32, 20);
}

#[test]
fn qwen2_with_qkv_bias_matches_the_reference() {
    check(TinySpec::qwen2_tiny(), Dtype::F32, 30);
}

#[test]
fn bf16_checkpoint_with_llama3_rope_scaling_matches_the_reference() {
    let spec = TinySpec {
        rope_scaling: Some(
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        ),
        rope_theta: 500000.0,
        ..TinySpec::llama_tiny()
    };
    check(spec, Dtype::BF16, 40);
}

#[test]
fn f16_checkpoint_with_linear_rope_scaling_matches_the_reference() {
    let spec = TinySpec {
        rope_scaling: Some(json!({"type": "linear", "factor": 4.0})),
        ..TinySpec::qwen3_tiny()
    };
    check(spec, Dtype::F16, 50);
}

/// A bfloat16 KV cache: each key and value rounded to 8 significant bits, so the logits
/// leave float32's agreement with the reference (the cache really holds 16 bits) but stay
/// within what that rounding explains, prefill and decode alike.
#[test]
fn a_bfloat16_kv_cache_stays_within_its_rounding_of_the_reference() {
    for (spec, seed) in [(TinySpec::llama_tiny(), 70), (TinySpec::qwen3_tiny(), 71)] {
        let run = Run::new(spec, Dtype::F32, seed);
        let logits = engine_logits_in(&run.engine, &run.tokens, &BLOCKS, 64, KvDtype::Bfloat16);
        let (err, model) = (relative_error(&logits, &run.reference), &run.model);
        // bf16 keeps 8 significant bits (relative rounding up to 2^-9 = 2e-3 a value).
        assert!(
            (1e-6..1e-2).contains(&err),
            "{:?}: relative error {err:e}",
            model.spec.arch
        );
    }
}

#[test]
fn a_missing_or_misshapen_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = TinyModel::random(TinySpec::llama_tiny(), 60);
    model.tensors.remove("model.layers.1.mlp.up_proj.weight");
    model.write_hf(dir.path());
    let err = LlamaModel::load(dir.path()).err().unwrap().to_string();
    assert!(err.contains("model.layers.1.mlp.up_proj.weight"), "{err}");

    let mut model = TinyModel::random(TinySpec::llama_tiny(), 61);
    let v = model.tensors.get_mut("model.norm.weight").unwrap();
    *v = (vec![63], v.1[..63].to_vec());
    model.write_hf(dir.path());
    let err = LlamaModel::load(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.norm.weight") && err.contains("[63]"),
        "{err}"
    );
}

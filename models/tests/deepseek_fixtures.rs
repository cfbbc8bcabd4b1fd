//! DeepSeek-V2, DeepSeek-V3 and Qwen3-MoE against transformers' own models: tiny random
//! checkpoints made and run in float64 by `scripts/make_deepseek_fixtures.py` (latent
//! attention with and without `q_lora_rank`, YaRN with its softmax `mscale`, softmax
//! group-limited and sigmoid `noaux_tc` routing, shared experts, a dense first layer).
//! Peregrine loads the same folders and must give the same logits at every position, in
//! one prefill and as a prefill followed by decode steps over scattered blocks.

use peregrine_models::LlamaModel;
use peregrine_ops::{AttentionPlan, SeqSpec};
use peregrine_testkit::fixtures;
use serde_json::Value;

const BLOCK_SIZE: usize = 4;
/// Blocks of the sequence, scattered over a pool of 64.
const BLOCKS: [u32; 8] = [37, 2, 63, 11, 50, 0, 29, 44];
const POOL: u64 = 64;

fn fixtures() -> Value {
    let text = std::fs::read_to_string(fixtures::deepseek("deepseek_fixtures.json"))
        .expect("reading the fixtures");
    serde_json::from_str(&text).expect("fixtures are JSON")
}

/// The logits of `prompt` fed in the steps `cuts` gives (lengths summing to the prompt).
fn logits(model: &LlamaModel, prompt: &[u32], cuts: &[usize]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache(POOL, BLOCK_SIZE as u64);
    let vocab = model.config().vocab_size;
    let (mut rows, mut done) = (Vec::new(), 0);
    for &len in cuts {
        let spec = SeqSpec {
            num_cached: done,
            num_new: len,
            block_table: &BLOCKS,
        };
        let plan = AttentionPlan::new(&[spec], BLOCK_SIZE, POOL).unwrap();
        let all: Vec<usize> = (0..len).collect();
        let out = model
            .forward(&prompt[done..done + len], &plan, &mut cache, &all)
            .unwrap();
        rows.extend(out.chunks(vocab).map(<[f32]>::to_vec));
        done += len;
    }
    rows
}

/// Largest |ours - theirs| over all logits, relative to the largest |theirs| (both printed).
fn relative_error(ours: &[Vec<f32>], theirs: &Value) -> f64 {
    let theirs: Vec<Vec<f64>> = serde_json::from_value(theirs.clone()).unwrap();
    let scale = theirs.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    assert_eq!(ours.len(), theirs.len());
    let diff = ours
        .iter()
        .zip(&theirs)
        .flat_map(|(a, b)| {
            assert_eq!(a.len(), b.len());
            a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs())
        })
        .fold(0f64, f64::max);
    eprintln!("largest logit difference {diff:.3e} of logits up to {scale:.3}");
    diff / scale
}

fn check(name: &str) {
    let fixtures = fixtures();
    let fixture = &fixtures["models"][name];
    let model = LlamaModel::load(&fixtures::deepseek(name)).unwrap();
    let prompt: Vec<u32> = serde_json::from_value(fixture["prompt_ids"].clone()).unwrap();
    let n = prompt.len();
    let prefill = logits(&model, &prompt, &[n]);
    let error = relative_error(&prefill, &fixture["logits"]);
    eprintln!("{name}: prefill error {error:.2e}");
    assert!(error < 1e-4, "{name}: one prefill is off by {error:.2e}");
    // A prefill of 13 tokens, then one token a step: the cache path and the decode rows.
    let mut cuts = vec![13];
    cuts.extend(std::iter::repeat_n(1, n - 13));
    let stepped = logits(&model, &prompt, &cuts);
    let error = relative_error(&stepped, &fixture["logits"]);
    assert!(
        error < 1e-4,
        "{name}: prefill then decode is off by {error:.2e}"
    );
}

#[test]
fn deepseek_v2_matches_transformers() {
    check("deepseek_v2");
}

#[test]
fn deepseek_v3_matches_transformers() {
    check("deepseek_v3");
}

#[test]
fn qwen3_moe_matches_transformers() {
    check("qwen3_moe");
}

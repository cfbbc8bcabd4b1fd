//! DeepSeek-V2 and V3 on the GPU (latent attention, mixtures of experts, YaRN): the tiny
//! checkpoints transformers made and ran in float64 (`scripts/make_deepseek_fixtures.py`;
//! the CPU is held to the same logits by `tests/deepseek_fixtures.rs`), in one prefill and
//! as a prefill followed by decode steps over scattered blocks. The latent model's graphs
//! are tested in `graphs.rs`.

use crate::model::gpu_model;
use crate::setup;
use peregrine_models::llama_gpu::GpuLlama;
use peregrine_ops::{AttentionPlan, SeqSpec};
use serde_json::Value;
use std::path::Path;

const BLOCK_SIZE: usize = 4;
/// Blocks of the sequence, scattered over a pool of 64.
const BLOCKS: [u32; 8] = [37, 2, 63, 11, 50, 0, 29, 44];
const POOL: u64 = 64;

fn fixture(name: &str) -> Value {
    let text = std::fs::read_to_string("tests/fixtures/deepseek/deepseek_fixtures.json")
        .expect("reading the fixtures");
    let all: Value = serde_json::from_str(&text).expect("fixtures are JSON");
    all["models"][name].clone()
}

/// The logits of `prompt` fed in the steps `cuts` gives (lengths summing to the prompt).
fn logits(model: &mut GpuLlama, prompt: &[u32], cuts: &[usize]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache(POOL, BLOCK_SIZE as u64).unwrap();
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
            .forward_to_host(&prompt[done..done + len], &plan, &mut cache, &all)
            .unwrap();
        rows.extend(out.chunks(vocab).map(<[f32]>::to_vec));
        done += len;
    }
    rows
}

/// Largest |ours - theirs| over all logits, relative to the largest |theirs|.
fn relative_error(ours: &[Vec<f32>], theirs: &Value) -> f64 {
    let theirs: Vec<Vec<f64>> = serde_json::from_value(theirs.clone()).unwrap();
    let scale = theirs.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    assert_eq!(ours.len(), theirs.len());
    let per_position: Vec<f64> = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (*x as f64 - y).abs())
                .fold(0f64, f64::max)
        })
        .collect();
    let diff = per_position.iter().copied().fold(0f64, f64::max);
    let shown: Vec<String> = per_position.iter().map(|d| format!("{d:.2}")).collect();
    eprintln!(
        "largest logit difference {diff:.3e} of logits up to {scale:.3}; by position: {}",
        shown.join(" ")
    );
    diff / scale
}

/// bf16 weights and activations against float64: a few percent of the largest logit.
const BF16_TOLERANCE: f64 = 3e-2;

fn check(name: &str) {
    if setup().is_none() {
        return;
    }
    let fixture = fixture(name);
    let dir = Path::new("tests/fixtures/deepseek").join(name);
    let mut model = gpu_model(&dir, false);
    let prompt: Vec<u32> = serde_json::from_value(fixture["prompt_ids"].clone()).unwrap();
    let n = prompt.len();
    let prefill = logits(&mut model, &prompt, &[n]);
    let error = relative_error(&prefill, &fixture["logits"]);
    eprintln!("{name} on the GPU: prefill error {error:.2e}");
    assert!(
        error < BF16_TOLERANCE,
        "{name}: one prefill is off by {error:.2e}"
    );
    let mut cuts = vec![13];
    cuts.extend(std::iter::repeat_n(1, n - 13));
    let stepped = logits(&mut model, &prompt, &cuts);
    let error = relative_error(&stepped, &fixture["logits"]);
    eprintln!("{name} on the GPU: prefill then decode error {error:.2e}");
    assert!(
        error < BF16_TOLERANCE,
        "{name}: prefill then decode is off by {error:.2e}"
    );
}

#[test]
fn deepseek_v2_on_the_gpu_matches_transformers() {
    check("deepseek_v2");
}

#[test]
fn deepseek_v3_on_the_gpu_matches_transformers() {
    check("deepseek_v3");
}

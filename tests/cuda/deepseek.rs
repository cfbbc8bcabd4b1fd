//! DeepSeek-V2 and V3 on the GPU (latent attention, mixtures of experts, YaRN): the tiny
//! checkpoints transformers made and ran in float64 (`scripts/make_deepseek_fixtures.py`;
//! the CPU is held to the same logits by `tests/deepseek_fixtures.rs`), in one prefill and
//! as a prefill followed by decode steps over scattered blocks; and a longer prompt's
//! prefill on the tensor-core latent kernel against the same prompt in steps short enough
//! for the split kernel. The latent model's graphs are tested in `graphs.rs`.

use crate::model::gpu_model;
use crate::{rng, setup};
use peregrine_kernels::cuda::mla::runs_prefill;
use peregrine_models::config::ModelConfig;
use peregrine_models::llama::cuda::{GpuLlama, GpuModelOptions};
use peregrine_ops::{AttentionPlan, SeqSpec};
use rand::seq::SliceRandom;
use rand::Rng;
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

/// The logits of `prompt` at positions `from` on, fed in the steps `cuts` gives (lengths
/// summing to the prompt) over the blocks `table`.
fn logits(
    model: &mut GpuLlama,
    prompt: &[u32],
    cuts: &[usize],
    table: &[u32],
    from: usize,
) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache(POOL, BLOCK_SIZE as u64).unwrap();
    let vocab = model.config().vocab_size;
    let (mut rows, mut done) = (Vec::new(), 0);
    for &len in cuts {
        let spec = SeqSpec {
            num_cached: done,
            num_new: len,
            block_table: table,
        };
        let plan = AttentionPlan::new(&[spec], BLOCK_SIZE, POOL).unwrap();
        let wanted: Vec<usize> = (from.saturating_sub(done)..len).collect();
        let out = model
            .forward_to_host(&prompt[done..done + len], &plan, &mut cache, &wanted)
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
    let prefill = logits(&mut model, &prompt, &[n], &BLOCKS, 0);
    let error = relative_error(&prefill, &fixture["logits"]);
    eprintln!("{name} on the GPU: prefill error {error:.2e}");
    assert!(
        error < BF16_TOLERANCE,
        "{name}: one prefill is off by {error:.2e}"
    );
    let mut cuts = vec![13];
    cuts.extend(std::iter::repeat_n(1, n - 13));
    let stepped = logits(&mut model, &prompt, &cuts, &BLOCKS, 0);
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

#[test]
fn a_latent_prefill_on_tensor_cores_matches_the_split_kernel_rows() {
    let Some(s) = setup() else { return };
    // The V2 fixture's shapes with every layer dense (a mixture of experts would turn a
    // rounding difference into another expert's output) and random weights.
    let dir = Path::new("tests/fixtures/deepseek/deepseek_v2");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["first_k_dense_replace"] = config["num_hidden_layers"].clone();
    let config = ModelConfig::from_json(&config.to_string()).unwrap();
    let m = config.mla.clone().unwrap();
    let width = m.kv_lora_rank + m.qk_rope_head_dim;
    assert!(runs_prefill(&s.kernels, m.kv_lora_rank, width));
    let vocab = config.vocab_size as u32;
    let options = GpuModelOptions {
        max_tokens: 2048,
        max_logit_rows: 64,
        deterministic: false,
        gemv_max_rows: peregrine_kernels::GEMV_MAX_ROWS,
    };
    let mut model = GpuLlama::random(config, 7, s.gpu.clone(), s.kernels.clone(), options).unwrap();
    let mut rng = rng("a_latent_prefill_on_tensor_cores");
    // 150 tokens over 38 of the pool's blocks, scattered; the logits of the last 60.
    let prompt: Vec<u32> = (0..150).map(|_| rng.random_range(0..vocab)).collect();
    let mut table: Vec<u32> = (0..POOL as u32).collect();
    table.shuffle(&mut rng);
    table.truncate(38);
    let from = 90;
    // One step: the tensor-core kernel. Steps of at most 32 rows: cut into one-row
    // sequences for the split kernel, as decode rows.
    let whole = logits(&mut model, &prompt, &[150], &table, from);
    let cut = logits(&mut model, &prompt, &[32, 32, 32, 32, 22], &table, from);
    assert_eq!((whole.len(), cut.len()), (60, 60));
    let scale = cut.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    let diff = whole
        .iter()
        .flatten()
        .zip(cut.iter().flatten())
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!(
        "tensor-core latent prefill against the split kernel: {diff:.3e} of logits up to \
         {scale:.3}"
    );
    assert!(
        diff / scale < BF16_TOLERANCE as f32,
        "off by {diff} of {scale}"
    );
}

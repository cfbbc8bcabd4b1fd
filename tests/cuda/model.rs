//! The whole model on the GPU against the CPU model: logits of tiny random checkpoints of
//! each architecture, batch invariance in deterministic mode, and greedy decoding of
//! SmolLM2-135M when its converted directory is named by `PEREGRINE_SMOLLM2_DIR`.

use crate::common::tiny_model::{TinyModel, TinySpec};
use crate::setup;
use peregrine_models::llama::cuda::{GpuLlama, GpuModelOptions, WorkspaceDims};
use peregrine_models::LlamaModel;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use std::path::Path;

/// A tiny spec with the head size the GPU attention kernels are built for.
pub fn gpu_sized(mut spec: TinySpec) -> TinySpec {
    spec.head_dim = 64;
    spec.hidden_size = 256;
    spec.intermediate_size = 512;
    spec.vocab_size = 1000;
    spec
}

/// The checkpoint in `dir` on the test GPU, its products as `serve` takes them by default.
pub fn gpu_model(dir: &Path, deterministic: bool) -> GpuLlama {
    let s = setup().expect("a GPU");
    let options = GpuModelOptions {
        max_tokens: 2048,
        max_logit_rows: 64,
        deterministic,
        gemv_max_rows: peregrine_kernels::GEMV_MAX_ROWS,
    };
    GpuLlama::load(dir, s.gpu.clone(), s.kernels.clone(), options).unwrap()
}

/// Prefill then `steps` greedy decode steps of one sequence on both devices, feeding the
/// CPU's token to both; returns (steps compared, steps whose top-1 differs although the
/// CPU's lead over its runner-up was at least `margin`, largest logit error / logit range).
fn compare_greedy(
    dir: &Path,
    prompt: &[u32],
    steps: usize,
    margin: f32,
    deterministic: bool,
) -> (usize, usize, f32) {
    let cpu = LlamaModel::load(dir).unwrap();
    let mut gpu = gpu_model(dir, deterministic);
    let c = cpu.config().clone();
    let (block_size, blocks) = (16usize, 64u64);
    let mut cpu_cache = KvCache::new(c.num_layers, cpu.kv_layout(blocks, block_size as u64));
    let g = gpu.gpu().clone();
    let mut gpu_cache =
        GpuKvCache::new(&g, c.num_layers, gpu.kv_layout(blocks, block_size as u64)).unwrap();
    // Scattered blocks, in reverse order.
    let table: Vec<u32> = (0..blocks as u32).rev().collect();
    let (mut fed, mut tokens) = (0usize, prompt.to_vec());
    let (mut compared, mut wrong, mut worst) = (0, 0, 0f32);
    for _ in 0..=steps {
        let spec = SeqSpec {
            num_cached: fed,
            num_new: tokens.len(),
            block_table: &table,
        };
        let plan = AttentionPlan::new(&[spec], block_size, blocks).unwrap();
        let last = [tokens.len() - 1];
        let want = cpu.forward(&tokens, &plan, &mut cpu_cache, &last).unwrap();
        let got = gpu
            .forward_to_host(&tokens, &plan, &mut gpu_cache, &last)
            .unwrap();
        let range = want.iter().fold(f32::MIN, |a, &b| a.max(b))
            - want.iter().fold(f32::MAX, |a, &b| a.min(b));
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        worst = worst.max(err / range);
        let top = |l: &[f32]| {
            (0..l.len())
                .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
                .unwrap()
        };
        let (cpu_top, gpu_top) = (top(&want), top(&got));
        let mut sorted = want.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if cpu_top != gpu_top && sorted[0] - sorted[1] >= margin {
            wrong += 1;
        }
        compared += 1;
        fed += tokens.len();
        tokens = vec![cpu_top as u32];
    }
    (compared, wrong, worst)
}

/// The activations planned before loading are the bytes the workspace then holds, and a
/// step too large for the device is refused by that plan, not by an allocation failure.
#[test]
fn the_workspace_plan_is_what_is_allocated() {
    let Some(s) = setup() else { return };
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 3).write_hf(dir.path());
    let model = gpu_model(dir.path(), false);
    let planned = WorkspaceDims::of(model.config()).bytes(2048, 64);
    assert_eq!(model.workspace_bytes(), planned);
    let options = GpuModelOptions {
        max_tokens: 1 << 40,
        max_logit_rows: 64,
        deterministic: false,
        gemv_max_rows: peregrine_kernels::GEMV_MAX_ROWS,
    };
    let err = GpuLlama::load(dir.path(), s.gpu.clone(), s.kernels.clone(), options)
        .err()
        .expect("refused");
    let err = format!("{err:#}");
    assert!(
        err.contains("tokens and 64 logit rows need") && err.contains("is free after the weights"),
        "{err}"
    );
}

#[test]
fn tiny_models_match_the_cpu_on_the_gpu() {
    if setup().is_none() {
        return;
    }
    for (name, spec) in [
        ("llama", TinySpec::llama_tiny()),
        ("qwen3", TinySpec::qwen3_tiny()),
        ("qwen2", TinySpec::qwen2_tiny()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        TinyModel::random(gpu_sized(spec), 7).write_hf(dir.path());
        let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
        // Deterministic mode runs the one-token steps through the other attention kernel.
        for deterministic in [false, true] {
            let (compared, wrong, worst) =
                compare_greedy(dir.path(), &prompt, 24, 0.05, deterministic);
            eprintln!(
                "{name} (deterministic: {deterministic}): {compared} steps, {wrong} top-1 \
                 misses, worst logit error {worst:e} of the range"
            );
            // bf16 weights and activations against f32: a few parts in a thousand of the range.
            assert!(
                worst < 2e-2,
                "{name}: logits differ by {worst} of their range"
            );
            assert_eq!(wrong, 0, "{name}: a clear top-1 differs");
        }
    }
}

#[test]
fn smollm2_greedy_tokens_match_the_cpu() {
    if setup().is_none() {
        return;
    }
    let Some(dir) = std::env::var_os("PEREGRINE_SMOLLM2_DIR") else {
        eprintln!("skipped: PEREGRINE_SMOLLM2_DIR is not set");
        return;
    };
    let dir = Path::new(&dir);
    let tokenizer = peregrine_models::tokenizer::Tokenizer::from_dir(dir).unwrap();
    for text in [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village by the sea,",
    ] {
        let prompt = tokenizer.encode(text, true).unwrap();
        let (compared, wrong, worst) = compare_greedy(dir, &prompt, 48, 0.5, false);
        eprintln!("smollm2 {text:?}: {compared} steps, {wrong} clear top-1 misses, worst logit error {worst:e} of the range");
        assert_eq!(
            wrong, 0,
            "{text:?}: the GPU's greedy token differs where the CPU's lead is at least 0.5"
        );
    }
}

#[test]
fn deterministic_mode_is_batch_invariant() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 9).write_hf(dir.path());
    let mut model = gpu_model(dir.path(), true);
    let c = model.config().clone();
    let g = model.gpu().clone();
    let (block_size, seqs, len) = (16usize, 64usize, 20usize);
    let per_seq = 4usize;
    let blocks = (seqs * per_seq) as u64;
    let prompts: Vec<Vec<u32>> = (0..seqs)
        .map(|s| {
            (0..len)
                .map(|i| ((s * 131 + i * 17) % 1000) as u32)
                .collect()
        })
        .collect();
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|s| {
            ((s * per_seq) as u32..((s + 1) * per_seq) as u32)
                .rev()
                .collect()
        })
        .collect();
    let run = |model: &mut GpuLlama, which: &[usize]| -> Vec<Vec<f32>> {
        let mut cache =
            GpuKvCache::new(&g, c.num_layers, model.kv_layout(blocks, block_size as u64)).unwrap();
        let specs: Vec<SeqSpec> = which
            .iter()
            .map(|&s| SeqSpec {
                num_cached: 0,
                num_new: len,
                block_table: &tables[s],
            })
            .collect();
        let plan = AttentionPlan::new(&specs, block_size, blocks).unwrap();
        let tokens: Vec<u32> = which.iter().flat_map(|&s| prompts[s].clone()).collect();
        let rows: Vec<usize> = (1..=which.len()).map(|i| i * len - 1).collect();
        let mut out = model
            .forward_to_host(&tokens, &plan, &mut cache, &rows)
            .unwrap();
        // Then three decode steps of every sequence together.
        for step in 0..3 {
            let specs: Vec<SeqSpec> = which
                .iter()
                .map(|&s| SeqSpec {
                    num_cached: len + step,
                    num_new: 1,
                    block_table: &tables[s],
                })
                .collect();
            let plan = AttentionPlan::new(&specs, block_size, blocks).unwrap();
            let tokens: Vec<u32> = which
                .iter()
                .map(|&s| (s as u32 * 7 + step as u32) % 1000)
                .collect();
            let rows: Vec<usize> = (0..which.len()).collect();
            out.extend(
                model
                    .forward_to_host(&tokens, &plan, &mut cache, &rows)
                    .unwrap(),
            );
        }
        let vocab = c.vocab_size;
        // Regroup per sequence: its prefill logits and its three decode logits.
        let n = which.len();
        (0..n)
            .map(|i| {
                (0..4)
                    .flat_map(|part| {
                        out[(part * n + i) * vocab..(part * n + i + 1) * vocab].to_vec()
                    })
                    .collect()
            })
            .collect()
    };
    let all: Vec<usize> = (0..seqs).collect();
    let batched = run(&mut model, &all);
    for s in [0, 17, 63] {
        let alone = &run(&mut model, &[s])[0];
        assert!(
            alone
                .iter()
                .zip(&batched[s])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "sequence {s}: logits differ alone and in a batch of {seqs}"
        );
    }
}

/// In deterministic mode a position's logits do not depend on how its prompt was cut into
/// chunks (nor, so, on a prefix-cache hit): the prompt at once, in chunks of 7, and one
/// token at a time give the same bits for its last position.
#[test]
fn deterministic_mode_is_chunking_invariant() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::qwen3_tiny()), 13).write_hf(dir.path());
    let mut model = gpu_model(dir.path(), true);
    let c = model.config().clone();
    let g = model.gpu().clone();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 71 + 5) % 1000).collect();
    let table: Vec<u32> = (0..4).rev().collect();
    let mut last_logits = |chunk: usize| -> Vec<f32> {
        let mut cache = GpuKvCache::new(&g, c.num_layers, model.kv_layout(4, 16)).unwrap();
        let mut logits = Vec::new();
        for start in (0..prompt.len()).step_by(chunk) {
            let tokens = &prompt[start..(start + chunk).min(prompt.len())];
            let spec = SeqSpec {
                num_cached: start,
                num_new: tokens.len(),
                block_table: &table,
            };
            let plan = AttentionPlan::new(&[spec], 16, 4).unwrap();
            let last = [tokens.len() - 1];
            logits = model
                .forward_to_host(tokens, &plan, &mut cache, &last)
                .unwrap();
        }
        logits
    };
    let whole = last_logits(20);
    for chunk in [19, 7, 1] {
        let chunked = last_logits(chunk);
        assert!(
            chunked
                .iter()
                .zip(&whole)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "chunks of {chunk}: the last position's logits differ from the whole prompt's"
        );
    }
}

/// In deterministic mode the rows of a verification step (the last token and three drafts,
/// every row a logit row) give the bits one-token steps give at their positions, also where
/// the step's rows reach into the next key tile of the prefill attention (64 keys) past the
/// first row's position (the attention kernel alone, with more heads, is checked for that
/// in `verification_rows_get_the_bits_of_one_row_steps_past_a_key_tile`).
#[test]
fn deterministic_verification_rows_equal_one_token_steps() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut tiny = TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 21);
    // Scores as large as a trained model's (its softmax peaked): 16x the random init's.
    // Even so, a rescale off by one product's rounding moved no logit's bits in this
    // model (too few heads); `verification_rows_get_the_bits_of_one_row_steps_past_a_key_tile` catches that.
    for (name, (_, values)) in tiny.tensors.iter_mut() {
        if name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight") {
            values.iter_mut().for_each(|v| *v *= 4.0);
        }
    }
    tiny.write_hf(dir.path());
    let mut model = gpu_model(dir.path(), true);
    let c = model.config().clone();
    let g = model.gpu().clone();
    let (block_size, blocks, rows) = (16usize, 10u64, 4usize);
    let prompt: Vec<u32> = (0..136).map(|i| (i * 389 + 11) % 1000).collect();
    let table: Vec<u32> = (0..blocks as u32).rev().collect();
    let vocab = c.vocab_size;
    // Runs `chunks` (start, length) of the prompt in order through a fresh cache; returns
    // each chunk's logits: of every row in chunks of up to `rows` tokens (one-token and
    // verification steps), of the last row in longer ones (prefills).
    let mut run = |chunks: &[(usize, usize)]| -> Vec<Vec<f32>> {
        let mut cache =
            GpuKvCache::new(&g, c.num_layers, model.kv_layout(blocks, block_size as u64)).unwrap();
        chunks
            .iter()
            .map(|&(start, len)| {
                let spec = SeqSpec {
                    num_cached: start,
                    num_new: len,
                    block_table: &table,
                };
                let plan = AttentionPlan::new(&[spec], block_size, blocks).unwrap();
                let wanted: Vec<usize> = if len <= rows {
                    (0..len).collect()
                } else {
                    vec![len - 1]
                };
                model
                    .forward_to_host(&prompt[start..start + len], &plan, &mut cache, &wanted)
                    .unwrap()
            })
            .collect()
    };
    // One token at a time: every position's logits.
    let singles: Vec<(usize, usize)> = (0..prompt.len()).map(|i| (i, 1)).collect();
    let one_by_one = run(&singles);
    for first in [57, 60, 61, 62, 63, 64, 125, 127] {
        let step = &run(&[(0, first), (first, rows)])[1];
        for r in 0..rows {
            let want = &one_by_one[first + r];
            let got = &step[r * vocab..(r + 1) * vocab];
            let differ = got
                .iter()
                .zip(want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differ,
                0,
                "a verification step from position {first}: row {r} (position {}) differs \
                 from its one-token step in {differ} of {vocab} logits",
                first + r
            );
        }
    }
}

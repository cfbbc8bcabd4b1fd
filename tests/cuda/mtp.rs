//! DeepSeek-V3's multi-token prediction layer on the GPU (`GpuMtpHead`): at step 0 over a
//! prompt (fed the target's last-layer outputs, which the GPU target records as "layer
//! num_layers", from the host and through the feature ring) and at a chained step fed its
//! own output, against the float64 forward of `common/mtp_reference.rs`; and its captured
//! draft steps and step-0 graphs, padded past the real rows, replayed as the eager head
//! runs, bit for bit, their padded rows writing the scratch block only.

use crate::common::mtp_checkpoint;
use crate::common::mtp_reference::{argmax, relative_error, MtpReference, Row};
use crate::model::gpu_model;
use crate::{rng, setup};
use half::bf16;
use peregrine_models::eagle3::feature_ring::FeatureRing;
use peregrine_models::eagle3::HeadInput;
use peregrine_models::graph::cuda::GraphLimits;
use peregrine_models::llama::cuda::{GpuLlama, GpuModelOptions};
use peregrine_models::mtp::cuda::GpuMtpHead;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::{AttentionPlan, SeqSpec};
use rand::Rng;
use serde_json::Value;
use std::path::Path;
use std::sync::{Arc, Mutex};

const BLOCK_SIZE: usize = 4;
const BLOCKS: [u32; 8] = [37, 2, 63, 11, 50, 0, 29, 44];
const POOL: u64 = 64;
/// bf16 weights and activations against float64: a few percent of the largest logit.
const BF16_TOLERANCE: f64 = 3e-2;

fn plan(cached: usize, new: usize) -> AttentionPlan {
    let spec = SeqSpec {
        num_cached: cached,
        num_new: new,
        block_table: &BLOCKS,
    };
    AttentionPlan::new(&[spec], BLOCK_SIZE, POOL).unwrap()
}

/// The head of the checkpoint in `dir` beside `target` on the test device.
fn head(dir: &Path, target: &GpuLlama) -> GpuMtpHead {
    let s = setup().expect("a GPU");
    let options = GpuModelOptions {
        max_tokens: 256,
        max_logit_rows: 64,
        deterministic: false,
        gemv_max_rows: peregrine_kernels::GEMV_MAX_ROWS,
    };
    let (config, shared) = (target.config(), target.shared_embedding());
    GpuMtpHead::load(
        dir,
        config,
        shared,
        s.gpu.clone(),
        s.kernels.clone(),
        options,
    )
    .unwrap()
}

#[test]
fn mtp_on_the_gpu_matches_the_float64_reference_at_step_0_and_chained() {
    let Some(s) = setup() else { return };
    let dir = tempfile::tempdir().unwrap();
    mtp_checkpoint::write(dir.path(), 11);
    let fixtures: Value = serde_json::from_str(
        &std::fs::read_to_string("tests/fixtures/deepseek/deepseek_fixtures.json").unwrap(),
    )
    .unwrap();
    let fixture = &fixtures["models"]["deepseek_v3"];
    let prompt: Vec<u32> = serde_json::from_value(fixture["prompt_ids"].clone()).unwrap();
    let hidden: Vec<Vec<Vec<f64>>> =
        serde_json::from_value(fixture["hidden_states"].clone()).unwrap();
    let normed_out = hidden.last().unwrap();

    let mut target = gpu_model(dir.path(), false);
    let c = target.config().clone();
    let (t, h, vocab) = (prompt.len(), c.hidden_size, c.vocab_size);
    target.record_aux(&[c.num_layers]).unwrap();
    let mut head = head(dir.path(), &target);
    assert_eq!(head.aux_layers(), [c.num_layers]);

    // The target's prefill, recording its last layer's output for every row.
    let mut cache = target.new_cache(POOL, BLOCK_SIZE as u64).unwrap();
    let rows: Vec<usize> = (0..t).collect();
    let logits = target
        .forward_to_host(&prompt, &plan(0, t), &mut cache, &rows)
        .unwrap();
    let next = argmax(&logits[(t - 1) * vocab..]);
    let last = s.gpu.download(&target.last_aux(t).unwrap()).unwrap();

    // Step 0: row j pairs the target's output at j with token j + 1.
    let mut tokens = prompt[1..].to_vec();
    tokens.push(next);
    let mut head_cache = head
        .new_cache(head.kv_layout(POOL, BLOCK_SIZE as u64))
        .unwrap();
    let input = HeadInput::Aux(&last);
    let out = head
        .forward(&tokens, input, &plan(0, t), &mut head_cache, &rows)
        .unwrap();
    let reference = MtpReference::load(dir.path());
    let mut ref_rows: Vec<Row> = tokens
        .iter()
        .enumerate()
        .map(|(j, &token)| Row {
            token,
            position: j,
            feature: normed_out[j].clone(),
        })
        .collect();
    let (want, ys) = reference.forward(&ref_rows);
    let error = relative_error(&out.logits, &want.concat());
    eprintln!("GPU MTP step 0: relative error {error:.2e}");
    assert!(error < BF16_TOLERANCE, "step 0 is off by {error:.2e}");
    let pre_error = relative_error(&out.pre, &ys.concat());
    eprintln!("GPU MTP step 0 pre: relative error {pre_error:.2e}");
    assert!(
        pre_error < BF16_TOLERANCE,
        "step 0's pre is off by {pre_error:.2e}"
    );

    // The same step fed through the feature ring, as the served head is.
    let ring = Arc::new(FeatureRing::new(&s.gpu, 4 * t, h).unwrap());
    head.read_features_from(ring.clone()).unwrap();
    let first = ring
        .store(
            &s.kernels,
            target.gpu().stream(),
            &target.last_aux(t).unwrap(),
            t,
        )
        .unwrap();
    let ids: Vec<u64> = (first..first + t as u64).collect();
    let mut ring_cache = head
        .new_cache(head.kv_layout(POOL, BLOCK_SIZE as u64))
        .unwrap();
    let input = HeadInput::Ring(&ids);
    let through_ring = head
        .forward(&tokens, input, &plan(0, t), &mut ring_cache, &rows)
        .unwrap();
    assert_eq!(through_ring.logits, out.logits, "the ring's step 0 differs");

    // Step 1: the draft of the last row at the next position, fed that row's own output.
    let draft = argmax(&out.logits[(t - 1) * vocab..]);
    let pre = &out.pre[(t - 1) * h..];
    let chained = head
        .forward(
            &[draft],
            HeadInput::Pre(pre),
            &plan(t, 1),
            &mut head_cache,
            &[0],
        )
        .unwrap();
    ref_rows.push(Row {
        token: draft,
        position: t,
        feature: ys[t - 1].clone(),
    });
    let (want, _) = reference.forward(&ref_rows);
    let error = relative_error(&chained.logits, want.last().unwrap());
    eprintln!("GPU MTP step 1: relative error {error:.2e}");
    assert!(
        error < BF16_TOLERANCE,
        "the chained step is off by {error:.2e}"
    );
}

/// Fills layer 0 of `cache` (its latent rows) with `values`.
fn fill(cache: &mut GpuKvCache, values: &[bf16]) {
    let s = setup().unwrap();
    let (k, _) = cache.layer_mut(0);
    s.gpu.stream().memcpy_htod(values, k).unwrap();
}

fn rows_of(cache: &GpuKvCache) -> Vec<bf16> {
    setup().unwrap().gpu.download(cache.layer(0).0).unwrap()
}

/// The head's draft steps through graphs of 1 to 16 sequences and its step 0 through
/// graphs of 2 to 32 rows (two rows a sequence, fed the feature ring), captured, churned,
/// then replayed by the smallest graph that holds each count of 1 to 16 sequences, against the eager head on the same poisoned cache: the same
/// drafts and `pre` bit for bit, and the same cache but for the scratch block.
#[test]
fn mtp_graphs_replay_as_the_eager_head_runs() {
    let Some(s) = setup() else { return };
    let mut rng = rng("mtp_graphs_replay_as_the_eager_head_runs");
    let dir = tempfile::tempdir().unwrap();
    mtp_checkpoint::write(dir.path(), 12);
    let target = gpu_model(dir.path(), false);
    let c = target.config().clone();
    let h = c.hidden_size;
    let mut head = head(dir.path(), &target);
    let ring = Arc::new(FeatureRing::new(&s.gpu, 1024, h).unwrap());
    head.read_features_from(ring.clone()).unwrap();
    // Sequence i owns blocks 2i and 2i + 1; the last block is the scratch block.
    let (pool, scratch) = (41u64, 40u64);
    let graph_cache = Arc::new(Mutex::new(
        head.new_cache(head.kv_layout(pool, BLOCK_SIZE as u64))
            .unwrap(),
    ));
    let mut eager_cache = head
        .new_cache(head.kv_layout(pool, BLOCK_SIZE as u64))
        .unwrap();
    let limits = GraphLimits {
        max_rows: 16,
        max_context: 2 * BLOCK_SIZE,
        scratch_slot: (scratch * BLOCK_SIZE as u64) as i64,
    };
    // Every size a decode batch of up to 16 sequences captures, largest first.
    let decode: Vec<_> = [16, 8, 4, 2, 1]
        .into_iter()
        .map(|n| head.capture_decode(n, limits, &graph_cache).unwrap())
        .collect();
    let first_limits = GraphLimits {
        max_rows: 32,
        ..limits
    };
    let first: Vec<_> = [32, 16, 8, 4, 2]
        .into_iter()
        .map(|n| head.capture_first(n, first_limits, &graph_cache).unwrap())
        .collect();
    // Churn: buffers of the graphs' sizes allocated and freed, so that a graph reading
    // freed memory would read someone else's data.
    for round in 0..50 {
        let bufs: Vec<_> = [32, 32 * h, 32 * c.vocab_size, 4096]
            .iter()
            .map(|&n| s.gpu.upload(&vec![f32::NAN; n + round]).unwrap())
            .collect();
        drop(bufs);
    }

    let elems = rows_of(&eager_cache).len();
    let scratch_rows = {
        let per_block = elems / pool as usize;
        scratch as usize * per_block..(scratch as usize + 1) * per_block
    };
    let outside_scratch = |v: &[bf16]| -> Vec<u16> {
        let (a, b) = (&v[..scratch_rows.start], &v[scratch_rows.end..]);
        a.iter().chain(b).map(|x| x.to_bits()).collect()
    };
    for n in 1..=16usize {
        let poison: Vec<bf16> = (0..elems)
            .map(|_| bf16::from_f32(rng.random_range(-1.0..1.0)))
            .collect();
        fill(&mut eager_cache, &poison);
        fill(&mut graph_cache.lock().unwrap(), &poison);
        let tables: Vec<Vec<u32>> = (0..n as u32).map(|i| vec![2 * i, 2 * i + 1]).collect();
        let tokens: Vec<u32> = (0..n)
            .map(|_| rng.random_range(0..c.vocab_size as u32))
            .collect();
        // A draft step: one row a sequence, fed its pre.
        let specs: Vec<SeqSpec> = tables
            .iter()
            .enumerate()
            .map(|(i, t)| SeqSpec {
                num_cached: 1 + i % 6,
                num_new: 1,
                block_table: t,
            })
            .collect();
        let plan = AttentionPlan::new(&specs, BLOCK_SIZE, pool).unwrap();
        let pre: Vec<f32> = (0..n * h).map(|_| rng.random_range(-2.0..2.0)).collect();
        let rows: Vec<usize> = (0..n).collect();
        let graph = decode.iter().rev().find(|g| g.size() >= n).unwrap();
        let got = graph.replay(&tokens, &pre, &plan, false).unwrap();
        let want = head
            .forward_greedy(
                &tokens,
                HeadInput::Pre(&pre),
                &plan,
                &mut eager_cache,
                &rows,
                false,
            )
            .unwrap();
        assert_eq!(got.drafts, want.drafts, "{n} sequences: drafts differ");
        assert_eq!(got.pre, want.pre, "{n} sequences: pre differs");
        let (eager, graphed) = (rows_of(&eager_cache), rows_of(&graph_cache.lock().unwrap()));
        assert_eq!(
            outside_scratch(&eager),
            outside_scratch(&graphed),
            "{n} sequences: a padded row wrote outside the scratch block"
        );

        // A step 0 of two rows a sequence, fed the ring, every row a logit row.
        let specs: Vec<SeqSpec> = tables
            .iter()
            .enumerate()
            .map(|(i, t)| SeqSpec {
                num_cached: i % 6,
                num_new: 2,
                block_table: t,
            })
            .collect();
        let plan = AttentionPlan::new(&specs, BLOCK_SIZE, pool).unwrap();
        let step_tokens: Vec<u32> = tokens.iter().flat_map(|&t| [t, t / 2]).collect();
        let features: Vec<f32> = (0..2 * n * h)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        let src = s.gpu.upload(&features).unwrap();
        let at = ring
            .store(&s.kernels, s.gpu.stream(), &src.slice(..), 2 * n)
            .unwrap();
        let ids: Vec<u64> = (at..at + 2 * n as u64).collect();
        let rows: Vec<usize> = (0..2 * n).collect();
        let graph = first.iter().rev().find(|g| g.size() >= 2 * n).unwrap();
        let got = graph
            .replay_first(&step_tokens, &ids, &plan, &rows)
            .unwrap();
        let input = HeadInput::Ring(&ids);
        let want = head
            .forward_greedy(&step_tokens, input, &plan, &mut eager_cache, &rows, false)
            .unwrap();
        assert_eq!(
            got.drafts, want.drafts,
            "{n} sequences' step 0: drafts differ"
        );
        assert_eq!(got.pre, want.pre, "{n} sequences' step 0: pre differs");
        let (eager, graphed) = (rows_of(&eager_cache), rows_of(&graph_cache.lock().unwrap()));
        assert_eq!(
            outside_scratch(&eager),
            outside_scratch(&graphed),
            "{n} sequences' step 0: a padded row wrote outside the scratch block"
        );
    }
}

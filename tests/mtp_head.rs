//! DeepSeek-V3's multi-token prediction layer as a draft head on the CPU, against the
//! float64 forward of `common/mtp_reference.rs` (transformers does not run MTP layers): at
//! step 0 over a prompt (fed the target's last-layer outputs, which the target records as
//! "layer num_layers"), then a chained step fed its own output.

mod common;

use common::mtp_reference::{argmax, relative_error, MtpReference, Row};
use peregrine_models::eagle3::HeadInput;
use peregrine_models::mtp::MtpHead;
use peregrine_models::{LlamaModel, Weights};
use peregrine_ops::{AttentionPlan, SeqSpec};
use serde_json::Value;

const BLOCK_SIZE: usize = 4;
const BLOCKS: [u32; 8] = [37, 2, 63, 11, 50, 0, 29, 44];
const POOL: u64 = 64;

fn plan(cached: usize, new: usize) -> AttentionPlan {
    let spec = SeqSpec {
        num_cached: cached,
        num_new: new,
        block_table: &BLOCKS,
    };
    AttentionPlan::new(&[spec], BLOCK_SIZE, POOL).unwrap()
}

#[test]
fn mtp_matches_the_float64_reference_at_step_0_and_chained() {
    let dir = tempfile::tempdir().unwrap();
    common::mtp_checkpoint::write(dir.path(), 11);
    let fixtures: Value = serde_json::from_str(
        &std::fs::read_to_string("tests/fixtures/deepseek/deepseek_fixtures.json").unwrap(),
    )
    .unwrap();
    let fixture = &fixtures["models"]["deepseek_v3"];
    let prompt: Vec<u32> = serde_json::from_value(fixture["prompt_ids"].clone()).unwrap();
    let hidden: Vec<Vec<Vec<f64>>> =
        serde_json::from_value(fixture["hidden_states"].clone()).unwrap();
    let normed_out = hidden.last().unwrap();

    let target = LlamaModel::load(dir.path()).unwrap();
    let c = target.config().clone();
    let (t, h, vocab) = (prompt.len(), c.hidden_size, c.vocab_size);
    let weights = Weights::open(dir.path()).unwrap();
    let head =
        MtpHead::from_weights(&c, &weights, target.embedding_table(), target.lm_head()).unwrap();
    assert_eq!(head.aux_layers(), [c.num_layers]);

    // The target's prefill, recording its last layer's output for every row.
    let mut cache = target.new_cache(POOL, BLOCK_SIZE as u64);
    let rows: Vec<usize> = (0..t).collect();
    let (logits, last) = target
        .forward_with_aux(&prompt, &plan(0, t), &mut cache, &rows, &[c.num_layers])
        .unwrap();
    let next = argmax(&logits[(t - 1) * vocab..]);

    // Step 0: row j pairs the target's output at j with token j + 1 (the last the target's
    // own next token).
    let mut tokens = prompt[1..].to_vec();
    tokens.push(next);
    let mut head_cache = head.new_cache(POOL, BLOCK_SIZE as u64);
    let out = head
        .forward(
            &tokens,
            HeadInput::Aux(&last),
            &plan(0, t),
            &mut head_cache,
            &rows,
        )
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
    let want: Vec<f64> = want.concat();
    let error = relative_error(&out.logits, &want);
    eprintln!("MTP step 0: relative error {error:.2e}");
    assert!(error < 1e-4, "step 0 is off by {error:.2e}");
    let pre_error = relative_error(&out.pre, &ys.concat());
    assert!(pre_error < 1e-4, "step 0's pre is off by {pre_error:.2e}");

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
    eprintln!("MTP step 1: relative error {error:.2e}");
    assert!(error < 1e-4, "the chained step is off by {error:.2e}");
}

#[test]
fn a_target_without_mtp_layers_is_refused_by_name() {
    let dir = std::path::Path::new("tests/fixtures/deepseek/deepseek_v2");
    let target = LlamaModel::load(dir).unwrap();
    let weights = Weights::open(dir).unwrap();
    let err = MtpHead::from_weights(
        target.config(),
        &weights,
        target.embedding_table(),
        target.lm_head(),
    )
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("num_nextn_predict_layers"),
        "{err}"
    );
}

/// The head's decode step over captured graphs (every size of 1 to 16, after allocation
/// churn) drafts exactly what the eager head does, bit for bit, and its padded rows write
/// latent rows into the scratch block only.
#[test]
fn mtp_decode_graphs_replay_as_the_eager_head_runs() {
    use peregrine_actors::graphs::{CaptureSizes, CpuHeadGraphs};
    let dir = tempfile::tempdir().unwrap();
    common::mtp_checkpoint::write(dir.path(), 12);
    let target = LlamaModel::load(dir.path()).unwrap();
    let c = target.config().clone();
    let h = c.hidden_size;
    let weights = Weights::open(dir.path()).unwrap();
    let head =
        MtpHead::from_weights(&c, &weights, target.embedding_table(), target.lm_head()).unwrap();
    let sizes = CaptureSizes::from_list(&[1, 2, 4, 8, 16], 16).unwrap();
    // Sequence i owns blocks 2i and 2i + 1; block 40 is the scratch block.
    let (pool, scratch) = (41u64, 40u64);
    let scratch_slot = (scratch * BLOCK_SIZE as u64) as i64;
    let mut graphs = CpuHeadGraphs::capture(&head, &sizes, 8, scratch_slot).unwrap();
    let churn: Vec<_> = (0..64).map(|i| head_pool_churn(&head, i)).collect();
    drop(churn);
    for n in 1..=16usize {
        let tables: Vec<Vec<u32>> = (0..n)
            .map(|i| vec![2 * i as u32, 2 * i as u32 + 1])
            .collect();
        let specs: Vec<SeqSpec> = tables
            .iter()
            .enumerate()
            .map(|(i, t)| SeqSpec {
                num_cached: 2 + i % 5,
                num_new: 1,
                block_table: t,
            })
            .collect();
        let plan = AttentionPlan::new(&specs, BLOCK_SIZE, pool).unwrap();
        let tokens: Vec<u32> = (0..n).map(|i| 5 + 17 * i as u32 % 300).collect();
        let pre: Vec<f32> = (0..n * h)
            .map(|j| ((j * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let rows: Vec<usize> = (0..n).collect();
        let mut eager_cache = head.new_cache(pool, BLOCK_SIZE as u64);
        let mut graph_cache = head.new_cache(pool, BLOCK_SIZE as u64);
        let want = head
            .forward(
                &tokens,
                HeadInput::Pre(&pre),
                &plan,
                &mut eager_cache,
                &rows,
            )
            .unwrap();
        let got = graphs
            .replay(&tokens, &pre, &plan, &rows, &mut graph_cache)
            .unwrap()
            .expect("a captured size holds the batch");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.logits), bits(&want.logits), "batch {n}");
        assert_eq!(bits(&got.pre), bits(&want.pre), "batch {n}");
        let (eager_rows, _) = eager_cache.layer(0);
        let (graph_rows, _) = graph_cache.layer(0);
        let per_block = (BLOCK_SIZE as u64 * eager_cache.layout().slot_elems()) as usize;
        let at = scratch as usize * per_block;
        assert_eq!(
            bits(&graph_rows[..at]),
            bits(&eager_rows[..at]),
            "batch {n}"
        );
        let padded = !sizes.sizes().contains(&n);
        let scratch_written = graph_rows[at..].iter().any(|&x| x != 0.0);
        assert_eq!(scratch_written, padded, "batch {n}: the scratch block");
    }
}

/// Buffers of the head's pool, written with poison and dropped, so the graphs' buffers
/// are not the only ones the pool hands out.
fn head_pool_churn(head: &MtpHead, i: usize) -> Vec<f32> {
    use peregrine_models::cpu_graph::head::{GraphHead, HeadIo};
    use peregrine_models::eagle3::FeatureKind;
    use peregrine_models::StepShape;
    let b = head.buffers(StepShape::decode(1 + i % 16), 8, FeatureKind::Pre);
    b.feature().write().fill(1.0e30);
    let pre = b.pre().read().to_vec();
    pre
}

//! DeepSeek-V3's multi-token prediction layer as a draft head on the CPU, against the
//! float64 forward of `peregrine_testkit::mtp_reference` (transformers does not run MTP
//! layers): at step 0 over a prompt (fed the target's last-layer outputs, which the target
//! records as "layer num_layers"), then a chained step fed its own output. Its decode
//! graphs are the engine's, tested in the workspace's `tests/mtp_head_graphs.rs`.

use peregrine_models::eagle3::HeadInput;
use peregrine_models::mtp::MtpHead;
use peregrine_models::{LlamaModel, Weights};
use peregrine_ops::{AttentionPlan, SeqSpec};
use peregrine_testkit::fixtures;
use peregrine_testkit::mtp_checkpoint::write_from;
use peregrine_testkit::mtp_reference::{argmax, relative_error, MtpReference, Row};
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
    write_from(&fixtures::deepseek("deepseek_v3"), dir.path(), 11);
    let fixtures: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures::deepseek("deepseek_fixtures.json")).unwrap(),
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
    let dir = fixtures::deepseek("deepseek_v2");
    let target = LlamaModel::load(&dir).unwrap();
    let weights = Weights::open(&dir).unwrap();
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

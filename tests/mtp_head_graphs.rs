//! DeepSeek-V3's multi-token prediction layer as a draft head on the CPU, over the engine's
//! captured decode graphs (`CpuHeadGraphs`): a replay drafts exactly what the eager head
//! drafts (the eager head against the float64 reference: `models/tests/mtp_head.rs`).

mod common;

use peregrine_actors::graphs::{CaptureSizes, CpuHeadGraphs};
use peregrine_models::eagle3::HeadInput;
use peregrine_models::mtp::MtpHead;
use peregrine_models::{LlamaModel, Weights};
use peregrine_ops::{AttentionPlan, SeqSpec};

const BLOCK_SIZE: usize = 4;

/// The head's decode step over captured graphs (every size of 1 to 16, after allocation
/// churn) drafts exactly what the eager head does, bit for bit, and its padded rows write
/// latent rows into the scratch block only.
#[test]
fn mtp_decode_graphs_replay_as_the_eager_head_runs() {
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
    use peregrine_models::eagle3::FeatureKind;
    use peregrine_models::graph::cpu::head::{GraphHead, HeadIo};
    use peregrine_models::StepShape;
    let b = head.buffers(StepShape::decode(1 + i % 16), 8, FeatureKind::Pre);
    b.feature().write().fill(1.0e30);
    let pre = b.pre().read().to_vec();
    pre
}

//! The draft model's decode graphs: its steps after the first replay graphs captured for
//! the target's sizes, padded up to a captured size, and draft exactly what the eager
//! draft model drafts, at exact, padded and oversized batches; the padded rows write draft
//! KV into the target pool's scratch block and nowhere else; the KV fault hook acts alike
//! on both paths.

mod common;

use common::engine::tiny_backend;
use common::tiny_model::{TinyModel, TinySpec};
use peregrine_actors::backend::PoolInfo;
use peregrine_actors::draft::{DraftMethod, DraftModel};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_actors::messages::{ProposeSeq, RequestId};
use peregrine_models::LlamaModel;
use peregrine_ops::KvCache;
use std::path::Path;
use std::sync::Arc;

const BLOCK: usize = 16;
/// Drafts per sequence and step.
const K: usize = 4;
/// The most sequences a direct proposal holds.
const MAX_SEQS: usize = 11;
/// Blocks each sequence may own: prompts of up to 36 tokens, three rounds of up to K + 1
/// accepted tokens, and K draft positions.
const SEQ_BLOCKS: usize = 4;
/// Usable blocks of the target pool (its scratch block comes after them).
const POOL_BLOCKS: u64 = 64;

/// The tiny Llama, written to a fresh directory.
fn tiny_dir(seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), seed).write_hf(dir.path());
    dir
}

/// The target pool the draft's cache mirrors: 64 blocks of 16 tokens and a scratch block.
fn target_pool(dir: &Path) -> PoolInfo {
    tiny_backend(dir, POOL_BLOCKS).pool().clone()
}

/// The tiny model in `dir` as a draft over `pool`, with graphs for `sizes` if any, and the
/// KV fault hook past block `fault` if any.
fn draft(
    dir: &Path,
    pool: &PoolInfo,
    sizes: Option<&CaptureSizes>,
    fault: Option<u32>,
) -> DraftModel {
    let model = LlamaModel::load(dir).unwrap();
    let config = model.config().clone();
    let mut draft = DraftModel::new(model, &config, pool).unwrap();
    if let Some(block) = fault {
        draft = draft.with_kv_fault_above(block);
    }
    draft.capture_graphs(sizes).unwrap();
    draft
}

/// The bits of block `block` in every layer of `cache`, K then V.
fn block_bits(cache: &KvCache, block: usize) -> Vec<u32> {
    let layout = cache.layout();
    let per_block = (layout.block_size * layout.slot_elems()) as usize;
    let mut bits = Vec::new();
    for l in 0..TinySpec::llama_tiny().num_layers {
        let (k, v) = cache.layer(l);
        for x in [k, v] {
            let block = &x[block * per_block..(block + 1) * per_block];
            bits.extend(block.iter().map(|f| f.to_bits()));
        }
    }
    bits
}

/// Sequence `i`'s `j`-th block: the sequences' blocks interleave.
fn block_of(i: usize, j: usize) -> u32 {
    (j * MAX_SEQS + i) as u32
}

/// How many drafts sequence `i` asks for: K, but 2 for every fourth, so that the later
/// steps hold fewer sequences than the first.
fn max_drafts(i: usize) -> usize {
    if i % 4 == 3 {
        2
    } else {
        K
    }
}

/// Whether a proposal for `n` sequences pads a step after the first up to a larger size.
fn pads(n: usize, sizes: &CaptureSizes) -> bool {
    (1..K).any(|step| {
        let m = (0..n).filter(|&i| max_drafts(i) > step).count();
        m > 0 && sizes.padded(m).is_some_and(|s| s > m)
    })
}

/// One round of proposals to the eager draft model and to the one with graphs.
struct Round<'a> {
    n: usize,
    round: usize,
    seqs: &'a [ProposeSeq],
    eager: &'a DraftModel,
    graphs: &'a DraftModel,
    eager_drafts: Vec<Vec<u32>>,
    graph_drafts: Vec<Vec<u32>>,
    /// Whether a step of the round padded its batch.
    padded: bool,
    /// The graph model's scratch block before the round.
    scratch_before: Vec<u32>,
}

/// Three rounds of proposals for `n` sequences of prompts of 3 to 36 tokens, each round
/// accepting a different number of each sequence's drafts plus a token of its own, to an
/// eager draft model and to one replaying graphs of sizes 1, 2, 4 and 8, both with the KV
/// fault past block `fault` if any; `check` sees every round.
fn rounds(n: usize, fault: Option<u32>, mut check: impl FnMut(&Round)) {
    let dir = tiny_dir(61);
    let pool = target_pool(dir.path());
    let scratch = pool.scratch_block.unwrap() as usize;
    let sizes = CaptureSizes::from_list(&[1, 2, 4, 8], 16).unwrap();
    let mut eager = draft(dir.path(), &pool, None, fault);
    let mut graphs = draft(dir.path(), &pool, Some(&sizes), fault);
    let mut tokens: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let len = 3 + (i * 7) % 34;
            (0..len)
                .map(|t| (3 + (i * 13 + t * 5) % 290) as u32)
                .collect()
        })
        .collect();
    for round in 0..3 {
        let seqs: Vec<ProposeSeq> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| ProposeSeq {
                id: RequestId(i as u64),
                tokens: Arc::from(t.as_slice()),
                block_table: (0..(t.len() + K).div_ceil(BLOCK))
                    .map(|j| block_of(i, j))
                    .collect(),
                max_drafts: max_drafts(i),
            })
            .collect();
        let scratch_before = block_bits(graphs.cache(), scratch);
        let eager_drafts = eager.propose(&seqs).unwrap();
        let graph_drafts = graphs.propose(&seqs).unwrap();
        check(&Round {
            n,
            round,
            seqs: &seqs,
            eager: &eager,
            graphs: &graphs,
            eager_drafts: eager_drafts.clone(),
            graph_drafts,
            padded: pads(n, &sizes),
            scratch_before,
        });
        for (i, (t, d)) in tokens.iter_mut().zip(&eager_drafts).enumerate() {
            let accepted = (i + round) % (d.len() + 1);
            t.extend(&d[..accepted]);
            t.push((3 + (i * 31 + round * 17) % 290) as u32);
        }
    }
}

/// Batch sizes of the direct proposals: exact sizes (1, 2, 8 at first), padded ones (3, 4
/// and 5, and 8 in its later steps) and one past the largest size (11, eager).
const BATCHES: [usize; 7] = [1, 2, 3, 4, 5, 8, MAX_SEQS];

#[test]
fn graph_drafts_equal_eager_drafts_at_exact_padded_and_oversized_batches() {
    let mut padded_rounds = 0;
    for n in BATCHES {
        rounds(n, None, |r| {
            assert_eq!(
                r.graph_drafts, r.eager_drafts,
                "batch {}, round {}",
                r.n, r.round
            );
            let lens: Vec<usize> = r.graph_drafts.iter().map(Vec::len).collect();
            let want: Vec<usize> = (0..r.n).map(max_drafts).collect();
            assert_eq!(lens, want, "batch {}, round {}", r.n, r.round);
            // The padded steps replayed a graph: their padded rows wrote the scratch block.
            let scratch = r.graphs.cache().layout().num_blocks as usize - 1;
            let written = block_bits(r.graphs.cache(), scratch) != r.scratch_before;
            assert_eq!(written, r.padded, "batch {}, round {}", r.n, r.round);
            padded_rounds += usize::from(r.padded);
        });
    }
    assert!(padded_rounds >= 12, "{padded_rounds} padded rounds");
}

#[test]
fn padded_draft_steps_write_no_kv_outside_the_sequences_slots_but_the_scratch_block() {
    for n in BATCHES {
        rounds(n, None, |r| {
            let layout = *r.graphs.cache().layout();
            let scratch = layout.num_blocks as usize - 1;
            let at = format!("batch {}, round {}", r.n, r.round);
            let zeros = vec![0; block_bits(r.graphs.cache(), 0).len()];
            for block in 0..layout.num_blocks as usize {
                let got = block_bits(r.graphs.cache(), block);
                let owned =
                    (0..r.n).any(|i| (0..SEQ_BLOCKS).any(|j| block_of(i, j) as usize == block));
                if block == scratch {
                    assert_eq!(block_bits(r.eager.cache(), block), zeros, "{at}");
                } else if owned {
                    // The same keys and values as the eager draft wrote, bit for bit.
                    let want = block_bits(r.eager.cache(), block);
                    assert!(got == want, "{at}: block {block} differs from eager");
                } else {
                    assert!(got == zeros, "{at}: block {block}, owned by none, written");
                }
            }
        });
    }
}

#[test]
fn the_kv_fault_hook_zeroes_the_same_draft_kv_eagerly_and_through_graphs() {
    // Sequences' third and fourth blocks lie past block 21: the longer sequences reach
    // them.
    const FAULT: u32 = 21;
    let mut faulted = 0;
    for n in BATCHES {
        rounds(n, Some(FAULT), |r| {
            let at = format!("batch {}, round {}", r.n, r.round);
            assert_eq!(r.graph_drafts, r.eager_drafts, "{at}");
            let scratch = r.graphs.cache().layout().num_blocks as usize - 1;
            for block in 0..scratch {
                let (got, want) = (
                    block_bits(r.graphs.cache(), block),
                    block_bits(r.eager.cache(), block),
                );
                assert!(got == want, "{at}: block {block} differs from eager");
                let used = r
                    .seqs
                    .iter()
                    .any(|s| s.block_table.contains(&(block as u32)));
                if used && block > FAULT as usize {
                    faulted += 1;
                    assert!(
                        got.iter().all(|&b| b == 0),
                        "{at}: block {block} not zeroed"
                    );
                }
            }
        });
    }
    assert!(faulted > 0, "no sequence reached a faulty block");
}

//! The proposals the draft-graph tests send a drafter with graphs and its eager twin:
//! sequences whose blocks interleave in a pool of 64 blocks, most asking K drafts and every
//! fourth 2, so that the steps after the first hold fewer sequences than the first.

use peregrine_actors::graphs::CaptureSizes;
use peregrine_actors::messages::{Drafted, ProposeSeq, RequestId};
use peregrine_ops::KvCache;

/// Tokens per KV block.
pub const BLOCK: usize = 16;
/// Drafts per sequence and step.
pub const K: usize = 4;
/// The most sequences a direct proposal holds.
pub const MAX_SEQS: usize = 11;
/// Blocks each sequence may own: prompts of up to 36 tokens, three rounds of up to K + 1
/// accepted tokens, and K draft positions.
pub const SEQ_BLOCKS: usize = 4;
/// Usable blocks of the target pool (its scratch block comes after them).
pub const POOL_BLOCKS: u64 = 64;
/// The batches the tests propose for: exact, padded and past the largest captured size.
pub const BATCHES: [usize; 7] = [1, 2, 3, 4, 5, 8, MAX_SEQS];

/// Sequence `i`'s `j`-th block: the sequences' blocks interleave.
pub fn block_of(i: usize, j: usize) -> u32 {
    (j * MAX_SEQS + i) as u32
}

/// How many drafts sequence `i` asks for: K, but 2 for every fourth.
pub fn max_drafts(i: usize) -> usize {
    if i % 4 == 3 {
        2
    } else {
        K
    }
}

/// Whether a proposal for `n` sequences pads a step after the first up to a larger size.
pub fn pads(n: usize, sizes: &CaptureSizes) -> bool {
    (1..K).any(|step| {
        let m = (0..n).filter(|&i| max_drafts(i) > step).count();
        m > 0 && sizes.padded(m).is_some_and(|s| s > m)
    })
}

/// The proposal for sequences of `tokens` (request `i` is sequence `i`), with blocks for K
/// drafts past each.
pub fn proposal(tokens: &[Vec<u32>]) -> Vec<ProposeSeq> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| ProposeSeq {
            id: RequestId(i as u64),
            tokens: t.clone(),
            block_table: (0..(t.len() + K).div_ceil(BLOCK))
                .map(|j| block_of(i, j))
                .collect(),
            max_drafts: max_drafts(i),
            sampling: None,
            drafts_paused: false,
        })
        .collect()
}

/// The bits of block `block` in the first `layers` layers of `cache`, K then V.
pub fn block_bits(cache: &KvCache, layers: usize, block: usize) -> Vec<u32> {
    let layout = cache.layout();
    let per_block = (layout.block_size * layout.slot_elems()) as usize;
    let mut bits = Vec::new();
    for l in 0..layers {
        let (k, v) = cache.layer(l);
        for x in [k, v] {
            let block = &x[block * per_block..(block + 1) * per_block];
            bits.extend(block.iter().map(|f| f.to_bits()));
        }
    }
    bits
}

/// The next round's tokens: each sequence accepts some of its drafts (a number that moves
/// with the round) and gains one more token.
pub fn accept(tokens: &mut [Vec<u32>], drafts: &[Vec<u32>], round: usize) {
    for (i, (t, d)) in tokens.iter_mut().zip(drafts).enumerate() {
        let accepted = (i + round) % (d.len() + 1);
        t.extend(&d[..accepted]);
        t.push((3 + (i * 31 + round * 17) % 290) as u32);
    }
}

/// Checks one round of proposals for `n` sequences: the drafter with graphs drafted what
/// its eager twin drafted, each sequence as many as it asked, and its cache's scratch
/// block changed (from `scratch_before`) exactly when a step was `padded`. `layers` is
/// the caches' layer count.
#[allow(clippy::too_many_arguments)]
pub fn assert_same_drafts(
    n: usize,
    round: usize,
    graph_drafts: &[Vec<u32>],
    eager_drafts: &[Vec<u32>],
    graph_cache: &KvCache,
    layers: usize,
    scratch_before: &[u32],
    padded: bool,
) {
    let at = format!("batch {n}, round {round}");
    assert_eq!(graph_drafts, eager_drafts, "{at}");
    let lens: Vec<usize> = graph_drafts.iter().map(Vec::len).collect();
    let want: Vec<usize> = (0..n).map(max_drafts).collect();
    assert_eq!(lens, want, "{at}");
    // The padded steps replayed a graph: their padded rows wrote the scratch block.
    let scratch = graph_cache.layout().num_blocks as usize - 1;
    let written = block_bits(graph_cache, layers, scratch) != scratch_before;
    assert_eq!(written, padded, "{at}");
}

/// Checks that after a round for `n` sequences the cache of the drafter with graphs holds
/// the eager twin's keys and values, bit for bit, in every block a sequence owns, and
/// zeros in every other block but the scratch block (which the eager twin never writes).
pub fn assert_kv_only_where_owned(
    n: usize,
    round: usize,
    graph_cache: &KvCache,
    eager_cache: &KvCache,
    layers: usize,
) {
    let num_blocks = graph_cache.layout().num_blocks as usize;
    let scratch = num_blocks - 1;
    let at = format!("batch {n}, round {round}");
    let zeros = vec![0; block_bits(graph_cache, layers, 0).len()];
    for block in 0..num_blocks {
        let got = block_bits(graph_cache, layers, block);
        let owned = (0..n).any(|i| (0..SEQ_BLOCKS).any(|j| block_of(i, j) as usize == block));
        if block == scratch {
            assert_eq!(block_bits(eager_cache, layers, block), zeros, "{at}");
        } else if owned {
            let want = block_bits(eager_cache, layers, block);
            assert!(got == want, "{at}: block {block} differs from eager");
        } else {
            assert!(got == zeros, "{at}: block {block}, owned by none, written");
        }
    }
}

/// The draft tokens of each sequence of a proposal.
pub fn tokens_of(drafts: Vec<Drafted>) -> Vec<Vec<u32>> {
    drafts.into_iter().map(|d| d.tokens).collect()
}

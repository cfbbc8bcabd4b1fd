//! The host tier in small, exact scenarios: what goes down, what comes back, and in which
//! order the copies are given.

use super::{admit_all, computed, free, step, BlockManager};
use crate::messages::{AllocateStep, KvMove, RequestId};

const BLOCK: usize = 4;

/// A pool of 4 blocks with a host tier of `slots`, holding request 1's 8 tokens (2 blocks)
/// computed, then freed, then pushed out of the pool by request 2's 16 tokens.
fn pushed_down(slots: u32) -> (BlockManager, Vec<u32>) {
    let mut m = BlockManager::new(4, BLOCK, true).with_host_tier(slots);
    let prompt: Vec<u32> = (10..18).collect();
    let first = admit_all(&mut m, &[(1, &prompt)]);
    assert!(first.moves.is_empty());
    computed(&mut m, 1, &prompt);
    free(&mut m, &[1]);
    let other: Vec<u32> = (50..66).collect();
    let grant = admit_all(&mut m, &[(2, &other)]);
    let spills: Vec<&KvMove> = grant
        .moves
        .iter()
        .filter(|m| matches!(m, KvMove::Spill { .. }))
        .collect();
    assert_eq!(
        spills.len(),
        2,
        "request 1's blocks go down: {:?}",
        grant.moves
    );
    computed(&mut m, 2, &other);
    free(&mut m, &[2]);
    (m, prompt)
}

#[test]
fn two_requests_admitted_together_share_one_load_of_their_prefix() {
    let (mut m, prompt) = pushed_down(8);
    let mut longer = prompt.clone();
    longer.extend([1, 2, 3]);
    let grant = admit_all(&mut m, &[(3, &longer), (4, &longer)]);
    let loads: Vec<&KvMove> = grant
        .moves
        .iter()
        .filter(|m| matches!(m, KvMove::Load { .. }))
        .collect();
    assert_eq!(loads.len(), 2, "each block loaded once: {:?}", grant.moves);
    let (a, b) = (&grant.admitted[0], &grant.admitted[1]);
    assert_eq!((a.num_cached, b.num_cached), (8, 8));
    assert_eq!(
        a.block_table[..2],
        b.block_table[..2],
        "the second shares the loaded blocks"
    );
    // Every load reads a slot a spill wrote, into a block the grant gives out, after the
    // spill that emptied that block.
    for (i, mv) in grant.moves.iter().enumerate() {
        if let KvMove::Load { block, .. } = mv {
            assert!(a.block_table.contains(block));
            let spilled_later = grant.moves[i + 1..]
                .iter()
                .any(|m| matches!(m, KvMove::Spill { block: b, .. } if b == block));
            assert!(!spilled_later, "block {block} spilled after its load");
        }
    }
    assert_eq!(m.usage().host_loaded, 2);
}

#[test]
fn a_full_tier_drops_the_end_of_a_chain_first() {
    // One slot: request 1's last block goes down first (a freed table is reused tail
    // first), then its first block needs the slot: the last one, a leaf, is dropped for it,
    // and the chain stays reachable from its start.
    let (mut m, prompt) = pushed_down(1);
    let usage = m.usage();
    assert_eq!((usage.host_blocks, usage.host_dropped), (1, 1));
    let grant = admit_all(&mut m, &[(3, &prompt)]);
    assert_eq!(
        grant.admitted[0].num_cached, BLOCK,
        "the chain's first block came back"
    );
}

#[test]
fn content_computed_again_takes_its_host_entry_back_without_a_copy() {
    let (mut m, prompt) = pushed_down(8);
    // Scoring the prompt takes nothing from the cache: it computes the blocks again.
    let grant = step(
        &mut m,
        AllocateStep {
            admit: vec![crate::messages::AdmitSeq {
                id: RequestId(5),
                tokens: prompt.clone().into(),
                scores_prompt: true,
            }],
            token_budget: usize::MAX,
            ..AllocateStep::default()
        },
    );
    assert_eq!(grant.admitted[0].num_cached, 0);
    assert!(grant
        .moves
        .iter()
        .all(|m| !matches!(m, KvMove::Load { .. })));
    let before = m.usage().host_blocks;
    computed(&mut m, 5, &prompt);
    assert_eq!(
        m.usage().host_blocks,
        before - 2,
        "both entries left the tier"
    );
    assert_eq!(m.usage().host_loaded, 0);
}

//! Reference counts and sharing through the prefix cache.

use super::{admit_all, computed, free, step, tokens, BlockManager};
use crate::messages::{AllocateStep, ComputedSeq, RequestId};

#[test]
fn two_sequences_with_one_prompt_share_its_full_blocks() {
    let mut m = BlockManager::new(16, 16, true);
    let prompt = tokens(100, 40);
    let a = admit_all(&mut m, &[(1, &prompt)]).admitted.remove(0);
    assert_eq!(
        (a.num_cached, a.num_scheduled, a.block_table.len()),
        (0, 40, 3)
    );
    computed(&mut m, 1, &prompt);

    let grant = admit_all(&mut m, &[(2, &prompt)]);
    let b = &grant.admitted[0];
    assert_eq!((b.num_cached, b.num_scheduled), (32, 8));
    assert_eq!(b.block_table[..2], a.block_table[..2]);
    assert_ne!(b.block_table[2], a.block_table[2]);
    for &shared in &a.block_table[..2] {
        assert_eq!(m.ref_count(shared), Some(2));
    }
    assert_eq!(grant.usage.used_blocks, 4);
    assert_eq!(
        (grant.usage.prefix_queries, grant.usage.prefix_hits),
        (64, 32)
    );

    let grant = free(&mut m, &[1]);
    assert_eq!(grant.usage.used_blocks, 3);
    for &block in &b.block_table {
        assert_eq!(m.ref_count(block), Some(1));
    }
    assert_eq!(m.ref_count(a.block_table[2]), Some(0));
    assert_eq!(m.block_table(RequestId(1)), None);
    assert_eq!(m.block_table(RequestId(2)), Some(&b.block_table[..]));
}

#[test]
fn a_fully_cached_prompt_still_recomputes_its_last_block() {
    let mut m = BlockManager::new(8, 16, true);
    let prompt = tokens(7, 32);
    let a = admit_all(&mut m, &[(1, &prompt)]).admitted.remove(0);
    computed(&mut m, 1, &prompt);
    let grant = admit_all(&mut m, &[(2, &prompt)]);
    let b = &grant.admitted[0];
    assert_eq!((b.num_cached, b.num_scheduled), (16, 16));
    assert_eq!(b.block_table[0], a.block_table[0]);
    assert_ne!(b.block_table[1], a.block_table[1]);
    assert_eq!(
        (grant.usage.prefix_queries, grant.usage.prefix_hits),
        (16 + 16, 16)
    );
}

#[test]
fn recomputing_the_last_hit_leaves_one_cached_block_to_compute() {
    let mut m = BlockManager::new(16, 16, true).recomputing_last_hit();
    let prompt = tokens(100, 60);
    let a = admit_all(&mut m, &[(1, &prompt)]).admitted.remove(0);
    computed(&mut m, 1, &prompt);
    // Three whole blocks are cached; the hit keeps two and computes the third again.
    let grant = admit_all(&mut m, &[(2, &prompt)]);
    let b = &grant.admitted[0];
    assert_eq!((b.num_cached, b.num_scheduled), (32, 28));
    assert_eq!(b.block_table[..2], a.block_table[..2]);
    assert_ne!(b.block_table[2], a.block_table[2]);
    assert_eq!(grant.usage.prefix_hits, 32);
    // A hit of one block leaves nothing cached.
    let short = tokens(100, 20);
    let c = admit_all(&mut m, &[(3, &short)]).admitted.remove(0);
    assert_eq!((c.num_cached, c.num_scheduled), (0, 20));
    // Its block chain is that of the blocks it kept: computing it registers the rest.
    computed(&mut m, 2, &prompt);
    let d = admit_all(&mut m, &[(4, &prompt)]).admitted.remove(0);
    assert_eq!(d.num_cached, 32);
}

#[test]
fn only_computed_blocks_enter_the_cache() {
    let mut m = BlockManager::new(8, 4, true);
    let prompt = tokens(0, 12);
    admit_all(&mut m, &[(1, &prompt)]);
    let b = admit_all(&mut m, &[(2, &prompt)]).admitted.remove(0);
    assert_eq!(b.num_cached, 0);
    computed(&mut m, 1, &prompt[..7]);
    let c = admit_all(&mut m, &[(3, &prompt)]).admitted.remove(0);
    assert_eq!(c.num_cached, 4);
}

#[test]
fn freeing_unknown_ids_changes_nothing() {
    let mut m = BlockManager::new(4, 4, true);
    admit_all(&mut m, &[(1, &tokens(0, 5))]);
    let grant = free(&mut m, &[9, 10]);
    assert_eq!(grant.usage.used_blocks, 2);
    computed(&mut m, 9, &tokens(0, 8));
    assert_eq!(m.num_free_blocks(), 2);
}

#[test]
fn a_sequence_freed_with_its_last_progress_report_stays_cached() {
    let mut m = BlockManager::new(8, 4, true);
    let prompt = tokens(0, 9);
    admit_all(&mut m, &[(1, &prompt)]);
    step(
        &mut m,
        AllocateStep {
            computed: vec![ComputedSeq {
                id: RequestId(1),
                first_block: 0,
                tokens: prompt.clone(),
            }],
            free: vec![RequestId(1)],
            ..AllocateStep::default()
        },
    );
    assert_eq!(m.num_free_blocks(), 8);
    let b = admit_all(&mut m, &[(2, &prompt)]).admitted.remove(0);
    assert_eq!(b.num_cached, 8);
}

#[test]
fn progress_reported_in_pieces_enters_the_cache_and_a_gap_registers_nothing() {
    let mut m = BlockManager::new(16, 4, true);
    let prompt = tokens(0, 12);
    admit_all(&mut m, &[(1, &prompt)]);
    let report = |first_block: usize, tokens: &[u32]| AllocateStep {
        computed: vec![ComputedSeq {
            id: RequestId(1),
            first_block,
            tokens: tokens.to_vec(),
        }],
        ..AllocateStep::default()
    };
    // A report past the first unregistered block has a gap before it: nothing enters.
    step(&mut m, report(1, &prompt[4..8]));
    let probe = admit_all(&mut m, &[(2, &prompt)]).admitted.remove(0);
    assert_eq!(probe.num_cached, 0, "a gap registers nothing");
    free(&mut m, &[2]);
    // Block 0, then blocks 1 and 2: the second report continues the first.
    step(&mut m, report(0, &prompt[..4]));
    step(&mut m, report(1, &prompt[4..12]));
    let mut longer = prompt.clone();
    longer.push(99);
    let hit = admit_all(&mut m, &[(3, &longer)]).admitted.remove(0);
    assert_eq!(
        hit.num_cached, 12,
        "all three blocks came from the two reports"
    );
}

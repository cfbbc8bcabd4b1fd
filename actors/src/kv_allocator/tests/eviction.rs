//! The free queue's LRU order and what eviction does to the cache.

use super::{admit_all, computed, free, tokens, BlockManager};

fn sorted(mut blocks: Vec<u32>) -> Vec<u32> {
    blocks.sort_unstable();
    blocks
}

#[test]
fn never_used_blocks_then_the_longest_freed_are_reused_first() {
    let mut m = BlockManager::new(6, 4, true);
    let grant = admit_all(&mut m, &[(1, &tokens(0, 8)), (2, &tokens(100, 8))]);
    let a = grant.admitted[0].block_table.clone();
    let b = grant.admitted[1].block_table.clone();
    free(&mut m, &[1]);
    free(&mut m, &[2]);
    let grant = admit_all(
        &mut m,
        &[
            (3, &tokens(200, 8)),
            (4, &tokens(300, 8)),
            (5, &tokens(400, 8)),
        ],
    );
    assert_eq!(sorted(grant.admitted[0].block_table.clone()), vec![4, 5]);
    assert_eq!(sorted(grant.admitted[1].block_table.clone()), sorted(a));
    assert_eq!(sorted(grant.admitted[2].block_table.clone()), sorted(b));
}

#[test]
fn a_sequence_frees_its_tail_before_its_head() {
    let mut m = BlockManager::new(3, 4, true);
    let a = admit_all(&mut m, &[(1, &tokens(0, 12))]).admitted.remove(0);
    free(&mut m, &[1]);
    let b = admit_all(&mut m, &[(2, &tokens(50, 4))]).admitted.remove(0);
    assert_eq!(b.block_table, vec![a.block_table[2]]);
}

#[test]
fn a_hit_on_a_free_cached_block_takes_it_out_of_the_free_queue() {
    let mut m = BlockManager::new(3, 4, true);
    let x = tokens(0, 4);
    let grant = admit_all(&mut m, &[(1, &x), (2, &tokens(100, 4))]);
    let (a, b) = (
        grant.admitted[0].block_table[0],
        grant.admitted[1].block_table[0],
    );
    computed(&mut m, 1, &x);
    free(&mut m, &[1]);
    free(&mut m, &[2]);
    // The queue is now: the never-used block, then A's, then B's.
    let prompt: Vec<u32> = x.iter().copied().chain(tokens(500, 5)).collect();
    let c = admit_all(&mut m, &[(3, &prompt)]).admitted.remove(0);
    assert_eq!(c.num_cached, 4);
    assert_eq!(c.block_table[0], a);
    assert_eq!(sorted(c.block_table[1..].to_vec()), sorted(vec![2, b]));
    assert_eq!(m.ref_count(a), Some(1));
    assert_eq!(m.num_free_blocks(), 0);

    let d = admit_all(&mut m, &[(4, &prompt[..5])]);
    assert!(d.admitted.is_empty(), "no block is free for D's last token");
    free(&mut m, &[3]);
    let d = admit_all(&mut m, &[(4, &prompt[..5])]).admitted.remove(0);
    assert_eq!((d.num_cached, d.block_table[0]), (4, a));
}

#[test]
fn an_evicted_block_leaves_the_cache() {
    let mut m = BlockManager::new(2, 4, true);
    let x = tokens(0, 8);
    admit_all(&mut m, &[(1, &x)]);
    computed(&mut m, 1, &x);
    free(&mut m, &[1]);
    let y = tokens(100, 8);
    admit_all(&mut m, &[(2, &y)]);
    free(&mut m, &[2]);
    let c = admit_all(&mut m, &[(3, &x)]).admitted.remove(0);
    assert_eq!(c.num_cached, 0, "x's blocks were overwritten by y");
}

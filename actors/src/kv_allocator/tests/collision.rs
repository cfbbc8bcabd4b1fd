//! Lookups are exact: a block is found only under its own content and its own prefix.

use super::{admit_all, computed, tokens, BlockManager};

#[test]
fn same_previous_block_with_different_tokens_is_no_hit() {
    let mut m = BlockManager::new(16, 4, true);
    let a: Vec<u32> = tokens(0, 12);
    admit_all(&mut m, &[(1, &a)]);
    computed(&mut m, 1, &a);
    let mut b = a.clone();
    b[5] = 999;
    let hit = admit_all(&mut m, &[(2, &b)]).admitted.remove(0);
    assert_eq!(hit.num_cached, 4, "only the first block is shared");
}

#[test]
fn same_tokens_after_a_different_prefix_is_no_hit() {
    let mut m = BlockManager::new(16, 4, true);
    let a: Vec<u32> = tokens(0, 12);
    admit_all(&mut m, &[(1, &a)]);
    computed(&mut m, 1, &a);
    // B's second block equals A's second block, but its first block differs.
    let b: Vec<u32> = tokens(50, 4).into_iter().chain(tokens(4, 8)).collect();
    let miss = admit_all(&mut m, &[(2, &b)]).admitted.remove(0);
    assert_eq!(miss.num_cached, 0);
    // A block that opens a sequence matches only at the start.
    let c: Vec<u32> = tokens(4, 4).into_iter().chain(tokens(60, 4)).collect();
    assert_eq!(admit_all(&mut m, &[(3, &c)]).admitted[0].num_cached, 0);
}

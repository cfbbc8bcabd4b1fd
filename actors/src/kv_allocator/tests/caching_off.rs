//! With prefix caching off nothing is shared and nothing is counted.

use super::{admit_all, computed, free, tokens, BlockManager};

#[test]
fn prefix_caching_off_never_hits() {
    let mut m = BlockManager::new(16, 4, false);
    let prompt = tokens(0, 20);
    let a = admit_all(&mut m, &[(1, &prompt)]).admitted.remove(0);
    computed(&mut m, 1, &prompt);
    let grant = admit_all(&mut m, &[(2, &prompt)]);
    let b = &grant.admitted[0];
    assert_eq!(b.num_cached, 0);
    assert!(b.block_table.iter().all(|x| !a.block_table.contains(x)));
    free(&mut m, &[1]);
    let c = admit_all(&mut m, &[(3, &prompt)]);
    assert_eq!(c.admitted[0].num_cached, 0);
    assert_eq!((c.usage.prefix_queries, c.usage.prefix_hits), (0, 0));
}

//! Block ids past 65,535: the number that broke another engine's kernel.

use super::{admit_all, grow, step, BlockManager};
use crate::messages::{AllocateStep, RequestId};

#[test]
fn block_ids_65535_and_65536_are_handed_out_and_reported() {
    let mut m = BlockManager::new(70_000, 16, true);
    let grant = admit_all(&mut m, &[(1, &[1, 2, 3])]);
    assert_eq!(grant.usage.max_block_id_in_use, Some(0));
    let to = |blocks: usize| AllocateStep {
        grow: vec![grow(1, blocks * 16)],
        ..AllocateStep::default()
    };
    let grant = step(&mut m, to(65_536));
    assert_eq!(grant.usage.max_block_id_in_use, Some(65_535));
    assert_eq!(grant.usage.used_blocks, 65_536);
    let grant = step(&mut m, to(65_537));
    assert_eq!(grant.usage.max_block_id_in_use, Some(65_536));
    let table = m.block_table(RequestId(1)).unwrap_or_default();
    assert_eq!(table[65_535..], [65_535, 65_536]);
    assert_eq!(grant.usage.num_blocks, 70_000);
}

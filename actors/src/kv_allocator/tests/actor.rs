//! The actor answers through its handle, and the handle reports a stopped actor.

use super::{admit, grow, tokens};
use crate::kv_allocator::KvAllocator;
use crate::messages::AllocateStep;

#[tokio::test]
async fn the_actor_answers_through_its_handle() {
    let handle = KvAllocator::spawn(8, 4, true);
    assert_eq!((handle.num_blocks(), handle.block_size()), (8, 4));
    let first = handle
        .allocate_step(AllocateStep {
            admit: vec![admit(1, &tokens(0, 6))],
            token_budget: 100,
            ..AllocateStep::default()
        })
        .await
        .unwrap();
    assert_eq!(first.admitted[0].block_table, vec![0, 1]);
    let second = handle
        .clone()
        .allocate_step(AllocateStep {
            grow: vec![grow(1, 9)],
            ..AllocateStep::default()
        })
        .await
        .unwrap();
    assert_eq!(second.grown[0].1, vec![0, 1, 2]);
    assert_eq!(second.usage.used_blocks, 3);
    assert_eq!(second.usage.max_block_id_in_use, Some(2));
}

#[test]
fn a_stopped_actor_is_an_error() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    };
    let first = runtime();
    let handle = first.block_on(async { KvAllocator::spawn(8, 4, true) });
    drop(first);
    let result = runtime().block_on(handle.allocate_step(AllocateStep::default()));
    assert!(result.is_err());
}

#[tokio::test]
async fn admissions_nobody_received_are_undone() {
    use futures_util::FutureExt;
    let handle = KvAllocator::spawn(8, 4, true);
    let lost = AllocateStep {
        admit: vec![admit(1, &tokens(0, 16))],
        token_budget: 100,
        ..AllocateStep::default()
    };
    // Sent, then dropped before the answer: the caller never learns of the admission.
    assert!(handle.allocate_step(lost).now_or_never().is_none());
    let next = handle
        .allocate_step(AllocateStep {
            admit: vec![admit(2, &tokens(100, 4))],
            token_budget: 100,
            ..AllocateStep::default()
        })
        .await
        .unwrap();
    assert_eq!(next.usage.used_blocks, 1);
}

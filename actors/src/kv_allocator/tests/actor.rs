//! The actor answers through its handle, and the handle reports a stopped actor; its
//! events leave as batches.

use super::{admit, grow, tokens};
use crate::kv_allocator::{BlockManager, CacheEvent, KvAllocator, Medium};
use crate::kv_disk::{chain_hash, FoundBlock, ROOT_HASH};
use crate::kv_events::KvEventSink;
use crate::messages::{AllocateStep, ComputedSeq, RequestId};

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

#[tokio::test]
async fn each_step_s_cache_changes_leave_the_actor_as_one_batch() {
    let (sink, mut batches) = KvEventSink::channel(8);
    let handle = KvAllocator::spawn_over(BlockManager::new(8, 4, true), Some(sink));
    let prompt = tokens(0, 9);
    handle
        .allocate_step(AllocateStep {
            admit: vec![admit(1, &prompt)],
            token_budget: 100,
            ..AllocateStep::default()
        })
        .await
        .unwrap();
    handle
        .allocate_step(AllocateStep {
            computed: vec![ComputedSeq {
                id: RequestId(1),
                first_block: 0,
                tokens: prompt[..8].to_vec(),
            }],
            ..AllocateStep::default()
        })
        .await
        .unwrap();
    // The admission changed no entry: the first batch is the registration's two stores.
    let batch = batches.recv().await.unwrap();
    assert_eq!(batch.events.len(), 2);
    assert!(matches!(batch.events[0], CacheEvent::Stored { .. }));
    assert!(batch.ts > 1.7e9, "seconds since the epoch, {}", batch.ts);
    assert!(batches.try_recv().is_err());
}

#[tokio::test]
async fn the_blocks_a_disk_tier_found_leave_the_actor_at_once() {
    // One block found on disk at start-up: its store is a batch of its own, sent before
    // any step, and a manager not publishing events never announces it.
    let block = tokens(0, 4);
    let found = [FoundBlock {
        slot: 3,
        chain: chain_hash(&ROOT_HASH, &block),
        parent: ROOT_HASH,
        tokens: block.clone(),
    }];
    let over = || BlockManager::new(8, 4, true).with_disk_tier(8, &found);
    let (sink, mut batches) = KvEventSink::channel(8);
    let _handle = KvAllocator::spawn_over(over(), Some(sink));
    let batch = batches.try_recv().expect("sent at once");
    assert!(matches!(
        &batch.events[..],
        [CacheEvent::Stored { tokens, medium: Medium::Disk, .. }] if tokens[..] == block[..]
    ));
    let mut quiet = over();
    quiet.allocate_step(AllocateStep::default());
    assert!(quiet.recording_events().take_events().is_empty());
}

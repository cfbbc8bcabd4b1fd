//! The disk tier in small, exact scenarios: what is written, under which names, what a
//! restart finds, what requests admitted together read, and the KV events of each.

use super::{admit_all, computed, free, BlockManager};
use crate::kv_allocator::{CacheEvent, ChainId, Medium};
use crate::kv_disk::{chain_hash, ContentHash, FailedRead, FailedReads, FoundBlock, ROOT_HASH};
use crate::messages::{KvMove, KvSource};

const BLOCK: usize = 4;

/// A pool of 4 blocks with no host tier and a disk tier of `slots` holding `found`,
/// recording events, where request 1's 8 tokens (2 blocks) were computed, freed, and
/// pushed out of the pool by request 2's 16 tokens; the writes that gave.
fn pushed_down(slots: u64, found: &[FoundBlock]) -> (BlockManager, Vec<u32>, Vec<KvMove>) {
    let mut m = BlockManager::new(4, BLOCK, true)
        .with_disk_tier(slots, found)
        .recording_events();
    let prompt: Vec<u32> = (10..18).collect();
    admit_all(&mut m, &[(1, &prompt)]);
    computed(&mut m, 1, &prompt);
    free(&mut m, &[1]);
    let other: Vec<u32> = (50..66).collect();
    let grant = admit_all(&mut m, &[(2, &other)]);
    computed(&mut m, 2, &other);
    free(&mut m, &[2]);
    (m, prompt, grant.moves)
}

/// The content chain of `tokens`' whole blocks, block by block.
fn chain_of(tokens: &[u32]) -> Vec<ContentHash> {
    let mut parent = ROOT_HASH;
    tokens
        .chunks_exact(BLOCK)
        .map(|chunk| {
            parent = chain_hash(&parent, chunk);
            parent
        })
        .collect()
}

/// The chain of the block of `tokens` stored in `medium` in `events`, if one was.
fn stored(events: &[CacheEvent], medium: Medium, tokens: &[u32]) -> Option<ChainId> {
    events.iter().find_map(|e| match e {
        CacheEvent::Stored {
            chain,
            tokens: t,
            medium: m,
            ..
        } if *m == medium && t[..] == *tokens => Some(*chain),
        _ => None,
    })
}

/// The records a file would hold after `moves`' writes (what a restart's scan finds).
pub(super) fn records(moves: &[KvMove]) -> Vec<FoundBlock> {
    moves
        .iter()
        .filter_map(|m| match m {
            KvMove::DiskWrite {
                slot,
                parent,
                tokens,
                ..
            } => Some(FoundBlock {
                slot: *slot,
                chain: chain_hash(parent, tokens),
                parent: *parent,
                tokens: tokens.to_vec(),
            }),
            _ => None,
        })
        .collect()
}

#[test]
fn blocks_leaving_the_pool_are_written_under_their_content_chain() {
    let (m, prompt, moves) = pushed_down(8, &[]);
    let written = records(&moves);
    assert_eq!(written.len(), 2, "request 1's blocks go down: {moves:?}");
    let chains = chain_of(&prompt);
    let mut names: Vec<ContentHash> = written.iter().map(|r| r.chain).collect();
    names.sort();
    let mut expected = chains.clone();
    expected.sort();
    assert_eq!(names, expected);
    // Each is read from the pool block it leaves, before that block is given out again.
    for m in &moves {
        if let KvMove::DiskWrite { from, .. } = m {
            assert!(matches!(from, KvSource::Pool(_)));
        }
    }
    assert_eq!(m.usage().disk_blocks, 2);
}

#[test]
fn two_requests_admitted_together_share_one_read_of_their_prefix() {
    let (mut m, prompt, _) = pushed_down(8, &[]);
    let mut longer = prompt.clone();
    longer.extend([1, 2, 3]);
    let grant = admit_all(&mut m, &[(3, &longer), (4, &longer)]);
    let reads: Vec<&KvMove> = grant
        .moves
        .iter()
        .filter(|m| matches!(m, KvMove::DiskRead { .. }))
        .collect();
    assert_eq!(reads.len(), 2, "each block read once: {:?}", grant.moves);
    let (a, b) = (&grant.admitted[0], &grant.admitted[1]);
    assert_eq!((a.num_cached, b.num_cached), (8, 8));
    assert_eq!(a.block_table[..2], b.block_table[..2]);
    // The reads name the chain in order, into the blocks the first request's table holds.
    let chains = chain_of(&prompt);
    for (read, (chain, block)) in reads.iter().zip(chains.iter().zip(&a.block_table)) {
        assert!(
            matches!(read, KvMove::DiskRead { chain: c, block: k, .. } if c == chain && k == block),
            "{read:?}"
        );
    }
    // Read back, the blocks are not written again when they leave the pool once more.
    computed(&mut m, 3, &longer);
    free(&mut m, &[3, 4]);
    let other: Vec<u32> = (70..86).collect();
    let grant = admit_all(&mut m, &[(5, &other)]);
    let rewritten = records(&grant.moves)
        .iter()
        .filter(|r| chains.contains(&r.chain))
        .count();
    assert_eq!(rewritten, 0, "{:?}", grant.moves);
}

#[test]
fn a_restart_finds_the_written_blocks_and_reads_them_in_chain_order() {
    let (_, prompt, moves) = pushed_down(8, &[]);
    let found = records(&moves);
    let mut m = BlockManager::new(4, BLOCK, true).with_disk_tier(8, &found);
    m.check_invariants().unwrap();
    let mut longer = prompt.clone();
    longer.push(7);
    let grant = admit_all(&mut m, &[(1, &longer)]);
    assert_eq!(grant.admitted[0].num_cached, 8);
    let read_chains: Vec<ContentHash> = grant
        .moves
        .iter()
        .filter_map(|m| match m {
            KvMove::DiskRead { chain, .. } => Some(*chain),
            _ => None,
        })
        .collect();
    assert_eq!(read_chains, chain_of(&prompt));
    // A restart that found only the second block finds nothing: the chain starts with
    // the first.
    let second: Vec<FoundBlock> = found
        .iter()
        .filter(|f| f.chain == chain_of(&prompt)[1])
        .cloned()
        .collect();
    let mut m = BlockManager::new(4, BLOCK, true).with_disk_tier(8, &second);
    let grant = admit_all(&mut m, &[(1, &longer)]);
    assert_eq!(grant.admitted[0].num_cached, 0);
}

#[test]
fn a_full_disk_tier_drops_the_end_of_a_chain_first() {
    // One slot: request 1's last block is written first (a freed table is reused tail
    // first), then its first block takes the slot from it, and the chain is still found
    // from its start.
    let (mut m, prompt, _) = pushed_down(1, &[]);
    let usage = m.usage();
    assert_eq!((usage.disk_blocks, usage.disk_dropped), (1, 1));
    let grant = admit_all(&mut m, &[(3, &prompt)]);
    assert_eq!(grant.admitted[0].num_cached, BLOCK);
}

#[test]
fn a_failed_read_is_forgotten_with_the_pool_entry_it_was_to_fill() {
    // Request 3's read of the prompt's first block fails its checks: before the next step
    // the slot is forgotten and so is the pool block's entry, which holds nothing valid;
    // the prompt then misses from its first block on, and nothing else is lost.
    let failed = FailedReads::shared();
    let (m, prompt, _) = pushed_down(8, &[]);
    let mut m = m.with_failed_reads(failed.clone());
    m.take_events();
    let mut longer = prompt.clone();
    longer.push(7);
    let grant = admit_all(&mut m, &[(3, &longer)]);
    let chain = stored(&m.take_events(), Medium::Pool, &prompt[..BLOCK]).expect("read back");
    let first = grant
        .moves
        .iter()
        .find_map(|mv| match mv {
            KvMove::DiskRead { slot, chain, block } if *chain == chain_of(&prompt)[0] => {
                Some(FailedRead {
                    slot: *slot,
                    block: *block,
                })
            }
            _ => None,
        })
        .expect("a read of the first block");
    failed.report(first);
    let before = m.usage();
    free(&mut m, &[3]);
    m.check_invariants().unwrap();
    let after = m.usage();
    assert_eq!(after.disk_blocks, before.disk_blocks - 1);
    assert_eq!(after.cached_blocks, before.cached_blocks - 1);
    // Both entries are gone, and subscribers are told.
    let events = m.take_events();
    for medium in [Medium::Disk, Medium::Pool] {
        let gone = CacheEvent::Removed { chain, medium };
        assert!(events.contains(&gone), "{events:?}");
    }
    let grant = admit_all(&mut m, &[(4, &longer)]);
    assert_eq!(grant.admitted[0].num_cached, 0, "{:?}", grant.moves);
    assert!(failed.take().is_empty());
}

#[test]
fn a_block_keeps_its_chain_id_on_disk_and_back_in_the_pool() {
    // Request 1's first block is stored on disk under the id it had in the pool, after its
    // removal from the pool, and read back into the pool under that id again, staying on
    // disk (no disk event of its own).
    let (mut m, prompt, _) = pushed_down(8, &[]);
    let first = &prompt[..BLOCK];
    let events = m.take_events();
    let chain = stored(&events, Medium::Pool, first).expect("stored in the pool");
    assert_eq!(
        stored(&events, Medium::Disk, first),
        Some(chain),
        "{events:?}"
    );
    let at = |event: &CacheEvent| events.iter().position(|e| e == event);
    let gone = CacheEvent::Removed {
        chain,
        medium: Medium::Pool,
    };
    let on_disk = events.iter().position(
        |e| matches!(e, CacheEvent::Stored { chain: c, medium: Medium::Disk, .. } if *c == chain),
    );
    assert!(at(&gone) < on_disk, "{events:?}");
    let mut longer = prompt.clone();
    longer.push(7);
    admit_all(&mut m, &[(3, &longer)]);
    let events = m.take_events();
    assert_eq!(
        stored(&events, Medium::Pool, first),
        Some(chain),
        "{events:?}"
    );
    let on_disk = |e: &CacheEvent| match e {
        CacheEvent::Stored {
            chain: c, medium, ..
        }
        | CacheEvent::Removed { chain: c, medium } => *c == chain && *medium == Medium::Disk,
    };
    assert!(!events.iter().any(on_disk), "{events:?}");
}

#[test]
fn a_restart_announces_the_chains_it_finds_from_their_start() {
    // Both blocks found: announced as disk stores before anything else, parent first.
    let (_, prompt, moves) = pushed_down(8, &[]);
    let found = records(&moves);
    let mut m = BlockManager::new(4, BLOCK, true)
        .with_disk_tier(8, &found)
        .recording_events();
    let events = m.take_events();
    let first = stored(&events, Medium::Disk, &prompt[..BLOCK]).expect("the first block");
    let second = stored(&events, Medium::Disk, &prompt[BLOCK..]).expect("the second block");
    let store = |chain, parent, tokens: &[u32]| CacheEvent::Stored {
        chain,
        parent,
        tokens: tokens.into(),
        medium: Medium::Disk,
    };
    assert_eq!(
        events,
        vec![
            store(first, ChainId::ROOT, &prompt[..BLOCK]),
            store(second, first, &prompt[BLOCK..]),
        ]
    );
    // Only the second found: nothing is announced until a prompt reaches it after the
    // first block computed again, in the pool; then it is stored on disk after that
    // block's entry, and read back into the pool under the same id.
    let second: Vec<FoundBlock> = found
        .into_iter()
        .filter(|f| f.chain == chain_of(&prompt)[1])
        .collect();
    let mut m = BlockManager::new(4, BLOCK, true)
        .with_disk_tier(8, &second)
        .recording_events();
    assert!(m.take_events().is_empty());
    let mut stem = prompt[..BLOCK].to_vec();
    stem.push(99);
    admit_all(&mut m, &[(1, &stem)]);
    computed(&mut m, 1, &stem);
    free(&mut m, &[1]);
    let parent = stored(&m.take_events(), Medium::Pool, &prompt[..BLOCK]).expect("computed");
    let mut longer = prompt.clone();
    longer.push(7);
    let grant = admit_all(&mut m, &[(2, &longer)]);
    assert_eq!(grant.admitted[0].num_cached, 2 * BLOCK);
    let events = m.take_events();
    let named = stored(&events, Medium::Disk, &prompt[BLOCK..]).expect("named on disk");
    assert_eq!(
        events[0],
        store(named, parent, &prompt[BLOCK..]),
        "{events:?}"
    );
    assert_eq!(stored(&events, Medium::Pool, &prompt[BLOCK..]), Some(named));
}

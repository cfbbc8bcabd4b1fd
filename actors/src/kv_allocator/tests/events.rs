//! The prefix cache's journal, replayed as a subscriber to the KV-cache events replays it,
//! agrees with the pool (and the host and disk tiers, where there are some) after every
//! step of a random run that evicts: as many live entries in each medium as it holds (on
//! disk, the very entries), nothing stored while live or removed unseen, and every chain
//! the replay holds whole is one the allocator finds, ending where the replay says. A
//! restart over the disk tier's file announces what it finds, parents first.

use super::disk_tier::records;
use super::{step, BlockManager};
use crate::kv_allocator::block_manager::Hit;
use crate::kv_allocator::{CacheEvent, ChainId, Medium};
use crate::kv_disk::FoundBlock;
use crate::messages::{AdmitSeq, AllocateStep, ComputedSeq, KvMove, RequestId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

const BLOCK: usize = 4;
const POOL: u32 = 24;
const DISK: u64 = 16;

/// What a subscriber knows: each live entry's parent and tokens, by chain and medium.
#[derive(Default)]
struct Replay {
    live: HashMap<(ChainId, Medium), (ChainId, Vec<u32>)>,
    ever: HashSet<ChainId>,
    /// Entries may be stored again (moving between media, or read back from disk).
    moves: bool,
    stores: HashMap<Medium, usize>,
    removals: HashMap<Medium, usize>,
}

impl Replay {
    fn apply(&mut self, events: Vec<CacheEvent>) {
        for event in events {
            match event {
                CacheEvent::Stored {
                    chain,
                    parent,
                    tokens,
                    medium,
                } => {
                    assert!(
                        !self.live.contains_key(&(chain, medium)),
                        "{chain:?} stored while live in {medium:?}"
                    );
                    assert!(
                        self.ever.insert(chain) || self.moves,
                        "{chain:?} stored twice"
                    );
                    assert!(
                        parent == ChainId::ROOT || self.ever.contains(&parent),
                        "{chain:?}'s parent was never stored"
                    );
                    assert_eq!(tokens.len(), BLOCK);
                    self.live.insert((chain, medium), (parent, tokens.to_vec()));
                    *self.stores.entry(medium).or_default() += 1;
                }
                CacheEvent::Removed { chain, medium } => {
                    let live = self.live.remove(&(chain, medium));
                    assert!(live.is_some(), "{chain:?} not live in {medium:?}");
                    *self.removals.entry(medium).or_default() += 1;
                }
            }
        }
    }

    /// Live entries in `medium`.
    fn count(&self, medium: Medium) -> usize {
        self.live.keys().filter(|(_, m)| *m == medium).count()
    }

    /// Stores journaled in `medium`.
    fn stored(&self, medium: Medium) -> usize {
        self.stores.get(&medium).copied().unwrap_or(0)
    }

    /// Removals journaled from `medium`.
    fn removed(&self, medium: Medium) -> usize {
        self.removals.get(&medium).copied().unwrap_or(0)
    }

    /// The tokens from the start of `chain`, if every block of it is live (in any medium).
    fn whole(&self, mut chain: ChainId) -> Option<Vec<u32>> {
        let mut blocks = Vec::new();
        while chain != ChainId::ROOT {
            let (parent, tokens) = [Medium::Pool, Medium::Host, Medium::Disk]
                .iter()
                .find_map(|&m| self.live.get(&(chain, m)))?;
            blocks.push(tokens.clone());
            chain = *parent;
        }
        Some(blocks.into_iter().rev().flatten().collect())
    }

    /// Checks the replay against `m` after a step.
    fn check(&self, m: &BlockManager, seed: u64) {
        let usage = m.usage();
        assert_eq!(self.count(Medium::Pool), usage.cached_blocks, "seed {seed}");
        assert_eq!(self.count(Medium::Host), usage.host_blocks, "seed {seed}");
        let on_disk: HashSet<ChainId> = m.disk.iter().flat_map(|d| d.ids()).collect();
        let replayed: HashSet<ChainId> = self
            .live
            .keys()
            .filter(|(_, medium)| *medium == Medium::Disk)
            .map(|(chain, _)| *chain)
            .collect();
        assert_eq!(replayed, on_disk, "seed {seed}");
        for &(chain, medium) in self.live.keys() {
            assert!(
                medium != Medium::Pool || !self.live.contains_key(&(chain, Medium::Host)),
                "seed {seed}: {chain:?} in the pool and the host tier at once"
            );
            let Some(tokens) = self.whole(chain) else {
                continue;
            };
            let found = m.cached_prefix(&tokens);
            assert_eq!(found.len(), tokens.len() / BLOCK, "seed {seed}: {chain:?}");
            // Found in memory first, where a block on disk is also in memory.
            let end = found.last().map(|h| h.at);
            assert!(
                match (end, medium) {
                    (Some(Hit::Pool { chain: c, .. }), Medium::Pool | Medium::Disk) => c == chain,
                    (Some(Hit::Host { chain: c, .. }), Medium::Host | Medium::Disk) => c == chain,
                    (Some(Hit::Disk { chain: c, .. }), Medium::Disk) => c == Some(chain),
                    _ => false,
                },
                "seed {seed}: {chain:?} in {medium:?}, found {end:?}"
            );
        }
    }
}

/// Runs 300 requests over three shared stems through `m`, some freed each step, the
/// journal replayed into `replay` and checked after each; returns the run's moves. The
/// stems are `seed`'s, the requests those of its `round`.
fn random_run(m: &mut BlockManager, replay: &mut Replay, seed: u64, round: u64) -> Vec<KvMove> {
    let mut rng = ChaCha8Rng::seed_from_u64(0xe7e7 + seed);
    let stems: Vec<Vec<u32>> = (0..3)
        .map(|_| (0..24).map(|_| rng.random_range(0..4)).collect())
        .collect();
    rng.set_stream(round);
    let mut running: Vec<RequestId> = Vec::new();
    let mut moves = Vec::new();
    for id in 0..300u64 {
        let stem = &stems[rng.random_range(0..stems.len())];
        let mut prompt = stem[..rng.random_range(0..=stem.len())].to_vec();
        prompt.extend((0..rng.random_range(1..10)).map(|_| rng.random_range(0..4)));
        let free: Vec<RequestId> = running
            .iter()
            .copied()
            .filter(|_| rng.random_bool(0.5))
            .collect();
        running.retain(|id| !free.contains(id));
        let grant = step(
            m,
            AllocateStep {
                free,
                admit: vec![AdmitSeq {
                    id: RequestId(id),
                    tokens: Arc::from(&prompt[..]),
                    scores_prompt: false,
                }],
                token_budget: usize::MAX,
                ..AllocateStep::default()
            },
        );
        moves.extend(grant.moves);
        if !grant.admitted.is_empty() {
            running.push(RequestId(id));
            let grant = step(
                m,
                AllocateStep {
                    computed: vec![ComputedSeq {
                        id: RequestId(id),
                        first_block: 0,
                        tokens: prompt.clone(),
                    }],
                    ..AllocateStep::default()
                },
            );
            moves.extend(grant.moves);
        }
        replay.apply(m.take_events());
        replay.check(m, seed);
    }
    moves
}

/// A replay where entries may be stored again.
fn moving() -> Replay {
    Replay {
        moves: true,
        ..Replay::default()
    }
}

/// The records a file holds after `moves`: each slot's last write.
fn file_after(moves: &[KvMove]) -> Vec<FoundBlock> {
    let by_slot: BTreeMap<u64, FoundBlock> =
        records(moves).into_iter().map(|r| (r.slot, r)).collect();
    by_slot.into_values().collect()
}

#[test]
fn the_journal_replayed_is_the_pool_s_cache_after_every_step() {
    for seed in 0..8 {
        let mut m = BlockManager::new(POOL, BLOCK, true).recording_events();
        let mut replay = Replay::default();
        random_run(&mut m, &mut replay, seed, 0);
        let (stores, removals) = (replay.stored(Medium::Pool), replay.removed(Medium::Pool));
        assert!(removals > 50 && stores > removals, "{stores} {removals}");
        assert!(!replay.stores.contains_key(&Medium::Host));
    }
}

#[test]
fn host_tier_moves_are_journaled_as_their_medium_s_stores_and_removals() {
    for seed in 0..8 {
        let mut m = BlockManager::new(POOL, BLOCK, true)
            .with_host_tier(12)
            .recording_events();
        let mut replay = moving();
        random_run(&mut m, &mut replay, seed, 0);
        // Spills, and entries leaving the tier (loaded back, computed again or dropped).
        let (spills, left) = (replay.stored(Medium::Host), replay.removed(Medium::Host));
        assert!(spills > 50 && left > 20, "seed {seed}: {spills} {left}");
    }
}

#[test]
fn disk_tier_writes_and_drops_are_journaled_as_disk_stores_and_removals() {
    let (mut announced_in_all, mut found_in_all) = (0, 0);
    for (seed, host) in (0..8).zip([0, 8].iter().cycle()) {
        let mut m = BlockManager::new(POOL, BLOCK, true)
            .with_host_tier(*host)
            .with_disk_tier(DISK, &[])
            .recording_events();
        let mut replay = moving();
        let moves = random_run(&mut m, &mut replay, seed, 0);
        // Entries written (under their chain ids), and leaves dropped to make room.
        let (written, dropped) = (replay.stored(Medium::Disk), replay.removed(Medium::Disk));
        let usage = m.usage();
        assert_eq!(written as u64, usage.disk_written, "seed {seed}");
        assert_eq!(dropped as u64, usage.disk_dropped, "seed {seed}");
        assert!(
            written > 50 && dropped > 20,
            "seed {seed}: {written} {dropped}"
        );

        // A restart over the file: its blocks whose chains start on disk are announced
        // (parents first, or the replay refuses them) before anything else, whichever
        // order the manager is built in; then it runs on, and the others are announced
        // as prompts reach them.
        let found = file_after(&moves);
        let restarted = || BlockManager::new(POOL, BLOCK, true).with_host_tier(*host);
        let mut m = restarted().with_disk_tier(DISK, &found).recording_events();
        let announced = m.take_events();
        let mut other = restarted().recording_events().with_disk_tier(DISK, &found);
        assert_eq!(other.take_events(), announced, "seed {seed}");
        assert!(announced.iter().all(|e| matches!(
            e,
            CacheEvent::Stored {
                medium: Medium::Disk,
                ..
            }
        )));
        let mut replay = moving();
        replay.apply(announced);
        replay.check(&m, seed);
        announced_in_all += replay.count(Medium::Disk);
        found_in_all += found.len();
        random_run(&mut m, &mut replay, seed, 1);
    }
    // Some chains start on disk, and some blocks' parents stayed in memory.
    assert!(
        announced_in_all > 0 && announced_in_all < found_in_all,
        "{announced_in_all} of {found_in_all}"
    );
}

//! The prefix cache's journal, replayed as a subscriber to the KV-cache events replays it,
//! agrees with the pool (and the host tier, where there is one) after every step of a
//! random run that evicts: as many live entries in each medium as it holds, nothing stored
//! while live or removed unseen, and every chain the replay holds whole is one the
//! allocator finds, ending where the replay says.

use super::{step, BlockManager};
use crate::kv_allocator::block_manager::Hit;
use crate::kv_allocator::{CacheEvent, ChainId, Medium};
use crate::messages::{AdmitSeq, AllocateStep, ComputedSeq, RequestId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

const BLOCK: usize = 4;
const POOL: u32 = 24;

/// What a subscriber knows: each live entry's medium, parent and tokens.
#[derive(Default)]
struct Replay {
    live: HashMap<ChainId, (Medium, ChainId, Vec<u32>)>,
    ever: HashSet<ChainId>,
    /// Entries may move between media (a host tier): a chain is then stored again.
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
                        !self.live.contains_key(&chain),
                        "{chain:?} stored while live"
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
                    self.live.insert(chain, (medium, parent, tokens.to_vec()));
                    *self.stores.entry(medium).or_default() += 1;
                }
                CacheEvent::Removed { chain, medium } => {
                    let live = self.live.remove(&chain).map(|(m, ..)| m);
                    assert_eq!(live, Some(medium), "{chain:?} not live in {medium:?}");
                    *self.removals.entry(medium).or_default() += 1;
                }
            }
        }
    }

    /// Live entries in `medium`.
    fn count(&self, medium: Medium) -> usize {
        self.live.values().filter(|(m, ..)| *m == medium).count()
    }

    /// The tokens from the start of `chain`, if every block of it is live (in either
    /// medium).
    fn whole(&self, mut chain: ChainId) -> Option<Vec<u32>> {
        let mut blocks = Vec::new();
        while chain != ChainId::ROOT {
            let (_, parent, tokens) = self.live.get(&chain)?;
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
        for (&chain, &(medium, ..)) in &self.live {
            let Some(tokens) = self.whole(chain) else {
                continue;
            };
            let found = m.cached_prefix(&tokens);
            assert_eq!(found.len(), tokens.len() / BLOCK, "seed {seed}");
            let end = found.last().map(|h| (h.at, medium));
            assert!(
                matches!(end, Some((Hit::Pool { chain: c, .. }, Medium::Pool)) if c == chain)
                    || matches!(end, Some((Hit::Host { chain: c, .. }, Medium::Host)) if c == chain),
                "seed {seed}: {chain:?} in {medium:?}, found {end:?}"
            );
        }
    }
}

/// Runs 300 requests over three shared stems through `m`, some freed each step, the
/// journal replayed and checked after each; returns the replay.
fn random_run(mut m: BlockManager, seed: u64, moves: bool) -> Replay {
    let mut rng = ChaCha8Rng::seed_from_u64(0xe7e7 + seed);
    let mut replay = Replay {
        moves,
        ..Replay::default()
    };
    let stems: Vec<Vec<u32>> = (0..3)
        .map(|_| (0..24).map(|_| rng.random_range(0..4)).collect())
        .collect();
    let mut running: Vec<RequestId> = Vec::new();
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
            &mut m,
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
        if !grant.admitted.is_empty() {
            running.push(RequestId(id));
            step(
                &mut m,
                AllocateStep {
                    computed: vec![ComputedSeq {
                        id: RequestId(id),
                        first_block: 0,
                        tokens: prompt.clone(),
                    }],
                    ..AllocateStep::default()
                },
            );
        }
        replay.apply(m.take_events());
        replay.check(&m, seed);
    }
    replay
}

#[test]
fn the_journal_replayed_is_the_pool_s_cache_after_every_step() {
    for seed in 0..8 {
        let m = BlockManager::new(POOL, BLOCK, true).recording_events();
        let replay = random_run(m, seed, false);
        let (stores, removals) = (replay.stores[&Medium::Pool], replay.removals[&Medium::Pool]);
        assert!(removals > 50 && stores > removals, "{stores} {removals}");
        assert!(!replay.stores.contains_key(&Medium::Host));
    }
}

#[test]
fn host_tier_moves_are_journaled_as_their_medium_s_stores_and_removals() {
    for seed in 0..8 {
        let m = BlockManager::new(POOL, BLOCK, true)
            .with_host_tier(12)
            .recording_events();
        let replay = random_run(m, seed, true);
        let count = |map: &HashMap<Medium, usize>, medium| map.get(&medium).copied().unwrap_or(0);
        // Spills, and entries leaving the tier (loaded back, computed again or dropped).
        let (spills, left) = (
            count(&replay.stores, Medium::Host),
            count(&replay.removals, Medium::Host),
        );
        assert!(spills > 50 && left > 20, "seed {seed}: {spills} {left}");
    }
}

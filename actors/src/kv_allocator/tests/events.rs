//! The prefix cache's journal, replayed as a subscriber to the KV-cache events replays it,
//! agrees with the pool after every step of a random run that evicts: as many live entries
//! as the pool caches, nothing stored twice or removed unseen, and every chain the replay
//! holds whole is one the pool finds.

use super::{step, BlockManager};
use crate::kv_allocator::block_manager::Hit;
use crate::kv_allocator::{CacheEvent, ChainId};
use crate::messages::{AdmitSeq, AllocateStep, ComputedSeq, RequestId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

const BLOCK: usize = 4;
const POOL: u32 = 24;

/// What a subscriber knows: each live entry's parent and tokens.
#[derive(Default)]
struct Replay {
    live: HashMap<ChainId, (ChainId, Vec<u32>)>,
    ever: HashSet<ChainId>,
}

impl Replay {
    fn apply(&mut self, events: Vec<CacheEvent>) {
        for event in events {
            match event {
                CacheEvent::Stored {
                    chain,
                    parent,
                    tokens,
                } => {
                    assert!(self.ever.insert(chain), "{chain:?} stored twice");
                    assert!(
                        parent == ChainId::ROOT || self.ever.contains(&parent),
                        "{chain:?}'s parent was never stored"
                    );
                    assert_eq!(tokens.len(), BLOCK);
                    self.live.insert(chain, (parent, tokens.to_vec()));
                }
                CacheEvent::Removed { chain } => {
                    assert!(self.live.remove(&chain).is_some(), "{chain:?} not live");
                }
            }
        }
    }

    /// The tokens from the start of `chain`, if every block of it is live.
    fn whole(&self, mut chain: ChainId) -> Option<Vec<u32>> {
        let mut blocks = Vec::new();
        while chain != ChainId::ROOT {
            let (parent, tokens) = self.live.get(&chain)?;
            blocks.push(tokens.clone());
            chain = *parent;
        }
        Some(blocks.into_iter().rev().flatten().collect())
    }
}

#[test]
fn the_journal_replayed_is_the_pool_s_cache_after_every_step() {
    for seed in 0..8 {
        let mut rng = ChaCha8Rng::seed_from_u64(0xe7e7 + seed);
        let mut m = BlockManager::new(POOL, BLOCK, true).recording_events();
        let mut replay = Replay::default();
        let stems: Vec<Vec<u32>> = (0..3)
            .map(|_| (0..24).map(|_| rng.random_range(0..4)).collect())
            .collect();
        let mut running: Vec<RequestId> = Vec::new();
        let (mut stores, mut removals) = (0, 0);
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
            let events = m.take_events();
            for event in &events {
                match event {
                    CacheEvent::Stored { .. } => stores += 1,
                    CacheEvent::Removed { .. } => removals += 1,
                }
            }
            replay.apply(events);
            assert_eq!(replay.live.len(), m.usage().cached_blocks);
            for &chain in replay.live.keys() {
                if let Some(tokens) = replay.whole(chain) {
                    let found = m.cached_prefix(&tokens);
                    assert_eq!(found.len(), tokens.len() / BLOCK, "seed {seed}");
                    assert!(
                        matches!(found.last().map(|h| h.at), Some(Hit::Pool { chain: end, .. }) if end == chain)
                    );
                }
            }
        }
        assert!(removals > 50 && stores > removals, "{stores} {removals}");
    }
}

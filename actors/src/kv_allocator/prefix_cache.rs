//! The prefix cache: which block holds which chain of token blocks.
//!
//! A full block's key is (the chain id of the previous block, the block's token ids), and
//! the map compares whole keys, so lookups are exact: two different contents never share an
//! entry, whatever their hashes. A chain id stands for one exact content chain (all the
//! tokens from the start of the sequence to the end of the block): ids are handed out once
//! and never reused, so a key whose parent block was evicted can never be looked up again.
//!
//! With a journal on, every entry made and dropped is also recorded as a [`CacheEvent`],
//! for the KV-cache events routers read (`crate::kv_events`); the block manager adds the
//! host and disk tiers' entries to the same journal ([`PrefixCache::note`]), in the order
//! they happen.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

/// Names one exact content chain of whole blocks; [`ChainId::ROOT`] is the empty chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChainId(u64);

impl ChainId {
    /// The chain before a sequence's first block.
    pub const ROOT: ChainId = ChainId(0);

    /// The id as a number: unique among the chains of one cache, never reused, 0 for
    /// [`ChainId::ROOT`].
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Where an entry's block is: in the pool, in a slot of the host tier below it, or in a
/// slot of the disk tier below both. An entry is in one place in memory at a time, and
/// keeps its chain id as it moves; the disk tier keeps its copy of a block read back, so
/// an entry may be on disk and in memory at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// The KV pool the forwards read.
    Pool,
    /// The host tier (`--kv-host-memory`).
    Host,
    /// The disk tier (`--kv-cache-dir`).
    Disk,
}

/// A change to the cache's entries, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheEvent {
    /// A block in `medium` now holds `tokens` after the chain `parent`; the block ends
    /// `chain`.
    Stored {
        chain: ChainId,
        parent: ChainId,
        tokens: Box<[u32]>,
        medium: Medium,
    },
    /// The entry in `medium` of the block ending `chain` is gone (its block is being
    /// reused, or it moved to another medium).
    Removed { chain: ChainId, medium: Medium },
}

/// A cached block's content: its predecessor chain and its own tokens.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct BlockKey {
    pub(super) parent: ChainId,
    pub(super) tokens: Box<[u32]>,
}

impl BlockKey {
    /// The key of `tokens` after the chain `parent`.
    pub(super) fn new(parent: ChainId, tokens: &[u32]) -> BlockKey {
        BlockKey {
            parent,
            tokens: tokens.into(),
        }
    }
}

/// Where a key's content lives.
#[derive(Clone, Copy, Debug)]
struct Entry {
    block: u32,
    chain: ChainId,
}

/// The map from block content to the block holding it.
pub struct PrefixCache<S = RandomState> {
    map: HashMap<Arc<BlockKey>, Entry, S>,
    /// Per block: its key while it is cached.
    keys: Vec<Option<Arc<BlockKey>>>,
    next_chain: u64,
    /// The changes not yet taken, when recording.
    journal: Option<Vec<CacheEvent>>,
}

impl PrefixCache {
    /// An empty cache for a pool of `num_blocks`.
    pub fn new(num_blocks: u32) -> PrefixCache {
        PrefixCache::with_hasher(num_blocks, RandomState::new())
    }
}

impl<S: BuildHasher> PrefixCache<S> {
    /// An empty cache hashing keys with `hasher` (tests use one where every key collides).
    pub fn with_hasher(num_blocks: u32, hasher: S) -> PrefixCache<S> {
        PrefixCache {
            map: HashMap::with_hasher(hasher),
            keys: vec![None; num_blocks as usize],
            next_chain: 1,
            journal: None,
        }
    }

    /// Starts recording every entry made and dropped (see [`PrefixCache::take_events`]).
    pub fn record_events(&mut self) {
        self.journal.get_or_insert_with(Vec::new);
    }

    /// The changes recorded since the last call, oldest first (none when not recording).
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        self.journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Appends `event` to the journal, when recording (the host and disk tiers' changes).
    pub(super) fn note(&mut self, event: impl FnOnce() -> CacheEvent) {
        if let Some(journal) = &mut self.journal {
            journal.push(event());
        }
    }

    /// Whether changes are being recorded.
    pub(super) fn is_recording(&self) -> bool {
        self.journal.is_some()
    }

    /// A chain id never handed out before (for an entry made here, or one the disk tier
    /// finds at start-up).
    pub(super) fn new_chain(&mut self) -> ChainId {
        let chain = ChainId(self.next_chain);
        self.next_chain += 1;
        chain
    }

    /// Blocks holding an entry.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The block holding `tokens` after the chain `parent`, and the chain it ends.
    pub fn lookup(&self, parent: ChainId, tokens: &[u32]) -> Option<(u32, ChainId)> {
        let key = BlockKey::new(parent, tokens);
        self.map.get(&key).map(|e| (e.block, e.chain))
    }

    /// Records that `block` holds `tokens` after the chain `parent`, and returns the chain
    /// the block ends. When another block already holds that content, the cache keeps that
    /// one, `block` stays uncached, and the existing chain is returned.
    /// A block outside the pool is not cached, and the chain returned then names nothing,
    /// so no later lookup can pass through it.
    #[cfg(test)]
    pub fn insert(&mut self, parent: ChainId, tokens: &[u32], block: u32) -> ChainId {
        self.insert_new(parent, tokens, block, None).0
    }

    /// [`PrefixCache::insert`], a new entry taking the chain id `id` where one is given
    /// (that of the disk tier's entry for the same content, which no entry in memory has)
    /// and a fresh one otherwise; and whether it made a new entry.
    pub(super) fn insert_new(
        &mut self,
        parent: ChainId,
        tokens: &[u32],
        block: u32,
        id: Option<ChainId>,
    ) -> (ChainId, bool) {
        let key = BlockKey::new(parent, tokens);
        if let Some(existing) = self.map.get(&key) {
            return (existing.chain, false);
        }
        let chain = id.unwrap_or_else(|| self.new_chain());
        let created = self.place(Arc::new(key), chain, block);
        (chain, created)
    }

    /// Puts the entry `key`, ending `chain`, back into `block` (brought back from a tier
    /// below the pool, its chain id kept); false for a block outside the pool.
    pub(super) fn place(&mut self, key: Arc<BlockKey>, chain: ChainId, block: u32) -> bool {
        self.evict(block);
        let Some(slot) = self.keys.get_mut(block as usize) else {
            return false;
        };
        *slot = Some(key.clone());
        if let Some(journal) = &mut self.journal {
            journal.push(CacheEvent::Stored {
                chain,
                parent: key.parent,
                tokens: key.tokens.clone(),
                medium: Medium::Pool,
            });
        }
        self.map.insert(key, Entry { block, chain });
        true
    }

    /// Forgets what `block` holds (it is about to be overwritten), and returns the entry
    /// it held: its key and the chain it ended.
    pub(super) fn evict(&mut self, block: u32) -> Option<(Arc<BlockKey>, ChainId)> {
        let key = self.keys.get_mut(block as usize).and_then(Option::take)?;
        let entry = self.map.remove(&key)?;
        if let Some(journal) = &mut self.journal {
            journal.push(CacheEvent::Removed {
                chain: entry.chain,
                medium: Medium::Pool,
            });
        }
        Some((key, entry.chain))
    }

    /// Each entry's parent chain (for the host tier's child counts).
    pub(super) fn parents(&self) -> impl Iterator<Item = ChainId> + '_ {
        self.map.keys().map(|k| k.parent)
    }

    /// Whether `block` is in the cache.
    pub fn is_cached(&self, block: u32) -> bool {
        self.keys.get(block as usize).is_some_and(Option::is_some)
    }

    /// Checks that the map and the per-block keys agree and that chain ids are unique.
    pub fn check(&self) -> Result<(), String> {
        let mut chains = std::collections::HashSet::new();
        for (key, entry) in &self.map {
            match self.keys.get(entry.block as usize) {
                Some(Some(k)) if Arc::ptr_eq(k, key) => {}
                _ => {
                    return Err(format!(
                        "prefix cache: the map names block {} but the block does not hold that key",
                        entry.block
                    ))
                }
            }
            if entry.chain == ChainId::ROOT || entry.chain.0 >= self.next_chain {
                return Err(format!(
                    "prefix cache: block {} has chain id {} that was never handed out",
                    entry.block, entry.chain.0
                ));
            }
            if !chains.insert(entry.chain) {
                return Err(format!(
                    "prefix cache: chain id {} is used twice",
                    entry.chain.0
                ));
            }
        }
        let cached = self.keys.iter().filter(|k| k.is_some()).count();
        if cached != self.map.len() {
            return Err(format!(
                "prefix cache: {cached} blocks hold keys but the map has {} entries",
                self.map.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{CacheEvent, ChainId, Medium, PrefixCache};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::hash::{BuildHasherDefault, Hasher};

    /// A hasher under which every key collides.
    #[derive(Default)]
    struct Constant;

    impl Hasher for Constant {
        fn finish(&self) -> u64 {
            7
        }
        fn write(&mut self, _bytes: &[u8]) {}
    }

    #[test]
    fn lookups_are_exact_when_every_hash_collides() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_c011);
        let mut cache = PrefixCache::with_hasher(64, BuildHasherDefault::<Constant>::default());
        let mut inserted = Vec::new();
        let mut parent = ChainId::ROOT;
        for block in 0..32u32 {
            let tokens: Vec<u32> = (0..4).map(|_| rng.random_range(0..3)).collect();
            let chain = cache.insert(parent, &tokens, block);
            if cache.is_cached(block) {
                inserted.push((parent, tokens, block, chain));
            }
            parent = chain;
        }
        cache.check().unwrap();
        assert!(inserted.len() > 1);
        for (parent, tokens, block, chain) in &inserted {
            assert_eq!(cache.lookup(*parent, tokens), Some((*block, *chain)));
            let mut other = tokens.clone();
            other[3] = 99;
            assert_eq!(cache.lookup(*parent, &other), None);
        }
    }

    #[test]
    fn the_parent_chain_is_part_of_the_key() {
        let mut cache = PrefixCache::new(4);
        let a = cache.insert(ChainId::ROOT, &[1, 2], 0);
        let b = cache.insert(a, &[3, 4], 1);
        assert_eq!(cache.lookup(a, &[3, 4]), Some((1, b)));
        assert_eq!(cache.lookup(ChainId::ROOT, &[3, 4]), None);
        assert_eq!(cache.lookup(b, &[3, 4]), None);
    }

    #[test]
    fn a_duplicate_content_keeps_the_first_block_and_its_chain() {
        let mut cache = PrefixCache::new(4);
        let first = cache.insert(ChainId::ROOT, &[1, 2], 0);
        assert_eq!(cache.insert(ChainId::ROOT, &[1, 2], 3), first);
        assert!(!cache.is_cached(3));
        assert_eq!(cache.lookup(ChainId::ROOT, &[1, 2]), Some((0, first)));
        cache.check().unwrap();
    }

    #[test]
    fn an_evicted_parent_makes_its_children_unreachable() {
        let mut cache = PrefixCache::new(4);
        let a = cache.insert(ChainId::ROOT, &[1, 2], 0);
        cache.insert(a, &[3, 4], 1);
        cache.evict(0);
        assert_eq!(cache.lookup(ChainId::ROOT, &[1, 2]), None);
        let a2 = cache.insert(ChainId::ROOT, &[1, 2], 2);
        assert_ne!(a2, a);
        assert_eq!(cache.lookup(a2, &[3, 4]), None);
        cache.check().unwrap();
    }

    #[test]
    fn the_journal_records_each_entry_made_and_dropped_once() {
        let mut cache = PrefixCache::new(4);
        cache.insert(ChainId::ROOT, &[9], 0);
        assert!(cache.take_events().is_empty(), "not recording yet");
        cache.record_events();
        let a = cache.insert(ChainId::ROOT, &[1, 2], 1);
        let b = cache.insert(a, &[3, 4], 2);
        // The same content again, in another block: no entry, no event.
        assert_eq!(cache.insert(ChainId::ROOT, &[1, 2], 3), a);
        cache.evict(1);
        cache.evict(1);
        cache.evict(3);
        assert_eq!(
            cache.take_events(),
            vec![
                CacheEvent::Stored {
                    chain: a,
                    parent: ChainId::ROOT,
                    tokens: [1, 2].into(),
                    medium: Medium::Pool,
                },
                CacheEvent::Stored {
                    chain: b,
                    parent: a,
                    tokens: [3, 4].into(),
                    medium: Medium::Pool,
                },
                CacheEvent::Removed {
                    chain: a,
                    medium: Medium::Pool,
                },
            ]
        );
        assert!(cache.take_events().is_empty());
        assert_eq!(cache.len(), 2);
    }
}

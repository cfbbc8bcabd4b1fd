//! The host tier below the pool: prefix-cache entries whose pool block was reused, kept in
//! slots of host memory instead of dropped, and found again by the same exact key (the
//! parent chain id and the block's tokens) with the same chain id, so that a chain may run
//! on through pool and host entries in any order.
//!
//! This is the index only; the bytes live with the backend that owns the pool, which
//! copies a block into its slot ([`KvMove::Spill`]) and back ([`KvMove::Load`]) in the
//! order the allocator gives the moves, before the step that follows them.
//!
//! A full tier drops its least recently spilled *leaf*: an entry no other entry (in the
//! pool or here) continues, so a chain loses its end first and never a middle block whose
//! descendants would stay behind unreachable. When every entry here has descendants, the
//! block being spilled is dropped instead. A slot given up (loaded back into the pool, or
//! its content computed again there) may take a spill in the same step: the moves run in
//! the order given, so its load has read it by then.

use super::prefix_cache::{BlockKey, ChainId};
use crate::messages::{KvMove, KvSource};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// A prefix-cache entry leaving memory: its key, the chain it ends, and where its bytes
/// are until the moves that follow overwrite them.
pub struct Leaving {
    pub key: Arc<BlockKey>,
    pub chain: ChainId,
    pub from: KvSource,
}

/// One entry in a slot.
#[derive(Clone, Debug)]
struct Held {
    key: Arc<BlockKey>,
    chain: ChainId,
    /// When it was spilled (its order among the leaves).
    stamp: u64,
}

/// The host tier's index.
pub struct HostTier {
    /// Key -> the slot holding it.
    map: HashMap<Arc<BlockKey>, u32>,
    /// Chain id -> the slot holding the entry that ends it.
    by_chain: HashMap<ChainId, u32>,
    /// Per slot: what it holds.
    slots: Vec<Option<Held>>,
    /// Empty slots, ready for a spill.
    free: Vec<u32>,
    /// The leaves here, by spill stamp: the order they are dropped in.
    leaves: BTreeMap<u64, u32>,
    /// Slots kept from being dropped until taken.
    pinned: HashSet<u32>,
    /// Per chain id: how many entries (in the pool or here) continue it.
    children: HashMap<ChainId, u32>,
    clock: u64,
    /// Blocks spilled, loaded back and dropped, cumulative.
    pub(super) spilled: u64,
    pub(super) loaded: u64,
    pub(super) dropped: u64,
}

impl HostTier {
    /// An empty tier of `slots` blocks.
    pub fn new(slots: u32) -> HostTier {
        HostTier {
            map: HashMap::new(),
            by_chain: HashMap::new(),
            slots: vec![None; slots as usize],
            free: (0..slots).rev().collect(),
            leaves: BTreeMap::new(),
            pinned: HashSet::new(),
            children: HashMap::new(),
            clock: 0,
            spilled: 0,
            loaded: 0,
            dropped: 0,
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The slot holding `tokens` after the chain `parent`, and the chain it ends.
    pub fn lookup(&self, parent: ChainId, tokens: &[u32]) -> Option<(u32, ChainId)> {
        let slot = *self.map.get(&BlockKey::new(parent, tokens))?;
        let held = self.slots[slot as usize].as_ref()?;
        Some((slot, held.chain))
    }

    /// A new entry (in the pool) continues `parent`.
    pub fn child_added(&mut self, parent: ChainId) {
        let count = self.children.entry(parent).or_insert(0);
        *count += 1;
        if *count == 1 {
            if let Some(stamp) = self.stamp_of(parent) {
                self.leaves.remove(&stamp);
            }
        }
    }

    /// An entry continuing `parent` is gone from both tiers.
    pub fn child_removed(&mut self, parent: ChainId) {
        let Some(count) = self.children.get_mut(&parent) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            self.children.remove(&parent);
            if let (Some(stamp), Some(&slot)) = (self.stamp_of(parent), self.by_chain.get(&parent))
            {
                if !self.pinned.contains(&slot) {
                    self.leaves.insert(stamp, slot);
                }
            }
        }
    }

    /// Takes the entry `key` (ending `chain`) of a pool block about to be reused into a
    /// slot, making room by dropping the oldest leaf if the tier is full, and returns the
    /// copy to make (`None` when no slot can be had: the entry is dropped, its parent
    /// loses a child) and the entry that leaves memory for it, if one does (the dropped
    /// leaf, or the entry itself), for a tier below: its copy must be made before this one.
    pub fn spill(
        &mut self,
        key: Arc<BlockKey>,
        chain: ChainId,
        block: u32,
    ) -> (Option<KvMove>, Option<Leaving>) {
        let (slot, leaving) = match self.free.pop() {
            Some(slot) => (slot, None),
            None => match self.drop_oldest_leaf() {
                Some((slot, held)) => (
                    slot,
                    Some(Leaving {
                        key: held.key,
                        chain: held.chain,
                        from: KvSource::Host(slot),
                    }),
                ),
                None => {
                    self.child_removed(key.parent);
                    self.dropped += 1;
                    let from = KvSource::Pool(block);
                    return (None, Some(Leaving { key, chain, from }));
                }
            },
        };
        self.clock += 1;
        let stamp = self.clock;
        if !self.children.contains_key(&chain) {
            self.leaves.insert(stamp, slot);
        }
        self.map.insert(key.clone(), slot);
        self.by_chain.insert(chain, slot);
        self.slots[slot as usize] = Some(Held { key, chain, stamp });
        self.spilled += 1;
        (Some(KvMove::Spill { block, slot }), leaving)
    }

    /// Takes `slot`'s entry out of the tier to go back into the pool (loaded, or computed
    /// again there): its key and chain. The slot is free again.
    pub fn take(&mut self, slot: u32) -> Option<(Arc<BlockKey>, ChainId)> {
        let held = self.slots.get_mut(slot as usize)?.take()?;
        self.map.remove(&held.key);
        self.by_chain.remove(&held.chain);
        self.leaves.remove(&held.stamp);
        self.pinned.remove(&slot);
        self.free.push(slot);
        Some((held.key, held.chain))
    }

    /// Keeps `slots` from being dropped until they are taken (a sequence admitted with them
    /// in its prefix); they leave the leaves.
    pub fn pin(&mut self, slots: &[u32]) {
        for &slot in slots {
            if let Some(held) = &self.slots[slot as usize] {
                self.leaves.remove(&held.stamp);
                self.pinned.insert(slot);
            }
        }
    }

    /// Checks that the index agrees with itself: each slot is free or held, once; the maps name exactly the held slots; the leaves are exactly the held,
    /// unpinned entries that nothing continues; and `children` counts what `counted`
    /// gives (every entry's parent, over the pool's and this tier's entries).
    pub fn check(&self, counted: &HashMap<ChainId, u32>) -> Result<(), String> {
        let mut seen = vec![false; self.slots.len()];
        for &slot in &self.free {
            let at = slot as usize;
            if at >= seen.len() || seen[at] || self.slots[at].is_some() {
                return Err(format!("host tier: slot {slot} is free twice or also held"));
            }
            seen[at] = true;
        }
        let held = self.slots.iter().filter(|s| s.is_some()).count();
        if held + self.free.len() != self.slots.len() {
            return Err(format!(
                "host tier: {held} held + {} free != {} slots",
                self.free.len(),
                self.slots.len()
            ));
        }
        if self.map.len() != held || self.by_chain.len() != held {
            return Err(format!(
                "host tier: {held} slots held but {} keys and {} chains indexed",
                self.map.len(),
                self.by_chain.len()
            ));
        }
        for (slot, h) in self.slots.iter().enumerate() {
            let Some(h) = h else { continue };
            let slot = slot as u32;
            if self.map.get(&h.key) != Some(&slot) || self.by_chain.get(&h.chain) != Some(&slot) {
                return Err(format!(
                    "host tier: slot {slot}'s entry is not indexed to it"
                ));
            }
            let leaf = !self.children.contains_key(&h.chain) && !self.pinned.contains(&slot);
            if leaf != (self.leaves.get(&h.stamp) == Some(&slot)) {
                return Err(format!(
                    "host tier: slot {slot} is a leaf = {leaf} but listed otherwise"
                ));
            }
        }
        if self.leaves.len()
            != self
                .slots
                .iter()
                .flatten()
                .filter(|h| self.leaves.contains_key(&h.stamp))
                .count()
        {
            return Err("host tier: a leaf names no held entry".into());
        }
        if &self.children != counted {
            return Err(format!(
                "host tier: child counts {:?} but the entries give {counted:?}",
                self.children
            ));
        }
        Ok(())
    }

    /// Each held entry's parent chain (for the child counts).
    pub fn parents(&self) -> impl Iterator<Item = ChainId> + '_ {
        self.slots.iter().flatten().map(|h| h.key.parent)
    }

    /// Drops the oldest leaf and returns its slot and what it held.
    fn drop_oldest_leaf(&mut self) -> Option<(u32, Held)> {
        let (_, slot) = self.leaves.pop_first()?;
        let held = self.slots[slot as usize].take()?;
        self.map.remove(&held.key);
        self.by_chain.remove(&held.chain);
        self.dropped += 1;
        self.child_removed(held.key.parent);
        Some((slot, held))
    }

    /// The spill stamp of the entry here ending `chain`, if one is here.
    fn stamp_of(&self, chain: ChainId) -> Option<u64> {
        let slot = *self.by_chain.get(&chain)?;
        self.slots[slot as usize].as_ref().map(|h| h.stamp)
    }
}

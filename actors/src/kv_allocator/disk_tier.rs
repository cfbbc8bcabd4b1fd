//! The disk tier below the pool (and the host tier, where there is one): prefix-cache
//! entries that leave memory are written to slots of the model's file under
//! `--kv-cache-dir` (`crate::kv_disk`), named by their content chain hash, and found again
//! by it, in this process or after a restart.
//!
//! This is the index only; the backend that owns the pool writes a block into its slot
//! ([`KvMove::DiskWrite`]) and reads it back, checked ([`KvMove::DiskRead`]), in the order
//! the allocator gives the moves. A block read back into the pool stays on disk too (the
//! tier is a cache of contents, not a place blocks move to), so a block leaving memory
//! again whose content is here is not written twice.
//!
//! A full tier drops its least recently used *leaf*: an entry no other entry here
//! continues, so a chain loses its end first. A slot read in a step is pinned until the
//! step's moves are given, so the same step's writes never reuse it.
//!
//! Each entry keeps the chain id it had in memory when it was written, which KV events
//! name it by and which it takes again when it comes back into the pool. An entry found at
//! start-up gets a fresh id when its parent is the root or an entry found with it, and
//! otherwise none until its content enters the pool after a parent that has one (no event
//! can name it before: a subscriber could not place it without its parent).

use super::prefix_cache::{CacheEvent, ChainId, Medium};
use crate::kv_disk::{ContentHash, FoundBlock, ROOT_HASH};
use std::collections::{BTreeMap, HashMap, HashSet};

/// One entry in a slot.
#[derive(Clone, Debug)]
struct Held {
    chain: ContentHash,
    parent: ContentHash,
    /// The chain id events name it by, where it has one.
    id: Option<ChainId>,
    /// When it was last written or read (its order among the leaves).
    stamp: u64,
}

/// The disk tier's index.
pub struct DiskTier {
    /// Chain -> the slot holding it.
    map: HashMap<ContentHash, u64>,
    /// Per slot: what it holds.
    slots: Vec<Option<Held>>,
    /// Empty slots, ready for a write.
    free: Vec<u64>,
    /// The leaves, by stamp: the order they are dropped in.
    leaves: BTreeMap<u64, u64>,
    /// Per chain: how many entries here continue it.
    children: HashMap<ContentHash, u32>,
    /// Slots read this step, kept from being dropped.
    pinned: HashSet<u64>,
    clock: u64,
    /// The stores announcing the entries found at start-up, parents first, until a
    /// journal takes them ([`DiskTier::take_found`]).
    found: Vec<CacheEvent>,
    /// Blocks written, read back and dropped, cumulative.
    pub(super) written: u64,
    pub(super) read: u64,
    pub(super) dropped: u64,
}

impl DiskTier {
    /// A tier of `slots` holding the blocks `found` (the file's records, checked), the
    /// lowest slots oldest, each whose chain starts on disk with an id from `new_chain`.
    pub fn new(
        slots: u64,
        found: &[FoundBlock],
        mut new_chain: impl FnMut() -> ChainId,
    ) -> DiskTier {
        let mut tier = DiskTier {
            map: HashMap::new(),
            slots: vec![None; slots as usize],
            free: Vec::new(),
            leaves: BTreeMap::new(),
            children: HashMap::new(),
            pinned: HashSet::new(),
            clock: 0,
            found: Vec::new(),
            written: 0,
            read: 0,
            dropped: 0,
        };
        // Per parent chain, the blocks held that continue it.
        let mut continuing: HashMap<ContentHash, Vec<&FoundBlock>> = HashMap::new();
        for f in found {
            let fits = (f.slot as usize) < tier.slots.len();
            if fits && tier.slots[f.slot as usize].is_none() && !tier.map.contains_key(&f.chain) {
                tier.hold(f.slot, f.chain, f.parent, None);
                continuing.entry(f.parent).or_default().push(f);
            }
        }
        // Ids from the root down, depth first: a parent is announced before its children,
        // and a chain's stores run in order.
        let roots = continuing.remove(&ROOT_HASH).into_iter().flatten();
        let mut reached: Vec<(&FoundBlock, ChainId)> = roots.map(|f| (f, ChainId::ROOT)).collect();
        while let Some((f, parent)) = reached.pop() {
            let id = new_chain();
            if let Some(held) = tier.slots[f.slot as usize].as_mut() {
                held.id = Some(id);
            }
            tier.found.push(CacheEvent::Stored {
                chain: id,
                parent,
                tokens: f.tokens.as_slice().into(),
                medium: Medium::Disk,
            });
            let next = continuing.remove(&f.chain).into_iter().flatten();
            reached.extend(next.map(|child| (child, id)));
        }
        tier.free = (0..slots)
            .rev()
            .filter(|&s| tier.slots[s as usize].is_none())
            .collect();
        tier
    }

    /// The stores announcing the entries found at start-up (see [`DiskTier::new`]), once.
    pub fn take_found(&mut self) -> Vec<CacheEvent> {
        std::mem::take(&mut self.found)
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the block ending `chain` is here.
    pub fn contains(&self, chain: &ContentHash) -> bool {
        self.map.contains_key(chain)
    }

    /// The slot holding the block ending `chain`, and its chain id where it has one.
    pub fn lookup(&self, chain: &ContentHash) -> Option<(u64, Option<ChainId>)> {
        let slot = *self.map.get(chain)?;
        let held = self.slots[slot as usize].as_ref()?;
        Some((slot, held.id))
    }

    /// Gives the entry in `slot`, held under no chain id, the id `id`.
    pub fn name(&mut self, slot: u64, id: ChainId) {
        if let Some(held) = self.slots[slot as usize].as_mut() {
            held.id.get_or_insert(id);
        }
    }

    /// The chain ids of the entries held that have one.
    #[cfg(test)]
    pub fn ids(&self) -> impl Iterator<Item = ChainId> + '_ {
        self.slots.iter().flatten().filter_map(|h| h.id)
    }

    /// Marks `slot` read this step: most recently used, and pinned until
    /// [`DiskTier::unpin_all`].
    pub fn read_from(&mut self, slot: u64) {
        self.read += 1;
        self.pinned.insert(slot);
        self.clock += 1;
        let stamp = self.clock;
        let Some(held) = self.slots[slot as usize].as_mut() else {
            return;
        };
        let old = std::mem::replace(&mut held.stamp, stamp);
        if self.leaves.remove(&old).is_some() {
            self.leaves.insert(stamp, slot);
        }
    }

    /// Forgets what `slot` holds (a read of it failed its checks): the slot is free again,
    /// and what continued it here can no longer be reached. Returns the chain id of the
    /// entry forgotten, where it had one.
    pub fn forget(&mut self, slot: u64) -> Option<ChainId> {
        let held = self.slots.get_mut(slot as usize).and_then(Option::take)?;
        self.leaves.remove(&held.stamp);
        self.map.remove(&held.chain);
        self.dropped += 1;
        self.release_parent(&held.parent);
        self.free.push(slot);
        held.id
    }

    /// Ends the step's pins.
    pub fn unpin_all(&mut self) {
        self.pinned.clear();
    }

    /// A slot for the block ending `chain` after `parent`, whose chain id is `id`, making
    /// room by dropping the least recently used unpinned leaf; `None` when none can be
    /// had. With the slot comes the chain id of the leaf dropped for it, where it had one.
    pub fn store(
        &mut self,
        chain: ContentHash,
        parent: ContentHash,
        id: ChainId,
    ) -> Option<(u64, Option<ChainId>)> {
        let (slot, dropped) = match self.free.pop() {
            Some(slot) => (slot, None),
            None => self.drop_oldest_leaf()?,
        };
        self.hold(slot, chain, parent, Some(id));
        self.written += 1;
        Some((slot, dropped))
    }

    /// Checks that the index agrees with itself: each slot free or held once, the map
    /// naming exactly the held slots, the leaves exactly the held entries nothing here
    /// continues, the child counts those of the held entries' parents, and no chain id
    /// held twice.
    pub fn check(&self) -> Result<(), String> {
        let held = self.slots.iter().flatten().count();
        if held + self.free.len() != self.slots.len() || self.map.len() != held {
            return Err(format!(
                "disk tier: {held} held, {} free, {} indexed, {} slots",
                self.free.len(),
                self.map.len(),
                self.slots.len()
            ));
        }
        let mut counted: HashMap<ContentHash, u32> = HashMap::new();
        for h in self.slots.iter().flatten() {
            *counted.entry(h.parent).or_insert(0) += 1;
        }
        if counted != self.children {
            return Err("disk tier: child counts disagree with the entries".into());
        }
        for (slot, h) in self.slots.iter().enumerate() {
            let Some(h) = h else { continue };
            let slot = slot as u64;
            if self.map.get(&h.chain) != Some(&slot) {
                return Err(format!(
                    "disk tier: slot {slot} is not indexed to its chain"
                ));
            }
            let leaf = !self.children.contains_key(&h.chain);
            if leaf != (self.leaves.get(&h.stamp) == Some(&slot)) {
                return Err(format!(
                    "disk tier: slot {slot} is a leaf = {leaf}, listed otherwise"
                ));
            }
        }
        for &slot in &self.free {
            if self.slots.get(slot as usize).is_none_or(Option::is_some) {
                return Err(format!("disk tier: free slot {slot} is held or outside"));
            }
        }
        let mut ids = HashSet::new();
        for id in self.slots.iter().flatten().filter_map(|h| h.id) {
            if !ids.insert(id) {
                return Err(format!("disk tier: chain id {} is held twice", id.get()));
            }
        }
        Ok(())
    }

    /// Records `slot` as holding `chain` after `parent`, under `id`, most recently used.
    fn hold(&mut self, slot: u64, chain: ContentHash, parent: ContentHash, id: Option<ChainId>) {
        self.clock += 1;
        let stamp = self.clock;
        *self.children.entry(parent).or_insert(0) += 1;
        if let Some(&p) = self.map.get(&parent) {
            if let Some(h) = &self.slots[p as usize] {
                self.leaves.remove(&h.stamp);
            }
        }
        if !self.children.contains_key(&chain) {
            self.leaves.insert(stamp, slot);
        }
        self.map.insert(chain, slot);
        self.slots[slot as usize] = Some(Held {
            chain,
            parent,
            id,
            stamp,
        });
    }

    /// Drops the least recently used unpinned leaf and returns its slot and chain id.
    fn drop_oldest_leaf(&mut self) -> Option<(u64, Option<ChainId>)> {
        let (&stamp, &slot) = self.leaves.iter().find(|(_, s)| !self.pinned.contains(s))?;
        self.leaves.remove(&stamp);
        let held = self.slots[slot as usize].take()?;
        self.map.remove(&held.chain);
        self.dropped += 1;
        self.release_parent(&held.parent);
        Some((slot, held.id))
    }

    /// One entry continuing `parent` is gone: the parent, if here, may become a leaf.
    fn release_parent(&mut self, parent: &ContentHash) {
        let Some(count) = self.children.get_mut(parent) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            self.children.remove(parent);
            if let Some(&p) = self.map.get(parent) {
                if let Some(h) = &self.slots[p as usize] {
                    self.leaves.insert(h.stamp, p);
                }
            }
        }
    }
}

//! The block pool's state and the operations on it: taking free blocks (evicting what they
//! cached), sharing cached blocks, releasing a sequence, registering computed blocks.
//! What one `AllocateStep` does with them is in `step.rs`, `grow.rs` and `admit.rs`.

use super::disk_tier::DiskTier;
use super::free_queue::FreeQueue;
use super::host_tier::{HostTier, Leaving};
use super::prefix_cache::{CacheEvent, ChainId, Medium, PrefixCache};
use crate::kv_disk::{chain_hash, ContentHash, FailedReads, FoundBlock, ROOT_HASH};
use crate::messages::{KvMove, KvSource, KvUsage, RequestId};
use std::collections::HashMap;
use std::sync::Arc;

/// The KV blocks of one pool: per-sequence block tables, reference counts (a block shared
/// through the prefix cache counts each owner), the free blocks in LRU order, and the
/// prefix cache. Synchronous; the [`KvAllocator`](super::KvAllocator) actor owns one.
pub struct BlockManager {
    /// Tokens per block.
    pub(super) block_size: usize,
    /// Per block: how many block tables hold it.
    pub(super) ref_counts: Vec<u32>,
    /// The blocks with no owner, in reuse order.
    pub(super) free: FreeQueue,
    /// `None` when prefix caching is off.
    pub(super) cache: Option<PrefixCache>,
    /// The tier below the pool, where one is kept (with prefix caching only).
    pub(super) host: Option<HostTier>,
    /// The tier below both, on disk, where one is kept (with prefix caching only).
    pub(super) disk: Option<DiskTier>,
    /// Where the backend reports disk reads that failed their checks.
    pub(super) failed_reads: Option<Arc<FailedReads>>,
    /// With a disk tier: per chain with an entry in memory (pool or host), the content
    /// chain hash of its parent (an entry's own is that and its tokens'), for writing it
    /// to disk when it leaves memory.
    pub(super) lineage: HashMap<ChainId, ContentHash>,
    /// The copies this step's allocation needs, in order.
    pub(super) moves: Vec<KvMove>,
    /// The sequences holding blocks.
    pub(super) seqs: HashMap<RequestId, SeqBlocks>,
    /// Tokens looked up in the prefix cache, cumulative.
    pub(super) prefix_queries: u64,
    /// Tokens found in the prefix cache, cumulative.
    pub(super) prefix_hits: u64,
    /// Prompt blocks found in the pool, cumulative.
    pub(super) pool_hits: u64,
    /// Bytes of one block over every layer, for the usage report.
    block_bytes: u64,
    /// A prefix hit leaves its last block to be computed again (see
    /// [`BlockManager::recomputing_last_hit`]).
    pub(super) recompute_last_hit: bool,
}

/// One sequence's blocks.
pub(super) struct SeqBlocks {
    /// The block ids, in sequence order.
    pub(super) table: Vec<u32>,
    /// Leading blocks whose content chain is known: found in the cache or registered from
    /// `computed`. The blocks after them are this sequence's alone and not cached.
    pub(super) num_registered: usize,
    /// The chain those leading blocks end.
    pub(super) chain: ChainId,
    /// That chain's content hash (kept with a disk tier only; else the root's).
    pub(super) content: ContentHash,
}

impl BlockManager {
    /// A pool of `num_blocks` free blocks of `block_size` tokens each, with prefix caching
    /// on or off.
    ///
    /// # Panics
    /// If `block_size` is 0 (the configuration refuses it before this point).
    pub fn new(num_blocks: u32, block_size: usize, prefix_caching: bool) -> BlockManager {
        assert!(block_size > 0, "the KV block size must be at least 1 token");
        BlockManager {
            block_size,
            ref_counts: vec![0; num_blocks as usize],
            free: FreeQueue::new(num_blocks),
            cache: prefix_caching.then(|| PrefixCache::new(num_blocks)),
            host: None,
            disk: None,
            failed_reads: None,
            lineage: HashMap::new(),
            moves: Vec::new(),
            seqs: HashMap::new(),
            prefix_queries: 0,
            prefix_hits: 0,
            pool_hits: 0,
            block_bytes: 0,
            recompute_last_hit: false,
        }
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> u32 {
        // The pool was built from a u32 count.
        self.ref_counts.len() as u32
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks owned by no sequence (cached or not).
    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// A sequence's block table, if it holds blocks.
    pub fn block_table(&self, id: RequestId) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| s.table.as_slice())
    }

    /// How many sequences hold `block` (None outside the pool).
    pub fn ref_count(&self, block: u32) -> Option<u32> {
        self.ref_counts.get(block as usize).copied()
    }

    /// The pool's state now.
    pub fn usage(&self) -> KvUsage {
        KvUsage {
            num_blocks: self.ref_counts.len(),
            used_blocks: self.ref_counts.len() - self.free.len(),
            max_block_id_in_use: self
                .seqs
                .values()
                .flat_map(|s| s.table.iter())
                .max()
                .copied(),
            prefix_queries: self.prefix_queries,
            prefix_hits: self.prefix_hits,
            cached_blocks: self.cache.as_ref().map_or(0, PrefixCache::len),
            pool_hit_blocks: self.pool_hits,
            block_bytes: self.block_bytes,
            host_blocks: self.host.as_ref().map_or(0, HostTier::len),
            host_spilled: self.host.as_ref().map_or(0, |h| h.spilled),
            host_loaded: self.host.as_ref().map_or(0, |h| h.loaded),
            host_dropped: self.host.as_ref().map_or(0, |h| h.dropped),
            disk_blocks: self.disk.as_ref().map_or(0, DiskTier::len),
            disk_written: self.disk.as_ref().map_or(0, |d| d.written),
            disk_read: self.disk.as_ref().map_or(0, |d| d.read),
            disk_dropped: self.disk.as_ref().map_or(0, |d| d.dropped),
        }
    }

    /// Blocks needed to hold `tokens` tokens.
    pub(super) fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// The same manager, whose prefix hits leave their last block to be computed again:
    /// an EAGLE-3 head drafts from the target's features at the position before the first
    /// token it computes, which a hit's last cached position would not have (vLLM does the
    /// same for EAGLE). The head's KV of the earlier cached blocks is in the shared blocks.
    pub fn recomputing_last_hit(mut self) -> BlockManager {
        self.recompute_last_hit = true;
        self
    }

    /// The same manager, reporting each tier's bytes as `bytes` a block (see
    /// [`KvUsage::block_bytes`]).
    pub fn with_block_bytes(mut self, bytes: u64) -> BlockManager {
        self.block_bytes = bytes;
        self
    }

    /// The same manager, whose prefix cache records every entry it makes and drops, for
    /// [`BlockManager::take_events`] (nothing is recorded with prefix caching off); the
    /// first events are the stores of the entries a disk tier found at start-up.
    pub fn recording_events(mut self) -> BlockManager {
        if let Some(cache) = &mut self.cache {
            cache.record_events();
        }
        self.announce_found();
        self
    }

    /// The same manager, whose prefix-cache entries go down to a host tier of
    /// `slots` blocks when their pool block is reused, and come back from it
    /// ([`HostTier`]); nothing changes with prefix caching off or no slots.
    pub fn with_host_tier(mut self, slots: u32) -> BlockManager {
        if self.cache.is_some() && slots > 0 {
            self.host = Some(HostTier::new(slots));
        }
        self
    }

    /// The same manager, whose prefix-cache entries leaving memory (dropped by the host
    /// tier, or evicted from the pool where there is none) are written to a disk tier of
    /// `slots` holding the blocks `found` at start-up, and read back from it
    /// ([`DiskTier`]); nothing changes with prefix caching off or no slots.
    pub fn with_disk_tier(mut self, slots: u64, found: &[FoundBlock]) -> BlockManager {
        if let Some(cache) = self.cache.as_mut().filter(|_| slots > 0) {
            self.disk = Some(DiskTier::new(slots, found, || cache.new_chain()));
        }
        self.announce_found();
        self
    }

    /// Journals the stores of the entries the disk tier found at start-up, once the prefix
    /// cache records (whichever of [`BlockManager::recording_events`] and
    /// [`BlockManager::with_disk_tier`] comes last; the first step drops them otherwise).
    fn announce_found(&mut self) {
        let (Some(cache), Some(disk)) = (&mut self.cache, &mut self.disk) else {
            return;
        };
        if cache.is_recording() {
            for event in disk.take_found() {
                cache.note(|| event);
            }
        }
    }

    /// The same manager, told by `failed` of the disk reads that failed their checks (see
    /// [`BlockManager::forget_failed_reads`]).
    pub fn with_failed_reads(mut self, failed: Arc<FailedReads>) -> BlockManager {
        self.failed_reads = Some(failed);
        self
    }

    /// Forgets the disk slots whose reads failed their checks and the prefix-cache entries
    /// of the pool blocks they were to fill (entered when the reads were granted; they hold
    /// nothing valid), so later prompts miss them. Called before a step's other work: the
    /// step that made the reads failed, and its sequences are being freed (a step is
    /// granted only after the one before it ran, so no grant since has shared the blocks).
    pub(super) fn forget_failed_reads(&mut self) {
        let Some(failed) = self.failed_reads.as_ref().map(|f| f.take()) else {
            return;
        };
        for read in failed {
            if let (Some(disk), Some(cache)) = (&mut self.disk, &mut self.cache) {
                if let Some(forgotten) = disk.forget(read.slot) {
                    cache.note(|| removed(Medium::Disk, forgotten));
                }
            }
            if let Some((key, chain)) = self.cache.as_mut().and_then(|c| c.evict(read.block)) {
                self.lineage.remove(&chain);
                if let Some(host) = &mut self.host {
                    host.child_removed(key.parent);
                }
            }
        }
    }

    /// The prefix cache's changes since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        self.cache
            .as_mut()
            .map(PrefixCache::take_events)
            .unwrap_or_default()
    }

    /// The longest run of cached whole blocks at the start of `tokens` (pass only the
    /// tokens that may be served from the cache), each in the pool, the host tier or on
    /// disk, with its content hash where there is a disk tier. Past a block found on disk
    /// under no chain id (found at start-up without its parent), the rest of the run is on
    /// disk too. A shorter `tokens` gives a prefix of the same run.
    pub(super) fn cached_prefix(&self, tokens: &[u32]) -> Vec<PrefixHit> {
        let mut hits = Vec::new();
        let Some(cache) = &self.cache else {
            return hits;
        };
        let mut chain = Some(ChainId::ROOT);
        let mut content = ROOT_HASH;
        for chunk in tokens.chunks_exact(self.block_size) {
            if self.disk.is_some() {
                content = chain_hash(&content, chunk);
            }
            let in_memory = chain.and_then(|c| match cache.lookup(c, chunk) {
                Some((block, next)) => Some(Hit::Pool { block, chain: next }),
                None => self
                    .host
                    .as_ref()
                    .and_then(|h| h.lookup(c, chunk))
                    .map(|(slot, next)| Hit::Host { slot, chain: next }),
            });
            let hit = in_memory.or_else(|| {
                let (slot, chain) = self.disk.as_ref()?.lookup(&content)?;
                Some(Hit::Disk { slot, chain })
            });
            let Some(at) = hit else {
                break;
            };
            chain = match at {
                Hit::Pool { chain, .. } | Hit::Host { chain, .. } => Some(chain),
                Hit::Disk { chain, .. } => chain,
            };
            hits.push(PrefixHit { at, content });
        }
        hits
    }

    /// The pool blocks of `hits` (a run from [`BlockManager::cached_prefix`] over
    /// `tokens`) in order, and the chain they end with its content hash (the root's
    /// without a disk tier): pool hits shared,
    /// host and disk hits loaded into free blocks (their copies queued in
    /// [`BlockManager::moves`]), disk hits entered in the prefix cache anew, under their
    /// chain id on disk (see [`disk_id`]). The caller has checked that the pool has a
    /// free block for each host and disk hit besides the free pool hits.
    pub(super) fn take_hits(
        &mut self,
        tokens: &[u32],
        hits: &[PrefixHit],
    ) -> (Vec<u32>, ChainId, ContentHash) {
        let slots: Vec<u32> = hits
            .iter()
            .filter_map(|h| match h.at {
                Hit::Host { slot, .. } => Some(slot),
                _ => None,
            })
            .collect();
        if let Some(host) = &mut self.host {
            host.pin(&slots);
        }
        // Disk slots read here are kept from the writes the loads' evictions may make.
        if let Some(disk) = &mut self.disk {
            for hit in hits {
                if let Hit::Disk { slot, .. } = hit.at {
                    disk.read_from(slot);
                }
            }
        }
        for hit in hits {
            if let Hit::Pool { block, .. } = hit.at {
                self.share(block);
            }
        }
        let mut table = Vec::with_capacity(hits.len());
        let (mut chain, mut content) = (ChainId::ROOT, ROOT_HASH);
        for (hit, chunk) in hits.iter().zip(tokens.chunks_exact(self.block_size)) {
            let parent_content = std::mem::replace(&mut content, hit.content);
            match hit.at {
                Hit::Pool { block, chain: next } => {
                    table.push(block);
                    chain = next;
                }
                Hit::Host { slot, chain: next } => {
                    let block = self.take_free().expect("a free block for each host hit");
                    let (Some(host), Some(cache)) = (&mut self.host, &mut self.cache) else {
                        unreachable!("host hits come from the host tier of a prefix cache");
                    };
                    let (key, held) = host.take(slot).expect("a pinned slot is held");
                    debug_assert_eq!(held, next);
                    cache.note(|| removed(Medium::Host, held));
                    cache.place(key, held, block);
                    host.loaded += 1;
                    self.moves.push(KvMove::Load { slot, block });
                    table.push(block);
                    chain = next;
                }
                Hit::Disk { slot, .. } => {
                    let block = self.take_free().expect("a free block for each disk hit");
                    let cache = self.cache.as_mut().expect("disk hits need a prefix cache");
                    let disk = self.disk.as_mut();
                    let id = disk_id(disk, cache, &self.lineage, &hit.content, chain, chunk);
                    let (next, created) = cache.insert_new(chain, chunk, block, id);
                    if created {
                        self.lineage.insert(next, parent_content);
                        if let Some(host) = &mut self.host {
                            host.child_added(chain);
                        }
                    }
                    self.moves.push(KvMove::DiskRead {
                        slot,
                        chain: hit.content,
                        block,
                    });
                    table.push(block);
                    chain = next;
                }
            }
        }
        if let Some(disk) = &mut self.disk {
            disk.unpin_all();
        }
        (table, chain, content)
    }

    /// Adds an owner to a cached block; a free one leaves the free queue (so it cannot be
    /// evicted while owned).
    pub(super) fn share(&mut self, block: u32) {
        if let Some(count) = self.ref_counts.get_mut(block as usize) {
            if *count == 0 {
                self.free.remove(block);
            }
            *count += 1;
        }
    }

    /// Takes the free block reused next, evicting what it cached (down to the host tier,
    /// or to disk where there is none), with one owner.
    fn take_free(&mut self) -> Option<u32> {
        let block = self.free.pop_front()?;
        let evicted = self.cache.as_mut().and_then(|c| c.evict(block));
        if let Some((key, chain)) = evicted {
            let (spill, leaving) = match &mut self.host {
                Some(host) => {
                    let held = key.clone();
                    let (spill, leaving) = host.spill(key, chain, block);
                    if let Some(cache) = &mut self.cache {
                        // A leaf dropped from the tier to make room goes first.
                        if let Some(Leaving {
                            chain: dropped,
                            from: KvSource::Host(_),
                            ..
                        }) = &leaving
                        {
                            cache.note(|| removed(Medium::Host, *dropped));
                        }
                        if spill.is_some() {
                            cache.note(|| CacheEvent::Stored {
                                chain,
                                parent: held.parent,
                                tokens: held.tokens.clone(),
                                medium: Medium::Host,
                            });
                        }
                    }
                    (spill, leaving)
                }
                None => {
                    let from = KvSource::Pool(block);
                    (None, Some(Leaving { key, chain, from }))
                }
            };
            // What leaves memory is read before the spill overwrites its slot.
            if let Some(leaving) = leaving {
                self.write_down(leaving);
            }
            self.moves.extend(spill);
        }
        if let Some(count) = self.ref_counts.get_mut(block as usize) {
            *count = 1;
        }
        Some(block)
    }

    /// Writes an entry leaving memory to the disk tier under its chain id (journaled as
    /// the disk's, after the leaf dropped for it), unless its content is there already or
    /// the tier has no room; without a disk tier it is simply gone.
    fn write_down(&mut self, leaving: Leaving) {
        let Some(parent) = self.lineage.remove(&leaving.chain) else {
            return;
        };
        let (Some(disk), Some(cache)) = (&mut self.disk, &mut self.cache) else {
            return;
        };
        let content = chain_hash(&parent, &leaving.key.tokens);
        if disk.contains(&content) {
            return;
        }
        if let Some((slot, dropped)) = disk.store(content, parent, leaving.chain) {
            if let Some(dropped) = dropped {
                cache.note(|| removed(Medium::Disk, dropped));
            }
            cache.note(|| CacheEvent::Stored {
                chain: leaving.chain,
                parent: leaving.key.parent,
                tokens: leaving.key.tokens.clone(),
                medium: Medium::Disk,
            });
            self.moves.push(KvMove::DiskWrite {
                from: leaving.from,
                slot,
                parent,
                tokens: Arc::from(&leaving.key.tokens[..]),
            });
        }
    }

    /// Takes up to `n` free blocks (fewer only if the pool runs out; callers check first).
    pub(super) fn take_free_blocks(&mut self, n: usize) -> Vec<u32> {
        (0..n).map_while(|_| self.take_free()).collect()
    }

    /// Releases all of `id`'s blocks; false if it held none. The blocks join the free queue
    /// last block first, so a sequence's tail is evicted before the prefix others may share.
    pub(super) fn release(&mut self, id: RequestId) -> bool {
        let Some(seq) = self.seqs.remove(&id) else {
            return false;
        };
        for &block in seq.table.iter().rev() {
            self.drop_owner(block);
        }
        true
    }

    /// Registers `id`'s full blocks in the prefix cache: `tokens` are those of its blocks
    /// from `first_block` on. Blocks already registered are skipped; a report that starts
    /// past the first block not registered yet registers nothing (a block's key chains on
    /// the one before it).
    pub(super) fn register_computed(&mut self, id: RequestId, first_block: usize, tokens: &[u32]) {
        let (Some(cache), Some(seq)) = (&mut self.cache, self.seqs.get_mut(&id)) else {
            return;
        };
        if first_block > seq.num_registered {
            return;
        }
        let bs = self.block_size;
        let full = (first_block + tokens.len() / bs).min(seq.table.len());
        for i in seq.num_registered..full {
            let at = (i - first_block) * bs;
            let (chunk, block) = (&tokens[at..at + bs], seq.table[i]);
            let parent_content = seq.content;
            if self.disk.is_some() {
                seq.content = chain_hash(&seq.content, chunk);
            }
            // Content the host tier holds comes back into the pool under its chain id,
            // so what continues it there stays reachable; the slot needs no copy.
            let held = self.host.as_mut().and_then(|h| {
                let (slot, _) = h.lookup(seq.chain, chunk)?;
                h.take(slot)
            });
            seq.chain = match held {
                Some((key, chain)) => {
                    cache.note(|| removed(Medium::Host, chain));
                    cache.place(key, chain, block);
                    chain
                }
                None => {
                    // Content the disk tier holds is entered under its chain id there, so
                    // what continues it in memory stays reachable.
                    let disk = self.disk.as_mut();
                    let id = disk_id(disk, cache, &self.lineage, &seq.content, seq.chain, chunk);
                    let (chain, created) = cache.insert_new(seq.chain, chunk, block, id);
                    if let (true, Some(host)) = (created, &mut self.host) {
                        host.child_added(seq.chain);
                    }
                    if created && self.disk.is_some() {
                        self.lineage.insert(chain, parent_content);
                    }
                    chain
                }
            };
        }
        seq.num_registered = seq.num_registered.max(full);
    }

    fn drop_owner(&mut self, block: u32) {
        if let Some(count) = self.ref_counts.get_mut(block as usize) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.free.push_back(block);
            }
        }
    }
}

/// The journal's record that `medium`'s entry ending `chain` is gone (from the host tier:
/// loaded back into the pool, computed again there, or dropped; from disk: dropped or
/// forgotten).
fn removed(medium: Medium, chain: ChainId) -> CacheEvent {
    CacheEvent::Removed { chain, medium }
}

/// The chain id an entry of `content` (`tokens` after the chain `parent`) entering the
/// pool takes: that of the disk tier's entry for the same content, so what continues it in
/// memory stays reachable, unless an entry in memory (named in `lineage`) has it already;
/// `None` gives a fresh one. A disk entry found at start-up under no id takes one now that
/// its parent has one, journaled as its store on disk.
fn disk_id(
    disk: Option<&mut DiskTier>,
    cache: &mut PrefixCache,
    lineage: &HashMap<ChainId, ContentHash>,
    content: &ContentHash,
    parent: ChainId,
    tokens: &[u32],
) -> Option<ChainId> {
    let disk = disk?;
    let (slot, id) = disk.lookup(content)?;
    let id = id.unwrap_or_else(|| {
        let id = cache.new_chain();
        disk.name(slot, id);
        cache.note(|| CacheEvent::Stored {
            chain: id,
            parent,
            tokens: tokens.into(),
            medium: Medium::Disk,
        });
        id
    });
    (!lineage.contains_key(&id)).then_some(id)
}

/// Where a cached block of a prefix was found (with the chain it ends, in memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hit {
    /// In this pool block.
    Pool { block: u32, chain: ChainId },
    /// In this slot of the host tier.
    Host { slot: u32, chain: ChainId },
    /// In this slot of the disk tier, under this chain id where it has one.
    Disk { slot: u64, chain: Option<ChainId> },
}

/// A cached block of a prefix: where it is, and the content hash of the chain it ends
/// (with a disk tier; the root's without one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PrefixHit {
    pub(super) at: Hit,
    pub(super) content: ContentHash,
}

//! The block pool's state and the operations on it: taking free blocks (evicting what they
//! cached), sharing cached blocks, releasing a sequence, registering computed blocks.
//! What one `AllocateStep` does with them is in `step.rs`, `grow.rs` and `admit.rs`.

use super::free_queue::FreeQueue;
use super::host_tier::HostTier;
use super::prefix_cache::{CacheEvent, ChainId, PrefixCache};
use crate::messages::{KvMove, KvUsage, RequestId};
use std::collections::HashMap;

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
    /// The copies this step's allocation needs, in order.
    pub(super) moves: Vec<KvMove>,
    /// The sequences holding blocks.
    pub(super) seqs: HashMap<RequestId, SeqBlocks>,
    /// Tokens looked up in the prefix cache, cumulative.
    pub(super) prefix_queries: u64,
    /// Tokens found in the prefix cache, cumulative.
    pub(super) prefix_hits: u64,
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
            moves: Vec::new(),
            seqs: HashMap::new(),
            prefix_queries: 0,
            prefix_hits: 0,
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
            host_blocks: self.host.as_ref().map_or(0, HostTier::len),
            host_spilled: self.host.as_ref().map_or(0, |h| h.spilled),
            host_loaded: self.host.as_ref().map_or(0, |h| h.loaded),
            host_dropped: self.host.as_ref().map_or(0, |h| h.dropped),
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

    /// The same manager, whose prefix cache records every entry it makes and drops, for
    /// [`BlockManager::take_events`] (nothing is recorded with prefix caching off).
    pub fn recording_events(mut self) -> BlockManager {
        if let Some(cache) = &mut self.cache {
            cache.record_events();
        }
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

    /// The prefix cache's changes since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        self.cache
            .as_mut()
            .map(PrefixCache::take_events)
            .unwrap_or_default()
    }

    /// The longest run of cached whole blocks at the start of `tokens` (pass only the
    /// tokens that may be served from the cache), each in the pool or the host tier, and
    /// the chain they end.
    pub(super) fn cached_prefix(&self, tokens: &[u32]) -> (Vec<Hit>, ChainId) {
        let mut hits = Vec::new();
        let mut chain = ChainId::ROOT;
        let Some(cache) = &self.cache else {
            return (hits, chain);
        };
        for chunk in tokens.chunks_exact(self.block_size) {
            let found = match cache.lookup(chain, chunk) {
                Some((block, next)) => Some((Hit::Pool(block), next)),
                None => self
                    .host
                    .as_ref()
                    .and_then(|h| h.lookup(chain, chunk))
                    .map(|(slot, next)| (Hit::Host(slot), next)),
            };
            let Some((hit, next)) = found else {
                break;
            };
            hits.push(hit);
            chain = next;
        }
        (hits, chain)
    }

    /// The pool blocks of `hits` in order: pool hits shared, host hits loaded into free
    /// blocks (their copies queued in [`BlockManager::moves`]). The caller has checked that
    /// the pool has a free block for each host hit besides the free pool hits.
    pub(super) fn take_hits(&mut self, hits: &[Hit]) -> Vec<u32> {
        let slots: Vec<u32> = hits
            .iter()
            .filter_map(|h| match h {
                Hit::Host(slot) => Some(*slot),
                Hit::Pool(_) => None,
            })
            .collect();
        if let Some(host) = &mut self.host {
            host.pin(&slots);
        }
        for hit in hits {
            if let Hit::Pool(block) = hit {
                self.share(*block);
            }
        }
        let mut table = Vec::with_capacity(hits.len());
        for hit in hits {
            match *hit {
                Hit::Pool(block) => table.push(block),
                Hit::Host(slot) => {
                    let block = self.take_free().expect("a free block for each host hit");
                    let (Some(host), Some(cache)) = (&mut self.host, &mut self.cache) else {
                        unreachable!("host hits come from the host tier of a prefix cache");
                    };
                    let (key, chain) = host.take(slot).expect("a pinned slot is held");
                    cache.place(key, chain, block);
                    host.loaded += 1;
                    self.moves.push(KvMove::Load { slot, block });
                    table.push(block);
                }
            }
        }
        table
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

    /// Takes the free block reused next, evicting what it cached, with one owner.
    fn take_free(&mut self) -> Option<u32> {
        let block = self.free.pop_front()?;
        let evicted = self.cache.as_mut().and_then(|c| c.evict(block));
        if let (Some((key, chain)), Some(host)) = (evicted, &mut self.host) {
            self.moves.extend(host.spill(key, chain, block));
        }
        if let Some(count) = self.ref_counts.get_mut(block as usize) {
            *count = 1;
        }
        Some(block)
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
            // Content the host tier holds comes back into the pool under its chain id,
            // so what continues it there stays reachable; the slot needs no copy.
            let held = self.host.as_mut().and_then(|h| {
                let (slot, _) = h.lookup(seq.chain, chunk)?;
                h.take(slot)
            });
            seq.chain = match held {
                Some((key, chain)) => {
                    cache.place(key, chain, block);
                    chain
                }
                None => {
                    let (chain, created) = cache.insert_new(seq.chain, chunk, block);
                    if let (true, Some(host)) = (created, &mut self.host) {
                        host.child_added(seq.chain);
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

/// Where a cached block of a prefix was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hit {
    /// In this pool block.
    Pool(u32),
    /// In this slot of the host tier.
    Host(u32),
}

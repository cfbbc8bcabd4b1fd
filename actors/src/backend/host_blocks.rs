//! The bytes of the host tier below a CPU pool: one slot a block, each holding the block's
//! keys and values of every layer as the pool's cache lays them out
//! ([`KvCache::copy_block_out`]). A slot's memory is taken when it is first spilled into,
//! so a tier costs what it holds. The index of what each slot holds is the KV
//! allocator's (`kv_allocator/host_tier.rs`); this only makes its copies.

use anyhow::{anyhow, Context};
use peregrine_ops::KvCache;

/// The slots of a host tier.
pub struct HostBlocks {
    block_bytes: usize,
    slots: Vec<Option<Box<[u8]>>>,
}

impl HostBlocks {
    /// A tier of as many blocks of `cache` as `bytes` holds (at least one).
    pub fn for_cache(cache: &KvCache, bytes: u64) -> anyhow::Result<HostBlocks> {
        let block_bytes = cache.block_bytes();
        let slots = bytes / block_bytes.max(1);
        if slots == 0 {
            anyhow::bail!(
                "kv_host_memory ({bytes} bytes) holds no block of this pool ({block_bytes} bytes a block)"
            );
        }
        let slots = u32::try_from(slots).context("kv_host_memory holds more than 2^32 blocks")?;
        Ok(HostBlocks {
            block_bytes: usize::try_from(block_bytes)?,
            slots: vec![None; slots as usize],
        })
    }

    /// Blocks the tier holds at most.
    pub fn slots(&self) -> u32 {
        // Built from a u32.
        self.slots.len() as u32
    }

    /// Copies pool block `block` of `cache` into `slot` (taking its memory the first time).
    pub fn spill(&mut self, cache: &KvCache, block: u32, slot: u32) -> anyhow::Result<()> {
        let size = self.block_bytes;
        let bytes = self.slot(slot)?.get_or_insert_with(|| vec![0; size].into());
        cache.copy_block_out(block, bytes);
        Ok(())
    }

    /// Copies `slot` into pool block `block` of `cache`.
    pub fn load(&self, cache: &mut KvCache, slot: u32, block: u32) -> anyhow::Result<()> {
        cache.copy_block_in(block, self.bytes(slot)?);
        Ok(())
    }

    /// The bytes `slot` holds.
    pub fn bytes(&self, slot: u32) -> anyhow::Result<&[u8]> {
        self.slots
            .get(slot as usize)
            .ok_or_else(|| anyhow!("host slot {slot} outside a tier of {}", self.slots.len()))?
            .as_deref()
            .ok_or_else(|| anyhow!("host slot {slot} read before anything was spilled into it"))
    }

    fn slot(&mut self, slot: u32) -> anyhow::Result<&mut Option<Box<[u8]>>> {
        let n = self.slots.len();
        self.slots
            .get_mut(slot as usize)
            .ok_or_else(|| anyhow!("host slot {slot} outside a tier of {n}"))
    }
}

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

#[cfg(test)]
mod tests {
    use super::HostBlocks;
    use peregrine_kernels::cpu::KvLayout;
    use peregrine_ops::{KvCache, KvDtype, KvRows};

    /// A pool of 4 blocks of 32 KiB (2 layers of 16 tokens, 2 KV heads of 64, float32),
    /// every element distinct.
    fn cache() -> KvCache {
        let layout = KvLayout {
            num_blocks: 4,
            block_size: 16,
            num_kv_heads: 2,
            head_dim: 64,
        };
        let mut cache =
            KvCache::try_with_dtype(2, layout, KvRows::KeysAndValues, KvDtype::Float32).unwrap();
        for layer in 0..2 {
            for slot in 0..64i64 {
                let row = |kv: usize| -> Vec<f32> {
                    (0..128)
                        .map(|e| (layer * 100_000 + kv * 50_000 + slot as usize * 128 + e) as f32)
                        .collect()
                };
                cache.write(layer, &[slot], &row(0), &row(1));
            }
        }
        cache
    }

    #[test]
    fn a_tier_past_4_gib_keeps_its_last_slot_apart_and_takes_memory_per_slot() {
        let mut cache = cache();
        let block = cache.block_bytes();
        assert_eq!(block, 32 * 1024);
        // 5 GiB of slots: the last one starts past 2^32 bytes of the tier.
        let mut tier = HostBlocks::for_cache(&cache, 5 << 30).unwrap();
        let last = tier.slots() - 1;
        assert_eq!(u64::from(tier.slots()), (5 << 30) / block);
        assert!(u64::from(last) * block > 1 << 32);
        let mut want = vec![0u8; block as usize];
        cache.copy_block_out(1, &mut want);
        tier.spill(&cache, 1, last).unwrap();
        tier.spill(&cache, 3, 0).unwrap();
        assert_eq!(tier.bytes(last).unwrap(), &want[..]);
        // Only the two slots spilled into hold memory.
        assert_eq!(tier.slots.iter().filter(|s| s.is_some()).count(), 2);
        tier.load(&mut cache, last, 2).unwrap();
        let mut got = vec![0u8; block as usize];
        cache.copy_block_out(2, &mut got);
        assert_eq!(got, want);
        assert!(tier.bytes(last + 1).is_err(), "a slot past the tier");
        assert!(tier.bytes(1).is_err(), "a slot never spilled into");
    }

    #[test]
    fn a_tier_smaller_than_a_block_is_refused() {
        let err = HostBlocks::for_cache(&cache(), 1000).err().unwrap();
        assert!(err.to_string().contains("kv_host_memory"), "{err}");
    }
}

//! The disk tier below a CPU pool: the model's file under `--kv-cache-dir`
//! ([`crate::kv_disk::DiskBlocks`]), one slot a block, each holding the block's keys and
//! values of every layer as the pool's cache lays them out ([`KvCache::copy_block_out`]).
//! The index of what each slot holds is the KV allocator's (`kv_allocator/disk_tier.rs`);
//! this makes the copies between the pool and the file, in order.

use crate::kv_disk::{BlockShape, ContentHash, DiskBlocks, DiskTierStart};
use peregrine_ops::KvCache;
use std::path::Path;

/// The disk tier and a block's worth of scratch.
pub struct CpuDiskBlocks {
    disk: DiskBlocks,
    scratch: Vec<u8>,
}

impl CpuDiskBlocks {
    /// Opens the file of the model `model` and of `cache`'s block shape in `dir`, with as
    /// many slots as `bytes` holds ([`DiskBlocks::open`]).
    pub fn open(
        cache: &KvCache,
        dir: &Path,
        bytes: u64,
        model: &ContentHash,
    ) -> anyhow::Result<(CpuDiskBlocks, DiskTierStart)> {
        let shape = BlockShape {
            device: "cpu",
            dtype: cache.dtype(),
            rows: cache.rows(),
            layout: *cache.layout(),
            block_bytes: cache.block_bytes(),
        };
        let (disk, start) = DiskBlocks::open(dir, bytes, model, &shape)?;
        let scratch = vec![0; usize::try_from(shape.block_bytes)?];
        Ok((CpuDiskBlocks { disk, scratch }, start))
    }

    /// Writes pool block `block` of `cache` into `slot` as the block of `tokens` after the
    /// content chain `parent`.
    pub fn write_from_pool(
        &mut self,
        cache: &KvCache,
        block: u32,
        slot: u64,
        parent: &ContentHash,
        tokens: &[u32],
    ) -> anyhow::Result<()> {
        cache.copy_block_out(block, &mut self.scratch);
        self.disk.write(slot, parent, tokens, &self.scratch)
    }

    /// Writes `data` (a block's bytes) into `slot` as the block of `tokens` after `parent`.
    pub fn write(
        &self,
        slot: u64,
        parent: &ContentHash,
        tokens: &[u32],
        data: &[u8],
    ) -> anyhow::Result<()> {
        self.disk.write(slot, parent, tokens, data)
    }

    /// Reads `slot`, checked to hold the block ending `chain`, into pool block `block` of
    /// `cache`; a block that fails its checks is not copied ([`DiskBlocks::read`]).
    pub fn read_into(
        &self,
        cache: &mut KvCache,
        slot: u64,
        chain: &ContentHash,
        block: u32,
    ) -> anyhow::Result<()> {
        let data = self.disk.read(slot, chain, block)?;
        cache.copy_block_in(block, &data);
        Ok(())
    }
}

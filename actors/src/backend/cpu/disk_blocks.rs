//! The disk tier below a CPU pool: the model's file under `--kv-cache-dir`
//! ([`crate::kv_disk::DiskBlocks`]), one slot a block, each holding the block's keys and
//! values of every layer as the pool's cache lays them out ([`KvCache::copy_block_out`]),
//! worked by the tier's own thread ([`DiskQueue`]). The index of what each slot holds is
//! the KV allocator's (`kv_allocator/disk_tier.rs`); this copies a block out of the pool
//! when its write is queued (the pool block is about to be reused) and a read's checked
//! bytes into its pool block once the thread hands them back.

use crate::kv_disk::{BlockShape, ContentHash, DiskBlocks, DiskQueue, DiskTierStart};
use crate::messages::LoadDone;
use peregrine_ops::KvCache;
use std::path::Path;
use std::sync::Arc;

/// The disk tier's queue.
pub struct CpuDiskBlocks {
    queue: DiskQueue,
}

impl CpuDiskBlocks {
    /// Opens the file of the model `model` and of `cache`'s block shape in `dir`, with as
    /// many slots as `bytes` holds ([`DiskBlocks::open`]), and starts its thread.
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
        let queue = DiskQueue::start(disk)?;
        Ok((CpuDiskBlocks { queue }, start))
    }

    /// Queues writing pool block `block` of `cache` (copied now) into `slot` as the block
    /// of `tokens` after the content chain `parent`.
    pub fn write_from_pool(
        &self,
        cache: &KvCache,
        block: u32,
        slot: u64,
        parent: &ContentHash,
        tokens: &Arc<[u32]>,
    ) -> anyhow::Result<()> {
        let mut data = vec![0; usize::try_from(self.queue.block_bytes())?];
        cache.copy_block_out(block, &mut data);
        self.queue.write(slot, parent, tokens, data);
        Ok(())
    }

    /// Queues writing `data` (a block's bytes, copied now) into `slot` as the block of
    /// `tokens` after `parent`.
    pub fn write(&self, slot: u64, parent: &ContentHash, tokens: &Arc<[u32]>, data: &[u8]) {
        self.queue.write(slot, parent, tokens, data.to_vec());
    }

    /// Queues reading `slot`, checked to hold the block ending `chain`, into pool block
    /// `block` ([`CpuDiskBlocks::finish_reads`] copies it in).
    pub fn read(&mut self, slot: u64, chain: &ContentHash, block: u32) {
        self.queue.read(slot, chain, block);
    }

    /// Copies the reads the thread has finished into their pool blocks of `cache` (a
    /// block that failed its checks is not copied) and says which; with `wait`, waits
    /// for at least one while any is pending.
    pub fn finish_reads(&mut self, cache: &mut KvCache, wait: bool) -> Vec<LoadDone> {
        self.queue
            .finished(wait)
            .into_iter()
            .map(|read| {
                if let Some(data) = &read.data {
                    cache.copy_block_in(read.block, data);
                }
                LoadDone {
                    block: read.block,
                    ok: read.data.is_some(),
                }
            })
            .collect()
    }
}

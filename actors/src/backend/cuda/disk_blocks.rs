//! The disk tier below a GPU pool: the model's file under `--kv-cache-dir`
//! ([`crate::kv_disk::DiskBlocks`], named by the pool's bf16 block shape on `cuda`, so a
//! CPU pool's file is never read here nor this one there), one slot a block in the order
//! [`GpuKvCache::copy_blocks`] lays a block out, worked by the tier's own thread
//! ([`DiskQueue`]). A run of writes is one gather kernel into the staging buffer and one
//! copy into page-locked host memory, then each block's bytes queued to its slot once the
//! stream has caught up. Reads are queued; the thread checks each slot's record and
//! SHA-256, and the blocks that passed go to the load lane (`load_lane.rs`), which copies
//! them into their pool blocks on its own stream. The index of what each slot holds is the
//! KV allocator's (`kv_allocator/disk_tier.rs`).

use super::staging::BlockStaging;
use crate::kv_disk::{BlockShape, ContentHash, DiskBlocks, DiskQueue, DiskTierStart};
use crate::messages::LoadDone;
use anyhow::Context;
use half::bf16;
use peregrine_kernels::cuda::kv_blocks::BlockCopy;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::KvDtype;
use peregrine_runtime::cuda::cudarc::driver::{result, DevicePtr, PinnedHostSlice};
use peregrine_runtime::cuda::Gpu;
use std::path::Path;
use std::sync::Arc;

/// One block to write: pool block `block` into `slot`, as the block of `tokens` after the
/// content chain `parent`.
pub struct PoolWrite<'a> {
    pub block: u32,
    pub slot: u64,
    pub parent: &'a ContentHash,
    pub tokens: &'a Arc<[u32]>,
}

/// The disk tier's queue and page-locked room for as many blocks as the staging buffer
/// holds.
pub struct GpuDiskBlocks {
    queue: DiskQueue,
    block_elems: usize,
    pinned: PinnedHostSlice<bf16>,
}

impl GpuDiskBlocks {
    /// Opens the file of the model `model` and of `cache`'s block shape in `dir`, with as
    /// many slots as `bytes` holds ([`DiskBlocks::open`]), with page-locked room for the
    /// entries of `staging`.
    pub fn open(
        gpu: &Gpu,
        cache: &GpuKvCache,
        staging: &BlockStaging,
        dir: &Path,
        bytes: u64,
        model: &ContentHash,
    ) -> anyhow::Result<(GpuDiskBlocks, DiskTierStart)> {
        let block_elems = cache.block_elems();
        let shape = BlockShape {
            device: "cuda",
            dtype: KvDtype::Bfloat16,
            rows: cache.rows(),
            layout: *cache.layout(),
            block_bytes: 2 * block_elems as u64,
        };
        let (disk, start) = DiskBlocks::open(dir, bytes, model, &shape)?;
        let queue = DiskQueue::start(disk)?;
        let elems = staging.entries() * block_elems;
        // SAFETY: every element is written (by a copy from the device, or from a checked
        // block) before the host or a copy reads it. Flags 0: cached page-locked memory,
        // which the host reads at full speed.
        let pinned = unsafe { gpu.context().alloc_pinned_with_flags::<bf16>(elems, 0) }
            .context("page-locked host memory for the disk tier's copies")?;
        Ok((
            GpuDiskBlocks {
                queue,
                block_elems,
                pinned,
            },
            start,
        ))
    }

    /// One run of writes out of the pool (at most what `staging` holds; every id checked by
    /// the caller), copied to the host before this returns and queued to the thread.
    pub fn write_from_pool(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        staging: &mut BlockStaging,
        run: &[PoolWrite],
    ) -> anyhow::Result<()> {
        let stream = gpu.stream();
        let blocks: Vec<u32> = run.iter().map(|w| w.block).collect();
        staging.copy(stream, kernels, cache, BlockCopy::Gather, &blocks)?;
        let elems = run.len() * self.block_elems;
        let host = self.pinned.as_mut_ptr()?;
        let staged = staging.span(0, run.len());
        let (from, guard) = staged.device_ptr(stream);
        // SAFETY: the first `elems` elements of the page-locked room (which holds the
        // staging buffer's entries), which nothing else reads or writes until the stream is
        // synchronized below; queued after the gather that fills `staged`.
        unsafe {
            let host = std::slice::from_raw_parts_mut(host, elems);
            result::memcpy_dtoh_async(host, from, stream.cu_stream())
        }?;
        drop(guard);
        stream.synchronize()?;
        let copied = self.pinned.as_slice()?;
        for (e, w) in run.iter().enumerate() {
            let block = &copied[e * self.block_elems..(e + 1) * self.block_elems];
            let data = bytemuck::cast_slice::<bf16, u8>(block).to_vec();
            self.queue.write(w.slot, w.parent, w.tokens, data);
        }
        Ok(())
    }

    /// Queues writing `data` (a block's bytes, a host slot's, copied now) into `slot` as
    /// the block of `tokens` after `parent`.
    pub fn write(&self, slot: u64, parent: &ContentHash, tokens: &Arc<[u32]>, data: &[u8]) {
        self.queue.write(slot, parent, tokens, data.to_vec());
    }

    /// Queues reading `slot`, checked to hold the block ending `chain`, into pool block
    /// `block` ([`GpuDiskBlocks::finish_loads`] copies it in).
    pub fn read(&mut self, slot: u64, chain: &ContentHash, block: u32) {
        self.queue.read(slot, chain, block);
    }

    /// The reads the thread has finished: those whose slot failed its checks, as failed
    /// loads, and the checked ones' pool blocks and bytes (every id checked when the read
    /// was queued), for the load lane to copy in. With `wait`, at least one read while any
    /// is pending.
    pub fn take_finished(&mut self, wait: bool) -> (Vec<LoadDone>, Vec<(u32, Vec<u8>)>) {
        let mut failed = Vec::new();
        let mut checked = Vec::new();
        for read in self.queue.finished(wait) {
            match read.data {
                Some(data) => checked.push((read.block, data)),
                None => failed.push(LoadDone {
                    block: read.block,
                    ok: false,
                }),
            }
        }
        (failed, checked)
    }

    /// Reads queued and not yet handed back.
    pub fn pending(&self) -> usize {
        self.queue.pending()
    }
}

//! The disk tier below a GPU pool: the model's file under `--kv-cache-dir`
//! ([`crate::kv_disk::DiskBlocks`], named by the pool's bf16 block shape on `cuda`, so a
//! CPU pool's file is never read here nor this one there), one slot a block in the order
//! [`GpuKvCache::copy_blocks`] lays a block out. A run of writes is one gather kernel into
//! the staging buffer and one copy into page-locked host memory, then each block's bytes
//! to its slot once the stream has caught up; a run of reads checks each slot's record
//! and SHA-256 on the host first, then copies only the blocks that pass into page-locked
//! memory, the staging buffer and, by one scatter kernel, their pool blocks. The index of
//! what each slot holds is the KV allocator's (`kv_allocator/disk_tier.rs`).

use super::staging::BlockStaging;
use crate::kv_disk::{BlockShape, ContentHash, DiskBlocks, DiskTierStart};
use anyhow::Context;
use half::bf16;
use peregrine_kernels::cuda::kv_blocks::BlockCopy;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::KvDtype;
use peregrine_runtime::cuda::cudarc::driver::{result, DevicePtr, DevicePtrMut, PinnedHostSlice};
use peregrine_runtime::cuda::Gpu;
use std::path::Path;

/// One block to write: pool block `block` into `slot`, as the block of `tokens` after the
/// content chain `parent`.
pub struct PoolWrite<'a> {
    pub block: u32,
    pub slot: u64,
    pub parent: &'a ContentHash,
    pub tokens: &'a [u32],
}

/// One block to read: `slot`, checked to end the content chain `chain`, into pool block
/// `block`.
pub struct DiskLoad<'a> {
    pub slot: u64,
    pub chain: &'a ContentHash,
    pub block: u32,
}

/// The disk tier and page-locked room for as many blocks as the staging buffer holds.
pub struct GpuDiskBlocks {
    disk: DiskBlocks,
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
        let elems = staging.entries() * block_elems;
        // SAFETY: every element is written (by a copy from the device, or from a checked
        // block) before the host or a copy reads it. Flags 0: cached page-locked memory,
        // which the host reads at full speed.
        let pinned = unsafe { gpu.context().alloc_pinned_with_flags::<bf16>(elems, 0) }
            .context("page-locked host memory for the disk tier's copies")?;
        Ok((
            GpuDiskBlocks {
                disk,
                block_elems,
                pinned,
            },
            start,
        ))
    }

    /// One run of writes out of the pool (at most what `staging` holds; every id checked by
    /// the caller), made before this returns.
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
        staging.copy(gpu, kernels, cache, BlockCopy::Gather, &blocks)?;
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
            self.disk
                .write(w.slot, w.parent, w.tokens, bytemuck::cast_slice(block))?;
        }
        Ok(())
    }

    /// Writes `data` (a block's bytes, a host slot's) into `slot` as the block of `tokens`
    /// after `parent`.
    pub fn write(
        &self,
        slot: u64,
        parent: &ContentHash,
        tokens: &[u32],
        data: &[u8],
    ) -> anyhow::Result<()> {
        self.disk.write(slot, parent, tokens, data)
    }

    /// One run of reads (at most what `staging` holds, no pool block twice; every id
    /// checked by the caller): each slot read and checked, and only the blocks that pass
    /// copied into their pool blocks, queued on `gpu`'s stream. A read that fails is
    /// reported and forgotten ([`DiskBlocks::read`]); the first such error is returned
    /// after the rest are copied.
    pub fn read_into(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        staging: &mut BlockStaging,
        run: &[DiskLoad],
    ) -> anyhow::Result<Option<anyhow::Error>> {
        let mut failed = None;
        let mut checked = Vec::with_capacity(run.len());
        for r in run {
            match self.disk.read(r.slot, r.chain, r.block) {
                Ok(data) => checked.push((r.block, data)),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if checked.is_empty() {
            return Ok(failed);
        }
        let stream = gpu.stream();
        // The room may still be the source of the last run's copy.
        stream.synchronize()?;
        let room = self.pinned.as_mut_slice()?;
        for (e, (_, data)) in checked.iter().enumerate() {
            let entry = &mut room[e * self.block_elems..(e + 1) * self.block_elems];
            bytemuck::cast_slice_mut::<bf16, u8>(entry).copy_from_slice(data);
        }
        let elems = checked.len() * self.block_elems;
        let host = self.pinned.as_ptr()?;
        let mut staged = staging.span_mut(0, checked.len());
        let (to, guard) = staged.device_ptr_mut(stream);
        // SAFETY: the first `elems` elements of the page-locked room, written above and
        // left alone until the stream is synchronized before the next run refills it;
        // copied into the staging entries the scatter below reads.
        unsafe {
            let host = std::slice::from_raw_parts(host, elems);
            result::memcpy_htod_async(to, host, stream.cu_stream())
        }?;
        drop(guard);
        let blocks: Vec<u32> = checked.iter().map(|&(block, _)| block).collect();
        staging.copy(gpu, kernels, cache, BlockCopy::Scatter, &blocks)?;
        Ok(failed)
    }
}

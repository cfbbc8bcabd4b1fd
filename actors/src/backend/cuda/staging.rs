//! Room on the device for whole KV blocks on their way between a GPU pool and a tier below
//! it: a run of blocks is gathered out of the pool into it by one kernel, or scattered
//! from it into the pool by one (`kernels/cuda/kv_blocks.cu`), each block's keys and
//! values of every layer one after another as [`GpuKvCache::copy_blocks`] lays them out.

use anyhow::Context;
use half::bf16;
use peregrine_kernels::cuda::kv_blocks::BlockCopy;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_runtime::cuda::cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use peregrine_runtime::cuda::Gpu;
use std::sync::Arc;

/// Bytes of the staging buffer (at least one block).
const STAGING_BYTES: u64 = 64 << 20;

/// The staging buffer and the ids of the blocks a copy goes through.
pub struct BlockStaging {
    /// Elements of a block.
    block_elems: usize,
    blocks: CudaSlice<bf16>,
    ids: CudaSlice<u32>,
    /// Blocks it holds.
    entries: usize,
}

impl BlockStaging {
    /// Room for as many blocks of `cache` as 64 MiB holds (at least one), on `gpu`.
    pub fn for_cache(gpu: &Gpu, cache: &GpuKvCache) -> anyhow::Result<BlockStaging> {
        let block_elems = cache.block_elems();
        let entries = usize::try_from(STAGING_BYTES / (2 * block_elems as u64).max(1))?.max(1);
        let blocks = gpu
            .zeros(entries * block_elems)
            .context("the KV tiers' staging buffer on the GPU")?;
        Ok(BlockStaging {
            block_elems,
            blocks,
            ids: gpu.zeros(entries)?,
            entries,
        })
    }

    /// Blocks it holds.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Copies the pool blocks `blocks` (at most [`BlockStaging::entries`], each within the
    /// pool: the caller checks) between `cache` and the first entries, the way `copy`
    /// says, queued on `stream` after their ids (the stream every use of this buffer goes
    /// through).
    pub fn copy(
        &mut self,
        stream: &Arc<CudaStream>,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        copy: BlockCopy,
        blocks: &[u32],
    ) -> anyhow::Result<()> {
        stream.memcpy_htod(blocks, &mut self.ids.slice_mut(..blocks.len()))?;
        let ids = self.ids.slice(..blocks.len());
        cache.copy_blocks(kernels, stream, copy, &ids, blocks, &mut self.blocks)?;
        Ok(())
    }

    /// Entries `first..first + n`.
    pub fn span(&self, first: usize, n: usize) -> CudaView<'_, bf16> {
        let at = first * self.block_elems;
        self.blocks.slice(at..at + n * self.block_elems)
    }

    /// Entries `first..first + n`, to write into.
    pub fn span_mut(&mut self, first: usize, n: usize) -> CudaViewMut<'_, bf16> {
        let at = first * self.block_elems;
        self.blocks.slice_mut(at..at + n * self.block_elems)
    }
}

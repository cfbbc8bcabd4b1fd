//! The host tier below a GPU pool: one slot a block in page-locked host memory, each
//! holding the block's keys and values of every layer as [`GpuKvCache::copy_blocks`] lays
//! them out. A run of spills is one gather kernel over its pool blocks into the staging
//! buffer, then one copy a block to its slot, queued on the target's stream ahead of the
//! step that follows; a run of loads one copy a slot into the load lane's staging buffer,
//! then one scatter kernel, queued on the lane's stream (`tiers.rs`). None waits on the
//! host. Page-locked memory is taken
//! in chunks as slots are first spilled into, so a tier costs about what it holds; it is
//! cached (not write-combined), since the disk tier's writes read slots on the host. The
//! index of what each slot holds is the KV allocator's (`kv_allocator/host_tier.rs`); this
//! only makes its copies.

use super::staging::BlockStaging;
use anyhow::{anyhow, Context};
use half::bf16;
use peregrine_kernels::cuda::kv_blocks::BlockCopy;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_runtime::cuda::cudarc::driver::{
    result, CudaStream, DevicePtr, DevicePtrMut, PinnedHostSlice,
};
use peregrine_runtime::cuda::Gpu;
use std::sync::Arc;

/// Bytes of page-locked memory taken at once (a chunk of slots).
const CHUNK_BYTES: u64 = 64 << 20;

/// The slots of a GPU pool's host tier.
pub struct GpuHostBlocks {
    /// Elements of a block (and a slot).
    block_elems: usize,
    slots: u32,
    /// Slots of a chunk of page-locked memory.
    chunk_slots: u32,
    /// The chunks taken so far, by index.
    chunks: Vec<Option<PinnedHostSlice<bf16>>>,
    /// Whether each slot has been spilled into (a read of one that has not is refused).
    filled: Vec<bool>,
}

impl GpuHostBlocks {
    /// A tier of as many blocks of `cache` as `bytes` holds (at least one).
    pub fn for_cache(cache: &GpuKvCache, bytes: u64) -> anyhow::Result<GpuHostBlocks> {
        let block_elems = cache.block_elems();
        let block_bytes = 2 * block_elems as u64;
        let slots = bytes / block_bytes.max(1);
        if slots == 0 {
            anyhow::bail!(
                "kv_host_memory ({bytes} bytes) holds no block of this pool ({block_bytes} bytes a block)"
            );
        }
        let slots = u32::try_from(slots).context("kv_host_memory holds more than 2^32 blocks")?;
        let per_chunk = (CHUNK_BYTES / block_bytes).max(1);
        let chunk_slots = u32::try_from(per_chunk)?.min(slots);
        Ok(GpuHostBlocks {
            block_elems,
            slots,
            chunk_slots,
            chunks: (0..slots.div_ceil(chunk_slots)).map(|_| None).collect(),
            filled: vec![false; slots as usize],
        })
    }

    /// Blocks the tier holds at most.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// One run of spills, `(pool block, slot)` each (at most what `staging` holds; every
    /// id checked by the caller): the pool blocks gathered into `staging`, then each copied
    /// to its slot (in order, so a slot spilled into twice keeps the later block).
    pub fn spill(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        staging: &mut BlockStaging,
        run: &[(u32, u32)],
    ) -> anyhow::Result<()> {
        let stream = gpu.stream();
        let blocks: Vec<u32> = run.iter().map(|&(block, _)| block).collect();
        staging.copy(stream, kernels, cache, BlockCopy::Gather, &blocks)?;
        for (e, &(_, slot)) in run.iter().enumerate() {
            let host = self.slot_ptr(gpu, slot)?;
            let staged = staging.span(e, 1);
            let (from, _guard) = staged.device_ptr(stream);
            // SAFETY: `host` is one slot (block_elems elements) of a live page-locked chunk
            // that nothing on the host touches until the stream is synchronized; the copy
            // is queued on the stream every use of the chunk goes through, after the
            // gather that fills `staged`.
            unsafe {
                let host = std::slice::from_raw_parts_mut(host, self.block_elems);
                result::memcpy_dtoh_async(host, from, stream.cu_stream())
            }?;
            self.filled[slot as usize] = true;
        }
        Ok(())
    }

    /// One run of loads, `(slot, pool block)` each (at most what `staging` holds, no pool
    /// block twice; every id checked by the caller): each slot copied into `staging`, then
    /// scattered into its pool block, queued on `stream` (the load lane's, which the caller
    /// orders after the spills into these slots and before any later spill into them).
    pub fn load(
        &mut self,
        stream: &Arc<CudaStream>,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        staging: &mut BlockStaging,
        run: &[(u32, u32)],
    ) -> anyhow::Result<()> {
        for (e, &(slot, _)) in run.iter().enumerate() {
            let host = self.filled_ptr(slot)?;
            let mut staged = staging.span_mut(e, 1);
            let (to, _guard) = staged.device_ptr_mut(stream);
            // SAFETY: as in `spill`: a slot of a live chunk, copied after the spill that
            // filled it (the caller orders the streams) into the staging entry the scatter
            // below reads.
            unsafe {
                let host = std::slice::from_raw_parts(host, self.block_elems);
                result::memcpy_htod_async(to, host, stream.cu_stream())
            }?;
        }
        let blocks: Vec<u32> = run.iter().map(|&(_, block)| block).collect();
        staging.copy(stream, kernels, cache, BlockCopy::Scatter, &blocks)
    }

    /// Slot `slot`'s bytes on the host, once every copy queued on `gpu`'s stream (a spill
    /// into it among them) is done; refused for a slot never spilled into.
    pub fn read_slot(&self, gpu: &Gpu, slot: u32) -> anyhow::Result<&[u8]> {
        let host = self.filled_ptr(slot)?;
        gpu.stream().synchronize()?;
        // SAFETY: a filled slot of a live chunk, whose copies are done (the stream is
        // synchronized) and which nothing writes while `self` is borrowed.
        let slot = unsafe { std::slice::from_raw_parts(host, self.block_elems) };
        Ok(bytemuck::cast_slice(slot))
    }

    /// The first element of slot `slot`, which a spill has filled.
    fn filled_ptr(&self, slot: u32) -> anyhow::Result<*const bf16> {
        if !self.filled.get(slot as usize).is_some_and(|&f| f) {
            anyhow::bail!("host slot {slot} read before anything was spilled into it");
        }
        let (chunk, at) = (slot / self.chunk_slots, slot % self.chunk_slots);
        let pinned = self.chunks[chunk as usize]
            .as_ref()
            .ok_or_else(|| anyhow!("host slot {slot} is filled in a chunk never taken"))?;
        let base = pinned.as_ptr()?;
        // SAFETY: the chunk holds chunk_slots slots of block_elems elements and `at` is
        // below chunk_slots.
        Ok(unsafe { base.add(at as usize * self.block_elems) })
    }

    /// The first of slot `slot`'s `block_elems` elements in its chunk, taking the chunk's
    /// page-locked memory the first time.
    fn slot_ptr(&mut self, gpu: &Gpu, slot: u32) -> anyhow::Result<*mut bf16> {
        let (chunk, at) = (slot / self.chunk_slots, slot % self.chunk_slots);
        let held = self
            .chunks
            .get_mut(chunk as usize)
            .ok_or_else(|| anyhow!("host slot {slot} outside a tier of {}", self.slots))?;
        if held.is_none() {
            let elems = self.chunk_slots as usize * self.block_elems;
            // SAFETY: a slot is written by a copy from the device before anything reads it
            // (a read of a slot never spilled into is refused). Flags 0: cached page-locked
            // memory, which the host reads at full speed.
            let pinned = unsafe { gpu.context().alloc_pinned_with_flags::<bf16>(elems, 0) }
                .context("page-locked host memory for the host tier")?;
            *held = Some(pinned);
        }
        let Some(pinned) = held.as_mut() else {
            unreachable!("the chunk was just taken");
        };
        let base = pinned.as_mut_ptr()?;
        // SAFETY: the chunk holds chunk_slots slots of block_elems elements and `at` is
        // below chunk_slots.
        Ok(unsafe { base.add(at as usize * self.block_elems) })
    }
}

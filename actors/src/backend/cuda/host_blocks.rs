//! The host tier below a GPU pool: one slot a block in page-locked host memory, each
//! holding the block's keys and values of every layer as [`GpuKvCache::copy_blocks`] lays
//! them out. The moves of a step go in runs of spills or of loads, each through a staging
//! buffer on the device: a run of spills is one gather kernel over its pool blocks, then
//! one copy a block to its slot; a run of loads one copy a slot into the staging buffer,
//! then one scatter kernel. Every copy is queued on the target's stream ahead of the step
//! that follows, so none waits on the host, and runs keep the moves' order. Page-locked
//! memory is taken in chunks as slots are first spilled into, so a tier costs about what
//! it holds. The index of what each slot holds is the KV allocator's
//! (`kv_allocator/host_tier.rs`); this only makes its copies.

use anyhow::{anyhow, Context};
use half::bf16;
use peregrine_kernels::cuda::kv_blocks::BlockCopy;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_runtime::cuda::cudarc::driver::{
    result, CudaSlice, DevicePtr, DevicePtrMut, PinnedHostSlice,
};
use peregrine_runtime::cuda::Gpu;

/// Bytes of page-locked memory taken at once (a chunk of slots), and of the staging buffer.
const CHUNK_BYTES: u64 = 64 << 20;

/// One way a block goes between the pool and the tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostMove {
    /// Pool block `block` into host slot `slot`.
    Spill { block: u32, slot: u32 },
    /// Host slot `slot` into pool block `block`.
    Load { slot: u32, block: u32 },
}

/// The slots of a GPU pool's host tier.
pub struct GpuHostBlocks {
    /// Elements of a block (and a slot).
    block_elems: usize,
    slots: u32,
    /// Slots of a chunk of page-locked memory.
    chunk_slots: u32,
    /// The chunks taken so far, by index.
    chunks: Vec<Option<PinnedHostSlice<bf16>>>,
    /// Whether each slot has been spilled into (a load of one that has not is refused).
    filled: Vec<bool>,
    /// Room for `staged` blocks on the device, and their ids.
    staging: CudaSlice<bf16>,
    ids: CudaSlice<u32>,
    staged: usize,
}

impl GpuHostBlocks {
    /// A tier of as many blocks of `cache` as `bytes` holds (at least one), with its staging
    /// buffer on `gpu`.
    pub fn for_cache(gpu: &Gpu, cache: &GpuKvCache, bytes: u64) -> anyhow::Result<GpuHostBlocks> {
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
        let staged = per_chunk.min(u64::from(slots)) as usize;
        let staging = gpu
            .zeros(staged * block_elems)
            .context("the host tier's staging buffer on the GPU")?;
        Ok(GpuHostBlocks {
            block_elems,
            slots,
            chunk_slots,
            chunks: (0..slots.div_ceil(chunk_slots)).map(|_| None).collect(),
            filled: vec![false; slots as usize],
            staging,
            ids: gpu.zeros(staged)?,
            staged,
        })
    }

    /// Blocks the tier holds at most.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Makes `moves` in order between `cache` and the tier, queued on `gpu`'s stream.
    pub fn apply(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        moves: &[HostMove],
    ) -> anyhow::Result<()> {
        let pool = cache.layout().num_blocks;
        for m in moves {
            let (block, slot) = match *m {
                HostMove::Spill { block, slot } | HostMove::Load { slot, block } => (block, slot),
            };
            if u64::from(block) >= pool || slot >= self.slots {
                anyhow::bail!(
                    "{m:?} outside a pool of {pool} blocks and a tier of {} slots",
                    self.slots
                );
            }
        }
        let mut rest = moves;
        while !rest.is_empty() {
            let run = run_length(rest, self.staged);
            let (run, after) = rest.split_at(run);
            match run[0] {
                HostMove::Spill { .. } => self.spill(gpu, kernels, cache, run)?,
                HostMove::Load { .. } => self.load(gpu, kernels, cache, run)?,
            }
            rest = after;
        }
        Ok(())
    }

    /// One run of spills: the pool blocks gathered into the staging buffer, then each copied
    /// to its slot (in order, so a slot spilled into twice keeps the later block).
    fn spill(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        run: &[HostMove],
    ) -> anyhow::Result<()> {
        let stream = gpu.stream();
        let pairs: Vec<(u32, u32)> = run
            .iter()
            .filter_map(|m| match *m {
                HostMove::Spill { block, slot } => Some((block, slot)),
                HostMove::Load { .. } => None,
            })
            .collect();
        let blocks: Vec<u32> = pairs.iter().map(|&(block, _)| block).collect();
        self.copy_staged(gpu, kernels, cache, BlockCopy::Gather, &blocks)?;
        for (e, &(_, slot)) in pairs.iter().enumerate() {
            let host = self.slot_ptr(gpu, slot)?;
            let staged = self
                .staging
                .slice(e * self.block_elems..(e + 1) * self.block_elems);
            let (from, _guard) = staged.device_ptr(stream);
            // SAFETY: `host` is one slot (block_elems elements) of a live page-locked chunk
            // that nothing on the host reads or writes; the copy is queued on the stream
            // every use of the chunk goes through, after the gather that fills `staged`.
            unsafe {
                let host = std::slice::from_raw_parts_mut(host, self.block_elems);
                result::memcpy_dtoh_async(host, from, stream.cu_stream())
            }?;
            self.filled[slot as usize] = true;
        }
        Ok(())
    }

    /// One run of loads: each slot copied into the staging buffer, then scattered into its
    /// pool block.
    fn load(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        run: &[HostMove],
    ) -> anyhow::Result<()> {
        let stream = gpu.stream();
        let mut blocks = Vec::with_capacity(run.len());
        for (e, m) in run.iter().enumerate() {
            let HostMove::Load { slot, block } = *m else {
                unreachable!("a run of loads holds only loads");
            };
            if !self.filled[slot as usize] {
                anyhow::bail!("host slot {slot} read before anything was spilled into it");
            }
            let host = self.slot_ptr(gpu, slot)?;
            let mut staged = self
                .staging
                .slice_mut(e * self.block_elems..(e + 1) * self.block_elems);
            let (to, _guard) = staged.device_ptr_mut(stream);
            // SAFETY: as in `spill`: a slot of a live chunk, copied on the stream that wrote
            // it, into the staging entry the scatter below reads.
            unsafe {
                let host = std::slice::from_raw_parts(host, self.block_elems);
                result::memcpy_htod_async(to, host, stream.cu_stream())
            }?;
            blocks.push(block);
        }
        self.copy_staged(gpu, kernels, cache, BlockCopy::Scatter, &blocks)
    }

    /// Copies the pool blocks `blocks` between `cache` and the staging buffer's first
    /// entries, their ids sent to the device first.
    fn copy_staged(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        copy: BlockCopy,
        blocks: &[u32],
    ) -> anyhow::Result<()> {
        let stream = gpu.stream();
        stream.memcpy_htod(blocks, &mut self.ids.slice_mut(..blocks.len()))?;
        let ids = self.ids.slice(..blocks.len());
        cache.copy_blocks(kernels, stream, copy, &ids, blocks, &mut self.staging)?;
        Ok(())
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
            // (a load of a slot never spilled into is refused).
            let pinned = unsafe { gpu.context().alloc_pinned::<bf16>(elems) }
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

/// How many of `moves` from the first go together: of one kind, at most `staged` (what the
/// staging buffer holds), and no load into a pool block another load of the run writes
/// (the scatter's blocks run side by side).
fn run_length(moves: &[HostMove], staged: usize) -> usize {
    let spill = matches!(moves[0], HostMove::Spill { .. });
    let mut written = Vec::new();
    moves
        .iter()
        .take(staged)
        .take_while(|m| match **m {
            HostMove::Spill { .. } => spill,
            HostMove::Load { block, .. } => {
                let fresh = !written.contains(&block);
                written.push(block);
                !spill && fresh
            }
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::{run_length, HostMove};

    #[test]
    fn runs_keep_one_kind_fit_the_staging_buffer_and_never_load_a_block_twice() {
        let spill = |block, slot| HostMove::Spill { block, slot };
        let load = |slot, block| HostMove::Load { slot, block };
        let moves = [spill(1, 0), spill(2, 1), load(0, 7), spill(3, 0)];
        assert_eq!(run_length(&moves, 8), 2);
        assert_eq!(run_length(&moves[2..], 8), 1);
        assert_eq!(run_length(&moves, 1), 1);
        let loads = [load(0, 7), load(1, 8), load(2, 7), load(3, 9)];
        assert_eq!(run_length(&loads, 8), 2);
        assert_eq!(run_length(&loads[2..], 8), 2);
    }
}

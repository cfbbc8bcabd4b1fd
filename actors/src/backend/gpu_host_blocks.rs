//! The host tier below a GPU pool: one slot a block in page-locked host memory, each
//! holding the block's keys and values of every layer as [`GpuKvCache::gather_block`]
//! lays them out. A block goes through a staging block on the device (gathered from its
//! layers, then one copy to or from the slot), every copy queued on the target's stream
//! ahead of the step that follows, so no copy waits on the host. A slot's memory is taken
//! when it is first spilled into, so a tier costs what it holds. The index of what each
//! slot holds is the KV allocator's (`kv_allocator/host_tier.rs`); this only makes its
//! copies.

use anyhow::{anyhow, Context};
use half::bf16;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_runtime::cuda::cudarc::driver::{CudaSlice, PinnedHostSlice};
use peregrine_runtime::cuda::Gpu;

/// The slots of a GPU pool's host tier.
pub struct GpuHostBlocks {
    block_elems: usize,
    staging: CudaSlice<bf16>,
    slots: Vec<Option<PinnedHostSlice<bf16>>>,
}

impl GpuHostBlocks {
    /// A tier of as many blocks of `cache` as `bytes` holds (at least one), with its staging
    /// block on `gpu`.
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
        let staging = gpu
            .zeros(block_elems)
            .context("the host tier's staging block on the GPU")?;
        Ok(GpuHostBlocks {
            block_elems,
            staging,
            slots: (0..slots).map(|_| None).collect(),
        })
    }

    /// Blocks the tier holds at most.
    pub fn slots(&self) -> u32 {
        // Built from a u32.
        self.slots.len() as u32
    }

    /// Copies pool block `block` of `cache` into `slot` (taking its memory the first time).
    pub fn spill(
        &mut self,
        gpu: &Gpu,
        cache: &GpuKvCache,
        block: u32,
        slot: u32,
    ) -> anyhow::Result<()> {
        let stream = gpu.stream();
        let elems = self.block_elems;
        let n = self.slots.len();
        let held = self
            .slots
            .get_mut(slot as usize)
            .ok_or_else(|| anyhow!("host slot {slot} outside a tier of {n}"))?;
        if held.is_none() {
            // SAFETY: the slot is written by the copy below before anything reads it (a
            // load of a slot never spilled into is refused).
            let pinned = unsafe { gpu.context().alloc_pinned::<bf16>(elems) }
                .context("page-locked host memory for the host tier")?;
            *held = Some(pinned);
        }
        let Some(pinned) = held.as_mut() else {
            unreachable!("the slot was just filled");
        };
        cache.gather_block(stream, block, &mut self.staging)?;
        stream.memcpy_dtoh(&self.staging, pinned)?;
        Ok(())
    }

    /// Copies `slot` into pool block `block` of `cache`.
    pub fn load(
        &mut self,
        gpu: &Gpu,
        cache: &mut GpuKvCache,
        slot: u32,
        block: u32,
    ) -> anyhow::Result<()> {
        let n = self.slots.len();
        let pinned = self
            .slots
            .get(slot as usize)
            .ok_or_else(|| anyhow!("host slot {slot} outside a tier of {n}"))?
            .as_ref()
            .ok_or_else(|| anyhow!("host slot {slot} read before anything was spilled into it"))?;
        let stream = gpu.stream();
        stream.memcpy_htod(pinned, &mut self.staging)?;
        cache.scatter_block(stream, &self.staging, block)?;
        Ok(())
    }
}

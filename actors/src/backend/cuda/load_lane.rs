//! The loads into a GPU pool on a stream of their own, so that the steps of the other
//! requests do not wait for them: a run of host-tier loads, or of checked disk blocks
//! through the lane's page-locked room, is queued on the lane after an event of the
//! target's stream (so it reads each slot after the spill that filled it, and writes each
//! pool block after whatever the target queued before), with a staging buffer of its own,
//! and an event after it tells the host when its blocks are in ([`LoadLane::finished`]).
//! Until then the scheduler holds the requests those blocks belong to out of every step
//! (`scheduler/tier_loads.rs`), so nothing on the target's stream touches them; and a
//! spill, which may reuse a slot a queued load still reads, first makes the target's
//! stream wait for the lane ([`LoadLane::fence`]).

use super::host_blocks::GpuHostBlocks;
use super::staging::BlockStaging;
use anyhow::Context;
use half::bf16;
use peregrine_kernels::cuda::kv_blocks::BlockCopy;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_runtime::cuda::cudarc::driver::sys::CUevent_flags;
use peregrine_runtime::cuda::cudarc::driver::{
    result, CudaEvent, CudaStream, DevicePtrMut, PinnedHostSlice,
};
use peregrine_runtime::cuda::Gpu;
use std::collections::VecDeque;
use std::sync::Arc;

/// The lane's stream, its staging buffer, its page-locked room for disk blocks, and the
/// runs queued on it.
pub struct LoadLane {
    stream: Arc<CudaStream>,
    staging: BlockStaging,
    /// Page-locked room for a run of disk blocks (taken when the disk tier is kept:
    /// [`LoadLane::keep_room`]), and the event after the copy out of it that the next run
    /// waits for before refilling it.
    room: Option<(PinnedHostSlice<bf16>, Option<CudaEvent>)>,
    /// Each run queued and not yet reported, oldest first: the event recorded after it
    /// and its pool blocks.
    pending: VecDeque<(CudaEvent, Vec<u32>)>,
}

impl LoadLane {
    /// A new stream on `gpu` with a staging buffer for blocks of `cache`.
    pub fn new(gpu: &Gpu, cache: &GpuKvCache) -> anyhow::Result<LoadLane> {
        Ok(LoadLane {
            stream: gpu.context().new_stream()?,
            staging: BlockStaging::for_cache(gpu, cache)?,
            room: None,
            pending: VecDeque::new(),
        })
    }

    /// Queues one run of loads, `(slot, pool block)` each (at most what a staging buffer of
    /// `cache`'s blocks holds, as the tiers' shared one; no pool block twice; every id
    /// checked by the caller), after everything queued on `gpu`'s stream so far.
    pub fn load(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        host: &mut GpuHostBlocks,
        run: &[(u32, u32)],
    ) -> anyhow::Result<()> {
        self.after_target(gpu)?;
        host.load(&self.stream, kernels, cache, &mut self.staging, run)?;
        let blocks = run.iter().map(|&(_, block)| block).collect();
        self.pending.push_back((event_after(&self.stream)?, blocks));
        Ok(())
    }

    /// Queues one run of checked disk blocks, `(pool block, bytes)` each (at most what a
    /// staging buffer of `cache`'s blocks holds, no pool block twice; every id checked
    /// when its read was queued), through the lane's page-locked room, after everything
    /// queued on `gpu`'s stream so far.
    pub fn upload(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        run: &[(u32, Vec<u8>)],
    ) -> anyhow::Result<()> {
        self.after_target(gpu)?;
        let LoadLane {
            stream,
            staging,
            room,
            pending,
        } = self;
        let block_elems = cache.block_elems();
        let elems = run.len() * block_elems;
        let Some((pinned, used)) = room else {
            anyhow::bail!("a disk block to load with no disk tier kept");
        };
        // The room may still be the source of the last run's copy.
        if let Some(used) = used.take() {
            used.synchronize()?;
        }
        let filled = pinned.as_mut_slice()?;
        for (e, (_, data)) in run.iter().enumerate() {
            let entry = &mut filled[e * block_elems..(e + 1) * block_elems];
            bytemuck::cast_slice_mut::<bf16, u8>(entry).copy_from_slice(data);
        }
        let host = pinned.as_ptr()?;
        let mut staged = staging.span_mut(0, run.len());
        let (to, guard) = staged.device_ptr_mut(stream);
        // SAFETY: the first `elems` elements of the page-locked room, written above and
        // left alone until the event recorded after this copy has passed (the next run
        // waits for it); copied into the staging entries the scatter below reads.
        unsafe {
            let host = std::slice::from_raw_parts(host, elems);
            result::memcpy_htod_async(to, host, stream.cu_stream())
        }?;
        drop(guard);
        *used = Some(event_after(stream)?);
        let blocks: Vec<u32> = run.iter().map(|&(block, _)| block).collect();
        staging.copy(stream, kernels, cache, BlockCopy::Scatter, &blocks)?;
        pending.push_back((event_after(stream)?, blocks));
        Ok(())
    }

    /// Takes the page-locked room the disk tier's blocks are loaded through, as large as
    /// the lane's staging buffer: at start-up, since taking 64 MiB of page-locked memory
    /// holds the runner for tens of milliseconds.
    pub fn keep_room(&mut self, gpu: &Gpu, cache: &GpuKvCache) -> anyhow::Result<()> {
        let all = self.staging.entries() * cache.block_elems();
        // SAFETY: every element a copy reads is written from a checked block first.
        // Flags 0: cached page-locked memory.
        let pinned = unsafe { gpu.context().alloc_pinned_with_flags::<bf16>(all, 0) }
            .context("page-locked host memory for the disk tier's loads")?;
        self.room = Some((pinned, None));
        Ok(())
    }

    /// Makes the lane wait for everything queued on `gpu`'s stream so far.
    fn after_target(&self, gpu: &Gpu) -> anyhow::Result<()> {
        self.stream.wait(&event_after(gpu.stream())?)?;
        Ok(())
    }

    /// Makes `gpu`'s stream wait for every load queued, before it writes a slot one of
    /// them may still read.
    pub fn fence(&self, gpu: &Gpu) -> anyhow::Result<()> {
        if let Some((last, _)) = self.pending.back() {
            gpu.stream().wait(last)?;
        }
        Ok(())
    }

    /// Whether a run is queued and not yet reported.
    pub fn is_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The pool blocks of the runs finished since the last call, oldest first; with
    /// `wait`, at least the oldest run's while any is queued.
    pub fn finished(&mut self, wait: bool) -> anyhow::Result<Vec<u32>> {
        let mut done = Vec::new();
        while let Some((event, _)) = self.pending.front() {
            if wait && done.is_empty() {
                event.synchronize()?;
            } else if !event.try_is_complete()? {
                break;
            }
            if let Some((_, blocks)) = self.pending.pop_front() {
                done.extend(blocks);
            }
        }
        Ok(done)
    }
}

impl Drop for LoadLane {
    /// Waits for the copies queued on the lane, which read the host tier's page-locked
    /// memory and the lane's room, before either is freed.
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}

/// An event after everything queued on `stream` so far.
fn event_after(stream: &CudaStream) -> anyhow::Result<CudaEvent> {
    Ok(stream.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?)
}

//! The host tier's loads on a stream of their own, so that the steps of the other requests
//! do not wait for them: a run of loads is queued on the lane after an event of the
//! target's stream (so it reads each slot after the spill that filled it, and writes each
//! pool block after whatever the target queued before), with a staging buffer of its own,
//! and an event after it tells the host when its blocks are in ([`LoadLane::finished`]).
//! Until then the scheduler holds the requests those blocks belong to out of every step
//! (`scheduler/tier_loads.rs`), so nothing on the target's stream touches them; and a
//! spill, which may reuse a slot a queued load still reads, first makes the target's
//! stream wait for the lane ([`LoadLane::fence`]).

use super::host_blocks::GpuHostBlocks;
use super::staging::BlockStaging;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_runtime::cuda::cudarc::driver::sys::CUevent_flags;
use peregrine_runtime::cuda::cudarc::driver::{CudaEvent, CudaStream};
use peregrine_runtime::cuda::Gpu;
use std::collections::VecDeque;
use std::sync::Arc;

/// The lane's stream, its staging buffer, and the runs queued on it.
pub struct LoadLane {
    stream: Arc<CudaStream>,
    staging: BlockStaging,
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
        let ready = gpu
            .stream()
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        self.stream.wait(&ready)?;
        host.load(&self.stream, kernels, cache, &mut self.staging, run)?;
        let done = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        let blocks = run.iter().map(|&(_, block)| block).collect();
        self.pending.push_back((done, blocks));
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
    /// memory, before it is freed.
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}

//! The device hand-off of a chained greedy proposal's drafts to the target's verification
//! step: the head copies its chain's drafts in on its stream and the proposal's reply names
//! them by generation and index, not by value, so the host plans the verification while
//! the head still runs, and the target's stream writes them into the step's token ids
//! itself ([`DraftHandOff::feed`]), never waiting for them on the host.
//!
//! Two events order the streams, as for the feature ring: `written`, recorded on the
//! head's stream after each write, which the target's stream waits on before it reads;
//! and `read`, recorded on the target's stream after each read, which the head's stream
//! waits on before its next write. One lock covers a write's or a read's queueing and its
//! event, and each write starts a new generation: a read that names another generation
//! (drafts a later proposal overwrote) is refused, never served stale.

use crate::draft_head::HandedDraft;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut};
use peregrine_kernels::cuda::elementwise::scatter_ids;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::{Gpu, GpuError};
use std::sync::{Arc, Mutex};

/// A read or write the hand-off cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum HandOffError {
    #[error("{len} drafts handed off into room for {capacity}")]
    Room { len: usize, capacity: usize },
    #[error("drafts of hand-off {asked} read after hand-off {current} replaced them")]
    Stale { asked: u64, current: u64 },
    #[error("draft {index} read from a hand-off of {len}")]
    Index { index: usize, len: usize },
    #[error("a draft fed into row {row} of a step of {rows} tokens")]
    Row { row: usize, rows: usize },
    #[error(transparent)]
    Driver(#[from] cudarc::driver::DriverError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// The drafts a chained proposal leaves on the device, shared by the head and the target.
pub struct DraftHandOff {
    capacity: usize,
    state: Mutex<HandOffState>,
    /// Recorded on the head's stream after each write.
    written: CudaEvent,
    /// Recorded on the target's stream after each read.
    read: CudaEvent,
}

/// What the lock guards.
struct HandOffState {
    /// i32 `[capacity]`: the last write's drafts (target token ids).
    drafts: CudaSlice<i32>,
    /// i32 `[capacity, 2]`: a feed's (row, draft) pairs.
    pairs: CudaSlice<i32>,
    /// Drafts the last write copied in.
    len: usize,
    /// Writes so far: the last one's generation.
    generation: u64,
}

impl DraftHandOff {
    /// A hand-off of up to `capacity` drafts on `gpu` (the target's device).
    pub fn new(gpu: &Gpu, capacity: usize) -> Result<DraftHandOff, GpuError> {
        assert!(
            capacity >= 1 && capacity < i32::MAX as usize / 2,
            "a draft hand-off of {capacity}"
        );
        let ctx = gpu.context();
        Ok(DraftHandOff {
            capacity,
            state: Mutex::new(HandOffState {
                drafts: gpu.zeros(capacity)?,
                pairs: gpu.zeros(2 * capacity)?,
                len: 0,
                generation: 0,
            }),
            written: ctx.new_event(None)?,
            read: ctx.new_event(None)?,
        })
    }

    /// Drafts one write holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Queues on `stream` (the head's), after the last read, the copy of `src` (target token
    /// ids) in; returns the write's generation, by which reads name its drafts.
    pub fn write(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaView<i32>,
    ) -> Result<u64, HandOffError> {
        let len = src.len();
        if len > self.capacity {
            let capacity = self.capacity;
            return Err(HandOffError::Room { len, capacity });
        }
        let mut state = self.lock();
        stream.wait(&self.read)?;
        if len > 0 {
            stream.memcpy_dtod(src, &mut state.drafts.slice_mut(0..len))?;
        }
        self.written.record(stream)?;
        state.len = len;
        state.generation += 1;
        Ok(state.generation)
    }

    /// Queues on `stream` (the target's), after the last write, `dst[row] = draft` for each
    /// `(row, draft)` of `fed`: drafts written into a step's token ids (`dst`, the step's
    /// rows). Refused, with nothing queued, for a draft of another write or past it, or a
    /// row past `dst`.
    pub fn feed(
        &self,
        kernels: &CudaKernels,
        stream: &Arc<CudaStream>,
        fed: &[(usize, HandedDraft)],
        dst: &mut CudaViewMut<i32>,
    ) -> Result<(), HandOffError> {
        if fed.is_empty() {
            return Ok(());
        }
        let mut state = self.lock();
        let mut pairs = Vec::with_capacity(2 * fed.len());
        for &(row, draft) in fed {
            state.check(draft)?;
            if row >= dst.len() {
                return Err(HandOffError::Row {
                    row,
                    rows: dst.len(),
                });
            }
            // Both below 2^31: rows of a step, and indices below the capacity.
            pairs.extend([row as i32, draft.index as i32]);
        }
        if fed.len() > self.capacity {
            let (len, capacity) = (fed.len(), self.capacity);
            return Err(HandOffError::Room { len, capacity });
        }
        let HandOffState {
            drafts,
            pairs: staged,
            ..
        } = &mut *state;
        stream.memcpy_htod(&pairs, &mut staged.slice_mut(0..pairs.len()))?;
        stream.wait(&self.written)?;
        let staged = staged.slice(0..pairs.len());
        scatter_ids(kernels, stream, &drafts.as_view(), &staged, dst, fed.len())?;
        self.read.record(stream)?;
        Ok(())
    }

    /// The drafts `which` on the host, read on `stream` (the target's) after the last
    /// write (waits for it). Refused for a draft of another write or past it.
    pub fn fetch(
        &self,
        stream: &Arc<CudaStream>,
        which: &[HandedDraft],
    ) -> Result<Vec<u32>, HandOffError> {
        if which.is_empty() {
            return Ok(Vec::new());
        }
        let state = self.lock();
        for &draft in which {
            state.check(draft)?;
        }
        stream.wait(&self.written)?;
        let all = stream.clone_dtoh(&state.drafts.slice(0..state.len))?;
        self.read.record(stream)?;
        Ok(which.iter().map(|d| all[d.index] as u32).collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HandOffState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl HandOffState {
    /// Whether `draft` is one the last write left.
    fn check(&self, draft: HandedDraft) -> Result<(), HandOffError> {
        if draft.generation != self.generation {
            return Err(HandOffError::Stale {
                asked: draft.generation,
                current: self.generation,
            });
        }
        if draft.index >= self.len {
            return Err(HandOffError::Index {
                index: draft.index,
                len: self.len,
            });
        }
        Ok(())
    }
}

//! The device hand-off of the target's recorded layer inputs to an EAGLE-3 head on the GPU
//! (`cuda` feature): a ring of bf16 rows that the target stores each forward's rows into
//! on its stream, and that the head gathers step 0's rows from on its own, so that the
//! features never travel through the host. The messages between the actors name rows of
//! the ring by number (`HiddenData::Ring`); the ring itself is made once, at load, and
//! held by both.
//!
//! Two events order the streams: `stored`, recorded on the target's stream after each
//! store, which the head's stream waits on before a gather; and `gathered`, recorded on the
//! head's stream after each gather, which the target's stream waits on before its next
//! store. One lock covers a store's or a gather's queueing and its event, so a store
//! queued after a gather cannot overwrite the rows it reads before it has read them, and a
//! gather refuses rows that a store queued before it has already overwritten.

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView};
use half::bf16;
use peregrine_kernels::cuda::elementwise::{gather_rows, ring_store};
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::{Gpu, GpuError};
use std::sync::{Arc, Mutex};

/// A gather that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("feature ring row {row} is not held: the ring holds rows {oldest}..{next}")]
    NotHeld { row: u64, oldest: u64, next: u64 },
    #[error("a gather of {rows} rows into room for {room}")]
    Room { rows: usize, room: usize },
    #[error(transparent)]
    Driver(#[from] cudarc::driver::DriverError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// The ring of recorded target features shared by the target and an EAGLE-3 head.
pub struct FeatureRing {
    width: usize,
    capacity: u64,
    state: Mutex<RingState>,
    /// Recorded on the storing stream after each store.
    stored: CudaEvent,
    /// Recorded on the gathering stream after each gather.
    gathered: CudaEvent,
}

/// What the lock guards: the rows and how many were ever stored.
struct RingState {
    /// bf16 `[capacity, width]`.
    rows: CudaSlice<bf16>,
    /// Rows stored so far; row `r` lies at `r % capacity`.
    next: u64,
}

impl FeatureRing {
    /// A ring of `capacity` rows of `width` features on `gpu` (the target's device).
    pub fn new(gpu: &Gpu, capacity: usize, width: usize) -> Result<FeatureRing, GpuError> {
        assert!(
            capacity >= 1 && capacity < i32::MAX as usize,
            "a feature ring of {capacity} rows"
        );
        let rows = gpu.zeros(capacity * width)?;
        let ctx = gpu.context();
        Ok(FeatureRing {
            width,
            capacity: capacity as u64,
            state: Mutex::new(RingState { rows, next: 0 }),
            stored: ctx.new_event(None)?,
            gathered: ctx.new_event(None)?,
        })
    }

    /// Features in one row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Rows the ring holds.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Bytes the ring takes on the device.
    pub fn bytes(&self) -> u64 {
        self.capacity * self.width as u64 * 2
    }

    /// Whether row `row` is still held: stored, and not overwritten by a store queued
    /// since. (A store queued later may still overwrite it before a gather is queued.)
    pub fn holds(&self, row: u64) -> bool {
        let next = self.lock().next;
        row < next && row + self.capacity >= next
    }

    /// Queues on `stream` (the target's), after the last gather, the store of the first
    /// `rows` rows of `src` (f32 `[rows, width]`), and returns the number of the first.
    pub fn store(
        &self,
        kernels: &CudaKernels,
        stream: &Arc<CudaStream>,
        src: &CudaView<f32>,
        rows: usize,
    ) -> Result<u64, RingError> {
        if rows as u64 > self.capacity {
            let room = self.capacity as usize;
            return Err(RingError::Room { rows, room });
        }
        let mut state = self.lock();
        let first = state.next;
        stream.wait(&self.gathered)?;
        let ring = &mut state.rows.as_view_mut();
        ring_store(kernels, stream, src, ring, first, rows, self.width)?;
        self.stored.record(stream)?;
        state.next += rows as u64;
        Ok(first)
    }

    /// Queues on `stream` (the head's), after the last store, the gather of rows `ids` into
    /// the first `ids.len()` rows of `out` (bf16 `[rows, width]`), their ring slots staged
    /// through `slots` (as many as `ids` or more). Refuses a row that is not held.
    pub fn gather(
        &self,
        kernels: &CudaKernels,
        stream: &Arc<CudaStream>,
        ids: &[u64],
        slots: &mut CudaSlice<i32>,
        out: &mut CudaSlice<bf16>,
    ) -> Result<(), RingError> {
        let n = ids.len();
        let room = (out.len() / self.width.max(1)).min(slots.len());
        if n > room {
            return Err(RingError::Room { rows: n, room });
        }
        if n == 0 {
            return Ok(());
        }
        let state = self.lock();
        let oldest = state.next.saturating_sub(self.capacity);
        let next = state.next;
        let mut host = Vec::with_capacity(n);
        for &row in ids {
            if row < oldest || row >= next {
                return Err(RingError::NotHeld { row, oldest, next });
            }
            // Below the capacity, which is below 2^31.
            host.push((row % self.capacity) as i32);
        }
        stream.memcpy_htod(&host, &mut slots.slice_mut(0..n))?;
        stream.wait(&self.stored)?;
        let dst = &mut out.slice_mut(0..n * self.width);
        let src = state.rows.as_view();
        gather_rows(kernels, stream, &src, &slots.slice(0..n), dst, self.width)?;
        self.gathered.record(stream)?;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

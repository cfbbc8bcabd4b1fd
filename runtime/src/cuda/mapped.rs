//! Page-locked host memory mapped into the device's address space: kernels write it
//! directly (zero-copy), so a step's few results reach the host without a copy operation
//! on the stream (a small device-to-host copy costs the stream about 9 us on an H200,
//! against a few stores from a kernel already running; `scripts/stream_op_costs.py`).

use cudarc::driver::{result, sys, CudaStream, DriverError};
use std::sync::Arc;

/// `len` values of `T` in page-locked host memory that kernels on `stream` write through
/// [`MappedHost::device_address`]. Dropping it waits for the stream first, so no queued
/// kernel (nor a graph that baked the address in) writes it after it is freed.
pub struct MappedHost<T> {
    ptr: *mut T,
    device_address: u64,
    len: usize,
    stream: Arc<CudaStream>,
}

// SAFETY: the memory is a plain allocation owned by this value; reads go through `read`,
// which copies out.
unsafe impl<T: Send> Send for MappedHost<T> {}
unsafe impl<T: Sync> Sync for MappedHost<T> {}

impl<T: Copy + Default> MappedHost<T> {
    /// `len` values (at least one), each `T::default()`, for kernels on `stream`.
    pub fn new(stream: &Arc<CudaStream>, len: usize) -> Result<MappedHost<T>, DriverError> {
        let len = len.max(1);
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("mapped host allocation size overflow");
        stream.context().bind_to_thread()?;
        // SAFETY: a fresh allocation of `bytes` bytes, written in full below before anyone
        // reads it; the device address is looked up for that allocation.
        unsafe {
            let ptr = result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP)? as *mut T;
            for i in 0..len {
                ptr.add(i).write(T::default());
            }
            let mut device_address: sys::CUdeviceptr = 0;
            if let Err(e) =
                sys::cuMemHostGetDevicePointer_v2(&mut device_address, ptr.cast(), 0).result()
            {
                let _ = result::free_host(ptr.cast());
                return Err(e);
            }
            Ok(MappedHost {
                ptr,
                device_address,
                len,
                stream: stream.clone(),
            })
        }
    }

    /// Where kernels write it: room for [`MappedHost::len`] values of `T`.
    pub fn device_address(&self) -> u64 {
        self.device_address
    }

    /// The values it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: it holds at least one value.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The first `n` values (at most [`MappedHost::len`]) as the device last wrote them.
    /// Read them only once the work that wrote them has completed (an event recorded after
    /// it, or the stream, synchronized); a kernel still running may be writing them.
    pub fn read(&self, n: usize) -> Vec<T> {
        assert!(n <= self.len, "{n} values read of {}", self.len);
        // SAFETY: `n` values lie within the allocation; volatile, since the device writes
        // them behind the compiler's back.
        (0..n)
            .map(|i| unsafe { self.ptr.add(i).read_volatile() })
            .collect()
    }
}

impl<T> Drop for MappedHost<T> {
    fn drop(&mut self) {
        // A kernel queued before the drop may still write the memory: wait for it.
        let _ = self.stream.synchronize();
        // SAFETY: allocated by `malloc_host` in `new`, freed once.
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}

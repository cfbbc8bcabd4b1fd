//! Kernel launches through `cuLaunchKernelEx`, with programmatic dependent launch where the
//! device has it (compute capability 9.0 and up).
//!
//! A kernel launched that way may start while the kernel ahead of it in the stream is
//! still running, once every block of that one has begun; it then waits in
//! `pdl_wait()` (`common.cuh`) until the kernel ahead has finished and its writes are
//! visible. Every kernel of this crate keeps to one rule: before `pdl_wait()` it writes
//! nothing and reads only what no kernel of the step writes (weights, the step's staged
//! inputs, and in a fused decode attention the KV of earlier steps' tokens; `common.cuh`
//! says why each is safe). Since a kernel only
//! finishes after its own wait returned, the wait covers every earlier kernel of the
//! stream too. What it buys: the next kernel's launch and its first weight loads overlap
//! the tail of the one before, which at batch 1 decode is most of a small product's time.
//! A kernel of another library (cuBLAS) is launched as usual and waits for all before it.
//! --deterministic launches this way too: it changes when a kernel starts, never what it
//! computes (on an H100, the Llama-3.2-1B shape's batch-1 and batch-8 steps in that mode
//! took 1.41 and 1.52 ms with it against 1.45 and 1.60 without; `docs/performance.md`).

use super::CudaKernels;
use cudarc::driver::sys::{
    CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
};
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DriverError,
    LaunchConfig,
};
use std::ffi::c_void;

/// The most parameters a kernel of this crate takes.
const MAX_PARAMS: usize = 24;

/// One kernel launch being put together: the kernel, its stream and its parameters.
pub struct KernelLaunch<'a> {
    kernels: &'a CudaKernels,
    stream: &'a CudaStream,
    name: &'a str,
    /// Each parameter's bytes from the start of its slot (8-byte aligned).
    params: [Slot; MAX_PARAMS],
    count: usize,
}

/// The room one parameter takes: up to [`SLOT_BYTES`] bytes, 8-byte aligned.
type Slot = [u64; SLOT_BYTES / 8];

/// The largest parameter a kernel of this crate takes, in bytes.
const SLOT_BYTES: usize = 64;

/// A value that can be passed to a kernel.
pub trait KernelArg {
    /// Writes the parameter's bytes from the start of `slot`.
    fn write(self, stream: &CudaStream, slot: &mut Slot);
}

/// A plain C struct passed to a kernel by value, laid out as the kernel declares it.
pub struct ByValue<T>(pub T);

impl<T: DeviceRepr + Copy> KernelArg for ByValue<T> {
    fn write(self, _: &CudaStream, slot: &mut Slot) {
        assert!(
            std::mem::size_of::<T>() <= SLOT_BYTES && std::mem::align_of::<T>() <= 8,
            "a kernel parameter of {} bytes is past the launcher's slots",
            std::mem::size_of::<T>()
        );
        // SAFETY: the value fits the slot, whose alignment (8) is at least its own.
        unsafe { std::ptr::write(slot.as_mut_ptr().cast::<T>(), self.0) };
    }
}

impl<'a> KernelLaunch<'a> {
    pub(crate) fn new(
        kernels: &'a CudaKernels,
        stream: &'a CudaStream,
        name: &'a str,
    ) -> KernelLaunch<'a> {
        KernelLaunch {
            kernels,
            stream,
            name,
            params: [[0; SLOT_BYTES / 8]; MAX_PARAMS],
            count: 0,
        }
    }

    /// Appends the next parameter.
    pub fn arg(&mut self, arg: impl KernelArg) -> &mut Self {
        assert!(
            self.count < MAX_PARAMS,
            "kernel `{}` takes more than {MAX_PARAMS} parameters",
            self.name
        );
        arg.write(self.stream, &mut self.params[self.count]);
        self.count += 1;
        self
    }

    /// Queues the kernel on the stream.
    ///
    /// # Safety
    /// The parameters must be those the kernel declares, in order and of the same sizes,
    /// and every buffer must hold what the kernel touches under `cfg`.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        let function = self.kernels.function(self.name);
        let mut pointers = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
        for (pointer, slot) in pointers.iter_mut().zip(self.params.iter_mut()) {
            *pointer = slot.as_mut_ptr().cast();
        }
        // SAFETY: a plain-data union; the one field the driver reads is set below.
        let mut value: CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attribute = CUlaunchAttribute {
            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let config = CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: u32::from(self.kernels.programmatic_launch()),
        };
        self.stream.context().bind_to_thread()?;
        // SAFETY: the config, the function and the parameter pointers (into `self.params`,
        // alive for the call) are valid; the caller vouches for the parameters' meaning.
        unsafe {
            cudarc::driver::sys::cuLaunchKernelEx(
                &config,
                function.cu_function(),
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        }
    }
}

/// A scalar parameter: its bytes at the start of the slot (little-endian, as the driver
/// reads them).
macro_rules! scalar_arg {
    ($($t:ty),* $(,)?) => {
        $(impl KernelArg for &$t {
            fn write(self, stream: &CudaStream, slot: &mut Slot) {
                ByValue(*self).write(stream, slot);
            }
        })*
    };
}

scalar_arg!(i32, u32, f32, i64, u64);

/// A device buffer parameter: its address.
fn write_address(address: u64, slot: &mut Slot) {
    slot[0] = address;
}

impl<T> KernelArg for &CudaSlice<T> {
    fn write(self, stream: &CudaStream, slot: &mut Slot) {
        write_address(self.device_ptr(stream).0, slot);
    }
}

impl<T> KernelArg for &mut CudaSlice<T> {
    fn write(self, stream: &CudaStream, slot: &mut Slot) {
        write_address(self.device_ptr_mut(stream).0, slot);
    }
}

impl<T> KernelArg for &CudaView<'_, T> {
    fn write(self, stream: &CudaStream, slot: &mut Slot) {
        write_address(self.device_ptr(stream).0, slot);
    }
}

impl<T> KernelArg for &mut CudaViewMut<'_, T> {
    fn write(self, stream: &CudaStream, slot: &mut Slot) {
        write_address(self.device_ptr_mut(stream).0, slot);
    }
}

//! The CUDA backend's device handle: one context, one stream, memory transfers, and the
//! NVRTC compiler with its on-disk cache. Built only with the `cuda` feature; the CUDA
//! libraries are loaded at run time, so the build needs no CUDA install.

mod compiler;
mod mapped;
pub mod nccl;

pub use compiler::{cuda_include_dir, CompiledModule, KernelCompiler, KernelSource};
pub use cudarc;
pub use mapped::MappedHost;

use cudarc::driver::{
    sys, CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, ValidAsZeroBits,
};
use std::sync::Arc;

/// Why the GPU could not be used.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The driver library could not be loaded or reported an error.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    /// The driver could not be loaded at all (no NVIDIA driver on this machine).
    #[error("no CUDA driver could be loaded: {0}")]
    NoDriver(String),
    /// No device with this ordinal.
    #[error("CUDA device {ordinal} does not exist ({count} device(s) found)")]
    NoDevice { ordinal: usize, count: usize },
    /// NVRTC could not find the CUDA headers it needs.
    #[error("{0}")]
    NoHeaders(String),
    /// A kernel failed to compile; the log says why.
    #[error("kernel module `{module}` failed to compile for {arch}: {log}")]
    Compile {
        module: String,
        arch: String,
        log: String,
    },
    /// No NCCL library could be loaded and used (tensor parallelism needs one).
    #[error("NCCL cannot be used: {0}")]
    NoNccl(String),
    /// NCCL reported an error.
    #[error("NCCL error: {0}")]
    Nccl(String),
    /// The kernel cache could not be read or written.
    #[error("kernel cache {path}: {source}")]
    Cache {
        path: String,
        source: std::io::Error,
    },
}

/// One CUDA device with the stream every kernel of the model path runs on.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    arch: String,
}

impl Gpu {
    /// Opens device `ordinal`. Event tracking is turned off before the first allocation:
    /// work is ordered by the one stream (and explicit events where streams meet), not by
    /// cudarc's per-buffer events, which cost time and would leak into captured graphs.
    pub fn open(ordinal: usize) -> Result<Gpu, GpuError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(GpuError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: called before any allocation or stream of this context exists.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability()?;
        // A stream of its own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream()?;
        Ok(Gpu {
            name: ctx.name()?,
            arch: format!("sm_{major}{minor}"),
            ctx,
            stream,
        })
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream the model path runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's name, as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The architecture NVRTC compiles for, such as `sm_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Free and total device memory, in bytes, once the context's work is done (every
    /// stream's, another `Gpu` of the same device included) and the memory freed has left
    /// the device's pool (stream-ordered frees wait there otherwise, and would count as used).
    pub fn memory(&self) -> Result<(u64, u64), GpuError> {
        self.ctx.synchronize()?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: the context is current (synchronize bound it), `pool` receives the device's
        // current pool, which trimming only shrinks to what its live allocations hold.
        unsafe {
            sys::cuDeviceGetMemPool(&mut pool, self.ctx.cu_device()).result()?;
            sys::cuMemPoolTrimTo(pool, 0).result()?;
        }
        let (free, total) = self.ctx.mem_get_info()?;
        Ok((free as u64, total as u64))
    }

    /// A device copy of `host`.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, GpuError> {
        Ok(self.stream.clone_htod(host)?)
    }

    /// A host copy of `device` (waits for the stream).
    pub fn download<T: DeviceRepr, S: DevicePtr<T>>(&self, device: &S) -> Result<Vec<T>, GpuError> {
        Ok(self.stream.clone_dtoh(device)?)
    }

    /// `len` zeroed elements on the device.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, GpuError> {
        Ok(self.stream.alloc_zeros(len)?)
    }

    /// Waits until everything queued on the stream has run.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        Ok(self.stream.synchronize()?)
    }
}

/// Number of CUDA devices, or why none can be used.
pub fn device_count() -> Result<usize, GpuError> {
    // cudarc panics when it cannot load the driver library: look for it first, so that a
    // machine without a driver gets this error and no panic message.
    // SAFETY: only tries to open the library by its known names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::NoDriver(
            "libcuda.so (the NVIDIA driver's library) was not found: install the NVIDIA \
             driver, or use --device cpu"
                .into(),
        ));
    }
    // A driver too old for a symbol cudarc asks for still panics there: report it too.
    let count = std::panic::catch_unwind(CudaContext::device_count).map_err(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the CUDA driver library failed to load".into());
        GpuError::NoDriver(text)
    })??;
    Ok(count.max(0) as usize)
}

/// Whether a CUDA device can be opened here; GPU tests skip themselves when not.
pub fn gpu_available() -> bool {
    matches!(device_count(), Ok(n) if n > 0)
}

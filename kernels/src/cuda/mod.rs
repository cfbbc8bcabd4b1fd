//! GPU kernels: CUDA C sources under `kernels/cuda/` (written to compile as HIP too),
//! compiled by NVRTC for the device at start-up and cached on disk, plus one Rust launcher
//! per kernel. Built with the `cuda` feature.

pub mod attention;
pub mod elementwise;
pub mod gemm;
pub mod gemm_lt;
pub mod kv_blocks;
pub mod kv_write;
pub mod launch;
pub mod mla;
pub mod moe;
pub mod norm;
pub mod sampling;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaFunction, CudaStream, DriverError, LaunchConfig};
use launch::KernelLaunch;
use peregrine_runtime::cuda::{Gpu, GpuError, KernelCompiler, KernelSource};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

/// The header prepended to every module.
const HEADER: &str = include_str!("../../cuda/common.cuh");

/// Every kernel module, one `.cu` file each.
pub const MODULES: &[KernelSource] = &[
    KernelSource {
        name: "norm",
        code: include_str!("../../cuda/norm.cu"),
    },
    KernelSource {
        name: "attention",
        code: concat!(
            include_str!("../../cuda/attention.cu"),
            include_str!("../../cuda/attention_mma.cu")
        ),
    },
    KernelSource {
        name: "mla",
        code: concat!(
            include_str!("../../cuda/mla.cu"),
            include_str!("../../cuda/mla_mma.cu")
        ),
    },
    KernelSource {
        name: "moe",
        code: include_str!("../../cuda/moe.cu"),
    },
    KernelSource {
        name: "moe_mma",
        code: include_str!("../../cuda/moe_mma.cu"),
    },
    KernelSource {
        name: "kv_write",
        code: include_str!("../../cuda/kv_write.cu"),
    },
    KernelSource {
        name: "kv_blocks",
        code: include_str!("../../cuda/kv_blocks.cu"),
    },
    KernelSource {
        name: "elementwise",
        code: include_str!("../../cuda/elementwise.cu"),
    },
    KernelSource {
        name: "gemm",
        code: include_str!("../../cuda/gemm.cu"),
    },
    KernelSource {
        name: "gemm_mma",
        code: include_str!("../../cuda/gemm_mma.cu"),
    },
    KernelSource {
        name: "sampling",
        code: include_str!("../../cuda/sampling.cu"),
    },
];

/// Every kernel function of every module, loaded into one device's context.
pub struct CudaKernels {
    functions: HashMap<String, CudaFunction>,
    compiled: usize,
    /// Launches use programmatic dependent launch (see [`launch`]).
    programmatic: bool,
    /// The device has bf16 tensor-core products (`mma.sync`, compute capability 8.0 up).
    tensor_cores: bool,
    /// The device's multiprocessors.
    multiprocessors: u32,
    /// [`CudaKernels::resident_blocks`] of each kernel asked about so far, by the dynamic
    /// shared memory asked with.
    resident: Mutex<HashMap<String, HashMap<u32, u32>>>,
    /// The dynamic shared memory each kernel asked about has been granted
    /// ([`CudaKernels::grant_shared`]).
    granted: Mutex<HashMap<String, u32>>,
}

impl CudaKernels {
    /// Compiles (or takes from `cache_dir`) every module for `gpu`'s architecture and loads
    /// its functions.
    pub fn load(gpu: &Gpu, cache_dir: &Path) -> Result<CudaKernels, GpuError> {
        let compiler = KernelCompiler::new(gpu.arch(), cache_dir, HEADER)?;
        let modules = compiler.load_all(gpu.context(), MODULES)?;
        let mut functions = HashMap::new();
        let mut compiled = 0;
        for (source, loaded) in MODULES.iter().zip(&modules) {
            compiled += usize::from(!loaded.from_cache);
            for name in kernel_names(source.code) {
                let function = loaded.module.load_function(name)?;
                functions.insert(name.to_string(), function);
            }
        }
        let multiprocessors = gpu
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(CudaKernels {
            functions,
            compiled,
            programmatic: supports_programmatic_launch(gpu.arch()),
            tensor_cores: has_bf16_tensor_cores(gpu.arch()),
            multiprocessors: multiprocessors.max(1) as u32,
            resident: Mutex::new(HashMap::new()),
            granted: Mutex::new(HashMap::new()),
        })
    }

    /// The same kernels, launched one after another without programmatic dependent launch
    /// (`bench latency --no-programmatic-launch` measures the two side by side).
    pub fn without_programmatic_launch(mut self) -> CudaKernels {
        self.programmatic = false;
        self
    }

    /// The same kernels with the tensor-core paths left unchosen: every launcher that has a
    /// CUDA-core kernel too takes it, as on a device without tensor cores (the GPU tests run
    /// the portable kernels this way).
    pub fn without_tensor_cores(mut self) -> CudaKernels {
        self.tensor_cores = false;
        self
    }

    /// Whether launches use programmatic dependent launch.
    pub fn programmatic_launch(&self) -> bool {
        self.programmatic
    }

    /// Whether the device has bf16 tensor-core products (the `_mma` kernels run there).
    pub(crate) fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    /// A launch of the kernel `name` on `stream`, to be given its parameters.
    pub(crate) fn launch<'a>(&'a self, stream: &'a CudaStream, name: &'a str) -> KernelLaunch<'a> {
        KernelLaunch::new(self, stream, name)
    }

    /// How many blocks of `threads` threads of the kernel `name`, each with `shared_bytes`
    /// of dynamic shared memory, the device runs at once: what one multiprocessor holds,
    /// times their number. Asked of the driver once per kernel and size.
    pub(crate) fn resident_blocks(
        &self,
        name: &str,
        threads: u32,
        shared_bytes: u32,
    ) -> Result<u32, DriverError> {
        let mut known = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&blocks) = known.get(name).and_then(|sizes| sizes.get(&shared_bytes)) {
            return Ok(blocks);
        }
        let per_sm = self
            .function(name)
            .occupancy_max_active_blocks_per_multiprocessor(threads, shared_bytes as usize, None)?;
        let blocks = per_sm.max(1) * self.multiprocessors;
        known
            .entry(name.to_string())
            .or_default()
            .insert(shared_bytes, blocks);
        Ok(blocks)
    }

    /// Lets blocks of the kernel `name` take `bytes` of dynamic shared memory, past the
    /// 48 KiB a block gets without asking (up to what the device allows a block, else the
    /// driver's error). Asked of the driver once per kernel and larger size.
    pub(crate) fn grant_shared(&self, name: &str, bytes: u32) -> Result<(), DriverError> {
        let mut granted = self.granted.lock().unwrap_or_else(|e| e.into_inner());
        if granted.get(name).is_some_and(|&have| have >= bytes) {
            return Ok(());
        }
        let attribute = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        let value = i32::try_from(bytes).expect("shared bytes past i32");
        self.function(name).set_attribute(attribute, value)?;
        granted.insert(name.to_string(), bytes);
        Ok(())
    }

    /// The device's multiprocessors.
    pub(crate) fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// How many modules were compiled now rather than taken from the cache.
    pub fn freshly_compiled(&self) -> usize {
        self.compiled
    }

    /// The kernel `name`. A missing name is a bug in this crate (a launcher naming a
    /// kernel its source does not define), caught by the test that loads every module.
    pub(crate) fn function(&self, name: &str) -> &CudaFunction {
        self.functions
            .get(name)
            .unwrap_or_else(|| panic!("no GPU kernel named `{name}` was loaded"))
    }
}

/// The compute capability of `arch` (`sm_90` is 90); none for a device of another vendor.
fn compute_capability(arch: &str) -> Option<u32> {
    arch.strip_prefix("sm_")
        .and_then(|digits| digits.parse::<u32>().ok())
}

/// Whether devices of `arch` have programmatic dependent launch: compute capability 9.0 up.
fn supports_programmatic_launch(arch: &str) -> bool {
    compute_capability(arch).is_some_and(|cc| cc >= 90)
}

/// Whether devices of `arch` have bf16 `mma.sync` products: compute capability 8.0 up.
fn has_bf16_tensor_cores(arch: &str) -> bool {
    compute_capability(arch).is_some_and(|cc| cc >= 80)
}

/// Names of the `extern "C" __global__` functions a source defines.
pub fn kernel_names(code: &str) -> impl Iterator<Item = &str> {
    code.split("__global__").skip(1).filter_map(|rest| {
        let rest = rest.trim_start().strip_prefix("void")?.trim_start();
        let rest = match rest.strip_prefix("__launch_bounds__") {
            Some(bounds) => &bounds[bounds.find(')')? + 1..],
            None => rest,
        };
        Some(rest[..rest.find('(')?].trim())
    })
}

/// Compiles every module for `arch` without a device (NVRTC alone), so that a machine
/// without a GPU can still check the sources; returns the names [`kernel_names`] reads
/// from each module that its PTX does not define (a loader would fail on them), module by
/// module.
pub fn compile_all(arch: &str, cache_dir: &Path) -> Result<Vec<Vec<String>>, GpuError> {
    let compiler = KernelCompiler::new(arch, cache_dir, HEADER)?;
    let mut missing = Vec::new();
    for source in MODULES {
        let (ptx, _) = compiler.ptx(source)?;
        let absent = kernel_names(source.code)
            .filter(|name| !ptx.contains(&format!(".entry {name}(")))
            .map(str::to_string)
            .collect();
        missing.push(absent);
    }
    Ok(missing)
}

/// A one-dimensional launch of `blocks` blocks of `threads` threads.
pub(crate) fn grid(blocks: u32, threads: u32, shared_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programmatic_launch_from_compute_capability_9() {
        assert!(supports_programmatic_launch("sm_90"));
        assert!(supports_programmatic_launch("sm_100"));
        assert!(!supports_programmatic_launch("sm_89"));
        assert!(!supports_programmatic_launch("sm_80"));
        assert!(!supports_programmatic_launch("gfx942"));
    }

    #[test]
    fn bf16_tensor_cores_from_compute_capability_8() {
        assert!(has_bf16_tensor_cores("sm_80"));
        assert!(has_bf16_tensor_cores("sm_90"));
        assert!(!has_bf16_tensor_cores("sm_75"));
        assert!(!has_bf16_tensor_cores("gfx90a"));
    }

    #[test]
    fn kernel_names_are_read_from_the_source() {
        let code = "extern \"C\" __global__ void alpha(const bf16* x) {}\n\
                    extern \"C\" __global__ void __launch_bounds__(256) beta (int n) {}";
        let names: Vec<_> = kernel_names(code).collect();
        assert_eq!(names, ["alpha", "beta"]);
    }

    /// Every module compiles with NVRTC for sm_90 (the H200), here too when this machine has
    /// NVRTC and the CUDA headers but no GPU; skipped when it has neither.
    #[test]
    fn every_module_compiles_with_nvrtc() {
        if let Err(why) = peregrine_runtime::cuda::cuda_include_dir() {
            eprintln!("skipped: {why}");
            return;
        }
        let cache = tempfile::tempdir().unwrap();
        let compiled = std::panic::catch_unwind(|| compile_all("sm_90", cache.path()));
        match compiled {
            Err(_) => eprintln!("skipped: NVRTC could not be loaded"),
            Ok(result) => {
                let missing = result.unwrap_or_else(|err| panic!("{err}"));
                assert_eq!(missing.len(), MODULES.len());
                for (source, missing) in MODULES.iter().zip(missing) {
                    assert!(kernel_names(source.code).count() > 0, "{}", source.name);
                    assert!(
                        missing.is_empty(),
                        "{}: no kernels {missing:?}",
                        source.name
                    );
                }
            }
        }
    }
}

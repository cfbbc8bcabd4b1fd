//! NVRTC compilation of the kernel modules, cached on disk by source hash and architecture.

use super::GpuError;
use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One kernel module's source: a `.cu` file compiled on its own.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// The module's name, used in errors and cache file names.
    pub name: &'static str,
    /// The CUDA C source (the shared header is prepended by the compiler).
    pub code: &'static str,
}

/// A module loaded into a context.
pub struct CompiledModule {
    /// The module's name.
    pub name: &'static str,
    /// The loaded module, from which functions are taken by name.
    pub module: Arc<CudaModule>,
    /// Whether the PTX came from the on-disk cache.
    pub from_cache: bool,
}

/// Compiles kernel sources with NVRTC for one architecture, caching the PTX on disk.
pub struct KernelCompiler {
    arch: String,
    include_dir: PathBuf,
    cache_dir: PathBuf,
    header: &'static str,
}

/// Where NVRTC can find the CUDA headers (`cuda_bf16.h` and what it includes): the
/// `include` folder of `CUDA_HOME`, then `CUDA_PATH`, then `/usr/local/cuda`.
pub fn cuda_include_dir() -> Result<PathBuf, GpuError> {
    let mut tried = Vec::new();
    let roots = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|var| std::env::var_os(var).map(PathBuf::from))
        .chain(std::iter::once(PathBuf::from("/usr/local/cuda")));
    for root in roots {
        let dir = root.join("include");
        if dir.join("cuda_bf16.h").is_file() {
            return Ok(dir);
        }
        tried.push(dir.display().to_string());
    }
    Err(GpuError::NoHeaders(format!(
        "NVRTC needs the CUDA headers (cuda_bf16.h) but found none in {}; set CUDA_HOME to the \
         CUDA toolkit's folder",
        tried.join(", ")
    )))
}

impl KernelCompiler {
    /// A compiler for `arch` (such as `sm_90`) that prepends `header` to every module and
    /// caches PTX under `cache_dir`.
    pub fn new(arch: &str, cache_dir: &Path, header: &'static str) -> Result<Self, GpuError> {
        Ok(KernelCompiler {
            arch: arch.to_string(),
            include_dir: cuda_include_dir()?,
            cache_dir: cache_dir.join(arch),
            header,
        })
    }

    fn options(&self) -> Vec<String> {
        vec![
            format!("--gpu-architecture={}", self.arch),
            "--std=c++17".into(),
            format!("--include-path={}", self.include_dir.display()),
            "--fmad=true".into(),
        ]
    }

    fn full_source(&self, source: &KernelSource) -> String {
        format!("{}\n{}", self.header, source.code)
    }

    /// The cache file for `source`: named by the module and a hash of everything that
    /// changes the PTX (source, header, options, NVRTC version).
    fn cache_path(&self, source: &KernelSource) -> PathBuf {
        let mut hash = Sha256::new();
        hash.update(self.full_source(source));
        for option in self.options() {
            hash.update(option);
        }
        hash.update(nvrtc_version());
        let digest = hash.finalize();
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        self.cache_dir.join(format!("{}-{hex}.ptx", source.name))
    }

    /// PTX for `source`, from the cache or freshly compiled (and then cached). The bool
    /// says whether it came from the cache.
    pub fn ptx(&self, source: &KernelSource) -> Result<(String, bool), GpuError> {
        let path = self.cache_path(source);
        if let Ok(text) = std::fs::read_to_string(&path) {
            return Ok((text, true));
        }
        let opts = CompileOptions {
            options: self.options(),
            name: Some(format!("{}.cu", source.name)),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(self.full_source(source), opts)
            .map_err(|err| self.compile_error(source, err))?
            .to_src();
        let cache_err = |err| GpuError::Cache {
            path: path.display().to_string(),
            source: err,
        };
        std::fs::create_dir_all(&self.cache_dir).map_err(cache_err)?;
        // Write then rename, so a concurrent reader never sees half a file.
        let partial = path.with_extension(format!("ptx.{}", std::process::id()));
        std::fs::write(&partial, &ptx).map_err(cache_err)?;
        std::fs::rename(&partial, &path).map_err(cache_err)?;
        Ok((ptx, false))
    }

    fn compile_error(&self, source: &KernelSource, err: CompileError) -> GpuError {
        let log = match err {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        };
        GpuError::Compile {
            module: source.name.into(),
            arch: self.arch.clone(),
            log,
        }
    }

    /// Compiles (or takes from the cache) and loads every module into `ctx`.
    pub fn load_all(
        &self,
        ctx: &Arc<CudaContext>,
        sources: &[KernelSource],
    ) -> Result<Vec<CompiledModule>, GpuError> {
        let ptxs: Vec<Result<(String, bool), GpuError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = sources
                .iter()
                .map(|source| scope.spawn(move || self.ptx(source)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("kernel compile thread panicked"))
                .collect()
        });
        sources
            .iter()
            .zip(ptxs)
            .map(|(source, ptx)| {
                let (ptx, from_cache) = ptx?;
                Ok(CompiledModule {
                    name: source.name,
                    module: ctx.load_module(Ptx::from_src(ptx))?,
                    from_cache,
                })
            })
            .collect()
    }
}

/// NVRTC's version, as text: PTX from another NVRTC is not reused.
fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers; the library is loaded by cudarc on first use.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    format!("nvrtc {major}.{minor} ({status:?})")
}

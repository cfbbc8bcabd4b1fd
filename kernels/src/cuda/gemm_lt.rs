//! Matrix products through cuBLASLt, with the algorithm chosen once per shape.
//!
//! `cublasGemmEx` (and cudarc's `matmul`) asks cuBLAS's heuristic on every call, which costs
//! several microseconds of host time a product: at batch 1 the host then launches slower
//! than the GPU runs. Here the descriptors are made at the first product of a shape (rows,
//! columns, depth, output type and operand alignments) and kept; every later product of
//! that shape is one `cublasLtMatmul` call. A query of the heuristic costs about 0.25 ms
//! of host time, and a server meets a new number of rows in most steps that mix prompt
//! chunks and verifications (on the H200, 155 to 626 new shapes in a one-second benchmark,
//! 37 to 110 ms of its host time), so the heuristic is asked once per bucket of rows
//! ([`algorithm_rows`]), for the bucket's largest, and a shape takes its bucket's algorithm
//! once cuBLASLt has checked it for the shape (else the heuristic's choice for the shape
//! itself). Each plan made is logged at debug level, with the host time it took. Split-k
//! schemes that reduce with atomics are excluded, and a shape's algorithm depends only on
//! the shape, so its result is the same at every step and from run to run.
//!
//! (Timing the heuristic's next best candidates at the first product of a small shape, as
//! PyTorch's GEMM tuning does, was tried on the H200 for Llama-3.2-1B's decode shapes and
//! chose nothing faster in the forward pass than the first candidate, so it is not done.)

use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Workspace for the algorithms that want one (cuBLAS's recommendation for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;
/// What decides a product's descriptors and algorithm.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct LtShape {
    /// Rows of x and of the output.
    pub m: usize,
    /// Output columns (rows of the weight).
    pub n: usize,
    /// The reduced dimension.
    pub k: usize,
    /// The output's element type.
    pub out: sys::cudaDataType,
    /// The largest power of two (up to 256) dividing each operand's address: x, w, out.
    pub align: [u32; 3],
}

/// The descriptors and chosen algorithm of one shape.
struct LtPlan {
    desc: sys::cublasLtMatmulDesc_t,
    w_layout: sys::cublasLtMatrixLayout_t,
    x_layout: sys::cublasLtMatrixLayout_t,
    out_layout: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // SAFETY: created by `LtPlan::new` and destroyed only here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.out_layout);
            let _ = lt::destroy_matrix_layout(self.x_layout);
            let _ = lt::destroy_matrix_layout(self.w_layout);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// The plans of the shapes seen so far, and the algorithms of their buckets.
#[derive(Default)]
struct Plans {
    shapes: HashMap<LtShape, Option<LtPlan>>,
    /// By shape with `m` its bucket's ([`algorithm_rows`]); `None` where the heuristic
    /// offers none.
    algorithms: HashMap<LtShape, Option<sys::cublasLtMatmulAlgo_t>>,
}

/// A cuBLASLt handle, its workspace and the plans of the shapes seen so far.
pub struct LtMatmul {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: Mutex<Plans>,
}

// SAFETY: the handle and descriptors are plain cuBLASLt objects that may be used from any
// thread; every use of the plans goes through the mutex, and products are queued on the
// caller's stream.
unsafe impl Send for LtMatmul {}
unsafe impl Sync for LtMatmul {}

impl Drop for LtMatmul {
    fn drop(&mut self) {
        self.plans.lock().map(|mut p| p.shapes.clear()).ok();
        // SAFETY: the handle was created by `LtMatmul::new` and is destroyed once, after the
        // plans made with it.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

/// The largest power of two, up to 256, dividing `address`.
pub fn alignment(address: u64) -> u32 {
    1u32 << address.trailing_zeros().min(8)
}

/// The rows whose heuristic choice a product of `m` rows takes: `m` itself up to 16, above
/// the end of its bucket, eight buckets to each power of two (17-20, 21-24, ... 29-32,
/// 33-40, ...).
pub fn algorithm_rows(m: usize) -> usize {
    if m <= 16 {
        return m;
    }
    let step = m.next_power_of_two() / 8;
    m.div_ceil(step) * step
}

impl LtMatmul {
    /// A handle whose products run on `stream`, with its workspace allocated there.
    pub fn new(stream: &Arc<CudaStream>) -> Result<LtMatmul, LtError> {
        let handle = lt::create_handle()?;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?;
        Ok(LtMatmul {
            handle,
            workspace,
            plans: Mutex::new(Plans::default()),
        })
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` (bf16 operands, f32 accumulation, `shape.out`
    /// output) on `stream`. Returns `Ok(false)` when cuBLASLt has no algorithm for the shape
    /// (the caller takes another path).
    ///
    /// # Safety
    /// `x`, `w` and `out` must be device addresses of `m * k`, `n * k` and `m * n` elements
    /// whose alignments are those of `shape`, alive until the product has run on `stream`,
    /// the stream this handle was made for.
    pub unsafe fn matmul(
        &self,
        stream: &CudaStream,
        shape: LtShape,
        x: u64,
        w: u64,
        out: u64,
    ) -> Result<bool, LtError> {
        let mut guard = self.plans.lock().expect("cuBLASLt plans poisoned");
        let plans = &mut *guard;
        let plan = match plans.shapes.entry(shape) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(new) => {
                let started = std::time::Instant::now();
                let bucket = LtShape {
                    m: algorithm_rows(shape.m),
                    ..shape
                };
                let plan = match plans.algorithms.entry(bucket) {
                    // The bucket's own largest shape: the heuristic's plan for it is both.
                    Entry::Vacant(new) if bucket == shape => {
                        let plan = LtPlan::new(self.handle, shape)?;
                        new.insert(plan.as_ref().map(|p| p.algo));
                        plan
                    }
                    entry => {
                        let algorithm = match entry {
                            Entry::Occupied(known) => *known.get(),
                            Entry::Vacant(new) => {
                                let chosen = LtPlan::new(self.handle, bucket)?.map(|p| p.algo);
                                *new.insert(chosen)
                            }
                        };
                        let checked = match algorithm {
                            Some(algo) => LtPlan::with_algorithm(self.handle, shape, algo)?,
                            None => None,
                        };
                        match checked {
                            Some(plan) => Some(plan),
                            None => LtPlan::new(self.handle, shape)?,
                        }
                    }
                };
                tracing::debug!(
                    ?shape,
                    found = plan.is_some(),
                    us = started.elapsed().as_micros() as u64,
                    "cuBLASLt plan made"
                );
                new.insert(plan)
            }
        };
        let Some(plan) = plan.as_ref() else {
            return Ok(false);
        };
        self.run(stream, plan, Operands { x, w, out })?;
        Ok(true)
    }

    /// Queues one product with the plan's algorithm on `stream`.
    ///
    /// # Safety
    /// As [`LtMatmul::matmul`].
    unsafe fn run(
        &self,
        stream: &CudaStream,
        plan: &LtPlan,
        operands: Operands,
    ) -> Result<(), LtError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (workspace, _guard) = self.workspace.device_ptr(stream);
        lt::matmul(
            self.handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            operands.w as *const c_void,
            plan.w_layout,
            operands.x as *const c_void,
            plan.x_layout,
            operands.out as *const c_void,
            plan.out_layout,
            operands.out as *mut c_void,
            plan.out_layout,
            &plan.algo,
            workspace as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as sys::cudaStream_t,
        )?;
        Ok(())
    }
}

/// The device addresses of a product's operands.
#[derive(Clone, Copy)]
struct Operands {
    x: u64,
    w: u64,
    out: u64,
}

impl LtPlan {
    /// The descriptors of `shape` and the heuristic's best algorithm, or `None` when it
    /// offers none. Column-major view, as cuBLAS sees row-major data: outᵀ[n, m] =
    /// w[n, k] (stored k-major, so transposed) · xᵀ[k, m].
    fn new(handle: sys::cublasLtHandle_t, shape: LtShape) -> Result<Option<LtPlan>, LtError> {
        // SAFETY: the caller's handle is live.
        unsafe { LtPlan::describe(shape)?.choose(handle, shape) }
    }

    /// The descriptors of `shape` with `algo`, if cuBLASLt's check finds that it runs the
    /// shape within the workspace.
    fn with_algorithm(
        handle: sys::cublasLtHandle_t,
        shape: LtShape,
        algo: sys::cublasLtMatmulAlgo_t,
    ) -> Result<Option<LtPlan>, LtError> {
        let mut plan = LtPlan::describe(shape)?;
        let mut result = std::mem::MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::uninit();
        // SAFETY: the descriptors are live and `result` is room for one heuristic result.
        let status = unsafe {
            sys::cublasLtMatmulAlgoCheck(
                handle,
                plan.desc,
                plan.w_layout,
                plan.x_layout,
                plan.out_layout,
                plan.out_layout,
                &algo,
                result.as_mut_ptr(),
            )
        };
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Ok(None);
        }
        // SAFETY: a successful check wrote the result.
        let result = unsafe { result.assume_init() };
        if result.workspaceSize > WORKSPACE_BYTES {
            return Ok(None);
        }
        plan.algo = algo;
        Ok(Some(plan))
    }

    /// The descriptors of `shape`, its algorithm not chosen yet.
    fn describe(shape: LtShape) -> Result<LtPlan, LtError> {
        let (m, n, k) = (shape.m as u64, shape.n as u64, shape.k as u64);
        let bf16 = sys::cudaDataType::CUDA_R_16BF;
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )?;
        let mut plan = LtPlan {
            desc,
            w_layout: std::ptr::null_mut(),
            x_layout: std::ptr::null_mut(),
            out_layout: std::ptr::null_mut(),
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        let transpose = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
        // SAFETY: every descriptor is live (created above or just now), and each attribute
        // buffer is a live value of the attribute's type and size.
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &transpose as *const _ as *const c_void,
                std::mem::size_of_val(&transpose),
            )?;
            plan.w_layout = lt::create_matrix_layout(bf16, k, n, k as i64)?;
            plan.x_layout = lt::create_matrix_layout(bf16, k, m, k as i64)?;
            plan.out_layout = lt::create_matrix_layout(shape.out, n, m, n as i64)?;
        }
        Ok(plan)
    }

    /// The plan with the heuristic's best algorithm for `shape`, whose descriptors it
    /// holds, or `None` when it offers none.
    ///
    /// # Safety
    /// `handle` is a live cuBLASLt handle.
    unsafe fn choose(
        mut self,
        handle: sys::cublasLtHandle_t,
        shape: LtShape,
    ) -> Result<Option<LtPlan>, LtError> {
        // SAFETY: the descriptors are live, and each attribute buffer is a live value of
        // the attribute's type and size.
        unsafe {
            let pref = lt::create_matmul_pref()?;
            let workspace = WORKSPACE_BYTES as u64;
            // No in-place split-k: it reduces with atomics, whose order varies.
            let schemes = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                as u32
                | sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE as u32;
            use sys::cublasLtMatmulPreferenceAttributes_t as Pref;
            let [x_align, w_align, out_align] = shape.align;
            let settings: [(Pref, *const c_void, usize); 6] = [
                (
                    Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &workspace as *const u64 as _,
                    8,
                ),
                (
                    Pref::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                    &schemes as *const u32 as _,
                    4,
                ),
                (
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    &w_align as *const u32 as _,
                    4,
                ),
                (
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    &x_align as *const u32 as _,
                    4,
                ),
                (
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    &out_align as *const u32 as _,
                    4,
                ),
                (
                    Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                    &out_align as *const u32 as _,
                    4,
                ),
            ];
            let chosen = settings
                .iter()
                .try_for_each(|&(attr, value, size)| {
                    lt::set_matmul_pref_attribute(pref, attr, value, size)
                })
                .and_then(|()| {
                    lt::get_matmul_algo_heuristic(
                        handle,
                        self.desc,
                        self.w_layout,
                        self.x_layout,
                        self.out_layout,
                        self.out_layout,
                        pref,
                    )
                });
            let _ = lt::destroy_matmul_pref(pref);
            match chosen {
                Ok(result) => {
                    self.algo = result.algo;
                    Ok(Some(self))
                }
                Err(CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED)) => Ok(None),
                Err(err) => Err(err.into()),
            }
        }
    }
}

/// A cuBLASLt call or its workspace allocation failed.
#[derive(Debug, thiserror::Error)]
pub enum LtError {
    #[error("cuBLASLt: {0}")]
    Cublas(#[from] CublasError),
    #[error("CUDA: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

#[cfg(test)]
mod tests {
    use super::{algorithm_rows, alignment};

    #[test]
    fn rows_share_an_algorithm_in_eight_buckets_a_power_of_two() {
        let buckets: Vec<usize> = [1, 16, 17, 20, 21, 32, 33, 40, 41, 64, 65, 129, 1000, 4096]
            .map(algorithm_rows)
            .to_vec();
        assert_eq!(
            buckets,
            vec![1, 16, 20, 20, 24, 32, 40, 40, 48, 64, 80, 160, 1024, 4096]
        );
        // Every m takes a bucket at least as large, less than a quarter larger again.
        for m in 1..5000 {
            let b = algorithm_rows(m);
            assert!(b >= m && (b - m) * 4 < m, "{m} -> {b}");
        }
    }

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0), 256);
        assert_eq!(alignment(0x7f00_0000_0200), 256);
        assert_eq!(alignment(0x7f00_0000_0210), 16);
        assert_eq!(alignment(0x7f00_0000_0202), 2);
        assert_eq!(alignment(0x7f00_0000_0281), 1);
    }
}

//! Matrix products `out[m, n] = x[m, k] · w[n, k]ᵀ` (a linear layer over row-major
//! activations and PyTorch-layout weights) in bf16 with f32 accumulation: cuBLAS, or a
//! batch-invariant kernel for every product of --deterministic mode (the tensor-core
//! kernels of `cuda/gemm_mma.cu` where the device and the depth allow, else the fixed-order
//! GEMV kernel of `cuda/gemm.cu`), and the GEMV kernel, on request, for products of few
//! rows.

mod batched;
mod fixed_mma;

pub use batched::{BatchedShape, Strided, WeightLayout};
pub use fixed_mma::FIXED_MMA_CHUNK;
use fixed_mma::{fixed_mma_linear, takes_fixed_mma};

use super::elementwise::silu_and_mul;
use super::gemm_lt::{alignment, LtError, LtMatmul, LtShape};
use super::launch::KernelLaunch;
use super::{grid, CudaKernels};
use cudarc::cublas::{result::gemm_ex, sys, CudaBlas};
use cudarc::driver::{
    CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DriverError,
    LaunchConfig,
};
use half::bf16;
use std::sync::Arc;

/// Why a matrix product failed.
#[derive(Debug, thiserror::Error)]
pub enum GemmError {
    #[error("cuBLAS: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),
    #[error(transparent)]
    Lt(#[from] LtError),
    #[error("CUDA: {0}")]
    Driver(#[from] DriverError),
}

/// An output element type of the products: bf16 activations or f32 logits.
pub trait GemmOutput: DeviceRepr {
    /// The cuBLAS data type.
    const CUDA_TYPE: sys::cudaDataType;
    /// The same, as cuBLASLt names it.
    const LT_TYPE: cudarc::cublaslt::sys::cudaDataType;
    /// The GEMV kernels writing this type, less their `_r{rows}` suffix.
    const GEMV_KERNEL: &'static str;
    /// The suffix of the tensor-core kernels writing this type.
    const KERNEL_SUFFIX: &'static str;
}

impl GemmOutput for bf16 {
    const CUDA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_16BF;
    const LT_TYPE: cudarc::cublaslt::sys::cudaDataType =
        cudarc::cublaslt::sys::cudaDataType::CUDA_R_16BF;
    const GEMV_KERNEL: &'static str = "gemv_fixed_order_bf16";
    const KERNEL_SUFFIX: &'static str = "bf16";
}

impl GemmOutput for f32 {
    const CUDA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_32F;
    const LT_TYPE: cudarc::cublaslt::sys::cudaDataType =
        cudarc::cublaslt::sys::cudaDataType::CUDA_R_32F;
    const GEMV_KERNEL: &'static str = "gemv_fixed_order_f32";
    const KERNEL_SUFFIX: &'static str = "f32";
}

use crate::GEMV_MAX_ROWS;

/// Warps per block of the GEMV kernel (`GEMV_WARPS` in its source).
const GEMV_BLOCK_COLS: usize = 8;
/// The most elements of a column one warp of the GEMV kernel streams: longer columns are
/// split over several warps.
const GEMV_SLICE_ELEMS: usize = 2048;

/// Warps per column of the GEMV kernel for a depth of `k`: a power of two up to the block's
/// warps, from k alone (so the reduction order never depends on the batch), dividing k into
/// stretches of whole 8-element pieces.
fn gemv_slices(k: usize) -> usize {
    let mut slices = 1;
    while slices < GEMV_BLOCK_COLS
        && k > slices * GEMV_SLICE_ELEMS
        && k.is_multiple_of(2 * slices * 8)
    {
        slices *= 2;
    }
    slices
}

/// The GEMV kernels of the MLP's gated activation, less their `_r{rows}` suffix.
const GEMV_GATED_KERNEL: &str = "gemv_gated_bf16";

/// The GEMV kernels fused with the RMSNorm ahead, plain and gated, and the one that adds
/// into the residual stream, less their `_r{rows}` suffix.
const GEMV_NORMED_KERNEL: &str = "gemv_normed_bf16";
const GEMV_NORMED_GATED_KERNEL: &str = "gemv_normed_gated_bf16";
const GEMV_ADD_KERNEL: &str = "gemv_add_f32";

/// The kernels (with their pass size) that have a `_packed` variant held to fewer registers
/// (gemm.cu says why), taken when a product has more column groups than the device has
/// multiprocessors.
const GEMV_PACKED: [&str; 1] = ["gemv_add_f32_r1"];

/// The input of a product fused with the RMSNorm ahead of it ([`Gemm::normed_linear`]).
#[derive(Clone, Copy)]
pub struct NormedInput<'a, 'b> {
    /// The f32 residual stream, `[m, k]`.
    pub residual: &'a CudaView<'b, f32>,
    /// The norm's weight, `[k]`.
    pub weight: &'a CudaView<'b, bf16>,
    /// The norm's epsilon.
    pub eps: f32,
}

/// The most rows the gated GEMV kernel takes: one pass of its largest variant, the decode
/// steps it was written for. Larger products (--deterministic batches, prefill) take the
/// GEMV and silu_and_mul, measured at 23.3 ms per step for the Llama-3.2-1B shape at batch
/// 64 on the H200; the fused kernel has not been measured there.
pub const GEMV_GATED_MAX_ROWS: usize = 8;

/// Rows of x per pass of the GEMV kernels (`_r1` .. `_r8`).
const GEMV_PASS_ROWS: [usize; 4] = [1, 2, 4, 8];

// The normed kernels take their rows in one pass (gemm.cu), and the fusions go up to
// GEMV_GATED_MAX_ROWS rows (Gemm::fuses_norms).
const _: () = assert!(GEMV_GATED_MAX_ROWS <= GEMV_PASS_ROWS[GEMV_PASS_ROWS.len() - 1]);

/// The kernel a product goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// The fixed-order GEMV kernel (`cuda/gemm.cu`).
    Gemv,
    /// The batch-invariant tensor-core kernels (`cuda/gemm_mma.cu`).
    FixedMma,
    /// cuBLASLt, or cuBLAS where it has no algorithm.
    Cublas,
}

/// How products are computed.
pub struct Gemm {
    blas: CudaBlas,
    lt: LtMatmul,
    deterministic: bool,
    gemv_max_rows: usize,
}

impl Gemm {
    /// Products on `stream`; `deterministic` selects the batch-invariant kernel.
    pub fn new(stream: Arc<CudaStream>, deterministic: bool) -> Result<Gemm, GemmError> {
        Ok(Gemm {
            lt: LtMatmul::new(&stream)?,
            blas: CudaBlas::new(stream)?,
            deterministic,
            gemv_max_rows: GEMV_MAX_ROWS,
        })
    }

    /// Products of up to `rows` rows go through the GEMV kernel, larger ones through cuBLAS
    /// (deterministic mode takes its batch-invariant kernels for all).
    pub fn with_gemv_max_rows(mut self, rows: usize) -> Gemm {
        self.gemv_max_rows = rows;
        self
    }

    /// The kernel of a product of `m` rows of depth `k`. In deterministic mode it depends
    /// on the device and `k` alone, never on `m`, so a row's bits do not depend on its batch.
    fn path(&self, kernels: &CudaKernels, m: usize, k: usize) -> Path {
        if self.deterministic {
            if takes_fixed_mma(kernels, k) {
                Path::FixedMma
            } else {
                Path::Gemv
            }
        } else if m <= self.gemv_max_rows {
            Path::Gemv
        } else {
            Path::Cublas
        }
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` for the first `m` rows of `x`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear<T: GemmOutput>(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        x: &CudaView<bf16>,
        w: &CudaView<bf16>,
        out: &mut CudaViewMut<T>,
        m: usize,
        n: usize,
    ) -> Result<(), GemmError> {
        let k = check_shapes(x.len(), w.len(), out.len(), m, n);
        if m == 0 {
            return Ok(());
        }
        match self.path(kernels, m, k) {
            Path::Gemv => Ok(gemv(kernels, stream, T::GEMV_KERNEL, x, w, out, m, n, k)?),
            Path::FixedMma => Ok(fixed_mma_linear(kernels, stream, x, w, out, m, n, k)?),
            Path::Cublas => self.cublas(stream, x, w, out, m, n, k),
        }
    }

    /// The MLP's gated activation `act[m, inter] = silu(x · w_gateᵀ) * (x · w_upᵀ)` for the
    /// `[2 · inter, k]` weight `w` (gate rows, then up rows). Where `m` rows take the GEMV
    /// path in one pass (up to [`GEMV_GATED_MAX_ROWS`]) it is one kernel that streams each
    /// gate row beside its up row and never writes the products; otherwise the product goes
    /// to `gate_up` (`[m, 2 · inter]`) and then through silu_and_mul. Both round the
    /// products to bf16 first and the GEMV's sums are the same, so on the GEMV path the two
    /// give the same bits (deterministic mode stays batch-invariant across the switch; on
    /// its tensor-core path every batch takes the product and silu_and_mul).
    #[allow(clippy::too_many_arguments)]
    pub fn gate_up_act(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        x: &CudaView<bf16>,
        w: &CudaView<bf16>,
        gate_up: &mut CudaViewMut<bf16>,
        act: &mut CudaViewMut<bf16>,
        m: usize,
        inter: usize,
    ) -> Result<(), GemmError> {
        let k = check_shapes(x.len(), w.len(), gate_up.len(), m, 2 * inter);
        assert!(act.len() >= m * inter, "gate_up_act: short activation");
        if m == 0 {
            Ok(())
        } else if self.path(kernels, m, k) == Path::Gemv && m <= GEMV_GATED_MAX_ROWS {
            let kernel = GEMV_GATED_KERNEL;
            Ok(gemv(kernels, stream, kernel, x, w, act, m, inter, k)?)
        } else {
            self.linear(kernels, stream, x, w, gate_up, m, 2 * inter)?;
            let gate_up = gate_up.as_view();
            Ok(silu_and_mul(kernels, stream, &gate_up, act, m, inter)?)
        }
    }

    /// Whether products of `m` rows take the decode fusions: [`Gemm::normed_linear`],
    /// [`Gemm::normed_gate_up_act`] and [`Gemm::add_linear`] in place of an RMSNorm (or an
    /// add and an RMSNorm) and a product. They are for steps whose products all go through
    /// the GEMV kernel in one pass, and not for --deterministic mode: their sums are not
    /// those of the unfused kernels, so a row's result would depend on whether its batch
    /// fits them.
    pub fn fuses_norms(&self, m: usize) -> bool {
        !self.deterministic && m >= 1 && m <= self.gemv_max_rows.min(GEMV_GATED_MAX_ROWS)
    }

    /// `out[m, n] = rms_norm(x.residual) · w[n, k]ᵀ` (the norm's weight and epsilon from `x`)
    /// in one kernel: the norm's scale is applied to each sum, so the normed activation is
    /// never written. Only where [`Gemm::fuses_norms`] holds for `m`.
    #[allow(clippy::too_many_arguments)]
    pub fn normed_linear(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        x: NormedInput,
        w: &CudaView<bf16>,
        out: &mut CudaViewMut<bf16>,
        m: usize,
        n: usize,
    ) -> Result<(), GemmError> {
        self.normed(kernels, stream, false, x, w, out, m, n)
    }

    /// `act[m, inter] = silu(rms_norm(x) · w_gateᵀ) * (rms_norm(x) · w_upᵀ)` in one kernel,
    /// the gated activation of [`Gemm::gate_up_act`] over the norm of
    /// [`Gemm::normed_linear`]. Only where [`Gemm::fuses_norms`] holds for `m`.
    #[allow(clippy::too_many_arguments)]
    pub fn normed_gate_up_act(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        x: NormedInput,
        w: &CudaView<bf16>,
        act: &mut CudaViewMut<bf16>,
        m: usize,
        inter: usize,
    ) -> Result<(), GemmError> {
        self.normed(kernels, stream, true, x, w, act, m, inter)
    }

    /// `residual[m, n] += bf16(x[m, k] · w[n, k]ᵀ)`: the product rounded to bf16 as
    /// [`Gemm::linear`] stores it, then added into the f32 residual stream as the residual
    /// add of `add_rms_norm` does. Only where [`Gemm::fuses_norms`] holds for `m`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_linear(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        x: &CudaView<bf16>,
        w: &CudaView<bf16>,
        residual: &mut CudaViewMut<f32>,
        m: usize,
        n: usize,
    ) -> Result<(), GemmError> {
        assert!(self.fuses_norms(m), "add_linear: {m} rows are not fused");
        let k = check_shapes(x.len(), w.len(), residual.len(), m, n);
        Ok(gemv(
            kernels,
            stream,
            GEMV_ADD_KERNEL,
            x,
            w,
            residual,
            m,
            n,
            k,
        )?)
    }

    /// [`Gemm::normed_linear`], or with `gated` [`Gemm::normed_gate_up_act`] (w then holds
    /// 2n rows).
    #[allow(clippy::too_many_arguments)]
    fn normed(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        gated: bool,
        x: NormedInput,
        w: &CudaView<bf16>,
        out: &mut CudaViewMut<bf16>,
        m: usize,
        n: usize,
    ) -> Result<(), GemmError> {
        let (name, halves) = if gated {
            (GEMV_NORMED_GATED_KERNEL, 2)
        } else {
            (GEMV_NORMED_KERNEL, 1)
        };
        assert!(self.fuses_norms(m), "{name}: {m} rows are not fused");
        // w is [halves * n, k] and out [m, n]: out holds m * n exactly when halves times it
        // holds m * (halves * n).
        let k = check_shapes(x.residual.len(), w.len(), halves * out.len(), m, halves * n);
        assert_eq!(x.weight.len(), k, "{name}: the norm's weight is not [k]");
        let gamma_ptr = x.weight.device_ptr(stream).0;
        assert!(
            gamma_ptr.is_multiple_of(16),
            "{name}: unaligned norm weight"
        );
        let ptrs = [x.residual.device_ptr(stream).0, w.device_ptr(stream).0];
        let plan = GemvPlan::new(kernels, name, true, ptrs, m, n, k)?;
        let mut launch = kernels.launch(stream, &plan.kernel);
        launch.arg(x.residual).arg(x.weight).arg(w).arg(out);
        plan.shape_args(&mut launch);
        launch.arg(&x.eps);
        // SAFETY: the residual holds m rows of k, the weight k, w halves * n rows of k and out
        // m * n elements (checked above), every row 16-byte aligned with k % 8 == 0 (checked
        // by the plan); each warp guards its column and rows.
        unsafe { launch.launch(plan.config()) }?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn cublas<T: GemmOutput>(
        &self,
        stream: &CudaStream,
        x: &CudaView<bf16>,
        w: &CudaView<bf16>,
        out: &mut CudaViewMut<T>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), GemmError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (x_ptr, _x) = x.device_ptr(stream);
        let (w_ptr, _w) = w.device_ptr(stream);
        let (o_ptr, _o) = out.device_ptr_mut(stream);
        let shape = LtShape {
            m,
            n,
            k,
            out: T::LT_TYPE,
            align: [alignment(x_ptr), alignment(w_ptr), alignment(o_ptr)],
        };
        // SAFETY: the pointers cover m*k, n*k and m*n elements (checked by the callers), their
        // alignments are the shape's, and they stay alive for the call, queued on `stream`.
        if unsafe { self.lt.matmul(stream, shape, x_ptr, w_ptr, o_ptr) }? {
            return Ok(());
        }
        // No cuBLASLt algorithm for this shape: cuBLAS chooses one itself.
        // Column-major view: outᵀ[n, m] = w[n, k] (stored k-major, so transposed) · xᵀ[k, m].
        // SAFETY: the pointers cover m*k, n*k and m*n elements (checked by the callers) and
        // stay alive for the call; cuBLAS runs on the handle's stream, the same as `stream`.
        unsafe {
            gemm_ex(
                *self.blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                &alpha as *const f32 as *const _,
                w_ptr as *const _,
                sys::cudaDataType::CUDA_R_16BF,
                k as i32,
                x_ptr as *const _,
                sys::cudaDataType::CUDA_R_16BF,
                k as i32,
                &beta as *const f32 as *const _,
                o_ptr as *mut _,
                T::CUDA_TYPE,
                n as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )?;
        }
        Ok(())
    }
}

/// Checks a product's buffers (`x` holds `m` rows of `k`) and returns `k`.
fn check_shapes(x: usize, w: usize, out: usize, m: usize, n: usize) -> usize {
    let k = w / n;
    assert_eq!(w, n * k, "linear: weight is not [{n}, k]");
    assert!(x >= m * k && out >= m * n, "linear: short buffers");
    assert!(
        m <= i32::MAX as usize && n <= i32::MAX as usize && k <= i32::MAX as usize,
        "linear: dimensions past i32"
    );
    k
}

/// Checks that a product's x and w (their device addresses) are 16-byte aligned, as the
/// kernels' 16-byte loads need.
fn check_aligned([x_ptr, w_ptr]: [u64; 2]) {
    for (what, ptr) in [("x", x_ptr), ("w", w_ptr)] {
        assert!(
            ptr.is_multiple_of(16),
            "linear: {what} is not 16-byte aligned"
        );
    }
}

/// The most dynamic shared memory a one-row GEMV block stages its row in: the 48 KiB that
/// every device grants a block without opting in, less room for the kernel's static
/// partial sums.
const GEMV_STAGE_MAX_BYTES: usize = 44 * 1024;

/// The bytes of dynamic shared memory the staged GEMV kernels (`_r1`, `_r{rows}_staged`)
/// stage `m` rows of `k` in, `None` past [`GEMV_STAGE_MAX_BYTES`]: the bf16 rows, or for a
/// normed product (`normed`) the f32 products of the rows and the norm's weight.
fn gemv_staged_bytes(normed: bool, m: usize, k: usize) -> Option<u32> {
    let bytes = m * if normed { 4 * k } else { 2 * k };
    (bytes <= GEMV_STAGE_MAX_BYTES).then_some(bytes as u32)
}

/// A GEMV launch: its kernel (with the `_r{rows}` suffix of its pass size), its grid, the
/// shared memory its blocks stage x in, and its shape arguments.
struct GemvPlan {
    kernel: String,
    blocks: u32,
    staged_bytes: u32,
    m: i32,
    n: i32,
    k: i32,
    slices: i32,
}

impl GemvPlan {
    /// The launch of the GEMV kernel family `name` for `m` rows, `n` columns of depth `k`,
    /// reading x and w through `x_ptr` and `w_ptr` (x the f32 residual stream where
    /// `normed`). The grid is one block per group of columns, capped at the blocks the
    /// device runs at once: each block then loops over groups, so the product streams
    /// without waves of blocks.
    #[allow(clippy::too_many_arguments)]
    fn new(
        kernels: &CudaKernels,
        name: &str,
        normed: bool,
        [x_ptr, w_ptr]: [u64; 2],
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<GemvPlan, DriverError> {
        assert!(
            k.is_multiple_of(8),
            "linear: the GEMV kernel needs k % 8 == 0, not {k}"
        );
        check_aligned([x_ptr, w_ptr]);
        let slices = gemv_slices(k);
        let groups = n.div_ceil(GEMV_BLOCK_COLS / slices);
        let mut rows = GEMV_PASS_ROWS
            .into_iter()
            .find(|&r| r >= m)
            .unwrap_or(GEMV_PASS_ROWS[GEMV_PASS_ROWS.len() - 1]);
        // One pass of rows that fit shared memory is staged; a row too long to stage takes
        // the two-row kernel, which reads x in place, and so do more rows than one pass.
        let staged = gemv_staged_bytes(normed, m, k).filter(|_| m <= rows);
        let staged_bytes = staged.unwrap_or(0);
        if rows == 1 && staged.is_none() {
            rows = 2;
        }
        let mut kernel = match (rows, staged) {
            (1, _) => format!("{name}_r1"),
            (_, Some(_)) => format!("{name}_r{rows}_staged"),
            (_, None) => format!("{name}_r{rows}"),
        };
        let mut resident = kernels.resident_blocks(&kernel, GEMV_THREADS, staged_bytes)?;
        // Blocks that share multiprocessors (more column groups than multiprocessors):
        // the kernel's packed variant (fewer registers), where it has one, leaves room
        // beside them for the next kernel's blocks, and where the grid is capped it holds
        // more blocks, each with its loads in flight.
        let shared = groups > kernels.multiprocessors() as usize;
        if shared && GEMV_PACKED.contains(&kernel.as_str()) {
            let packed = format!("{kernel}_packed");
            let packed_resident = kernels.resident_blocks(&packed, GEMV_THREADS, staged_bytes)?;
            if packed_resident > resident {
                (kernel, resident) = (packed, packed_resident);
            }
        }
        let blocks = u32::try_from(groups)
            .expect("linear: n past the grid")
            .min(resident);
        Ok(GemvPlan {
            kernel,
            blocks,
            staged_bytes,
            m: m as i32,
            n: n as i32,
            k: k as i32,
            slices: slices as i32,
        })
    }

    /// Appends the shape arguments every GEMV kernel takes after its buffers.
    fn shape_args(&self, launch: &mut KernelLaunch) {
        launch
            .arg(&self.m)
            .arg(&self.n)
            .arg(&self.k)
            .arg(&self.slices);
    }

    fn config(&self) -> LaunchConfig {
        grid(self.blocks, GEMV_THREADS, self.staged_bytes)
    }
}

/// Threads per block of the GEMV kernels.
const GEMV_THREADS: u32 = 32 * GEMV_BLOCK_COLS as u32;

#[allow(clippy::too_many_arguments)]
fn gemv<T: DeviceRepr>(
    kernels: &CudaKernels,
    stream: &CudaStream,
    name: &str,
    x: &CudaView<bf16>,
    w: &CudaView<bf16>,
    out: &mut CudaViewMut<T>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), DriverError> {
    let ptrs = [x.device_ptr(stream).0, w.device_ptr(stream).0];
    let plan = GemvPlan::new(kernels, name, false, ptrs, m, n, k)?;
    let mut launch = kernels.launch(stream, &plan.kernel);
    launch.arg(x).arg(w).arg(out);
    plan.shape_args(&mut launch);
    // SAFETY: x, w and out hold m rows, n*k and m*n elements (checked by the callers), rows are
    // 16-byte aligned with k % 8 == 0 (checked by the plan); each warp guards its column and
    // rows.
    unsafe { launch.launch(plan.config()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_columns_are_split_over_warps_by_their_depth_alone() {
        assert_eq!(gemv_slices(576), 1);
        assert_eq!(gemv_slices(2048), 1);
        assert_eq!(gemv_slices(4096), 2);
        assert_eq!(gemv_slices(8192), 4);
        assert_eq!(gemv_slices(14336), 8);
        assert_eq!(gemv_slices(1 << 20), 8);
        // Stretches stay whole 8-element pieces: 2056 = 8 * 257 cannot halve.
        assert_eq!(gemv_slices(2056), 1);
        assert_eq!(gemv_slices(4112), 2);
    }

    #[test]
    fn products_stage_rows_that_fit_a_block() {
        // The decode products of the Llama-3.2-1B shape: qkv and gate/up normed over 2048,
        // down over 8192.
        assert_eq!(gemv_staged_bytes(true, 1, 2048), Some(4 * 2048));
        assert_eq!(gemv_staged_bytes(false, 1, 8192), Some(2 * 8192));
        // So are Llama-3-70B's normed products (8192); past 44 KiB the two-row kernel reads
        // x in place: a normed row of 12,288 and the 70B down projection (28,672).
        assert_eq!(gemv_staged_bytes(true, 1, 8192), Some(4 * 8192));
        assert_eq!(gemv_staged_bytes(true, 1, 12_288), None);
        assert_eq!(gemv_staged_bytes(false, 1, 28_672), None);
        // A verification step of 4 rows (K = 3): SmolLM2-135M's products all stage, and the
        // 1B shape's normed ones (4 x 2048 f32) but not its down projection (4 x 8192).
        assert_eq!(gemv_staged_bytes(true, 4, 576), Some(4 * 4 * 576));
        assert_eq!(gemv_staged_bytes(false, 4, 1536), Some(2 * 4 * 1536));
        assert_eq!(gemv_staged_bytes(true, 4, 2048), Some(4 * 4 * 2048));
        assert_eq!(gemv_staged_bytes(false, 4, 8192), None);
    }

    #[test]
    fn the_source_agrees_with_the_launcher_constants() {
        let source = include_str!("../../cuda/gemm.cu");
        let line = format!("#define GEMV_WARPS {GEMV_BLOCK_COLS}\n");
        assert!(source.contains(&line), "gemm.cu lacks `{line}`");
        let names: Vec<&str> = crate::cuda::kernel_names(source).collect();
        for rows in GEMV_PASS_ROWS {
            for kernel in [
                bf16::GEMV_KERNEL,
                f32::GEMV_KERNEL,
                GEMV_GATED_KERNEL,
                GEMV_NORMED_KERNEL,
                GEMV_NORMED_GATED_KERNEL,
                GEMV_ADD_KERNEL,
            ] {
                let name = format!("{kernel}_r{rows}");
                assert!(names.contains(&name.as_str()), "gemm.cu lacks {name}");
                if rows > 1 {
                    let name = format!("{kernel}_r{rows}_staged");
                    assert!(names.contains(&name.as_str()), "gemm.cu lacks {name}");
                }
            }
        }
        for kernel in GEMV_PACKED {
            let name = format!("{kernel}_packed");
            assert!(names.contains(&name.as_str()), "gemm.cu lacks {name}");
        }
    }
}

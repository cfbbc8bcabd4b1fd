//! Strided batched products through cuBLAS: one launch for a product per head, each head's
//! operands a fixed stride apart (latent attention's absorbed `W_UK` and `W_UV`).

use super::{Gemm, GemmError, GemmOutput};
use cudarc::cublas::{result::gemm_strided_batched_ex, sys};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use half::bf16;

/// One operand of a batched product: batch b's matrix starts `batch_stride` elements after
/// batch b - 1's, and its rows `ld` elements apart.
#[derive(Clone, Copy)]
pub struct Strided<'a, 'b> {
    /// The first batch's first element onwards.
    pub view: &'a CudaView<'b, bf16>,
    /// Elements between rows.
    pub ld: usize,
    /// Elements between batches.
    pub batch_stride: usize,
}

/// How each batch's weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[n, k]`, as a linear layer's weight: `out = x · wᵀ`.
    OutByIn,
    /// `[k, n]`: `out = x · w`.
    InByOut,
}

/// The shape of a batched product: `batches` products of `m` rows, `k` deep, `n` wide.
#[derive(Clone, Copy, Debug)]
pub struct BatchedShape {
    pub batches: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Gemm {
    /// For every batch b: `out_b[m, n] = x_b[m, k] · W_b` with `W_b` the batch's weight as
    /// `layout` says, `out_b`'s rows `out_ld` apart and `out_batch_stride` after the batch
    /// before. Through cuBLAS at every size: its results are not batch-invariant, so the
    /// models that use it refuse `--deterministic` on the GPU.
    #[allow(clippy::too_many_arguments)]
    pub fn batched<T: GemmOutput>(
        &self,
        stream: &CudaStream,
        x: Strided,
        w: Strided,
        layout: WeightLayout,
        out: &mut CudaViewMut<T>,
        out_ld: usize,
        out_batch_stride: usize,
        s: BatchedShape,
    ) -> Result<(), GemmError> {
        let BatchedShape { batches, m, n, k } = s;
        if batches * m * n == 0 {
            return Ok(());
        }
        let (w_rows, w_cols) = match layout {
            WeightLayout::OutByIn => (n, k),
            WeightLayout::InByOut => (k, n),
        };
        let reach = |ld: usize, stride: usize, rows: usize, cols: usize| {
            (batches - 1) * stride + (rows - 1) * ld + cols
        };
        assert!(
            x.ld >= k && w.ld >= w_cols && out_ld >= n,
            "batched: rows overlap"
        );
        assert!(
            x.view.len() >= reach(x.ld, x.batch_stride, m, k)
                && w.view.len() >= reach(w.ld, w.batch_stride, w_rows, w_cols)
                && out.len() >= reach(out_ld, out_batch_stride, m, n),
            "batched: short buffers"
        );
        let int = |v: usize| i32::try_from(v).expect("batched: a dimension past i32");
        let long = |v: usize| i64::try_from(v).expect("batched: a stride past i64");
        let op_w = match layout {
            WeightLayout::OutByIn => sys::cublasOperation_t::CUBLAS_OP_T,
            WeightLayout::InByOut => sys::cublasOperation_t::CUBLAS_OP_N,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (x_ptr, _x) = x.view.device_ptr(stream);
        let (w_ptr, _w) = w.view.device_ptr(stream);
        let (o_ptr, _o) = out.device_ptr_mut(stream);
        // Column-major: out_bᵀ[n, m] = W_bᵀ[n, k] · x_bᵀ[k, m]. A row-major [n, k] weight is
        // a column-major [k, n] one (transposed); a row-major [k, n] weight is already
        // the column-major [n, k] the product needs.
        // SAFETY: every batch's operands lie inside their views (checked above) and stay
        // alive for the call; cuBLAS runs on the handle's stream, the same as `stream`.
        unsafe {
            gemm_strided_batched_ex(
                *self.blas.handle(),
                op_w,
                sys::cublasOperation_t::CUBLAS_OP_N,
                int(n),
                int(m),
                int(k),
                &alpha as *const f32 as *const _,
                w_ptr as *const _,
                sys::cudaDataType::CUDA_R_16BF,
                int(w.ld),
                long(w.batch_stride),
                x_ptr as *const _,
                sys::cudaDataType::CUDA_R_16BF,
                int(x.ld),
                long(x.batch_stride),
                &beta as *const f32 as *const _,
                o_ptr as *mut _,
                T::CUDA_TYPE,
                int(out_ld),
                long(out_batch_stride),
                int(batches),
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )?;
        }
        Ok(())
    }
}

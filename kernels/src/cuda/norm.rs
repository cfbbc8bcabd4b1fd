//! Launchers of the RMSNorm kernels (`cuda/norm.cu`).

use super::{grid, CudaKernels};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DriverError};
use half::bf16;

/// Threads per row of the row-wise norms: the most a block has, so that each thread loads
/// only a few elements of the row and a one-row step (decode at batch 1) is not held up
/// by a chain of dependent loads. Fixed, so a row's reduction order never changes.
const ROW_THREADS: u32 = 1024;

/// Threads per block of the per-head norm (one warp per head).
const HEAD_THREADS: u32 = 256;

/// `out[r] = x[r] / rms(x[r]) * weight` for `rows` rows of `dim` (x in f32, out in bf16).
pub fn rms_norm(
    k: &CudaKernels,
    stream: &CudaStream,
    x: &CudaView<f32>,
    weight: &CudaView<bf16>,
    out: &mut CudaViewMut<bf16>,
    rows: usize,
    eps: f32,
) -> Result<(), DriverError> {
    rms_norm_columns(k, stream, x, weight, out, rows, weight.len(), eps)
}

/// [`rms_norm`] into the first `weight.len()` columns of the `[rows, out_stride]` matrix
/// `out` (offset the view to start at another column): one half of a concatenation.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_columns(
    k: &CudaKernels,
    stream: &CudaStream,
    x: &CudaView<f32>,
    weight: &CudaView<bf16>,
    out: &mut CudaViewMut<bf16>,
    rows: usize,
    out_stride: usize,
    eps: f32,
) -> Result<(), DriverError> {
    let dim = weight.len();
    assert!(out_stride >= dim, "rms_norm_columns: rows overlap");
    assert!(
        x.len() >= rows * dim && (rows == 0 || out.len() >= (rows - 1) * out_stride + dim),
        "rms_norm_columns: short buffers"
    );
    if rows == 0 {
        return Ok(());
    }
    let (dim_i, stride_i) = (dim as i32, out_stride as i32);
    let mut launch = k.launch(stream, "rms_norm_f32_bf16");
    launch
        .arg(x)
        .arg(weight)
        .arg(out)
        .arg(&dim_i)
        .arg(&stride_i)
        .arg(&eps);
    // SAFETY: `x` holds `rows * dim` elements and `out` the last row's columns (checked
    // above); one block per row.
    unsafe { launch.launch(grid(rows as u32, ROW_THREADS, 0)) }?;
    Ok(())
}

/// `out[r] = x[r] / rms(x[r]) * weight` for `rows` bf16 rows of `weight.len()` columns
/// whose starts are `x_stride` elements apart (the first columns of a wider matrix), into
/// the dense `[rows, weight.len()]` matrix `out`.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_rows(
    k: &CudaKernels,
    stream: &CudaStream,
    x: &CudaView<bf16>,
    x_stride: usize,
    weight: &CudaView<bf16>,
    out: &mut CudaViewMut<bf16>,
    rows: usize,
    eps: f32,
) -> Result<(), DriverError> {
    let dim = weight.len();
    assert!(x_stride >= dim, "rms_norm_rows: rows overlap");
    if rows == 0 {
        return Ok(());
    }
    assert!(
        x.len() >= (rows - 1) * x_stride + dim && out.len() >= rows * dim,
        "rms_norm_rows: short buffers"
    );
    let (stride_i, dim_i) = (x_stride as i64, dim as i32);
    let mut launch = k.launch(stream, "rms_norm_bf16_rows");
    launch
        .arg(x)
        .arg(&stride_i)
        .arg(weight)
        .arg(out)
        .arg(&dim_i)
        .arg(&eps);
    // SAFETY: both buffers reach their last row (checked above); one block per row.
    unsafe { launch.launch(grid(rows as u32, HEAD_THREADS, 0)) }?;
    Ok(())
}

/// `residual[r] += delta[r]`, then `out[r] = residual[r] / rms(residual[r]) * weight`.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm(
    k: &CudaKernels,
    stream: &CudaStream,
    residual: &mut CudaViewMut<f32>,
    delta: &CudaView<bf16>,
    weight: &CudaView<bf16>,
    out: &mut CudaViewMut<bf16>,
    rows: usize,
    eps: f32,
) -> Result<(), DriverError> {
    let dim = weight.len();
    assert!(
        residual.len() >= rows * dim && delta.len() >= rows * dim && out.len() >= rows * dim,
        "add_rms_norm: short buffers"
    );
    if rows == 0 {
        return Ok(());
    }
    let dim_i = dim as i32;
    let mut launch = k.launch(stream, "add_rms_norm_f32_bf16");
    launch
        .arg(residual)
        .arg(delta)
        .arg(weight)
        .arg(out)
        .arg(&dim_i)
        .arg(&eps);
    // SAFETY: as in `rms_norm`.
    unsafe { launch.launch(grid(rows as u32, ROW_THREADS, 0)) }?;
    Ok(())
}

/// In place: RMSNorm of `heads` heads of `weight.len()` elements each, starting at column
/// `first_col` of every row of the `[rows, width]` matrix `x` (Qwen3's q/k norms).
#[allow(clippy::too_many_arguments)]
pub fn head_rms_norm(
    k: &CudaKernels,
    stream: &CudaStream,
    x: &mut CudaViewMut<bf16>,
    weight: &CudaView<bf16>,
    rows: usize,
    width: usize,
    first_col: usize,
    heads: usize,
    eps: f32,
) -> Result<(), DriverError> {
    let head_dim = weight.len();
    assert!(
        first_col + heads * head_dim <= width,
        "head_rms_norm: heads past the row"
    );
    assert!(x.len() >= rows * width, "head_rms_norm: short buffer");
    let warps = rows * heads;
    if warps == 0 {
        return Ok(());
    }
    let per_block = (HEAD_THREADS / 32) as usize;
    let blocks = warps.div_ceil(per_block) as u32;
    let (rows_i, width_i, first_i, heads_i, dim_i) = (
        rows as i32,
        width as i32,
        first_col as i32,
        heads as i32,
        head_dim as i32,
    );
    let mut launch = k.launch(stream, "head_rms_norm_bf16");
    launch
        .arg(x)
        .arg(weight)
        .arg(&rows_i)
        .arg(&width_i)
        .arg(&first_i)
        .arg(&heads_i)
        .arg(&dim_i)
        .arg(&eps);
    // SAFETY: every head lies inside its row (checked above); one warp per head.
    unsafe { launch.launch(grid(blocks, HEAD_THREADS, 0)) }?;
    Ok(())
}

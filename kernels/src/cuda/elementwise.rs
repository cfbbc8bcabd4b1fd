//! Launchers of the element-wise kernels (`cuda/elementwise.cu`).

use super::{grid, CudaKernels};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DriverError};
use half::bf16;

const THREADS: u32 = 256;

fn blocks(elements: usize) -> u32 {
    u32::try_from(elements.div_ceil(THREADS as usize)).expect("launch of over 2^32 blocks")
}

/// `out[r] = table[tokens[r]]` widened to f32 (`[rows, dim]`). Token ids must be checked
/// against the vocabulary by the caller.
pub fn embedding(
    k: &CudaKernels,
    stream: &CudaStream,
    tokens: &CudaView<i32>,
    table: &CudaView<bf16>,
    out: &mut CudaViewMut<f32>,
    dim: usize,
) -> Result<(), DriverError> {
    let rows = tokens.len();
    assert!(out.len() >= rows * dim, "embedding: short output");
    if rows == 0 {
        return Ok(());
    }
    let (rows_i, dim_i) = (rows as i32, dim as i32);
    let mut launch = k.launch(stream, "embedding_bf16_f32");
    launch
        .arg(tokens)
        .arg(table)
        .arg(out)
        .arg(&rows_i)
        .arg(&dim_i);
    // SAFETY: `out` holds rows * dim elements; ids are in the table (caller's check).
    unsafe { launch.launch(grid(blocks(rows * dim), THREADS, 0)) }?;
    Ok(())
}

/// [`embedding`], with the rows whose `positions` are 0 zeroed (a multi-token prediction
/// layer's embedding). `positions` holds one position a token.
pub fn embedding_past_first(
    k: &CudaKernels,
    stream: &CudaStream,
    tokens: &CudaView<i32>,
    positions: &CudaView<i32>,
    table: &CudaView<bf16>,
    out: &mut CudaViewMut<f32>,
    dim: usize,
) -> Result<(), DriverError> {
    let rows = tokens.len();
    assert!(out.len() >= rows * dim, "embedding: short output");
    assert!(positions.len() >= rows, "embedding: a position short");
    if rows == 0 {
        return Ok(());
    }
    let (rows_i, dim_i) = (rows as i32, dim as i32);
    let mut launch = k.launch(stream, "embedding_past_first_bf16_f32");
    launch
        .arg(tokens)
        .arg(positions)
        .arg(table)
        .arg(out)
        .arg(&rows_i)
        .arg(&dim_i);
    // SAFETY: `out` holds rows * dim elements and `positions` rows; ids are in the table
    // (caller's check).
    unsafe { launch.launch(grid(blocks(rows * dim), THREADS, 0)) }?;
    Ok(())
}

/// `out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]` for `rows` rows.
pub fn silu_and_mul(
    k: &CudaKernels,
    stream: &CudaStream,
    gate_up: &CudaView<bf16>,
    out: &mut CudaViewMut<bf16>,
    rows: usize,
    inter: usize,
) -> Result<(), DriverError> {
    assert!(
        gate_up.len() >= rows * 2 * inter && out.len() >= rows * inter,
        "silu_and_mul: short buffers"
    );
    if rows * inter == 0 {
        return Ok(());
    }
    let (rows_i, inter_i) = (rows as i32, inter as i32);
    let mut launch = k.launch(stream, "silu_and_mul_bf16");
    launch.arg(gate_up).arg(out).arg(&rows_i).arg(&inter_i);
    // SAFETY: buffer lengths checked above.
    unsafe { launch.launch(grid(blocks(rows * inter), THREADS, 0)) }?;
    Ok(())
}

/// `out[j] = src[rows[j]]` for bf16 rows of `dim` elements.
pub fn gather_rows(
    k: &CudaKernels,
    stream: &CudaStream,
    src: &CudaView<bf16>,
    rows: &CudaView<i32>,
    out: &mut CudaViewMut<bf16>,
    dim: usize,
) -> Result<(), DriverError> {
    let count = rows.len();
    assert!(out.len() >= count * dim, "gather_rows: short output");
    if count == 0 {
        return Ok(());
    }
    let (count_i, dim_i) = (count as i32, dim as i32);
    let mut launch = k.launch(stream, "gather_rows_bf16");
    launch.arg(src).arg(rows).arg(out).arg(&count_i).arg(&dim_i);
    // SAFETY: `out` holds count * dim elements; row ids are checked by the caller.
    unsafe { launch.launch(grid(blocks(count * dim), THREADS, 0)) }?;
    Ok(())
}

/// Where [`draft_feed`] writes a draft head's next step: its `pre` rows, its token ids and
/// the proposal's record of the drafts.
pub struct DraftFeedOut<'a, 'b> {
    /// `[count, dim]` f32 rows.
    pub pre: &'a mut CudaViewMut<'b, f32>,
    /// `count` token ids (the next step's plan).
    pub tokens: &'a mut CudaViewMut<'b, i32>,
    /// `count` drafts kept for the proposal.
    pub drafts: &'a mut CudaViewMut<'b, i32>,
}

/// For each row `j` of `rows` (`s = rows[j]`): `out.pre[j] = pre[s]` (rows of `dim`) and
/// `out.tokens[j] = out.drafts[j] = to_target[ids[s]]`: a draft head's next step fed from
/// the one before, on the device. Row ids must lie in `pre` and `ids`, and every id of a
/// row read in `to_target` (an argmax over the draft vocabulary): the caller's check.
pub fn draft_feed(
    k: &CudaKernels,
    stream: &CudaStream,
    (pre, ids): (&CudaView<f32>, &CudaView<u32>),
    rows: &CudaView<i32>,
    to_target: &CudaView<i32>,
    out: DraftFeedOut,
    dim: usize,
) -> Result<(), DriverError> {
    let count = rows.len();
    assert!(
        out.pre.len() >= count * dim && out.tokens.len() >= count && out.drafts.len() >= count,
        "draft_feed: short output"
    );
    if count * dim == 0 {
        return Ok(());
    }
    let (count_i, dim_i) = (count as i32, dim as i32);
    let mut launch = k.launch(stream, "draft_feed_f32");
    launch
        .arg(pre)
        .arg(ids)
        .arg(rows)
        .arg(to_target)
        .arg(out.pre)
        .arg(out.tokens)
        .arg(out.drafts)
        .arg(&count_i)
        .arg(&dim_i);
    // SAFETY: the outputs hold count rows (checked above); row ids and draft ids are in
    // range (caller's check).
    unsafe { launch.launch(grid(blocks(count * dim), THREADS, 0)) }?;
    Ok(())
}

/// `dst[to] = src[from]` for each `(to, from)` of the first `count` pairs of `pairs` (i32
/// `[count, 2]`): drafts left on the device fed into a step's token ids. Every index must
/// lie in its buffer: the caller's check.
pub fn scatter_ids(
    k: &CudaKernels,
    stream: &CudaStream,
    src: &CudaView<i32>,
    pairs: &CudaView<i32>,
    dst: &mut CudaViewMut<i32>,
    count: usize,
) -> Result<(), DriverError> {
    assert!(pairs.len() >= 2 * count, "scatter_ids: short pairs");
    if count == 0 {
        return Ok(());
    }
    let count_i = i32::try_from(count).expect("scatter_ids: a count past i32");
    let mut launch = k.launch(stream, "scatter_ids_i32");
    launch.arg(src).arg(pairs).arg(dst).arg(&count_i);
    // SAFETY: `pairs` holds `count` pairs (checked above); their indices lie in `src` and
    // `dst` (caller's check).
    unsafe { launch.launch(grid(blocks(count), THREADS, 0)) }?;
    Ok(())
}

/// `ring[(first + r) % capacity] = src[r]` narrowed to bf16, for the `rows` f32 rows of `dim`
/// elements at the start of `src`, where `ring` holds `capacity` rows of `dim`.
pub fn ring_store(
    k: &CudaKernels,
    stream: &CudaStream,
    src: &CudaView<f32>,
    ring: &mut CudaViewMut<bf16>,
    first: u64,
    rows: usize,
    dim: usize,
) -> Result<(), DriverError> {
    if rows * dim == 0 {
        return Ok(());
    }
    let capacity = ring.len() / dim;
    assert!(src.len() >= rows * dim, "ring_store: short source");
    assert!(
        rows <= capacity,
        "ring_store: {rows} rows past a ring of {capacity}"
    );
    let i32_of = |v: usize| i32::try_from(v).expect("ring_store: a size past i32");
    let (rows_i, dim_i) = (i32_of(rows), i32_of(dim));
    // The kernel reduces the row modulo the capacity: the sum stays far below 2^63.
    let (first_i, capacity_i) = ((first % capacity as u64) as i64, capacity as i64);
    let mut launch = k.launch(stream, "ring_store_f32_bf16");
    launch
        .arg(src)
        .arg(ring)
        .arg(&first_i)
        .arg(&capacity_i)
        .arg(&rows_i)
        .arg(&dim_i);
    // SAFETY: every row lands in the ring modulo its capacity; `src` holds rows * dim.
    unsafe { launch.launch(grid(blocks(rows * dim), THREADS, 0)) }?;
    Ok(())
}

/// Fills `out` with values uniform in `[-scale, scale)` from a hash of `(seed, index)`.
pub fn fill_uniform(
    k: &CudaKernels,
    stream: &CudaStream,
    out: &mut CudaViewMut<bf16>,
    seed: u64,
    scale: f32,
) -> Result<(), DriverError> {
    let n = out.len() as i64;
    if n == 0 {
        return Ok(());
    }
    let mut launch = k.launch(stream, "fill_uniform_bf16");
    launch.arg(out).arg(&n).arg(&seed).arg(&scale);
    // SAFETY: one thread per element of `out`.
    unsafe { launch.launch(grid(blocks(n as usize), THREADS, 0)) }?;
    Ok(())
}

/// `x[r] += bias` for the first `rows` rows of `bias.len()` elements.
pub fn add_bias(
    k: &CudaKernels,
    stream: &CudaStream,
    x: &mut CudaViewMut<bf16>,
    bias: &CudaView<bf16>,
    rows: usize,
) -> Result<(), DriverError> {
    let n = bias.len();
    assert!(x.len() >= rows * n, "add_bias: short buffer");
    if rows * n == 0 {
        return Ok(());
    }
    let (rows_i, n_i) = (rows as i32, n as i32);
    let mut launch = k.launch(stream, "add_bias_bf16");
    launch.arg(x).arg(bias).arg(&rows_i).arg(&n_i);
    // SAFETY: `x` holds rows * n elements (checked above).
    unsafe { launch.launch(grid(blocks(rows * n), THREADS, 0)) }?;
    Ok(())
}

/// A value a column copy reads: f32 or bf16, widened to f32.
pub trait ColumnSource: cudarc::driver::DeviceRepr {
    /// The kernel that reads it.
    const KERNEL: &'static str;
}

impl ColumnSource for f32 {
    const KERNEL: &'static str = "copy_columns_f32";
}

impl ColumnSource for bf16 {
    const KERNEL: &'static str = "copy_columns_bf16_f32";
}

/// `dst[r, c] = src[r, c]` widened to f32 for `rows` rows of `dim` columns, where `src`'s
/// rows are `src_stride` elements apart and `dst`'s `dst_stride` (views offset to the
/// first column copied): a block of columns into or out of a wider matrix.
#[allow(clippy::too_many_arguments)]
pub fn copy_columns<S: ColumnSource>(
    k: &CudaKernels,
    stream: &CudaStream,
    src: &CudaView<S>,
    src_stride: usize,
    dst: &mut CudaViewMut<f32>,
    dst_stride: usize,
    rows: usize,
    dim: usize,
) -> Result<(), DriverError> {
    if rows * dim == 0 {
        return Ok(());
    }
    assert!(
        src_stride >= dim && dst_stride >= dim,
        "copy_columns: rows overlap"
    );
    let reach = |stride: usize| (rows - 1) * stride + dim;
    assert!(
        src.len() >= reach(src_stride) && dst.len() >= reach(dst_stride),
        "copy_columns: short buffers"
    );
    let i32_of = |v: usize| i32::try_from(v).expect("copy_columns: a size past i32");
    let (rows_i, dim_i) = (i32_of(rows), i32_of(dim));
    let (src_i, dst_i) = (i32_of(src_stride), i32_of(dst_stride));
    let mut launch = k.launch(stream, S::KERNEL);
    launch
        .arg(src)
        .arg(&src_i)
        .arg(dst)
        .arg(&dst_i)
        .arg(&rows_i)
        .arg(&dim_i);
    // SAFETY: both views reach their last row's columns (checked above).
    unsafe { launch.launch(grid(blocks(rows * dim), THREADS, 0)) }?;
    Ok(())
}

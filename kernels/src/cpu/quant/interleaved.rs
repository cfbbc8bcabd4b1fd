//! Weight rows of Q4_0, Q4_1 and Q8_0 interleaved `L` at a time (`L` of [`LANES`] or
//! [`WIDE_LANES`]), so one SIMD register holds four values of each of `L` rows (eight in
//! 256 bits, sixteen in 512) and the rows' sums land in their own lanes: an activation
//! block is loaded once for `L` weight rows, and no horizontal sums or scalar scales are
//! left. The layout is made once at load; it takes the bytes the blocks took.
//!
//! A group of `L` rows is its blocks in order; block `b` of a group is
//! - the `L` rows' f16 `d` (`2L` bytes), then for Q4_1 their f16 `m` (`2L` bytes);
//! - Q4_0 and Q4_1: four chunks of `4L` bytes; in chunk `c`, byte `4 * j + t` holds value
//!   `8c + t` of row `j` in its low nibble and value `8c + 4 + t` in its high nibble;
//! - Q8_0: eight chunks of `4L` bytes; in chunk `c`, byte `4 * j + t` is value `4c + t` of
//!   row `j`.
//!
//! So the first (last) half of each chunk and scale array of a 16-row group is the layout
//! of its first (last) eight rows: a kernel of eight lanes runs either width.
//!
//! Every path computes a block of each row and activation row the same way: the exact
//! integer sum `q · qx`, then `acc = fma(sum, d * dx, acc)` and, for Q4_0 and Q4_1,
//! `acc = fma(m, sx, acc)` with `m` the block's minimum (Q4_1) or `-8 d` (Q4_0); so the portable and the
//! SIMD paths agree bit for bit and a row's result does not depend on the batch.

use super::format::{f16_at, BlockFormat, Unpacked};
use super::q8::{Q8Row, QK8};

/// Weight rows per interleaved group for 256-bit registers.
pub const LANES: usize = 8;

/// Weight rows per interleaved group for 512-bit registers.
pub const WIDE_LANES: usize = 16;

/// Whether `format` has an interleaved layout.
pub fn interleaves(format: BlockFormat) -> bool {
    matches!(
        format,
        BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q8_0
    )
}

/// Bytes of scales before a group block's values, for groups of `lanes` rows.
pub(crate) const fn header_bytes(format: BlockFormat, lanes: usize) -> usize {
    match format {
        BlockFormat::Q4_1 => 4 * lanes,
        _ => 2 * lanes,
    }
}

/// Whether `lanes` is a group width of the layout.
fn is_width(lanes: usize) -> bool {
    lanes == LANES || lanes == WIDE_LANES
}

/// Where value `v` of lane `j` lives in a group block's values (groups of `lanes`): its
/// byte, and whether it is the byte's high nibble (Q4 formats).
fn place(format: BlockFormat, lanes: usize, j: usize, v: usize) -> (usize, bool) {
    let chunk = 4 * lanes;
    match format {
        BlockFormat::Q8_0 => (chunk * (v / 4) + 4 * j + v % 4, false),
        _ => (chunk * (v / 8) + 4 * j + v % 4, v % 8 >= 4),
    }
}

/// `bytes` (rows of `row_bytes`, a multiple of `lanes` rows, plain ggml blocks of
/// `format`) in the interleaved layout of groups of `lanes` ([`LANES`] or [`WIDE_LANES`]).
pub fn interleave(format: BlockFormat, bytes: &[u8], row_bytes: usize, lanes: usize) -> Vec<u8> {
    assert!(
        interleaves(format)
            && is_width(lanes)
            && row_bytes > 0
            && row_bytes.is_multiple_of(format.block_bytes())
            && bytes.len().is_multiple_of(lanes * row_bytes),
        "interleave: {} bytes are not groups of {lanes} {} rows of {row_bytes} bytes",
        bytes.len(),
        format.name()
    );
    let size = format.block_bytes();
    let (group_block, header) = (lanes * size, header_bytes(format, lanes));
    let mut out = vec![0u8; bytes.len()];
    let mut u = Unpacked::new();
    for (src, dst) in bytes
        .chunks_exact(lanes * row_bytes)
        .zip(out.chunks_exact_mut(lanes * row_bytes))
    {
        for (b, dst) in dst.chunks_exact_mut(group_block).enumerate() {
            for j in 0..lanes {
                let block = &src[j * row_bytes + b * size..][..size];
                dst[2 * j..2 * j + 2].copy_from_slice(&block[..2]);
                if format == BlockFormat::Q4_1 {
                    dst[2 * lanes + 2 * j..][..2].copy_from_slice(&block[2..4]);
                }
                format.unpack(block, &mut u);
                let values = &mut dst[header..];
                for v in 0..QK8 {
                    let (at, high) = place(format, lanes, j, v);
                    let q = u.q[v] as u8;
                    if format == BlockFormat::Q8_0 {
                        values[at] = q;
                    } else if high {
                        values[at] |= q << 4;
                    } else {
                        values[at] |= q;
                    }
                }
            }
        }
    }
    out
}

/// The integer of value `v` of lane `j` in group block `g` of `lanes` rows (Q4 formats
/// unsigned, 0..16).
fn value(format: BlockFormat, lanes: usize, g: &[u8], j: usize, v: usize) -> i32 {
    let (at, high) = place(format, lanes, j, v);
    let byte = g[header_bytes(format, lanes) + at];
    match (format, high) {
        (BlockFormat::Q8_0, _) => i32::from(byte as i8),
        (_, true) => i32::from(byte >> 4),
        (_, false) => i32::from(byte & 0x0f),
    }
}

/// Lane `j`'s scale `d` and the offset `off` its values have subtracted (value
/// `d * q - off`, as [`BlockFormat::dequantize`] computes it) in group block `g` of
/// `lanes` rows.
fn scales(format: BlockFormat, lanes: usize, g: &[u8], j: usize) -> (f32, f32) {
    let d = f16_at(g, 2 * j);
    match format {
        BlockFormat::Q4_1 => (d, -f16_at(g, 2 * lanes + 2 * j)),
        BlockFormat::Q4_0 => (d, 8.0 * d),
        _ => (d, 0.0),
    }
}

/// Row `r` of interleaved `bytes` (groups of `lanes` rows of `row_bytes`) as float32
/// into `out`.
pub fn dequantize_row(
    format: BlockFormat,
    lanes: usize,
    bytes: &[u8],
    row_bytes: usize,
    r: usize,
    out: &mut [f32],
) {
    let group_block = lanes * format.block_bytes();
    let group = &bytes[r / lanes * lanes * row_bytes..][..lanes * row_bytes];
    let j = r % lanes;
    for (g, values) in group
        .chunks_exact(group_block)
        .zip(out.chunks_exact_mut(QK8))
    {
        let (d, off) = scales(format, lanes, g, j);
        for (v, out) in values.iter_mut().enumerate() {
            *out = d * value(format, lanes, g, j, v) as f32 - off;
        }
    }
}

/// `dst[r * stride + i] = w[i] · x[r]` for every row `i` of `w` (whole groups of `lanes`
/// interleaved rows of `row_bytes`) and every row `r` of `x`, in plain Rust.
///
/// # Safety
/// `dst[r * stride + i]` must be writable for every such `r` and `i`, and no other
/// thread may access those elements during the call.
pub unsafe fn rows(
    format: BlockFormat,
    lanes: usize,
    w: &[u8],
    row_bytes: usize,
    x: &[Q8Row],
    dst: *mut f32,
    stride: usize,
) {
    let group_block = lanes * format.block_bytes();
    for (gi, group) in w.chunks_exact(lanes * row_bytes).enumerate() {
        for (r, x) in x.iter().enumerate() {
            for j in 0..lanes {
                let mut acc = 0.0f32;
                for (b, g) in group.chunks_exact(group_block).enumerate() {
                    let xq = &x.q[b * QK8..(b + 1) * QK8];
                    let sum: i32 = (0..QK8)
                        .map(|v| value(format, lanes, g, j, v) * i32::from(xq[v]))
                        .sum();
                    let (d, off) = scales(format, lanes, g, j);
                    acc = (sum as f32).mul_add(d * x.d[b], acc);
                    if format != BlockFormat::Q8_0 {
                        acc = (-off).mul_add(x.s[b], acc);
                    }
                }
                // SAFETY: the caller's contract.
                unsafe { *dst.add(r * stride + gi * lanes + j) = acc };
            }
        }
    }
}

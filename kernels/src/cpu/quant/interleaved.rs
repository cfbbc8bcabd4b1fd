//! Weight rows of Q4_0, Q4_1 and Q8_0 interleaved eight at a time, so one SIMD register
//! holds four values of each of eight rows and the eight rows' sums land in eight lanes:
//! an activation block is loaded once for eight weight rows, and no horizontal sums or
//! scalar scales are left. The layout is made once at load; it takes the bytes the
//! blocks took.
//!
//! A group of eight rows is its blocks in order; block `b` of a group is
//! - the eight rows' f16 `d` (16 bytes), then for Q4_1 their f16 `m` (16 bytes);
//! - Q4_0 and Q4_1: four 32-byte chunks; in chunk `c`, byte `4 * j + t` holds value
//!   `8c + t` of row `j` in its low nibble and value `8c + 4 + t` in its high nibble;
//! - Q8_0: eight 32-byte chunks; in chunk `c`, byte `4 * j + t` is value `4c + t` of row
//!   `j`.
//!
//! Every path computes a block of each row and activation row the same way: the exact
//! integer sum `q · qx`, then `acc = fma(sum, d * dx, acc)` and, for Q4_0 and Q4_1,
//! `acc = fma(m, sx, acc)` with `m` the block's minimum (Q4_1) or `-8 d` (Q4_0); so the portable and the
//! SIMD paths agree bit for bit and a row's result does not depend on the batch.

use super::format::{f16_at, BlockFormat, Unpacked};
use super::q8::{Q8Row, QK8};

/// Weight rows per interleaved group.
pub const LANES: usize = 8;

/// Whether `format` has an interleaved layout.
pub fn interleaves(format: BlockFormat) -> bool {
    matches!(
        format,
        BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q8_0
    )
}

/// Bytes of scales before a group block's values.
pub(crate) const fn header_bytes(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q4_1 => 4 * LANES,
        _ => 2 * LANES,
    }
}

/// Where value `v` of lane `j` lives in a group block's values: its byte, and whether it
/// is the byte's high nibble (Q4 formats).
fn place(format: BlockFormat, j: usize, v: usize) -> (usize, bool) {
    match format {
        BlockFormat::Q8_0 => (32 * (v / 4) + 4 * j + v % 4, false),
        _ => (32 * (v / 8) + 4 * j + v % 4, v % 8 >= 4),
    }
}

/// `bytes` (rows of `row_bytes`, a multiple of [`LANES`] rows, plain ggml blocks of
/// `format`) in the interleaved layout.
pub fn interleave(format: BlockFormat, bytes: &[u8], row_bytes: usize) -> Vec<u8> {
    assert!(
        interleaves(format)
            && row_bytes > 0
            && row_bytes.is_multiple_of(format.block_bytes())
            && bytes.len().is_multiple_of(LANES * row_bytes),
        "interleave: {} bytes are not groups of {LANES} {} rows of {row_bytes} bytes",
        bytes.len(),
        format.name()
    );
    let size = format.block_bytes();
    let (group_block, header) = (LANES * size, header_bytes(format));
    let mut out = vec![0u8; bytes.len()];
    let mut u = Unpacked::new();
    for (src, dst) in bytes
        .chunks_exact(LANES * row_bytes)
        .zip(out.chunks_exact_mut(LANES * row_bytes))
    {
        for (b, dst) in dst.chunks_exact_mut(group_block).enumerate() {
            for j in 0..LANES {
                let block = &src[j * row_bytes + b * size..][..size];
                dst[2 * j..2 * j + 2].copy_from_slice(&block[..2]);
                if format == BlockFormat::Q4_1 {
                    dst[2 * LANES + 2 * j..][..2].copy_from_slice(&block[2..4]);
                }
                format.unpack(block, &mut u);
                let values = &mut dst[header..];
                for v in 0..QK8 {
                    let (at, high) = place(format, j, v);
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

/// The integer of value `v` of lane `j` in group block `g` (Q4 formats unsigned, 0..16).
fn value(format: BlockFormat, g: &[u8], j: usize, v: usize) -> i32 {
    let (at, high) = place(format, j, v);
    let byte = g[header_bytes(format) + at];
    match (format, high) {
        (BlockFormat::Q8_0, _) => i32::from(byte as i8),
        (_, true) => i32::from(byte >> 4),
        (_, false) => i32::from(byte & 0x0f),
    }
}

/// Lane `j`'s scale `d` and the offset `off` its values have subtracted (value
/// `d * q - off`, as [`BlockFormat::dequantize`] computes it) in group block `g`.
fn scales(format: BlockFormat, g: &[u8], j: usize) -> (f32, f32) {
    let d = f16_at(g, 2 * j);
    match format {
        BlockFormat::Q4_1 => (d, -f16_at(g, 2 * LANES + 2 * j)),
        BlockFormat::Q4_0 => (d, 8.0 * d),
        _ => (d, 0.0),
    }
}

/// Row `r` of interleaved `bytes` (rows of `row_bytes`) as float32 into `out`.
pub fn dequantize_row(
    format: BlockFormat,
    bytes: &[u8],
    row_bytes: usize,
    r: usize,
    out: &mut [f32],
) {
    let group_block = LANES * format.block_bytes();
    let group = &bytes[r / LANES * LANES * row_bytes..][..LANES * row_bytes];
    let j = r % LANES;
    for (g, values) in group
        .chunks_exact(group_block)
        .zip(out.chunks_exact_mut(QK8))
    {
        let (d, off) = scales(format, g, j);
        for (v, out) in values.iter_mut().enumerate() {
            *out = d * value(format, g, j, v) as f32 - off;
        }
    }
}

/// `dst[r * stride + i] = w[i] · x[r]` for every row `i` of `w` (whole groups of
/// interleaved rows of `row_bytes`) and every row `r` of `x`, in plain Rust.
///
/// # Safety
/// `dst[r * stride + i]` must be writable for every such `r` and `i`, and no other
/// thread may access those elements during the call.
pub unsafe fn rows(
    format: BlockFormat,
    w: &[u8],
    row_bytes: usize,
    x: &[Q8Row],
    dst: *mut f32,
    stride: usize,
) {
    let group_block = LANES * format.block_bytes();
    for (gi, group) in w.chunks_exact(LANES * row_bytes).enumerate() {
        for (r, x) in x.iter().enumerate() {
            for j in 0..LANES {
                let mut acc = 0.0f32;
                for (b, g) in group.chunks_exact(group_block).enumerate() {
                    let xq = &x.q[b * QK8..(b + 1) * QK8];
                    let sum: i32 = (0..QK8)
                        .map(|v| value(format, g, j, v) * i32::from(xq[v]))
                        .sum();
                    let (d, off) = scales(format, g, j);
                    acc = (sum as f32).mul_add(d * x.d[b], acc);
                    if format != BlockFormat::Q8_0 {
                        acc = (-off).mul_add(x.s[b], acc);
                    }
                }
                // SAFETY: the caller's contract.
                unsafe { *dst.add(r * stride + gi * LANES + j) = acc };
            }
        }
    }
}

//! Weight rows of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q4_K interleaved `L` at a time (`L` of [`LANES`] or
//! [`WIDE_LANES`]), so one SIMD register holds four values of each of `L` rows (eight in
//! 256 bits, sixteen in 512) and the rows' sums land in their own lanes: an activation
//! block is loaded once for `L` weight rows, and no horizontal sums or scalar scales are
//! left. The layout is made once at load; it takes the bytes the blocks took.
//!
//! A group of `L` rows is its blocks in order; block `b` of a group is
//! - the `L` rows' f16 `d` (`2L` bytes), then for Q4_1 their f16 `m` (`2L` bytes);
//! - Q4_0 and Q4_1: four chunks of `4L` bytes; in chunk `c`, byte `4 * j + t` holds value
//!   `8c + t` of row `j` in its low nibble and value `8c + 4 + t` in its high nibble;
//! - Q5_0 and Q5_1: as Q4_0 and Q4_1 (the values' low four bits), with the fifth bits
//!   between the scales and the values: four chunks of `L` bytes, bit `i` of byte `c * L +
//!   j` the fifth bit of value `8c + i` of row `j`;
//! - Q8_0: eight chunks of `4L` bytes; in chunk `c`, byte `4 * j + t` is value `4c + t` of
//!   row `j`;
//! - Q4_K (256 values, 148 bytes a row where ggml's block takes 144): the rows' f16 `d`
//!   then f16 `dmin` (`2L` bytes each), then each sub-block's 6-bit scales (`L` bytes a
//!   sub-block, 8 sub-blocks) and minimums (the same), unpacked from ggml's 12 bytes; then
//!   the 256 values as the Q4 formats' 32, in 32 chunks.
//!
//! So the first (last) half of each chunk and scale array of a 16-row group is the layout
//! of its first (last) eight rows: a kernel of eight lanes runs either width.
//!
//! Every path computes each 32 values of each row and activation row the same way: the
//! exact integer sum `q · qx`, then `acc = fma(sum, d * dx, acc)` (for Q4_K `d` is the
//! sub-block's `d * scale`) and, for the Q4 formats, `acc = fma(-off, sx, acc)` with `off`
//! what the values have subtracted (`-m` for Q4_1, `8 d` for Q4_0, `dmin * min` for Q4_K);
//! so the portable and the SIMD paths agree bit for bit and a row's result does not depend
//! on the batch.

use super::format::{f16_at, scale_min_k4, BlockFormat, Unpacked};
use super::q8::{Q8Row, QK8};

/// Weight rows per interleaved group for 256-bit registers.
pub const LANES: usize = 8;

/// Weight rows per interleaved group for 512-bit registers.
pub const WIDE_LANES: usize = 16;

/// Whether `format` has an interleaved layout.
pub fn interleaves(format: BlockFormat) -> bool {
    matches!(
        format,
        BlockFormat::Q4_0
            | BlockFormat::Q4_1
            | BlockFormat::Q5_0
            | BlockFormat::Q5_1
            | BlockFormat::Q8_0
            | BlockFormat::Q4K
    )
}

/// Where a Q5 format's fifth bits start in a group block of `lanes` rows: after the scales.
pub(crate) const fn fifth_bits_at(format: BlockFormat, lanes: usize) -> usize {
    match format {
        BlockFormat::Q5_1 => 4 * lanes,
        _ => 2 * lanes,
    }
}

/// Bytes of scales before a group block's values, for groups of `lanes` rows.
pub(crate) const fn header_bytes(format: BlockFormat, lanes: usize) -> usize {
    match format {
        BlockFormat::Q4_1 => 4 * lanes,
        BlockFormat::Q5_0 => 6 * lanes,
        BlockFormat::Q5_1 => 8 * lanes,
        BlockFormat::Q4K => 20 * lanes,
        _ => 2 * lanes,
    }
}

/// Bytes one row's block takes in the layout (Q4_K's unpacked scales take 4 more).
pub(crate) const fn lane_block_bytes(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q4K => 148,
        _ => format.block_bytes(),
    }
}

/// Bytes a row of `cols` values takes in the interleaved layout, if `cols` is whole blocks.
pub fn woven_row_bytes(format: BlockFormat, cols: usize) -> Option<usize> {
    let elems = format.block_elems();
    cols.is_multiple_of(elems)
        .then(|| cols / elems * lane_block_bytes(format))
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
/// `format`) in the interleaved layout of groups of `lanes` ([`LANES`] or [`WIDE_LANES`]),
/// rows of [`woven_row_bytes`].
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
    let (group_block, header) = (
        lanes * lane_block_bytes(format),
        header_bytes(format, lanes),
    );
    let woven = row_bytes / size * lane_block_bytes(format);
    let mut out = vec![0u8; bytes.len() / row_bytes * woven];
    let mut u = Unpacked::new();
    for (src, dst) in bytes
        .chunks_exact(lanes * row_bytes)
        .zip(out.chunks_exact_mut(lanes * woven))
    {
        for (b, dst) in dst.chunks_exact_mut(group_block).enumerate() {
            for j in 0..lanes {
                let block = &src[j * row_bytes + b * size..][..size];
                dst[2 * j..2 * j + 2].copy_from_slice(&block[..2]);
                if matches!(
                    format,
                    BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4K
                ) {
                    dst[2 * lanes + 2 * j..][..2].copy_from_slice(&block[2..4]);
                }
                if format == BlockFormat::Q4K {
                    for sub in 0..8 {
                        let (scale, min) = scale_min_k4(sub, &block[4..16]);
                        dst[4 * lanes + sub * lanes + j] = scale;
                        dst[12 * lanes + sub * lanes + j] = min;
                    }
                }
                format.unpack(block, &mut u);
                for v in 0..format.block_elems() {
                    let (at, high) = place(format, lanes, j, v);
                    let q = u.q[v] as u8;
                    if matches!(format, BlockFormat::Q5_0 | BlockFormat::Q5_1) {
                        let at = fifth_bits_at(format, lanes) + v / 8 * lanes + j;
                        dst[at] |= (q >> 4) << (v % 8);
                    }
                    let values = &mut dst[header..];
                    let q = if format == BlockFormat::Q8_0 {
                        q
                    } else {
                        q & 0x0f
                    };
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
/// unsigned, 0..16, and Q5 ones 0..32).
fn value(format: BlockFormat, lanes: usize, g: &[u8], j: usize, v: usize) -> i32 {
    let (at, high) = place(format, lanes, j, v);
    let byte = g[header_bytes(format, lanes) + at];
    let low = match (format, high) {
        (BlockFormat::Q8_0, _) => return i32::from(byte as i8),
        (_, true) => i32::from(byte >> 4),
        (_, false) => i32::from(byte & 0x0f),
    };
    match format {
        BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
            let fifth = g[fifth_bits_at(format, lanes) + v / 8 * lanes + j] >> (v % 8) & 1;
            low | i32::from(fifth) << 4
        }
        _ => low,
    }
}

/// Lane `j`'s scale `d` and the offset `off` the values of its sub-block `sub` (of 32
/// values) have subtracted (value `d * q - off`, as [`BlockFormat::dequantize`] computes
/// it) in group block `g` of `lanes` rows.
fn scales(format: BlockFormat, lanes: usize, g: &[u8], j: usize, sub: usize) -> (f32, f32) {
    let d = f16_at(g, 2 * j);
    match format {
        BlockFormat::Q4K => {
            let dmin = f16_at(g, 2 * lanes + 2 * j);
            let (scale, min) = (
                g[4 * lanes + sub * lanes + j],
                g[12 * lanes + sub * lanes + j],
            );
            (d * f32::from(scale), dmin * f32::from(min))
        }
        BlockFormat::Q4_1 | BlockFormat::Q5_1 => (d, -f16_at(g, 2 * lanes + 2 * j)),
        BlockFormat::Q5_0 => (d, 16.0 * d),
        BlockFormat::Q4_0 => (d, 8.0 * d),
        _ => (d, 0.0),
    }
}

/// Row `r` of interleaved `bytes` (groups of `lanes` rows of `row_bytes`, as
/// [`woven_row_bytes`] gives) as float32 into `out`.
pub fn dequantize_row(
    format: BlockFormat,
    lanes: usize,
    bytes: &[u8],
    row_bytes: usize,
    r: usize,
    out: &mut [f32],
) {
    let group_block = lanes * lane_block_bytes(format);
    let group = &bytes[r / lanes * lanes * row_bytes..][..lanes * row_bytes];
    let j = r % lanes;
    for (g, values) in group
        .chunks_exact(group_block)
        .zip(out.chunks_exact_mut(format.block_elems()))
    {
        for (sub, values) in values.chunks_exact_mut(QK8).enumerate() {
            let (d, off) = scales(format, lanes, g, j, sub);
            for (i, out) in values.iter_mut().enumerate() {
                *out = d * value(format, lanes, g, j, sub * QK8 + i) as f32 - off;
            }
        }
    }
}

/// `dst[r * stride + i] = w[i] · x[r]` for every row `i` of `w` (whole groups of `lanes`
/// interleaved rows of `row_bytes`, as [`woven_row_bytes`] gives) and every row `r` of
/// `x`, in plain Rust.
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
    let group_block = lanes * lane_block_bytes(format);
    let subs = format.block_elems() / QK8;
    for (gi, group) in w.chunks_exact(lanes * row_bytes).enumerate() {
        for (r, x) in x.iter().enumerate() {
            for j in 0..lanes {
                let mut acc = 0.0f32;
                for (b, g) in group.chunks_exact(group_block).enumerate() {
                    for sub in 0..subs {
                        let a = b * subs + sub;
                        let xq = &x.q[a * QK8..(a + 1) * QK8];
                        let sum: i32 = (0..QK8)
                            .map(|i| value(format, lanes, g, j, sub * QK8 + i) * i32::from(xq[i]))
                            .sum();
                        let (d, off) = scales(format, lanes, g, j, sub);
                        acc = (sum as f32).mul_add(d * x.d[a], acc);
                        if format != BlockFormat::Q8_0 {
                            acc = (-off).mul_add(x.s[a], acc);
                        }
                    }
                }
                // SAFETY: the caller's contract.
                unsafe { *dst.add(r * stride + gi * lanes + j) = acc };
            }
        }
    }
}

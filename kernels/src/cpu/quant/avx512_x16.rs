//! The interleaved (sixteen rows at a time) Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q4_K products
//! with AVX-512 VNNI: each 64-byte load holds four values of each of sixteen weight rows,
//! each activation row's four matching values are broadcast to every lane, and one
//! `vpdpbusd` adds the sixteen rows' four products into their own `i32` lanes; up to eight
//! activation rows share each weight load.
//! - Q5_0 and Q5_1 run as Q4_0 and Q4_1 with each chunk's fifth bits spread to their bytes
//!   (`vpshufb`) and set where a bit test finds them.
//! - Q4_K runs as Q4_0 per sub-block of 32 values, with the sub-block's scale and minimum
//!   per lane.
//! - Q8_0's signed weights are made unsigned in the register (`q + 128`) and 128 times the
//!   activation block's integer sum is taken off again.
//!
//! So the integer sums are exact and the arithmetic per output is the portable one of
//! [`interleaved`](super::interleaved), bit for bit.

use super::format::BlockFormat;
use super::interleaved::{fifth_bits_at, header_bytes, lane_block_bytes, WIDE_LANES};
use super::q8::{Q8Row, QK8};
use std::arch::x86_64::*;

/// `dst[r * stride + i] = w[i] · x[r]`, as [`super::interleaved::rows`], for groups of
/// [`WIDE_LANES`] rows.
///
/// # Safety
/// The CPU must have what [`super::avx512::available`] checks; `format` must interleave;
/// `w` must be whole groups of [`WIDE_LANES`] interleaved rows of `row_bytes` and every
/// row of `x` as long as a row; `dst` as [`super::interleaved::rows`] requires.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")]
pub unsafe fn rows(
    format: BlockFormat,
    w: &[u8],
    row_bytes: usize,
    x: &[Q8Row],
    dst: *mut f32,
    stride: usize,
) {
    let blocks = row_bytes / lane_block_bytes(format);
    // Q8_0: 128 times each activation block's integer sum, what the offset weights add.
    let offsets: Vec<i32> = if format == BlockFormat::Q8_0 {
        x.iter()
            .flat_map(|x| x.q.chunks_exact(QK8))
            .map(|b| 128 * b.iter().map(|&v| i32::from(v)).sum::<i32>())
            .collect()
    } else {
        Vec::new()
    };
    for (gi, group) in w.chunks_exact(WIDE_LANES * row_bytes).enumerate() {
        let group = group.as_ptr();
        for (c, x) in x.chunks(ROWS).enumerate() {
            let out = dst.add(ROWS * c * stride + gi * WIDE_LANES);
            let offsets = offsets.get(ROWS * c * blocks..).unwrap_or_default();
            let args = (format, group, blocks, x, offsets, out, stride);
            match x.len() {
                1 => sixteen::<1>(args),
                2 => sixteen::<2>(args),
                3 => sixteen::<3>(args),
                4 => sixteen::<4>(args),
                5 => sixteen::<5>(args),
                6 => sixteen::<6>(args),
                7 => sixteen::<7>(args),
                _ => sixteen::<ROWS>(args),
            }
        }
    }
}

/// Activation rows that share each weight load: eight rows' integer and float sums take
/// sixteen of the 32 registers, and their eight independent chains of `vpdpbusd` keep
/// its latency hidden.
const ROWS: usize = 8;

/// One group of sixteen rows against `R` rows of `x`, stored at `out`.
#[inline(always)]
unsafe fn sixteen<const R: usize>(
    (format, group, blocks, x, offsets, out, stride): (
        BlockFormat,
        *const u8,
        usize,
        &[Q8Row],
        &[i32],
        *mut f32,
        usize,
    ),
) {
    let acc = match format {
        BlockFormat::Q8_0 => bytes::<R>(group, blocks, x, offsets),
        BlockFormat::Q4K => q4k::<R>(group, blocks, x),
        _ => nibbles::<R>(format, group, blocks, x),
    };
    store(acc, out, stride);
}

#[inline(always)]
unsafe fn store<const R: usize>(acc: [__m512; R], out: *mut f32, stride: usize) {
    for (r, acc) in acc.into_iter().enumerate() {
        _mm512_storeu_ps(out.add(r * stride), acc);
    }
}

/// The four bytes of `x`'s integers from value `at`, in every lane.
#[inline(always)]
unsafe fn broadcast(x: &Q8Row, at: usize) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(x.q.as_ptr().add(at) as *const i32))
}

/// The sixteen lanes' f16 scales at `p`, widened.
#[inline(always)]
unsafe fn halves(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// `acc += sum * (d * dx)`, the block's scaled integer sum.
#[inline(always)]
unsafe fn scaled(acc: __m512, sum: __m512i, d: __m512, dx: f32) -> __m512 {
    _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(sum),
        _mm512_mul_ps(d, _mm512_set1_ps(dx)),
        acc,
    )
}

/// `sums[r] += lo · x[r][at..at + 4] + hi · x[r][at + 4..at + 8]` in every lane: a chunk
/// of nibbles (values `t` and `t + 4` of each row's four) against each activation row.
#[inline(always)]
unsafe fn add_nibbles<const R: usize>(
    sums: &mut [__m512i; R],
    lo: __m512i,
    hi: __m512i,
    x: &[Q8Row],
    at: usize,
) {
    for (sum, x) in sums.iter_mut().zip(x) {
        *sum = _mm512_dpbusd_epi32(*sum, lo, broadcast(x, at));
        *sum = _mm512_dpbusd_epi32(*sum, hi, broadcast(x, at + 4));
    }
}

/// Byte `q` of a chunk belongs to row `q / 4`: which of a 16-byte row-per-byte array's
/// bytes (the same in every 128-bit lane) it takes.
const SPREAD: [u8; 64] = {
    let mut at = [0u8; 64];
    let mut q = 0;
    while q < 64 {
        at[q] = ((q % 16) / 4 + 4 * (q / 16)) as u8;
        q += 1;
    }
    at
};

/// Byte `q` of a chunk holds value `t = q % 4` of its row (low nibble) and `t + 4` (high):
/// the bits of those values in a Q5 fifth-bit byte.
const LOW_BITS: [u8; 64] = bits(0);
const HIGH_BITS: [u8; 64] = bits(4);

const fn bits(shift: usize) -> [u8; 64] {
    let mut b = [0u8; 64];
    let mut q = 0;
    while q < 64 {
        b[q] = 1 << (shift + q % 4);
        q += 1;
    }
    b
}

/// Q4_0, Q4_1, Q5_0 and Q5_1: the values are unsigned.
#[inline(always)]
unsafe fn nibbles<const R: usize>(
    format: BlockFormat,
    group: *const u8,
    blocks: usize,
    x: &[Q8Row],
) -> [__m512; R] {
    let mask = _mm512_set1_epi8(0x0f);
    let size = WIDE_LANES * format.block_bytes();
    let header = header_bytes(format, WIDE_LANES);
    let five = matches!(format, BlockFormat::Q5_0 | BlockFormat::Q5_1);
    let fifth = fifth_bits_at(format, WIDE_LANES);
    let load = |b: &[u8; 64]| _mm512_loadu_si512(b.as_ptr() as *const __m512i);
    let (spread, low_bits, high_bits) = (load(&SPREAD), load(&LOW_BITS), load(&HIGH_BITS));
    let sixteen = _mm512_set1_epi8(0x10);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let p = group.add(b * size);
        let d = halves(p);
        let o = match format {
            BlockFormat::Q4_1 | BlockFormat::Q5_1 => halves(p.add(2 * WIDE_LANES)),
            BlockFormat::Q5_0 => _mm512_mul_ps(d, _mm512_set1_ps(-16.0)),
            _ => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
        };
        let mut sums = [_mm512_setzero_si512(); R];
        for chunk in 0..4 {
            let v = _mm512_loadu_si512(p.add(header + 64 * chunk) as *const __m512i);
            let mut lo = _mm512_and_si512(v, mask);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            if five {
                let at = p.add(fifth + chunk * WIDE_LANES) as *const __m128i;
                let bits = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(at)), spread);
                let (low, high) = (
                    _mm512_test_epi8_mask(bits, low_bits),
                    _mm512_test_epi8_mask(bits, high_bits),
                );
                lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(low, sixteen));
                hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(high, sixteen));
            }
            add_nibbles(&mut sums, lo, hi, x, b * QK8 + 8 * chunk);
        }
        for r in 0..R {
            acc[r] = scaled(acc[r], sums[r], d, *x[r].d.get_unchecked(b));
            acc[r] = _mm512_fmadd_ps(o, _mm512_set1_ps(*x[r].s.get_unchecked(b)), acc[r]);
        }
    }
    acc
}

/// Q8_0: the weights offset by 128 in the register; `offsets[r * blocks + b]` is what that
/// adds to row `r`'s sum of block `b`.
#[inline(always)]
unsafe fn bytes<const R: usize>(
    group: *const u8,
    blocks: usize,
    x: &[Q8Row],
    offsets: &[i32],
) -> [__m512; R] {
    let flip = _mm512_set1_epi8(i8::MIN);
    let size = WIDE_LANES * BlockFormat::Q8_0.block_bytes();
    let header = header_bytes(BlockFormat::Q8_0, WIDE_LANES);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let p = group.add(b * size);
        let d = halves(p);
        let mut sums = [_mm512_setzero_si512(); R];
        for chunk in 0..8 {
            let v = _mm512_loadu_si512(p.add(header + 64 * chunk) as *const __m512i);
            let unsigned = _mm512_xor_si512(v, flip);
            for r in 0..R {
                let at = b * QK8 + 4 * chunk;
                sums[r] = _mm512_dpbusd_epi32(sums[r], unsigned, broadcast(&x[r], at));
            }
        }
        for r in 0..R {
            let offset = _mm512_set1_epi32(*offsets.get_unchecked(r * blocks + b));
            let sum = _mm512_sub_epi32(sums[r], offset);
            acc[r] = scaled(acc[r], sum, d, *x[r].d.get_unchecked(b));
        }
    }
    acc
}

/// Q4_K: per sub-block of 32 values the nibbles' sums, scaled by the lanes' `d * scale`
/// and less their `dmin * min` times the activation block's sum.
#[inline(always)]
unsafe fn q4k<const R: usize>(group: *const u8, blocks: usize, x: &[Q8Row]) -> [__m512; R] {
    const L: usize = WIDE_LANES;
    let mask = _mm512_set1_epi8(0x0f);
    let size = L * lane_block_bytes(BlockFormat::Q4K);
    let header = header_bytes(BlockFormat::Q4K, L);
    let bytes = |p: *const u8| {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i)))
    };
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let p = group.add(b * size);
        let (d, dmin) = (halves(p), halves(p.add(2 * L)));
        for sub in 0..8 {
            let scale = _mm512_mul_ps(d, bytes(p.add(4 * L + sub * L)));
            let off = _mm512_mul_ps(dmin, bytes(p.add(12 * L + sub * L)));
            let a = b * 8 + sub;
            let mut sums = [_mm512_setzero_si512(); R];
            for chunk in 0..4 {
                let at = header + 64 * (4 * sub + chunk);
                let v = _mm512_loadu_si512(p.add(at) as *const __m512i);
                let lo = _mm512_and_si512(v, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
                add_nibbles(&mut sums, lo, hi, x, a * QK8 + 8 * chunk);
            }
            for r in 0..R {
                acc[r] = scaled(acc[r], sums[r], scale, *x[r].d.get_unchecked(a));
                let sx = _mm512_set1_ps(*x[r].s.get_unchecked(a));
                acc[r] = _mm512_fnmadd_ps(off, sx, acc[r]);
            }
        }
    }
    acc
}

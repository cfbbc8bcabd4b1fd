//! The interleaved (eight rows at a time) Q4_0, Q4_1 and Q8_0 products with AVX2, FMA
//! and F16C: each 32-byte load holds four values of each of eight weight rows, each
//! activation row's four matching values are broadcast to every lane, and `vpmaddubsw`
//! leaves each row's sums in its own lanes; up to four activation rows share each
//! weight load. Groups of sixteen rows run as two groups of eight (the layout's halves).
//! The arithmetic per output is the portable one of [`interleaved`](super::interleaved),
//! bit for bit.

use super::format::BlockFormat;
use super::interleaved::{header_bytes, LANES};
use super::q8::{Q8Row, QK8};
use std::arch::x86_64::*;

/// Eight rows of a group of `lanes` interleaved rows: the group's first byte, its width,
/// and which eight of its rows.
#[derive(Clone, Copy)]
struct Eight {
    group: *const u8,
    lanes: usize,
    half: usize,
}

impl Eight {
    /// Block `b`'s first byte (blocks of `format`).
    #[inline(always)]
    unsafe fn block(self, format: BlockFormat, b: usize) -> *const u8 {
        self.group.add(b * self.lanes * format.block_bytes())
    }

    /// The eight rows' f16 scales of the array at `p` (`d`, or Q4_1's `m` one array on).
    #[inline(always)]
    unsafe fn scales(self, p: *const u8) -> __m256 {
        halves(p.add(2 * LANES * self.half))
    }

    /// The eight rows' 32 bytes of chunk `c` of the block at `p`.
    #[inline(always)]
    unsafe fn chunk(self, format: BlockFormat, p: *const u8, c: usize) -> __m256i {
        let at = header_bytes(format, self.lanes) + 4 * self.lanes * c + 32 * self.half;
        _mm256_loadu_si256(p.add(at) as *const __m256i)
    }
}

/// `dst[r * stride + i] = w[i] · x[r]`, as [`super::interleaved::rows`].
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `format` must interleave; `w` must be whole
/// groups of `lanes` ([`LANES`] or twice that) interleaved rows of `row_bytes` and every
/// row of `x` as long as a row; `dst` as [`super::interleaved::rows`] requires.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows(
    format: BlockFormat,
    lanes: usize,
    w: &[u8],
    row_bytes: usize,
    x: &[Q8Row],
    dst: *mut f32,
    stride: usize,
) {
    let blocks = row_bytes / format.block_bytes();
    for (gi, group) in w.chunks_exact(lanes * row_bytes).enumerate() {
        for (c, x) in x.chunks(4).enumerate() {
            for half in 0..lanes / LANES {
                let group = Eight {
                    group: group.as_ptr(),
                    lanes,
                    half,
                };
                let out = dst.add(4 * c * stride + gi * lanes + half * LANES);
                eight(format, group, blocks, x, out, stride);
            }
        }
    }
}

/// One group of eight rows against up to four rows of `x`, stored at `out`.
#[inline(always)]
unsafe fn eight(
    format: BlockFormat,
    group: Eight,
    blocks: usize,
    x: &[Q8Row],
    out: *mut f32,
    stride: usize,
) {
    match (format, x.len()) {
        (BlockFormat::Q8_0, 1) => store(bytes_group::<1>(group, blocks, x), out, stride),
        (BlockFormat::Q8_0, 2) => store(bytes_group::<2>(group, blocks, x), out, stride),
        (BlockFormat::Q8_0, 3) => store(bytes_group::<3>(group, blocks, x), out, stride),
        (BlockFormat::Q8_0, _) => store(bytes_group::<4>(group, blocks, x), out, stride),
        (f, 1) => store(nibble_group::<1>(f, group, blocks, x), out, stride),
        (f, 2) => store(nibble_group::<2>(f, group, blocks, x), out, stride),
        (f, 3) => store(nibble_group::<3>(f, group, blocks, x), out, stride),
        (f, _) => store(nibble_group::<4>(f, group, blocks, x), out, stride),
    }
}

#[inline(always)]
unsafe fn store<const R: usize>(acc: [__m256; R], out: *mut f32, stride: usize) {
    for (r, acc) in acc.into_iter().enumerate() {
        _mm256_storeu_ps(out.add(r * stride), acc);
    }
}

/// The four bytes of `x`'s integers from value `at`, in every lane.
#[inline(always)]
unsafe fn broadcast(x: &Q8Row, at: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(x.q.as_ptr().add(at) as *const i32))
}

/// The eight lanes' f16 scales at `p`, widened.
#[inline(always)]
unsafe fn halves(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// Q4_0 and Q4_1: sums of `vpmaddubsw` pairs (at most 2 · 15 · 127 each, eight to a
/// block, so they fit `i16`) widened once per block.
#[inline(always)]
unsafe fn nibble_group<const R: usize>(
    format: BlockFormat,
    group: Eight,
    blocks: usize,
    x: &[Q8Row],
) -> [__m256; R] {
    let (mask, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..blocks {
        let p = group.block(format, b);
        let d = group.scales(p);
        let o = if format == BlockFormat::Q4_1 {
            group.scales(p.add(2 * group.lanes))
        } else {
            _mm256_mul_ps(d, _mm256_set1_ps(-8.0))
        };
        let mut sums = [_mm256_setzero_si256(); R];
        for chunk in 0..4 {
            let v = group.chunk(format, p, chunk);
            let lo = _mm256_and_si256(v, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            for r in 0..R {
                let at = b * QK8 + 8 * chunk;
                let pair = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo, broadcast(&x[r], at)),
                    _mm256_maddubs_epi16(hi, broadcast(&x[r], at + 4)),
                );
                sums[r] = _mm256_add_epi16(sums[r], pair);
            }
        }
        for r in 0..R {
            let sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums[r], ones));
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*x[r].d.get_unchecked(b)));
            acc[r] = _mm256_fmadd_ps(sum, scale, acc[r]);
            acc[r] = _mm256_fmadd_ps(o, _mm256_set1_ps(*x[r].s.get_unchecked(b)), acc[r]);
        }
    }
    acc
}

/// Q8_0: signed weights, multiplied as `|w| * (x * sign(w))` so `vpmaddubsw` applies;
/// each chunk's pairs are widened to `i32` before they are summed.
#[inline(always)]
unsafe fn bytes_group<const R: usize>(group: Eight, blocks: usize, x: &[Q8Row]) -> [__m256; R] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..blocks {
        let p = group.block(BlockFormat::Q8_0, b);
        let d = group.scales(p);
        let mut sums = [_mm256_setzero_si256(); R];
        for chunk in 0..8 {
            let v = group.chunk(BlockFormat::Q8_0, p, chunk);
            let magnitude = _mm256_sign_epi8(v, v);
            for r in 0..R {
                let signed = _mm256_sign_epi8(broadcast(&x[r], b * QK8 + 4 * chunk), v);
                let pairs = _mm256_maddubs_epi16(magnitude, signed);
                sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs, ones));
            }
        }
        for r in 0..R {
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*x[r].d.get_unchecked(b)));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
        }
    }
    acc
}

//! Block dot products with AVX-512 VNNI for the 32-value formats (Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1): two blocks at a time, their 64 weights widened to unsigned bytes in one 512-bit
//! register and multiplied with the activations' 64 `i8` by one `vpdpbusd`. Q8_0's signed
//! weights are offset by 128 (value `d * (q + 128) - 128 * d`) so every format is unsigned.
//! A lone last block runs the same code with the second half masked to zero. Each output
//! row's operations are the same whatever the number of rows in the group.

use super::format::BlockFormat;
use super::q8::{Q8Row, QK8};
use std::arch::x86_64::*;

/// Whether this CPU runs [`dot`].
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("fma")
}

/// Whether [`dot`] handles `format`.
pub fn handles(format: BlockFormat) -> bool {
    format.block_elems() == QK8
}

/// `out[j * n + r] = w[j] · x[r]` for every row `j` of `w` (rows of `row_bytes`) and
/// every row `r` of the `n` rows of `x`.
///
/// # Safety
/// The CPU must have the features [`available`] checks; `format` must be one [`handles`];
/// `w` must be whole rows of whole blocks and every row of `x` as long as one.
pub unsafe fn rows(format: BlockFormat, w: &[u8], row_bytes: usize, x: &[Q8Row], out: &mut [f32]) {
    match format {
        BlockFormat::Q8_0 => rows_q8_0(w, row_bytes, x, out),
        BlockFormat::Q4_0 => rows_q4_0(w, row_bytes, x, out),
        BlockFormat::Q4_1 => rows_q4_1(w, row_bytes, x, out),
        BlockFormat::Q5_0 => rows_q5_0(w, row_bytes, x, out),
        BlockFormat::Q5_1 => rows_q5_1(w, row_bytes, x, out),
        other => panic!("avx512::rows: {} is not a 32-value format", other.name()),
    }
}

/// One format's kernel: [`pairs`] over blocks of `$bytes` with the weights of `$weights`,
/// for every weight row and group of up to four activation rows.
macro_rules! kernel {
    ($name:ident, $bytes:expr, $weights:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")]
        unsafe fn $name(w: &[u8], row_bytes: usize, x: &[Q8Row], out: &mut [f32]) {
            let scales: Vec<Scales> = x.iter().map(Scales::of).collect();
            super::for_groups(w, row_bytes, x, out, |w, first, x, out| {
                let weights = |p0, p1| $weights(p0, p1);
                let scales = &scales[first..first + x.len()];
                match x.len() {
                    1 => pairs::<1>(w, $bytes, x, scales, out, weights),
                    2 => pairs::<2>(w, $bytes, x, scales, out, weights),
                    3 => pairs::<3>(w, $bytes, x, scales, out, weights),
                    _ => pairs::<4>(w, $bytes, x, scales, out, weights),
                }
            })
        }
    };
}
kernel!(rows_q8_0, 34, q8_0);
kernel!(rows_q4_0, 18, q4_0);
kernel!(rows_q4_1, 20, q4_1);
kernel!(rows_q5_0, 22, q5_0);
kernel!(rows_q5_1, 24, q5_1);

/// One activation row's scales laid out for [`pairs`]: per pair of blocks, 16 lanes
/// holding the first block's scale in lanes 0..8 and the second's in 8..16, and the two
/// blocks' scaled sums; 0 for the missing second block of an odd count.
struct Scales {
    d: Vec<[f32; 16]>,
    s: Vec<[f32; 4]>,
}

impl Scales {
    fn of(x: &Q8Row) -> Scales {
        let pairs = x.d.len().div_ceil(2);
        let at = |v: &[f32], i: usize| v.get(i).copied().unwrap_or(0.0);
        let mut scales = Scales {
            d: Vec::with_capacity(pairs),
            s: Vec::with_capacity(pairs),
        };
        for p in 0..pairs {
            let (d0, d1) = (at(x.d, 2 * p), at(x.d, 2 * p + 1));
            let mut lanes = [d0; 16];
            lanes[8..].fill(d1);
            scales.d.push(lanes);
            scales
                .s
                .push([at(x.s, 2 * p), at(x.s, 2 * p + 1), 0.0, 0.0]);
        }
        scales
    }
}

/// The loop every format shares: `weights(p0, p1)` gives two blocks' weights as 64
/// unsigned bytes (block `p0`'s 32, then `p1`'s) and `[d0, d1, o0, o1]`, each block's
/// scale and the offset its values have subtracted (value `d * q - o`). Per row and pair:
/// the integer dot of each block, times `d * dx`, into sixteen float lanes; `o * sx`
/// into two.
#[inline(always)]
unsafe fn pairs<const R: usize>(
    w: &[u8],
    bytes: usize,
    x: &[Q8Row],
    scales: &[Scales],
    out: &mut [f32],
    weights: impl Fn(*const u8, *const u8) -> (__m512i, __m128),
) {
    let blocks = w.len() / bytes;
    // Lanes 0..8 take a scale's first value, lanes 8..16 its second.
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut offsets = [_mm_setzero_ps(); R];
    let mut b = 0;
    while b < blocks {
        let last = b + 1 == blocks;
        let p0 = w.as_ptr().add(b * bytes);
        let p1 = if last { p0 } else { p0.add(bytes) };
        let (wv, ws) = weights(p0, p1);
        let (d, o) = (
            _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(ws)),
            _mm_movehl_ps(ws, ws),
        );
        let pair = b / 2;
        for r in 0..R {
            let q = x[r].q.as_ptr().add(b * QK8);
            let xv = if last {
                _mm512_maskz_loadu_epi8(u64::from(u32::MAX), q)
            } else {
                _mm512_loadu_si512(q as *const __m512i)
            };
            let dx = _mm512_loadu_ps(scales[r].d.get_unchecked(pair).as_ptr());
            let sx = _mm_loadu_ps(scales[r].s.get_unchecked(pair).as_ptr());
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(d, dx), acc[r]);
            offsets[r] = _mm_fmadd_ps(o, sx, offsets[r]);
        }
        b += 2;
    }
    for r in 0..R {
        let o = offsets[r];
        let o = _mm_cvtss_f32(o) + _mm_cvtss_f32(_mm_movehdup_ps(o));
        out[r] = _mm512_reduce_add_ps(acc[r]) - o;
    }
}

/// The f16 pairs at `p0` and `p1` (4 bytes each) widened: `[p0's first, p0's second, p1's
/// first, p1's second]`.
#[inline(always)]
unsafe fn halves(p0: *const u8, p1: *const u8) -> __m128 {
    let word = |p: *const u8| i32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
    _mm_cvtph_ps(_mm_setr_epi32(word(p0), word(p1), 0, 0))
}

/// The f16 at `p0` and at `p1` widened: `[p0's, p1's, 0, 0]`.
#[inline(always)]
unsafe fn scales(p0: *const u8, p1: *const u8) -> __m128 {
    let half = |p: *const u8| i32::from(u16::from_le_bytes([*p, *p.add(1)]));
    _mm_cvtph_ps(_mm_setr_epi32(half(p0) | (half(p1) << 16), 0, 0, 0))
}

/// `[d0, d1, k * d0, k * d1]` from `[d0, d1, _, _]`.
#[inline(always)]
unsafe fn with_offsets(d: __m128, k: f32) -> __m128 {
    _mm_movelh_ps(d, _mm_mul_ps(d, _mm_set1_ps(k)))
}

/// `[d0, d1, -m0, -m1]` from `[d0, m0, d1, m1]`.
#[inline(always)]
unsafe fn scale_min(v: __m128) -> __m128 {
    let d = _mm_shuffle_ps(v, v, 0b10_00_10_00);
    let m = _mm_shuffle_ps(v, v, 0b11_01_11_01);
    _mm_movelh_ps(d, _mm_sub_ps(_mm_setzero_ps(), m))
}

/// Sixteen nibble bytes of each block as 64 bytes: block 0's low then high nibbles, then
/// block 1's.
#[inline(always)]
unsafe fn nibbles(q0: *const u8, q1: *const u8) -> __m512i {
    let v = _mm256_set_m128i(
        _mm_loadu_si128(q1 as *const __m128i),
        _mm_loadu_si128(q0 as *const __m128i),
    );
    let mask = _mm256_set1_epi8(0x0f);
    let lo = _mm256_and_si256(v, mask);
    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    let w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    // [lo0, lo1, hi0, hi1] to [lo0, hi0, lo1, hi1].
    _mm512_shuffle_i64x2(w, w, 0b11_01_10_00)
}

/// Byte `i` is 0x10 where bit `i` of the 64-bit value made of the u32s at `h0` (low) and
/// `h1` (high) is set.
#[inline(always)]
unsafe fn fifth_bits(h0: *const u8, h1: *const u8) -> __m512i {
    let word = |p: *const u8| u64::from(u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]));
    let bits = _mm512_movm_epi8(word(h0) | (word(h1) << 32));
    _mm512_and_si512(bits, _mm512_set1_epi8(0x10))
}

#[inline(always)]
unsafe fn q4_0(p0: *const u8, p1: *const u8) -> (__m512i, __m128) {
    (
        nibbles(p0.add(2), p1.add(2)),
        with_offsets(scales(p0, p1), 8.0),
    )
}

#[inline(always)]
unsafe fn q4_1(p0: *const u8, p1: *const u8) -> (__m512i, __m128) {
    (nibbles(p0.add(4), p1.add(4)), scale_min(halves(p0, p1)))
}

#[inline(always)]
unsafe fn q5_0(p0: *const u8, p1: *const u8) -> (__m512i, __m128) {
    let q = _mm512_or_si512(
        nibbles(p0.add(6), p1.add(6)),
        fifth_bits(p0.add(2), p1.add(2)),
    );
    (q, with_offsets(scales(p0, p1), 16.0))
}

#[inline(always)]
unsafe fn q5_1(p0: *const u8, p1: *const u8) -> (__m512i, __m128) {
    let q = _mm512_or_si512(
        nibbles(p0.add(8), p1.add(8)),
        fifth_bits(p0.add(4), p1.add(4)),
    );
    (q, scale_min(halves(p0, p1)))
}

#[inline(always)]
unsafe fn q8_0(p0: *const u8, p1: *const u8) -> (__m512i, __m128) {
    let q = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(p0.add(2) as *const __m256i)),
        _mm256_loadu_si256(p1.add(2) as *const __m256i),
        1,
    );
    let unsigned = _mm512_xor_si512(q, _mm512_set1_epi8(-128));
    (unsigned, with_offsets(scales(p0, p1), 128.0))
}

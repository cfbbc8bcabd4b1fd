//! Block dot products with AVX2, FMA and F16C for the 32-value formats (Q8_0, Q4_0, Q4_1,
//! Q5_0, Q5_1) and the K-quants (Q4_K, Q5_K, Q6_K): each 32 weights are widened to bytes
//! once, then multiplied with each activation row's 32 `i8` by `vpmaddubsw` and summed in
//! eight f32 lanes (the K-quants' sub-block scales applied to the integer sums by
//! `vpmaddwd`). Each output row's operations are the same whatever the number of rows in
//! the group.

use super::format::{scale_min_k4, BlockFormat};
use super::q8::{Q8Row, QK8};
use std::arch::x86_64::*;

/// Whether this CPU runs [`rows`].
pub fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// `out[j * n + r] = w[j] · x[r]` for every row `j` of `w` (rows of `row_bytes`) and
/// every row `r` of the `n` rows of `x`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C ([`available`]); `w` must be whole rows of whole
/// blocks and every row of `x` as long as one.
pub unsafe fn rows(format: BlockFormat, w: &[u8], row_bytes: usize, x: &[Q8Row], out: &mut [f32]) {
    match format {
        BlockFormat::Q8_0 => rows_q8_0(w, row_bytes, x, out),
        BlockFormat::Q4_0 => rows_q4_0(w, row_bytes, x, out),
        BlockFormat::Q4_1 => rows_q4_1(w, row_bytes, x, out),
        BlockFormat::Q5_0 => rows_q5_0(w, row_bytes, x, out),
        BlockFormat::Q5_1 => rows_q5_1(w, row_bytes, x, out),
        BlockFormat::Q4K => rows_q4k(w, row_bytes, x, out),
        BlockFormat::Q5K => rows_q5k(w, row_bytes, x, out),
        BlockFormat::Q6K => rows_q6k(w, row_bytes, x, out),
    }
}

/// One format's kernel, `$group::<R>` for every weight row and group of up to four
/// activation rows.
macro_rules! kernel {
    ($name:ident, $group:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(w: &[u8], row_bytes: usize, x: &[Q8Row], out: &mut [f32]) {
            super::for_groups(w, row_bytes, x, out, |w, _, x, out| match x.len() {
                1 => $group::<1>(w, x, out),
                2 => $group::<2>(w, x, out),
                3 => $group::<3>(w, x, out),
                _ => $group::<4>(w, x, out),
            })
        }
    };
}
kernel!(rows_q8_0, q8_0);
kernel!(rows_q4_0, q4_0);
kernel!(rows_q4_1, q4_1);
kernel!(rows_q5_0, q5_0);
kernel!(rows_q5_1, q5_1);
kernel!(rows_q4k, q4k);
kernel!(rows_q5k, q5k);
kernel!(rows_q6k, q6k);

#[inline(always)]
unsafe fn f16(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Sixteen bytes of nibbles as 32 bytes: low nibbles first, then high nibbles.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let v = _mm_loadu_si128(p as *const __m128i);
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(v, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    _mm256_set_m128i(hi, lo)
}

/// Byte `i` is 0x10 where bit `i` of the little-endian u32 at `p` is set, else 0.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    let bits = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The common loop of the unsigned formats: `weights(block)` gives a block's values as
/// bytes 0..32, its scale `d` and the offset `o` each value has subtracted (value
/// `d * q - o`); per row, `sum_b d * dx * (q · qx) - o * sx`. Even and odd blocks go to
/// two accumulators (so consecutive blocks do not wait on each other), summed at the end.
#[inline(always)]
unsafe fn unsigned<const R: usize>(
    w: &[u8],
    bytes: usize,
    x: &[Q8Row],
    out: &mut [f32],
    weights: impl Fn(*const u8) -> (__m256i, f32, f32),
) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); R]; 2];
    let mut offsets = [[0.0f32; R]; 2];
    for b in 0..w.len() / bytes {
        let (wv, d, o) = weights(w.as_ptr().add(b * bytes));
        let (acc, offsets) = (&mut acc[b % 2], &mut offsets[b % 2]);
        for r in 0..R {
            let x = &x[r];
            let xv = _mm256_loadu_si256(x.q.as_ptr().add(b * QK8) as *const __m256i);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones);
            let scale = _mm256_set1_ps(d * *x.d.get_unchecked(b));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[r]);
            offsets[r] += o * *x.s.get_unchecked(b);
        }
    }
    for r in 0..R {
        out[r] = hsum(_mm256_add_ps(acc[0][r], acc[1][r])) - (offsets[0][r] + offsets[1][r]);
    }
}

#[inline(always)]
unsafe fn q4_0<const R: usize>(w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    unsigned::<R>(w, 18, x, out, |p| {
        let d = f16(p);
        (nibbles(p.add(2)), d, 8.0 * d)
    })
}

#[inline(always)]
unsafe fn q4_1<const R: usize>(w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    unsigned::<R>(w, 20, x, out, |p| {
        (nibbles(p.add(4)), f16(p), -f16(p.add(2)))
    })
}

#[inline(always)]
unsafe fn q5_0<const R: usize>(w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    unsigned::<R>(w, 22, x, out, |p| {
        let d = f16(p);
        let q = _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2)));
        (q, d, 16.0 * d)
    })
}

#[inline(always)]
unsafe fn q5_1<const R: usize>(w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    unsigned::<R>(w, 24, x, out, |p| {
        let q = _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4)));
        (q, f16(p), -f16(p.add(2)))
    })
}

/// Q8_0: signed weights, multiplied as `|w| * (x * sign(w))` so `vpmaddubsw` applies.
#[inline(always)]
unsafe fn q8_0<const R: usize>(w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); R]; 2];
    for b in 0..w.len() / 34 {
        let acc = &mut acc[b % 2];
        let p = w.as_ptr().add(b * 34);
        let d = f16(p);
        let wv = _mm256_loadu_si256(p.add(2) as *const __m256i);
        let magnitude = _mm256_sign_epi8(wv, wv);
        for r in 0..R {
            let x = &x[r];
            let xv = _mm256_loadu_si256(x.q.as_ptr().add(b * QK8) as *const __m256i);
            let signed = _mm256_sign_epi8(xv, wv);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed), ones);
            let scale = _mm256_set1_ps(d * *x.d.get_unchecked(b));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum(_mm256_add_ps(acc[0][r], acc[1][r]));
    }
}

/// Q4_K and Q5_K: per 32 values (one activation block) a 6-bit scale `sc` and minimum `m`;
/// per row, `sum d * dx * sc * (q · qx) - dmin * m * sx` over the sub-blocks.
#[inline(always)]
unsafe fn q45k<const R: usize, const FIVE: bool>(w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    let bytes = if FIVE { 176 } else { 144 };
    let (mask, one) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(1));
    let mut acc = [_mm256_setzero_ps(); R];
    let mut offsets = [0f32; R];
    for b in 0..w.len() / bytes {
        let block = &w[b * bytes..(b + 1) * bytes];
        let (d, dmin) = (f16(block.as_ptr()), f16(block.as_ptr().add(2)));
        let scales = &block[4..16];
        let qs = block.as_ptr().add(if FIVE { 48 } else { 16 });
        let high = if FIVE {
            _mm256_loadu_si256(block.as_ptr().add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        for chunk in 0..4 {
            let v = _mm256_loadu_si256(qs.add(32 * chunk) as *const __m256i);
            for half in 0..2 {
                let sub = 2 * chunk + half;
                let (sc, m) = scale_min_k4(sub, scales);
                let shifted = if half == 0 {
                    v
                } else {
                    _mm256_srli_epi16(v, 4)
                };
                let mut q = _mm256_and_si256(shifted, mask);
                if FIVE {
                    // Bit `sub` of each byte of `high` is its value's fifth bit.
                    let bit = _mm256_srl_epi16(high, _mm_cvtsi32_si128(sub as i32));
                    q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(bit, one), 4));
                }
                let scale = _mm256_set1_epi16(i16::from(sc));
                let a = b * 8 + sub;
                for r in 0..R {
                    let x = &x[r];
                    let xv = _mm256_loadu_si256(x.q.as_ptr().add(a * QK8) as *const __m256i);
                    let sum = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), scale);
                    let dx = _mm256_set1_ps(d * *x.d.get_unchecked(a));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), dx, acc[r]);
                    offsets[r] += dmin * f32::from(m) * *x.s.get_unchecked(a);
                }
            }
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]) - offsets[r];
    }
}

#[inline(always)]
unsafe fn q4k<const R: usize>(w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    q45k::<R, false>(w, x, out)
}

#[inline(always)]
unsafe fn q5k<const R: usize>(w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    q45k::<R, true>(w, x, out)
}

/// Q6_K: values `q - 32` with `q` of six bits, a signed scale per 16; `q · qx - 32 Σ qx`
/// per pair in `i16` (at most 2 · 63 · 127 and 2 · 32 · 127), the two scales of each 32
/// values applied by `vpmaddwd`.
#[inline(always)]
unsafe fn q6k<const R: usize>(w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    let (mask, three, bias) = (
        _mm256_set1_epi8(0x0f),
        _mm256_set1_epi8(3),
        _mm256_set1_epi8(32),
    );
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..w.len() / 210 {
        let block = &w[b * 210..(b + 1) * 210];
        let p = block.as_ptr();
        let d = f16(p.add(208));
        let sc = &block[192..208];
        for n in 0..2 {
            let ql0 = _mm256_loadu_si256(p.add(64 * n) as *const __m256i);
            let ql1 = _mm256_loadu_si256(p.add(64 * n + 32) as *const __m256i);
            let h = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
            let two_bits = |shift: i32| {
                let bits = _mm256_srl_epi16(h, _mm_cvtsi32_si128(shift));
                _mm256_slli_epi16(_mm256_and_si256(bits, three), 4)
            };
            // Values 128n + 32i + l for l in 0..32, i = 0..4.
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, mask), two_bits(0)),
                _mm256_or_si256(_mm256_and_si256(ql1, mask), two_bits(2)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask),
                    two_bits(4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask),
                    two_bits(6),
                ),
            ];
            for (i, q) in q.into_iter().enumerate() {
                let s = 8 * n + 2 * i;
                let scale = _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(sc[s + 1] as i8)),
                    _mm_set1_epi16(i16::from(sc[s] as i8)),
                );
                let a = b * 8 + 4 * n + i;
                for r in 0..R {
                    let x = &x[r];
                    let xv = _mm256_loadu_si256(x.q.as_ptr().add(a * QK8) as *const __m256i);
                    let pairs = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(q, xv),
                        _mm256_maddubs_epi16(bias, xv),
                    );
                    let sum = _mm256_madd_epi16(pairs, scale);
                    let dx = _mm256_set1_ps(d * *x.d.get_unchecked(a));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), dx, acc[r]);
                }
            }
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
}

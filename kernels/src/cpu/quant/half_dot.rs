//! Dot products of 16-bit float weights (bf16 or IEEE f16) with f32 activations, widened in
//! registers: with AVX2/FMA/F16C where the CPU has them, else in plain Rust. Eight f32
//! lanes in a fixed order, so a row's result does not depend on the batch.

use half::{bf16, f16};

/// Which 16-bit float a weight row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
}

/// `w · x` for one row of 16-bit weights (as raw bits) and one f32 row of the same length.
pub fn dot(kind: Half, w: &[u16], x: &[f32], simd: bool) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is set only where `super::avx2::available()` said yes; lengths are
        // equal (checked by the caller's shapes).
        return unsafe { avx2::dot(kind, w, x) };
    }
    let _ = simd;
    let widen = |b: u16| match kind {
        Half::Bf16 => bf16::from_bits(b).to_f32(),
        Half::F16 => f16::from_bits(b).to_f32(),
    };
    let mut lanes = [0.0f32; 8];
    let chunks = w.len() / 8 * 8;
    for (w, x) in w[..chunks].chunks_exact(8).zip(x[..chunks].chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] = widen(w[l]).mul_add(x[l], lanes[l]);
        }
    }
    let mut sum = tree(lanes);
    for (&w, &x) in w[chunks..].iter().zip(&x[chunks..]) {
        sum = widen(w).mul_add(x, sum);
    }
    sum
}

/// The lanes summed in the order the AVX2 reduction uses.
fn tree(l: [f32; 8]) -> f32 {
    let s = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let s = [s[0] + s[2], s[1] + s[3]];
    s[0] + s[1]
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Half;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(kind: Half, w: &[u16], x: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let chunks = w.len() / 8 * 8;
        for i in (0..chunks).step_by(8) {
            let bits = _mm_loadu_si128(w.as_ptr().add(i) as *const __m128i);
            let wv = match kind {
                Half::Bf16 => {
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16))
                }
                Half::F16 => _mm256_cvtph_ps(bits),
            };
            acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i)), acc);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        let mut sum = super::tree(lanes);
        for i in chunks..w.len() {
            let wf = match kind {
                Half::Bf16 => half::bf16::from_bits(w[i]).to_f32(),
                Half::F16 => half::f16::from_bits(w[i]).to_f32(),
            };
            sum = wf.mul_add(x[i], sum);
        }
        sum
    }
}

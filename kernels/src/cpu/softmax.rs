//! The exponentials of attention's softmax, eight at a time: `exp(s - max)` for a row of
//! scores by one fixed polynomial (Cephes' `expf`: a degree-6 polynomial after a reduction
//! by `ln 2`, within two units in the last place), the same in a SIMD lane as in the
//! scalar code that takes a row's last values, so every score's weight is the same
//! function of its score wherever it is computed.

/// `ln 2` split in two so `n * LN2_HI` is exact.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this the exponential is under `f32`'s smallest normal number; inputs are clamped.
const LOWEST: f32 = -87.336_55;
/// Cephes' coefficients, highest degree first.
const POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `exp(x)` for `x <= 0` (larger `x` is not a softmax input), as [`exp_avx2`] computes it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn exp_scalar(x: f32) -> f32 {
    let x = x.max(LOWEST);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let p = POLY[1..].iter().fold(POLY[0], |p, &c| p.mul_add(r, c));
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// [`exp_scalar`] in eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let x = _mm256_max_ps(x, _mm256_set1_ps(LOWEST));
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(POLY[0]);
    for &c in &POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(y, _mm256_castsi256_ps(bits))
}

/// Replaces each score `s` of `scores` by `exp(s - max)` (`max` the row's largest) and
/// returns their sum, in order: the portable softmax numerator of the attention kernels.
pub(crate) fn exp_row(scores: &mut [f32]) -> f32 {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        total += *s;
    }
    total
}

/// Replaces each score `s` of `scores` by `exp(s - max)` (`max` the row's largest) and
/// returns their sum: eight lanes summed in order, the lanes added in a fixed tree, then
/// the last values one by one; so the result depends on the row alone.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_row_avx2(scores: &mut [f32]) -> f32 {
    use std::arch::x86_64::*;
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let whole = scores.len() / 8 * 8;
    let m = _mm256_set1_ps(max);
    let mut lanes = _mm256_setzero_ps();
    for chunk in scores[..whole].chunks_exact_mut(8) {
        let e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(chunk.as_ptr()), m));
        _mm256_storeu_ps(chunk.as_mut_ptr(), e);
        lanes = _mm256_add_ps(lanes, e);
    }
    let four = _mm_add_ps(
        _mm256_castps256_ps128(lanes),
        _mm256_extractf128_ps(lanes, 1),
    );
    let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    let mut total = _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
    for s in &mut scores[whole..] {
        *s = exp_scalar(*s - max);
        total += *s;
    }
    total
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn the_lanes_and_the_scalar_give_exp_within_two_ulp() {
        if !crate::cpu::quant::Simd::detected().has_avx2() {
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut xs: Vec<f32> = (0..4096).map(|_| rng.random_range(-90.0f32..0.0)).collect();
        xs.extend([
            0.0, -0.0, -1e-30, -0.5, -1.0, -87.0, -87.3, -87.4, -100.0, -1e30,
        ]);
        xs.resize(xs.len().next_multiple_of(8), -3.25);
        for chunk in xs.chunks(8) {
            let mut lanes = [f32::NAN; 8];
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            unsafe {
                use std::arch::x86_64::*;
                _mm256_storeu_ps(
                    lanes.as_mut_ptr(),
                    exp_avx2(_mm256_loadu_ps(chunk.as_ptr())),
                );
            }
            for (&x, &got) in chunk.iter().zip(&lanes) {
                assert_eq!(
                    got.to_bits(),
                    exp_scalar(x).to_bits(),
                    "exp({x}): lane and scalar"
                );
                let want = f64::from(x).exp();
                if want < f64::from(f32::MIN_POSITIVE) {
                    assert!(
                        f64::from(got) <= 2.0 * f64::from(f32::MIN_POSITIVE),
                        "exp({x}) = {got}"
                    );
                    continue;
                }
                let ulp = f64::from(f32::EPSILON) * want;
                assert!(
                    (f64::from(got) - want).abs() <= 2.0 * ulp,
                    "exp({x}) = {got}, not {want}"
                );
            }
        }
    }

    #[test]
    fn a_row_sums_its_exponentials() {
        if !crate::cpu::quant::Simd::detected().has_avx2() {
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        for len in [1usize, 7, 8, 9, 63, 200] {
            let row: Vec<f32> = (0..len).map(|_| rng.random_range(-20.0f32..20.0)).collect();
            let mut got = row.clone();
            // SAFETY: as above.
            let total = unsafe { exp_row_avx2(&mut got) };
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let want: Vec<f64> = row.iter().map(|&s| f64::from(s - max).exp()).collect();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (f64::from(*g) - w).abs() <= 3e-7 * w.max(1e-30),
                    "{g} vs {w}"
                );
            }
            let sum: f64 = want.iter().sum();
            assert!(
                (f64::from(total) - sum).abs() <= 1e-6 * sum,
                "len {len}: {total} vs {sum}"
            );
        }
    }
}

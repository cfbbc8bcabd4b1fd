//! The element types a CPU KV cache stores: `f32`, or `bf16` (half the bytes and the memory
//! traffic; f32's range, so no key or value overflows; rounded to nearest even when
//! written). The attention kernels read either, widening to f32 as they load.

use half::bf16;

/// An element of a CPU KV cache.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// The element nearest `x`.
    fn from_f32(x: f32) -> Self;

    /// The element's value.
    fn to_f32(self) -> f32;

    /// Eight elements from `p` as f32 lanes.
    ///
    /// # Safety
    /// `p` must point at eight readable elements, and the CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl KvElem for f32 {
    #[inline(always)]
    fn from_f32(x: f32) -> f32 {
        x
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl KvElem for bf16 {
    #[inline(always)]
    fn from_f32(x: f32) -> bf16 {
        bf16::from_f32(x)
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }

    /// A bf16 is the top half of the f32 it widens to: zero-extend, shift left 16.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let halves = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16))
    }
}

#[cfg(test)]
mod tests {
    use super::KvElem;
    use half::bf16;

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_f32_s_range() {
        // 1 + 2^-8 lies halfway between 1 and the next bf16 (1 + 2^-7): even is 1.
        assert_eq!(<bf16 as KvElem>::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        assert_eq!(
            <bf16 as KvElem>::from_f32(1.0 + 3.0 / 256.0).to_f32(),
            1.0 + 4.0 / 256.0
        );
        let big = <bf16 as KvElem>::from_f32(1.0e30).to_f32();
        assert!(big.is_finite() && (big / 1.0e30 - 1.0).abs() < 0.01);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn eight_lanes_widen_as_one_element_does() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let values: Vec<bf16> = [
            -3.5f32, 0.0, -0.0, 1.0e-30, 65504.0, 1.0e30, 0.1, -7.25, 2.0,
        ]
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
        let mut got = [f32::NAN; 8];
        // SAFETY: the CPU has AVX2 (checked above); eight elements are readable from 1.
        unsafe {
            let lanes = <bf16 as KvElem>::load8(values[1..].as_ptr());
            std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr(), lanes);
        }
        for (got, want) in got.iter().zip(&values[1..]) {
            assert_eq!(got.to_bits(), want.to_f32().to_bits());
        }
    }
}

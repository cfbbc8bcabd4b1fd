//! Weights kept as they are stored (ggml's block quantizations, bf16, f16): the block
//! formats, activations quantized per block, and the dot products that read the blocks
//! directly, with SIMD chosen at run time by CPU feature detection.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_x8;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_x16;
mod format;
mod half_dot;
mod interleaved;
mod portable;
mod q8;

pub use format::BlockFormat;
pub use half_dot::Half;
pub use interleaved::{
    dequantize_row as interleaved_row, interleave, interleaves, woven_row_bytes, LANES, WIDE_LANES,
};
pub use q8::{q8_0_blocks, Q8Row, Q8Rows, QK8};

use std::sync::OnceLock;

/// The instruction set the dot products use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simd {
    /// AVX-512 (F, BW, VL, DQ) with VNNI, F16C and FMA (x86-64).
    Avx512Vnni,
    /// AVX2 with FMA and F16C (x86-64).
    Avx2,
    /// Plain Rust, on any CPU.
    Portable,
}

impl Simd {
    /// What this CPU supports, detected once.
    pub fn detected() -> Simd {
        static DETECTED: OnceLock<Simd> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            if avx512::available() {
                return Simd::Avx512Vnni;
            }
            #[cfg(target_arch = "x86_64")]
            if avx2::available() {
                return Simd::Avx2;
            }
            Simd::Portable
        })
    }

    /// Whether the CPU behind `self` runs the AVX2 kernels.
    pub fn has_avx2(self) -> bool {
        self != Simd::Portable && Simd::detected() != Simd::Portable
    }

    /// The name logs and benchmarks print.
    pub fn name(self) -> &'static str {
        match self {
            Simd::Avx512Vnni => "avx512-vnni",
            Simd::Avx2 => "avx2",
            Simd::Portable => "portable",
        }
    }
}

/// `out[j * n + r] = w[j] · x[r]` for every row `j` of `w` (whole rows of `format`
/// blocks, `x[0]`'s length each) and every row `r` of the `n` rows of `x`, with `simd`
/// (which must be this CPU's or portable).
pub fn block_rows(simd: Simd, format: BlockFormat, w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    let Some(first) = x.first() else { return };
    let values = first.q.len();
    let row_bytes = format.row_bytes(values).unwrap_or(0);
    assert!(
        row_bytes > 0
            && w.len().is_multiple_of(row_bytes)
            && x.iter().all(|x| x.q.len() == values
                && x.d.len() == values / QK8
                && x.s.len() == values / QK8)
            && out.len() == w.len() / row_bytes * x.len(),
        "block_rows: {} bytes of {} rows against {} activation rows of {values}, {} outputs",
        w.len(),
        format.name(),
        x.len(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if simd == Simd::Avx512Vnni && avx512::handles(format) {
        assert!(
            Simd::detected() == Simd::Avx512Vnni,
            "block_rows: this CPU lacks AVX-512 VNNI"
        );
        // SAFETY: the CPU has the features (checked), the format is one the kernel
        // handles, `w` is whole rows and every row of `x` holds one row's values.
        unsafe { avx512::rows(format, w, row_bytes, x, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Portable {
        assert!(simd.has_avx2(), "block_rows: this CPU lacks AVX2");
        // SAFETY: as above, for AVX2.
        unsafe { avx2::rows(format, w, row_bytes, x, out) };
        return;
    }
    let _ = simd;
    portable::rows(format, w, row_bytes, x, out);
}

/// `dst[r * stride + i] = w[i] · x[r]` for every row `i` of `w` (whole groups of `lanes`
/// ([`LANES`] or [`WIDE_LANES`]) rows of `format` in the [`interleave`]d layout, `x[0]`'s
/// length each) and every row `r` of `x`, with `simd` (which must be this CPU's or
/// portable). The result is the same, bit for bit, with every `simd`.
///
/// # Safety
/// `dst[r * stride + i]` must be writable for every such `r` and `i`, and no other thread
/// may access those elements during the call.
pub unsafe fn interleaved_rows(
    simd: Simd,
    format: BlockFormat,
    lanes: usize,
    w: &[u8],
    x: &[Q8Row],
    dst: *mut f32,
    stride: usize,
) {
    let Some(first) = x.first() else { return };
    let values = first.q.len();
    let row_bytes = woven_row_bytes(format, values).unwrap_or(0);
    assert!(
        interleaves(format)
            && (lanes == LANES || lanes == WIDE_LANES)
            && row_bytes > 0
            && w.len().is_multiple_of(lanes * row_bytes)
            && stride >= w.len() / row_bytes
            && x.iter().all(|x| x.q.len() == values
                && x.d.len() == values / QK8
                && x.s.len() == values / QK8),
        "interleaved_rows: {} bytes of {} rows in groups of {lanes} against {} activation \
         rows of {values}",
        w.len(),
        format.name(),
        x.len(),
    );
    #[cfg(target_arch = "x86_64")]
    if simd == Simd::Avx512Vnni && lanes == WIDE_LANES {
        assert!(
            Simd::detected() == Simd::Avx512Vnni,
            "interleaved_rows: this CPU lacks AVX-512 VNNI"
        );
        // SAFETY: the CPU has the features (checked), `w` is whole groups of rows and every
        // row of `x` holds one row's values (checked); `dst` is the caller's.
        unsafe { avx512_x16::rows(format, w, row_bytes, x, dst, stride) };
        return;
    }
    // The eight-lane AVX2 kernel has Q4_0, Q4_1 and Q8_0 (the others are woven for VNNI).
    let eight = matches!(
        format,
        BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q8_0
    );
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Portable && eight {
        assert!(simd.has_avx2(), "interleaved_rows: this CPU lacks AVX2");
        // SAFETY: as above, for AVX2.
        unsafe { avx2_x8::rows(format, lanes, w, row_bytes, x, dst, stride) };
        return;
    }
    let _ = (simd, eight);
    // SAFETY: as above.
    unsafe { interleaved::rows(format, lanes, w, row_bytes, x, dst, stride) };
}

/// Runs `group(row, first, xs, outs)` for every row of `w` (rows of `row_bytes`) and every
/// group `xs` of up to four rows of `x` (from row `first`), `outs` being that row's and
/// group's part of `out` (`[w rows, x.len()]`).
#[inline(always)]
fn for_groups(
    w: &[u8],
    row_bytes: usize,
    x: &[Q8Row],
    out: &mut [f32],
    mut group: impl FnMut(&[u8], usize, &[Q8Row], &mut [f32]),
) {
    let n = x.len();
    for (row, out) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
        for (g, (x, out)) in x.chunks(4).zip(out.chunks_mut(4)).enumerate() {
            group(row, 4 * g, x, out);
        }
    }
}

/// `w · x` for one row of 16-bit float weights and an f32 row, with `simd`.
pub fn half_dot(simd: Simd, kind: Half, w: &[u16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "half_dot: lengths differ");
    half_dot::dot(kind, w, x, simd.has_avx2())
}

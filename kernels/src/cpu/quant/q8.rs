//! Activations quantized per 32 values to `i8` with one f32 scale (ggml's Q8_0/Q8_1), the
//! form every block dot product reads its input in.

use half::f16;
use rayon::prelude::*;

/// Values per activation block.
pub const QK8: usize = 32;

/// Rows of activations quantized per 32 values: value `i` of a row is about
/// `d[i / 32] * q[i]`; `s[b]` is `d[b]` times the sum of block `b`'s integers.
pub struct Q8Rows {
    /// Values per row, a multiple of 32.
    pub cols: usize,
    /// The integers, `[rows, cols]`.
    pub q: Vec<i8>,
    /// Each block's scale, `[rows, cols / 32]`.
    pub d: Vec<f32>,
    /// Each block's scale times the sum of its integers, `[rows, cols / 32]`.
    pub s: Vec<f32>,
}

impl Q8Rows {
    /// Quantizes `x` (`[rows, cols]`, `cols` a multiple of 32): each block's scale is its
    /// largest magnitude over 127, each value rounded to the nearest integer (halves away
    /// from zero). A row's result depends on that row alone.
    pub fn quantize(x: &[f32], cols: usize) -> Q8Rows {
        assert!(
            cols > 0 && cols.is_multiple_of(QK8) && x.len().is_multiple_of(cols),
            "Q8Rows: {} values are not rows of {cols}, a multiple of {QK8}",
            x.len()
        );
        let blocks = x.len() / QK8;
        let mut rows = Q8Rows {
            cols,
            q: vec![0; x.len()],
            d: vec![0.0; blocks],
            s: vec![0.0; blocks],
        };
        let work = x
            .par_chunks(QK8)
            .zip(rows.q.par_chunks_mut(QK8))
            .zip(rows.d.par_iter_mut().zip(rows.s.par_iter_mut()));
        work.with_min_len(256)
            .for_each(|((x, q), (d, s))| quantize_block(x, q, d, s));
        rows
    }

    /// Row `r`'s integers, scales and scaled sums.
    pub fn row(&self, r: usize) -> Q8Row<'_> {
        let (k, nb) = (self.cols, self.cols / QK8);
        Q8Row {
            q: &self.q[r * k..(r + 1) * k],
            d: &self.d[r * nb..(r + 1) * nb],
            s: &self.s[r * nb..(r + 1) * nb],
        }
    }
}

/// One row of [`Q8Rows`].
#[derive(Clone, Copy)]
pub struct Q8Row<'a> {
    /// The integers.
    pub q: &'a [i8],
    /// Each block's scale.
    pub d: &'a [f32],
    /// Each block's scale times the sum of its integers.
    pub s: &'a [f32],
}

/// `v.round()` (halves away from zero) for `|v|` below 2^31, without the library call
/// `f32::round` compiles to on baseline x86-64: the truncation is exact, and so is the
/// fraction left.
#[inline(always)]
fn round_half_away(v: f32) -> i32 {
    let t = v as i32;
    let fraction = v - t as f32;
    t + i32::from(fraction >= 0.5) - i32::from(fraction <= -0.5)
}

fn quantize_block(x: &[f32], q: &mut [i8], d: &mut f32, s: &mut f32) {
    *d = round_block(x, q);
    let sum: i32 = q.iter().map(|&q| i32::from(q)).sum();
    *s = *d * sum as f32;
}

/// Rounds one block of `x` into `q` as ggml's reference quantizer does and returns its
/// scale: the largest magnitude over 127; each value times the scale's inverse, rounded
/// (halves away from zero).
fn round_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = round_half_away(v * inv) as i8;
    }
    d
}

/// Weights (`cols` a multiple of 32 per row, so whole blocks) quantized to ggml's Q8_0
/// blocks, byte for byte as `quantize_row_q8_0_ref` makes them: each block's scale as f16
/// (rounded to nearest, ties to even), then its 32 integers rounded from the f32 scale.
pub fn q8_0_blocks(values: &[f32]) -> Vec<u8> {
    assert!(
        values.len().is_multiple_of(QK8),
        "q8_0_blocks: {} values are not whole blocks of {QK8}",
        values.len()
    );
    const BYTES: usize = 2 + QK8;
    let mut out = vec![0u8; values.len() / QK8 * BYTES];
    out.par_chunks_mut(BYTES)
        .zip(values.par_chunks(QK8))
        .with_min_len(256)
        .for_each(|(block, x)| {
            let mut q = [0i8; QK8];
            let d = round_block(x, &mut q);
            block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
            block[2..].iter_mut().zip(q).for_each(|(b, q)| *b = q as u8);
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_f32_rounds() {
        let mut values = vec![0.5f32, -0.5, 1.5, -1.5, 2.5, 126.5, -126.5, 127.0, -127.0];
        values.extend([0.49999997f32, -0.49999997, 0.50000006, 1.4999999, 0.0, -0.0]);
        values.extend((0..20_000).map(|i| (i as f32 - 10_000.0) * 0.012_7));
        for v in values {
            assert_eq!(round_half_away(v), v.round() as i32, "{v}");
        }
    }

    #[test]
    fn blocks_round_to_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 23) as f32 - 11.3) * 0.17)
            .collect();
        let r = Q8Rows::quantize(&x, 96);
        for (i, &v) in x.iter().enumerate() {
            let d = r.d[i / 32];
            assert!((d * f32::from(r.q[i]) - v).abs() <= 0.5 * d * 1.0001, "{i}");
        }
        let sum: i32 = r.q[32..64].iter().map(|&q| i32::from(q)).sum();
        assert_eq!(r.s[1], r.d[1] * sum as f32);
        let zeros = Q8Rows::quantize(&[0.0; 32], 32);
        assert_eq!((zeros.d[0], zeros.s[0]), (0.0, 0.0));
    }
}

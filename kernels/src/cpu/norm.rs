//! RMSNorm, alone and fused with the residual add.

use rayon::prelude::*;

/// Rows at or above which the norms run on several threads.
const PARALLEL_ROWS: usize = 16;

fn normalize(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let r = (1.0 / (ms + eps as f64).sqrt()) as f32;
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * r * g;
    }
}

/// `out[r] = x[r] / rms(x[r]) * w` for each row of width `w.len()`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    assert!(
        x.len().is_multiple_of(h) && out.len() == x.len(),
        "rms_norm: shapes"
    );
    if x.len() / h >= PARALLEL_ROWS {
        out.par_chunks_mut(h)
            .zip(x.par_chunks(h))
            .for_each(|(o, x)| normalize(x, w, eps, o));
    } else {
        out.chunks_mut(h)
            .zip(x.chunks(h))
            .for_each(|(o, x)| normalize(x, w, eps, o));
    }
}

/// `residual += delta`, then `out = rms_norm(residual) * w`, row by row.
pub fn add_rms_norm(residual: &mut [f32], delta: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    assert!(
        residual.len().is_multiple_of(h)
            && delta.len() == residual.len()
            && out.len() == residual.len(),
        "add_rms_norm: shapes"
    );
    let row = |(res, (d, o)): (&mut [f32], (&[f32], &mut [f32]))| {
        res.iter_mut().zip(d).for_each(|(r, d)| *r += d);
        normalize(res, w, eps, o);
    };
    if residual.len() / h >= PARALLEL_ROWS {
        residual
            .par_chunks_mut(h)
            .zip(delta.par_chunks(h).zip(out.par_chunks_mut(h)))
            .for_each(row);
    } else {
        residual
            .chunks_mut(h)
            .zip(delta.chunks(h).zip(out.chunks_mut(h)))
            .for_each(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn matches_float64_and_fuses_the_residual() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (rows, h) = (20, 96);
        let x: Vec<f32> = (0..rows * h).map(|_| rng.random_range(-2.0..2.0)).collect();
        let d: Vec<f32> = (0..rows * h).map(|_| rng.random_range(-2.0..2.0)).collect();
        let w: Vec<f32> = (0..h).map(|_| rng.random_range(0.5..1.5)).collect();
        let mut res = x.clone();
        let mut out = vec![f32::NAN; rows * h];
        add_rms_norm(&mut res, &d, &w, 1e-6, &mut out);
        for r in 0..rows {
            let s: Vec<f64> = (0..h)
                .map(|i| x[r * h + i] as f64 + d[r * h + i] as f64)
                .collect();
            let ms = s.iter().map(|v| v * v).sum::<f64>() / h as f64;
            for i in 0..h {
                assert!((res[r * h + i] as f64 - s[i]).abs() < 1e-6);
                let want = s[i] / (ms + 1e-6).sqrt() * w[i] as f64;
                assert!(
                    (out[r * h + i] as f64 - want).abs() < 1e-5,
                    "row {r} col {i}"
                );
            }
        }
        let mut plain = vec![f32::NAN; rows * h];
        rms_norm(&res, &w, 1e-6, &mut plain);
        assert_eq!(plain, out);
    }
}

//! Linear layers: `out = x · wᵀ` through the `gemm` crate.
//!
//! `gemm` sums a row of a one-row product in a different order from the same row inside
//! a product of two or more rows, so a row's result would change with the batch around
//! it. To stay batch-invariant every row is computed as its own one-row product. The
//! weight is cut into column panels sized for the cache by `k` alone; threads take panels
//! and run every row through a panel while it is cache-resident, so the weight is read
//! from memory once per call, whatever the number of rows.

use gemm::{gemm, Parallelism};
use rayon::prelude::*;

/// Bytes of weight a panel aims to hold (fits a core's L2 cache).
const PANEL_BYTES: usize = 256 * 1024;

/// `out[r, :] = x[r, :] · wᵀ` for every row `r`; `x` is `[rows, k]`, `w` is `[n, k]` and
/// `out` is `[rows, n]`, all row-major.
pub fn linear(x: &[f32], k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    assert!(
        k > 0 && x.len().is_multiple_of(k),
        "linear: x is not [rows, {k}]"
    );
    let rows = x.len() / k;
    assert_eq!(w.len(), n * k, "linear: w is not [{n}, {k}]");
    assert_eq!(out.len(), rows * n, "linear: out is not [{rows}, {n}]");
    let panel = (PANEL_BYTES / (k * 4)).clamp(8, n.max(8)) / 8 * 8;
    let dst = SendPtr(out.as_mut_ptr());
    (0..n.div_ceil(panel)).into_par_iter().for_each(|p| {
        let c0 = p * panel;
        let cols = panel.min(n - c0);
        for r in 0..rows {
            // SAFETY: the panel writes columns c0..c0+cols of row r of `out`, which lie in
            // bounds (checked above) and which no other panel writes; `x` and `w` are read
            // within their checked extents with the strides given.
            unsafe {
                gemm(
                    1,
                    cols,
                    k,
                    dst.at(r * n + c0),
                    1,
                    n as isize,
                    false,
                    x.as_ptr().add(r * k),
                    1,
                    k as isize,
                    w.as_ptr().add(c0 * k),
                    k as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
            }
        }
    });
}

/// A pointer into an output that threads write disjoint parts of.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);

impl SendPtr {
    /// The pointer `i` elements on; the caller keeps it within the allocation.
    pub(crate) unsafe fn at(self, i: usize) -> *mut f32 {
        self.0.add(i)
    }
}
// SAFETY: used only to write disjoint column panels from different threads.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    #[test]
    fn matches_a_float64_product() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for (rows, k, n) in [(1, 7, 5), (3, 576, 192), (5, 1536, 576), (2, 64, 1000)] {
            let x = random(&mut rng, rows * k);
            let w = random(&mut rng, n * k);
            let mut out = vec![f32::NAN; rows * n];
            linear(&x, k, &w, n, &mut out);
            for r in 0..rows {
                for c in 0..n {
                    let want: f64 = (0..k)
                        .map(|i| x[r * k + i] as f64 * w[c * k + i] as f64)
                        .sum();
                    let got = out[r * n + c] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (k as f64).sqrt(),
                        "{got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_row_is_bit_identical_alone_and_in_any_batch() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for (k, n) in [(576, 1536), (1536, 576), (64, 300)] {
            let w = random(&mut rng, n * k);
            let row = random(&mut rng, k);
            let mut alone = vec![f32::NAN; n];
            linear(&row, k, &w, n, &mut alone);
            for (batch, at) in [(2, 1), (9, 0), (37, 36), (64, 17)] {
                let mut x = random(&mut rng, batch * k);
                x[at * k..(at + 1) * k].copy_from_slice(&row);
                let mut out = vec![f32::NAN; batch * n];
                linear(&x, k, &w, n, &mut out);
                assert_eq!(
                    &out[at * n..(at + 1) * n],
                    &alone[..],
                    "k {k} n {n} batch {batch}"
                );
            }
        }
    }
}

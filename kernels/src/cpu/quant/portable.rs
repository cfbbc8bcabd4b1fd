//! Block dot products in plain Rust for every format: each block unpacked once, then
//! integer sums per 16 values against each activation row.

use super::format::{BlockFormat, Unpacked};
use super::q8::{Q8Row, QK8};

/// `out[j * n + r] = w[j] · x[r]` for every row `j` of `w` (rows of `row_bytes`) and
/// every row `r` of the `n` rows of `x`.
pub fn rows(format: BlockFormat, w: &[u8], row_bytes: usize, x: &[Q8Row], out: &mut [f32]) {
    super::for_groups(w, row_bytes, x, out, |w, _, x, out| dot(format, w, x, out));
}

/// `out[r] = w · x[r]` for one weight row `w` (whole blocks of `format`) and the rows `x`.
fn dot(format: BlockFormat, w: &[u8], x: &[Q8Row], out: &mut [f32]) {
    let (bytes, subs) = (format.block_bytes(), format.block_elems() / QK8);
    let mut u = Unpacked::new();
    out.fill(0.0);
    for (b, block) in w.chunks_exact(bytes).enumerate() {
        format.unpack(block, &mut u);
        for sub in 0..subs {
            let a = b * subs + sub;
            let wq = &u.q[sub * QK8..(sub + 1) * QK8];
            for (acc, x) in out.iter_mut().zip(x) {
                let xq = &x.q[a * QK8..(a + 1) * QK8];
                let half = |h: usize| -> f32 {
                    let (w, x) = (&wq[h * 16..h * 16 + 16], &xq[h * 16..h * 16 + 16]);
                    let sum: i32 = w
                        .iter()
                        .zip(x)
                        .map(|(&w, &x)| i32::from(w) * i32::from(x))
                        .sum();
                    sum as f32
                };
                let scaled = u.scale[2 * sub] * half(0) + u.scale[2 * sub + 1] * half(1);
                *acc += x.d[a] * scaled - u.offset[sub] * x.s[a];
            }
        }
    }
}

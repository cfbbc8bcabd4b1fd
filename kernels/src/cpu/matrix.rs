//! A weight matrix `[rows, cols]` kept in the form it was stored in: float32, bf16, f16 or
//! one of ggml's block quantizations, possibly stacked from parts of different forms (a
//! fused q/k/v of a Q4_K_M file mixes Q4_K and Q6_K). Its product reads that form directly.

use super::linear::{linear, SendPtr};
use super::quant::{
    block_rows, half_dot, interleave, interleaved_row, interleaved_rows, interleaves, q8_0_blocks,
    woven_row_bytes, BlockFormat, Half, Q8Row, Q8Rows, Simd, LANES, QK8, WIDE_LANES,
};
use rayon::prelude::*;
use std::sync::Arc;

/// How one part's values are stored, row-major.
#[derive(Clone, Debug)]
pub enum Storage {
    /// float32.
    F32(Arc<[f32]>),
    /// 16-bit floats, as their bits.
    Half(Half, Arc<[u16]>),
    /// Whole blocks of `format` per row.
    Blocks(BlockFormat, Arc<[u8]>),
    /// Groups of `lanes` ([`LANES`] or [`WIDE_LANES`]) rows of `format` in the
    /// [`interleave`]d layout.
    Interleaved(BlockFormat, usize, Arc<[u8]>),
}

/// Rows of a matrix stored one way.
#[derive(Clone, Debug)]
struct Part {
    storage: Storage,
    rows: usize,
}

/// Rows of activations a panel runs through its weight rows at a time.
const X_TILE: usize = 16;

/// A `[rows, cols]` weight matrix: parts of rows stacked in order.
#[derive(Clone, Debug)]
pub struct Matrix {
    parts: Vec<Part>,
    rows: usize,
    cols: usize,
}

/// A matrix that cannot be built from what was given.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    #[error("{values} values do not make rows of {cols}")]
    Length { values: usize, cols: usize },
    #[error("rows of {cols} values are not whole {format} blocks of {block}")]
    Blocks {
        format: &'static str,
        cols: usize,
        block: usize,
    },
    #[error("cannot stack matrices of {0} and {1} columns")]
    Columns(usize, usize),
    #[error("nothing to stack")]
    Empty,
}

impl Matrix {
    /// A float32 matrix of `cols` columns.
    pub fn f32(values: Arc<[f32]>, cols: usize) -> Result<Matrix, MatrixError> {
        let rows = whole_rows(values.len(), cols)?;
        Ok(Matrix::one(Storage::F32(values), rows, cols))
    }

    /// A matrix of no rows (a placeholder where no table is held).
    pub fn empty(cols: usize) -> Matrix {
        Matrix::one(Storage::F32(Arc::from(Vec::new())), 0, cols)
    }

    /// A bf16 or f16 matrix of `cols` columns from the values' bits.
    pub fn half(kind: Half, bits: Arc<[u16]>, cols: usize) -> Result<Matrix, MatrixError> {
        let rows = whole_rows(bits.len(), cols)?;
        Ok(Matrix::one(Storage::Half(kind, bits), rows, cols))
    }

    /// A bf16 or f16 matrix of `cols` columns from the values' little-endian bytes.
    pub fn half_bytes(kind: Half, bytes: &[u8], cols: usize) -> Result<Matrix, MatrixError> {
        let bits = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        Matrix::half(kind, bits, cols)
    }

    /// A block-quantized matrix of `cols` columns from its bytes (whole blocks per row).
    /// Q4_0, Q4_1 and Q8_0 rows are interleaved for the products: sixteen at a time where
    /// the CPU has AVX-512 VNNI and their number is a multiple of sixteen, else eight at a
    /// time when it is a multiple of eight; Q5_0, Q5_1 and Q4_K rows sixteen at a time, with
    /// VNNI only.
    pub fn blocks(
        format: BlockFormat,
        bytes: Arc<[u8]>,
        cols: usize,
    ) -> Result<Matrix, MatrixError> {
        let row_bytes = format
            .row_bytes(cols)
            .filter(|&b| b > 0)
            .ok_or(MatrixError::Blocks {
                format: format.name(),
                cols,
                block: format.block_elems(),
            })?;
        let rows = whole_rows(bytes.len(), row_bytes)?;
        let wide = Simd::detected() == Simd::Avx512Vnni && rows.is_multiple_of(WIDE_LANES);
        let lanes = if wide { WIDE_LANES } else { LANES };
        let weave = interleaves(format)
            && rows.is_multiple_of(lanes)
            && (wide
                || matches!(
                    format,
                    BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q8_0
                ));
        let storage = if weave {
            let bytes = interleave(format, &bytes, row_bytes, lanes);
            Storage::Interleaved(format, lanes, bytes.into())
        } else {
            Storage::Blocks(format, bytes)
        };
        Ok(Matrix::one(storage, rows, cols))
    }

    fn one(storage: Storage, rows: usize, cols: usize) -> Matrix {
        Matrix {
            parts: vec![Part { storage, rows }],
            rows,
            cols,
        }
    }

    /// The matrices' rows stacked in order; neighbouring parts stored alike are joined.
    pub fn stack(matrices: Vec<Matrix>) -> Result<Matrix, MatrixError> {
        let cols = matrices.first().ok_or(MatrixError::Empty)?.cols;
        let mut parts: Vec<Part> = Vec::new();
        for m in matrices {
            if m.cols != cols {
                return Err(MatrixError::Columns(cols, m.cols));
            }
            for part in m.parts {
                match parts.last_mut().and_then(|last| join(last, &part)) {
                    Some(joined) => *parts.last_mut().expect("a last part") = joined,
                    None => parts.push(part),
                }
            }
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        Ok(Matrix { parts, rows, cols })
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The values when the whole matrix is one float32 part (shared, not copied).
    pub fn as_f32(&self) -> Option<&Arc<[f32]>> {
        match self.parts.as_slice() {
            [Part {
                storage: Storage::F32(v),
                ..
            }] => Some(v),
            _ => None,
        }
    }

    /// The matrix quantized to Q8_0 blocks ([`q8_0_blocks`]) when it is float32 with rows
    /// of whole blocks; `None` otherwise (stored another way, or rows of another width).
    pub fn to_q8_0(&self) -> Option<Matrix> {
        let values = self.as_f32()?;
        if self.cols == 0 || !self.cols.is_multiple_of(QK8) {
            return None;
        }
        let bytes = q8_0_blocks(values);
        Some(Matrix::blocks(BlockFormat::Q8_0, bytes.into(), self.cols).expect("whole Q8_0 rows"))
    }

    /// Bytes the matrix holds.
    pub fn size_bytes(&self) -> u64 {
        let part = |p: &Part| match &p.storage {
            Storage::F32(v) => 4 * v.len(),
            Storage::Half(_, v) => 2 * v.len(),
            Storage::Blocks(_, b) | Storage::Interleaved(_, _, b) => b.len(),
        };
        self.parts.iter().map(part).sum::<usize>() as u64
    }

    /// How the parts are stored, e.g. `"Q4_K x 576, Q6_K x 192"`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|p| format!("{} x {}", p.storage_name(), p.rows))
            .collect();
        parts.join(", ")
    }

    /// The name of each part's storage (`"F32"`, `"BF16"`, `"Q4_K"`, ...), in order.
    pub fn storage_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.parts.iter().map(Part::storage_name)
    }

    /// Row `r` as float32 into `out` (`cols` values).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        assert!(
            r < self.rows && out.len() == self.cols,
            "Matrix::row_into: row {r}"
        );
        let (part, local) = self.locate(r);
        let k = self.cols;
        match &part.storage {
            Storage::F32(v) => out.copy_from_slice(&v[local * k..(local + 1) * k]),
            Storage::Half(kind, bits) => {
                let row = &bits[local * k..(local + 1) * k];
                for (o, &b) in out.iter_mut().zip(row) {
                    *o = match kind {
                        Half::Bf16 => half::bf16::from_bits(b).to_f32(),
                        Half::F16 => half::f16::from_bits(b).to_f32(),
                    };
                }
            }
            Storage::Blocks(format, bytes) => {
                let rb = format.row_bytes(k).expect("checked at construction");
                format.dequantize(&bytes[local * rb..(local + 1) * rb], out);
            }
            Storage::Interleaved(format, lanes, bytes) => {
                let rb = woven_row_bytes(*format, k).expect("checked at construction");
                interleaved_row(*format, *lanes, bytes, rb, local, out);
            }
        }
    }

    /// The whole matrix as float32, `[rows, cols]`.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        out.par_chunks_mut(self.cols.max(1))
            .enumerate()
            .for_each(|(r, row)| self.row_into(r, row));
        out
    }

    fn locate(&self, mut r: usize) -> (&Part, usize) {
        for p in &self.parts {
            if r < p.rows {
                return (p, r);
            }
            r -= p.rows;
        }
        unreachable!("row past the matrix, checked by the caller")
    }

    /// `out[i, :] = x[i, :] · selfᵀ` for every row `i`: `x` is `[n, cols]`, `out` is
    /// `[n, rows]`. Blocks are multiplied with `x` quantized per 32 values (as llama.cpp
    /// does); threads take panels of the weight's rows and run every row of `x` through
    /// each, so the weight is read once per call. A row's result does not depend on the
    /// other rows of `x`.
    pub fn matmul(&self, x: &[f32], out: &mut [f32]) {
        self.matmul_with(Simd::detected(), x, out)
    }

    /// [`matmul`](Self::matmul) with the dot products of `simd` (tests compare them).
    pub fn matmul_with(&self, simd: Simd, x: &[f32], out: &mut [f32]) {
        let k = self.cols;
        assert!(
            k > 0 && x.len().is_multiple_of(k),
            "Matrix::matmul: x is not [n, {k}]"
        );
        let n = x.len() / k;
        assert_eq!(
            out.len(),
            n * self.rows,
            "Matrix::matmul: out is not [{n}, {}]",
            self.rows
        );
        if let Some(w) = self.as_f32() {
            return linear(x, k, w, self.rows, out);
        }
        let quantized = self
            .parts
            .iter()
            .any(|p| matches!(p.storage, Storage::Blocks(..) | Storage::Interleaved(..)))
            .then(|| Q8Rows::quantize(x, k));
        let q8: Vec<Q8Row> = quantized
            .as_ref()
            .map(|q| (0..n).map(|r| q.row(r)).collect())
            .unwrap_or_default();
        let dst = SendPtr(out.as_mut_ptr());
        let width = self.rows;
        self.panels()
            .into_par_iter()
            .for_each(|(part, first, start, count)| {
                let mut dots = Vec::new();
                // Tiles of x's rows, so a tile stays in the core's first-level cache while
                // every weight row of the panel runs through it.
                for t in (0..n).step_by(X_TILE) {
                    let rows = X_TILE.min(n - t);
                    let q8 = q8.get(t..t + rows).unwrap_or_default();
                    if let Storage::Interleaved(format, lanes, bytes) = &part.storage {
                        let rb = woven_row_bytes(*format, k).expect("checked at construction");
                        let w = &bytes[start * rb..(start + count) * rb];
                        // SAFETY: the panel's columns of rows t..t + rows lie in `out`
                        // (checked above) and belong to this panel alone; `start` and
                        // `count` are whole groups (see `panels`).
                        unsafe {
                            let at = dst.at(t * width + first + start);
                            interleaved_rows(simd, *format, *lanes, w, q8, at, width);
                        }
                        continue;
                    }
                    dots.resize(count * rows, 0.0);
                    let xt = &x[t * k..(t + rows) * k];
                    part.dots(simd, start, count, k, xt, q8, &mut dots);
                    for (j, dots) in dots.chunks_exact(rows).enumerate() {
                        for (r, &v) in dots.iter().enumerate() {
                            // SAFETY: column `first + start + j` of row `t + r` lies in
                            // `out` (checked above); each column belongs to one panel.
                            unsafe { *dst.at((t + r) * width + first + start + j) = v };
                        }
                    }
                }
            });
    }

    /// Panels of rows for the threads: (part, its first row in the matrix, first row in
    /// the part, rows), about four per thread of the pool, whole groups of [`WIDE_LANES`]
    /// rows. An output's value does not depend on which panel computes it.
    fn panels(&self) -> Vec<(&Part, usize, usize, usize)> {
        let threads = rayon::current_num_threads().max(1);
        let per = self
            .rows
            .div_ceil(4 * threads)
            .max(1)
            .next_multiple_of(WIDE_LANES);
        let mut panels = Vec::new();
        let mut first = 0;
        for p in &self.parts {
            for start in (0..p.rows).step_by(per) {
                panels.push((p, first, start, per.min(p.rows - start)));
            }
            first += p.rows;
        }
        panels
    }
}

impl Part {
    fn storage_name(&self) -> &'static str {
        match &self.storage {
            Storage::F32(_) => "F32",
            Storage::Half(Half::Bf16, _) => "BF16",
            Storage::Half(Half::F16, _) => "F16",
            Storage::Blocks(f, _) | Storage::Interleaved(f, _, _) => f.name(),
        }
    }

    /// `out[j * n + r]`: row `start + j` (of this part, `count` rows) dotted with row `r`
    /// of the `n` rows of `x` (`q8`, quantized, for block formats).
    #[allow(clippy::too_many_arguments)]
    fn dots(
        &self,
        simd: Simd,
        start: usize,
        count: usize,
        k: usize,
        x: &[f32],
        q8: &[Q8Row],
        out: &mut [f32],
    ) {
        let n = x.len() / k;
        match &self.storage {
            Storage::Blocks(format, bytes) => {
                let rb = format.row_bytes(k).expect("checked at construction");
                block_rows(
                    simd,
                    *format,
                    &bytes[start * rb..(start + count) * rb],
                    q8,
                    out,
                );
            }
            Storage::Half(kind, bits) => {
                for (j, out) in out.chunks_exact_mut(n).enumerate() {
                    let w = &bits[(start + j) * k..(start + j + 1) * k];
                    for (o, x) in out.iter_mut().zip(x.chunks_exact(k)) {
                        *o = half_dot(simd, *kind, w, x);
                    }
                }
            }
            Storage::Interleaved(..) => unreachable!("interleaved parts write their outputs"),
            Storage::F32(values) => {
                for (j, out) in out.chunks_exact_mut(n).enumerate() {
                    let w = &values[(start + j) * k..(start + j + 1) * k];
                    for (o, x) in out.iter_mut().zip(x.chunks_exact(k)) {
                        *o = w.iter().zip(x).fold(0.0, |s, (&w, &x)| w.mul_add(x, s));
                    }
                }
            }
        }
    }
}

/// `a` and `b` as one part, when they are stored alike.
fn join(a: &Part, b: &Part) -> Option<Part> {
    let storage = match (&a.storage, &b.storage) {
        (Storage::F32(x), Storage::F32(y)) => Storage::F32(concat(x, y)),
        (Storage::Half(k, x), Storage::Half(l, y)) if k == l => Storage::Half(*k, concat(x, y)),
        (Storage::Blocks(f, x), Storage::Blocks(g, y)) if f == g => {
            Storage::Blocks(*f, concat(x, y))
        }
        (Storage::Interleaved(f, l, x), Storage::Interleaved(g, m, y)) if f == g && l == m => {
            Storage::Interleaved(*f, *l, concat(x, y))
        }
        _ => return None,
    };
    Some(Part {
        storage,
        rows: a.rows + b.rows,
    })
}

fn concat<T: Copy>(a: &[T], b: &[T]) -> Arc<[T]> {
    a.iter().chain(b).copied().collect()
}

fn whole_rows(len: usize, per_row: usize) -> Result<usize, MatrixError> {
    if per_row == 0 || !len.is_multiple_of(per_row) {
        return Err(MatrixError::Length {
            values: len,
            cols: per_row,
        });
    }
    Ok(len / per_row)
}

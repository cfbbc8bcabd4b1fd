//! Cutting a rank's shard out of a full row-major matrix.

use std::ops::Range;

/// Which part of a row-major `[rows, cols]` matrix a rank holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    /// These rows, concatenated in order, then `pad` rows of zeros (a column-parallel
    /// projection's output features; a vocabulary shard).
    Rows {
        ranges: Vec<Range<usize>>,
        pad: usize,
    },
    /// These columns of every row, concatenated in order (a row-parallel projection's
    /// input features).
    Columns(Vec<Range<usize>>),
    /// The whole matrix (norms).
    Replicated,
}

impl Cut {
    /// The shard's shape, `[rows, cols]`, of a `[rows, cols]` matrix.
    pub fn shape(&self, rows: usize, cols: usize) -> [usize; 2] {
        let len = |r: &[Range<usize>]| r.iter().map(|r| r.len()).sum::<usize>();
        match self {
            Cut::Rows { ranges, pad } => [len(ranges) + pad, cols],
            Cut::Columns(ranges) => [rows, len(ranges)],
            Cut::Replicated => [rows, cols],
        }
    }
}

/// The part `how` names of the row-major `full` (`rows` rows of `cols`), row-major: a
/// 1-D tensor (a bias) is a matrix of one column. Panics if `full` is not `rows * cols`
/// long or a range lies outside the matrix.
pub fn cut<T: Copy + Default>(full: &[T], rows: usize, cols: usize, how: &Cut) -> Vec<T> {
    assert_eq!(full.len(), rows * cols, "a [{rows}, {cols}] matrix");
    match how {
        Cut::Rows { ranges, pad } => {
            let mut out = Vec::with_capacity(how.shape(rows, cols).iter().product());
            for r in ranges {
                assert!(r.end <= rows, "rows {r:?} of {rows}");
                out.extend_from_slice(&full[r.start * cols..r.end * cols]);
            }
            out.resize(out.len() + pad * cols, T::default());
            out
        }
        Cut::Columns(ranges) => {
            let mut out = Vec::with_capacity(how.shape(rows, cols).iter().product());
            for row in full.chunks_exact(cols) {
                for r in ranges {
                    assert!(r.end <= cols, "columns {r:?} of {cols}");
                    out.extend_from_slice(&row[r.clone()]);
                }
            }
            out
        }
        Cut::Replicated => full.to_vec(),
    }
}

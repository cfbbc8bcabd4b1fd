//! Undoing the row permutation llama.cpp's converter applies to `attn_q` and `attn_k`.
//!
//! The converter reorders each head's rows from Hugging Face's half-split rotary layout
//! (first half of the head dimension, then second half) to interleaved pairs:
//! `w.reshape(n_head, 2, head_dim / 2, in).swapaxes(1, 2).reshape(out, in)`. So GGUF row
//! `h * head_dim + 2 * i + j` holds Hugging Face row `h * head_dim + j * head_dim / 2 + i`.

use anyhow::{bail, Result};

/// Checks that `n_rows` rows split into `n_heads` heads of an even size.
pub(crate) fn check_permutable(name: &str, n_rows: usize, n_heads: usize) -> Result<()> {
    if n_heads == 0 || !n_rows.is_multiple_of(n_heads) || !(n_rows / n_heads).is_multiple_of(2) {
        bail!("tensor '{name}': {n_rows} rows do not split into {n_heads} heads of an even size");
    }
    Ok(())
}

/// Reorders the rows of `data` (`n_rows` equal rows, checked by [`check_permutable`]) from
/// llama.cpp's interleaved order back to Hugging Face's order.
pub(crate) fn unpermute_rows<T: Copy>(data: &[T], n_rows: usize, n_heads: usize) -> Vec<T> {
    let row_bytes = data.len() / n_rows;
    let head_dim = n_rows / n_heads;
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(data.len());
    for r in 0..n_rows {
        let (head, within) = (r / head_dim, r % head_dim);
        let src = head * head_dim + 2 * (within % half) + within / half;
        out.extend_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's forward permutation, written as the reshape it is.
    fn permute(rows: &[u8], n_heads: usize) -> Vec<u8> {
        let head_dim = rows.len() / n_heads;
        let mut out = vec![0; rows.len()];
        for h in 0..n_heads {
            for j in 0..2 {
                for i in 0..head_dim / 2 {
                    out[h * head_dim + i * 2 + j] = rows[h * head_dim + j * head_dim / 2 + i];
                }
            }
        }
        out
    }

    #[test]
    fn inverts_llama_cpp_permutation() {
        let rows: Vec<u8> = (0..24).collect();
        for heads in [1, 2, 3, 6] {
            let permuted = permute(&rows, heads);
            assert_ne!(permuted, rows);
            assert_eq!(unpermute_rows(&permuted, 24, heads), rows);
        }
        let wide: Vec<u8> = (0..16).collect(); // 8 rows of 2 bytes, 2 heads
        let permuted = unpermute_rows(&wide, 8, 2);
        assert_eq!(&permuted[..4], &[0, 1, 4, 5]);
    }

    #[test]
    fn rejects_odd_heads() {
        assert!(check_permutable("q", 12, 4).is_err());
        assert!(check_permutable("q", 10, 3).is_err());
        assert!(check_permutable("q", 10, 0).is_err());
        assert!(check_permutable("q", 16, 4).is_ok());
    }
}

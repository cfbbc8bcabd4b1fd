//! Embedding lookup.

use super::Matrix;

/// Writes row `ids[i]` of `table` (`[vocab, hidden]`, in whatever form it is stored) into
/// row `i` of `out` as float32. Ids must be below the vocabulary size; callers check
/// user-supplied ids first.
pub fn embedding(ids: &[u32], table: &Matrix, out: &mut [f32]) {
    let hidden = table.cols();
    assert_eq!(
        out.len(),
        ids.len() * hidden,
        "embedding: out is not [tokens, {hidden}]"
    );
    for (row, &id) in out.chunks_mut(hidden).zip(ids) {
        table.row_into(id as usize, row);
    }
}

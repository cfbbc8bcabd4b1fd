//! Embedding lookup.

/// Copies row `ids[i]` of `table` (`[vocab, hidden]`) into row `i` of `out`. Ids must be
/// below the vocabulary size; callers check user-supplied ids first.
pub fn embedding(ids: &[u32], table: &[f32], hidden: usize, out: &mut [f32]) {
    assert_eq!(
        out.len(),
        ids.len() * hidden,
        "embedding: out is not [tokens, {hidden}]"
    );
    for (row, &id) in out.chunks_mut(hidden).zip(ids) {
        let start = id as usize * hidden;
        row.copy_from_slice(&table[start..start + hidden]);
    }
}

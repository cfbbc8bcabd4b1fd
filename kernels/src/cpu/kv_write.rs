//! Writing new keys and values into their cache slots.

use super::{KvElem, KvLayout};

/// Copies row `r` of `k` and `v` (`[rows, num_kv_heads * head_dim]`) into slot
/// `slot_mapping[r]` of one layer's caches, as the caches' element type (rounded to nearest
/// even into bf16). A negative slot marks a padded row and is skipped. Offsets are computed
/// in 64 bits; a slot past the pool panics (callers plan slots from allocated blocks only).
pub fn write_kv<T: KvElem>(
    k_cache: &mut [T],
    v_cache: &mut [T],
    layout: &KvLayout,
    slot_mapping: &[i64],
    k: &[f32],
    v: &[f32],
) {
    assert_eq!(v.len(), k.len(), "write_kv: v differs from k");
    write_rows(k_cache, layout, slot_mapping, k);
    write_rows(v_cache, layout, slot_mapping, v);
}

/// Copies row `r` of `rows` (`[rows, num_kv_heads * head_dim]`) into slot
/// `slot_mapping[r]` of one cache: a latent-attention layer's one row per token, or one of
/// [`write_kv`]'s two. Negative slots are skipped; offsets are 64-bit.
pub fn write_rows<T: KvElem>(
    cache: &mut [T],
    layout: &KvLayout,
    slot_mapping: &[i64],
    rows: &[f32],
) {
    let width = layout.slot_elems() as usize;
    assert_eq!(
        rows.len(),
        slot_mapping.len() * width,
        "write_kv: rows are not [rows, {width}]"
    );
    for (r, &slot) in slot_mapping.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let at = layout.slot_offset(slot as u64) as usize;
        let row = &rows[r * width..(r + 1) * width];
        for (slot, &x) in cache[at..at + width].iter_mut().zip(row) {
            *slot = T::from_f32(x);
        }
    }
}

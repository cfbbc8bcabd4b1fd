//! Launcher of the KV-cache write with the rotary embedding fused in (`cuda/kv_write.cu`).

use super::{grid, CudaKernels};
use crate::cpu::KvLayout;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError};
use half::bf16;

/// Threads per (row, head) block (`KV_WRITE_THREADS`).
const THREADS: u32 = 64;

/// The rotary embedding applied on the way: each row's position and the angle table.
#[derive(Clone, Copy)]
pub struct RotaryInput<'a, 'b> {
    /// Each row's position (`rows` entries, below the table's positions).
    pub positions: &'a CudaView<'b, i32>,
    /// Per position, `head_dim / 2` cosines then `head_dim / 2` sines.
    pub cos_sin: &'a CudaView<'b, f32>,
    /// Pairs (2i, 2i+1) instead of (i, i + head_dim/2).
    pub interleaved: bool,
}

/// Writes the K and V of the first `rows` rows of `qkv` (bf16, `[rows, row_stride]`: `q_heads`
/// query heads from column 0, then the layout's KV heads of keys, then of values) into slot
/// `slot_mapping[r]` of one layer's caches, laid out as `layout` says. With `rotary`, the
/// query heads are rotated in place and the keys on their way into the cache. A negative
/// slot (and, defensively, a slot past the pool) skips its row's K and V. Offsets are 64-bit
/// in the kernel.
#[allow(clippy::too_many_arguments)]
pub fn write_kv(
    k: &CudaKernels,
    stream: &CudaStream,
    qkv: &mut CudaViewMut<bf16>,
    row_stride: usize,
    q_heads: usize,
    rotary: Option<RotaryInput>,
    slot_mapping: &CudaView<i64>,
    rows: usize,
    k_cache: &mut CudaSlice<bf16>,
    v_cache: &mut CudaSlice<bf16>,
    layout: &KvLayout,
) -> Result<(), DriverError> {
    let d = layout.head_dim as usize;
    let kv_heads = layout.num_kv_heads as usize;
    assert!(
        (q_heads + 2 * kv_heads) * d <= row_stride,
        "write_kv: q, K and V columns past the row"
    );
    assert!(
        qkv.len() >= rows * row_stride && slot_mapping.len() >= rows,
        "write_kv: short qkv or slot mapping"
    );
    if let Some(r) = &rotary {
        assert!(
            r.positions.len() >= rows && d.is_multiple_of(2),
            "write_kv: short positions or odd head size"
        );
    }
    let layer = layout.layer_elems();
    assert!(
        k_cache.len() as u64 >= layer && v_cache.len() as u64 >= layer,
        "write_kv: cache smaller than its layout"
    );
    assert!(
        rows <= i32::MAX as usize && (q_heads + 2 * kv_heads) * d <= i32::MAX as usize,
        "write_kv: too many rows or heads"
    );
    if rows == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(rows * (q_heads + kv_heads)).expect("write_kv: grid too large");
    let stride_i = row_stride as i64;
    let (q_heads_i, kv_heads_i, d_i, rows_i) =
        (q_heads as i32, kv_heads as i32, d as i32, rows as i32);
    let num_slots = (layout.num_blocks * layout.block_size) as i64;
    let mode = rotary.map_or(0i32, |r| if r.interleaved { 2 } else { 1 });
    // A null pointer for the tables the kernel does not read without rotary.
    let null = 0u64;
    let mut launch = k.launch(stream, "kv_write_bf16");
    launch
        .arg(qkv)
        .arg(&stride_i)
        .arg(&q_heads_i)
        .arg(&kv_heads_i)
        .arg(&d_i);
    match &rotary {
        Some(r) => launch.arg(r.positions).arg(r.cos_sin),
        None => launch.arg(&null).arg(&null),
    };
    launch
        .arg(&mode)
        .arg(slot_mapping)
        .arg(&rows_i)
        .arg(&num_slots)
        .arg(k_cache)
        .arg(v_cache);
    // SAFETY: qkv holds `rows` rows of `row_stride` and q, K and V lie inside a row, the slot
    // mapping (and positions, with rotary) hold `rows` entries, and the kernel writes only
    // slots in `0..num_slots`, which the caches hold (all checked above). Positions index the
    // angle table below its length (the caller's check: positions below the model's
    // maximum, which the table covers). One block per row and head.
    unsafe { launch.launch(grid(blocks, THREADS, 0)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::THREADS;

    #[test]
    fn the_source_agrees_with_the_launcher_constants() {
        let source = include_str!("../../cuda/kv_write.cu");
        assert!(source.contains(&format!("#define KV_WRITE_THREADS {THREADS} ")));
    }
}

//! Launcher of the KV-cache write (`cuda/kv_write.cu`).

use super::{grid, CudaKernels};
use crate::cpu::KvLayout;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DriverError, PushKernelArg};
use half::bf16;

/// Threads per row.
const THREADS: u32 = 256;

/// Copies the K and V of the first `rows` rows of `qkv` (bf16, `[rows, row_stride]`; K at
/// column `k_col`, V at `v_col`, each `num_kv_heads * head_dim` wide) into slot
/// `slot_mapping[r]` of one layer's caches, laid out as `layout` says. A negative slot (and,
/// defensively, a slot past the pool) skips its row. Offsets are 64-bit in the kernel.
#[allow(clippy::too_many_arguments)]
pub fn write_kv(
    k: &CudaKernels,
    stream: &CudaStream,
    qkv: &CudaView<bf16>,
    row_stride: usize,
    k_col: usize,
    v_col: usize,
    slot_mapping: &CudaView<i64>,
    rows: usize,
    k_cache: &mut CudaSlice<bf16>,
    v_cache: &mut CudaSlice<bf16>,
    layout: &KvLayout,
) -> Result<(), DriverError> {
    let width = layout.slot_elems() as usize;
    assert!(
        k_col + width <= row_stride && v_col + width <= row_stride,
        "write_kv: K or V columns past the row"
    );
    assert!(
        qkv.len() >= rows * row_stride && slot_mapping.len() >= rows,
        "write_kv: short qkv or slot mapping"
    );
    let layer = layout.layer_elems();
    assert!(
        k_cache.len() as u64 >= layer && v_cache.len() as u64 >= layer,
        "write_kv: cache smaller than its layout"
    );
    assert!(
        rows <= i32::MAX as usize && width <= i32::MAX as usize,
        "write_kv: too many rows"
    );
    if rows == 0 {
        return Ok(());
    }
    let (stride_i, k_col_i, v_col_i) = (row_stride as i64, k_col as i64, v_col as i64);
    let (rows_i, width_i) = (rows as i32, width as i32);
    let num_slots = (layout.num_blocks * layout.block_size) as i64;
    let mut launch = stream.launch_builder(k.function("kv_write_bf16"));
    launch
        .arg(qkv)
        .arg(&stride_i)
        .arg(&k_col_i)
        .arg(&v_col_i)
        .arg(slot_mapping)
        .arg(&rows_i)
        .arg(&width_i)
        .arg(&num_slots)
        .arg(k_cache)
        .arg(v_cache);
    // SAFETY: qkv holds `rows` rows of `row_stride` and both column ranges lie inside a row,
    // the slot mapping holds `rows` entries, and the kernel writes only slots in
    // `0..num_slots`, which the caches hold (all checked above). One block per row.
    unsafe { launch.launch(grid(rows as u32, THREADS, 0)) }?;
    Ok(())
}

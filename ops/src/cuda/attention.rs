//! Paged attention and the KV write on the GPU.
//!
//! They read one step's metadata from a [`DeviceAttentionPlan`] (planned over the real
//! tokens); [`GpuPagedAttention::forward`] and [`write_kv`] check on the host, with
//! plain integers and no device sync, that the plan fits the buffers and the pool before
//! they launch anything (docs/architecture.md, rule 3).

pub use super::attention_error::AttentionError;
pub use super::plan::DeviceAttentionPlan;
use crate::attention::PlanError;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::attention::{self as kernel, FusedKvWrite, Heads};
use peregrine_kernels::cuda::kv_write::{self, RotaryInput};
use peregrine_kernels::cuda::CudaKernels;

/// Refuses caches shorter than `layout` says.
fn check_caches(k: usize, v: usize, layout: &KvLayout) -> Result<(), AttentionError> {
    let layer = layout.layer_elems();
    if (k as u64) < layer || (v as u64) < layer {
        return Err(AttentionError::Shape(format!(
            "caches of {k} and {v} elements, layout needs {layer}"
        )));
    }
    Ok(())
}

/// Grouped-query paged attention over one layer's bf16 caches on the GPU.
#[derive(Clone, Copy, Debug)]
pub struct GpuPagedAttention {
    /// Query heads; a multiple of `num_kv_heads`.
    pub num_heads: usize,
    /// KV heads, as in the cache layout.
    pub num_kv_heads: usize,
    /// Elements per head (64 or 128).
    pub head_dim: usize,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

impl GpuPagedAttention {
    /// Attention for the planned rows of `q` (bf16 rows of `q_stride` elements, query heads
    /// at column 0: a view of the fused qkv activation) into the dense `o`
    /// (`[rows, num_heads * head_dim]`), over one layer's `k_cache` / `v_cache` laid out as
    /// `layout`, which already hold the step's keys and values. Checks first, on the host,
    /// that the plan's rows fit q and o and its blocks fit the pool; nothing is launched
    /// otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        q: &CudaView<bf16>,
        q_stride: usize,
        k_cache: &mut CudaSlice<bf16>,
        v_cache: &mut CudaSlice<bf16>,
        layout: &KvLayout,
        plan: &DeviceAttentionPlan,
        o: &mut CudaViewMut<bf16>,
    ) -> Result<(), AttentionError> {
        let caches = (k_cache, v_cache);
        self.run(kernels, stream, q, q_stride, caches, layout, plan, None, o)
    }

    /// [`write_kv`] and [`forward`](Self::forward) of a step whose rows all go to the split
    /// kernel (a decode step, or a verification step cut into decode rows) in one launch:
    /// each row's key and value go from `qkv` (rows of `row_stride`: query heads, then
    /// keys, then values) to its slot, the key and q rotated by `rotary` on the way, and a
    /// row reads its sequence's earlier rows of the step from `qkv` too: the same bits as
    /// the two calls. Refused, with nothing launched, where the plan does not fuse the
    /// write ([`DeviceAttentionPlan::fuses_kv_write`]: rows of the prefill kernel), or
    /// where either call's checks refuse.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_writing_kv(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        qkv: &CudaView<bf16>,
        row_stride: usize,
        rotary: Option<RotaryTable>,
        k_cache: &mut CudaSlice<bf16>,
        v_cache: &mut CudaSlice<bf16>,
        layout: &KvLayout,
        plan: &DeviceAttentionPlan,
        o: &mut CudaViewMut<bf16>,
    ) -> Result<(), AttentionError> {
        if !plan.fuses_kv_write() {
            return Err(AttentionError::Shape(
                "the KV write fuses into steps whose rows all go to the split kernel".into(),
            ));
        }
        let rows = qkv.len() / row_stride.max(1);
        let caches = (k_cache.len(), v_cache.len());
        check_kv_write(
            rows,
            row_stride,
            self.num_heads,
            rotary.as_ref(),
            caches,
            layout,
            plan,
        )?;
        let positions = plan.positions();
        let slot_mapping = plan.slot_mapping();
        let step_tokens = plan.step_tokens();
        let cos_sin = rotary.as_ref().map(|t| (t.cos_sin, t.interleaved));
        let fused = FusedKvWrite {
            positions: &positions,
            rotary: cos_sin,
            slot_mapping: &slot_mapping,
            step_tokens: &step_tokens,
            step_rows: plan.step_rows(),
        };
        let caches = (k_cache, v_cache);
        self.run(
            kernels,
            stream,
            qkv,
            row_stride,
            caches,
            layout,
            plan,
            Some(fused),
            o,
        )
    }

    /// The checks and the launch of both entry points.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        q: &CudaView<bf16>,
        q_stride: usize,
        (k_cache, v_cache): (&mut CudaSlice<bf16>, &mut CudaSlice<bf16>),
        layout: &KvLayout,
        plan: &DeviceAttentionPlan,
        fused: Option<FusedKvWrite>,
        o: &mut CudaViewMut<bf16>,
    ) -> Result<(), AttentionError> {
        self.check_shape(layout, q_stride)?;
        let width = self.num_heads * self.head_dim;
        plan.check_fits(q.len() / q_stride, o.len() / width)?;
        plan.check_blocks(layout)?;
        check_caches(k_cache.len(), v_cache.len(), layout)?;
        if plan.rows() == 0 {
            return Ok(());
        }
        let mut scratch = plan.scratch();
        plan.ensure_scratch(&mut scratch, self.num_heads, self.head_dim)?;
        let scratch = scratch.as_mut().expect("scratch allocated above");
        let heads = Heads {
            num_heads: self.num_heads,
            scale: self.scale,
        };
        kernel::paged_attention(
            kernels,
            stream,
            q,
            q_stride,
            k_cache,
            v_cache,
            layout,
            heads,
            &plan.meta(),
            fused,
            scratch,
            o,
        )?;
        Ok(())
    }

    fn check_shape(&self, layout: &KvLayout, q_stride: usize) -> Result<(), AttentionError> {
        let (nh, kvh, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let problem = if layout.num_kv_heads != kvh as u64 || layout.head_dim != d as u64 {
            Some(format!(
                "{kvh} KV heads of {d}, but the cache holds {} of {}",
                layout.num_kv_heads, layout.head_dim
            ))
        } else if kvh == 0 || !nh.is_multiple_of(kvh) || nh == 0 {
            Some(format!("{nh} query heads cannot share {kvh} KV heads"))
        } else if !kernel::HEAD_DIMS.contains(&d) {
            Some(format!("head_dim {d} (built: {:?})", kernel::HEAD_DIMS))
        } else if layout.block_size == 0 {
            Some("block size 0".into())
        } else if q_stride < nh * d {
            Some(format!("q row stride {q_stride} below {nh} heads x {d}"))
        } else {
            None
        };
        problem.map_or(Ok(()), |p| Err(AttentionError::Shape(p)))
    }
}

/// The angle table of a model's rotary embedding on the device: per position,
/// `head_dim / 2` cosines then `head_dim / 2` sines.
#[derive(Clone, Copy)]
pub struct RotaryTable<'a, 'b> {
    /// The table, `[positions, head_dim]`.
    pub cos_sin: &'a CudaView<'b, f32>,
    /// Positions the table covers.
    pub positions: usize,
    /// Pairs (2i, 2i+1) instead of (i, i + head_dim/2).
    pub interleaved: bool,
}

/// Writes the K and V of every planned row into one layer's caches: row r of `qkv` (bf16,
/// `[rows, row_stride]`: `q_heads` query heads, then the layout's KV heads of keys, then of
/// values) goes to slot `plan.slot_mapping()[r]`. With `rotary`, the query heads are
/// rotated in place and the keys on their way into the cache, by each row's planned
/// position. Checks first, on the host, that the plan's rows fit qkv, the heads fit a row,
/// every slot fits the pool and every position the table.
#[allow(clippy::too_many_arguments)]
pub fn write_kv(
    kernels: &CudaKernels,
    stream: &CudaStream,
    qkv: &mut CudaViewMut<bf16>,
    row_stride: usize,
    q_heads: usize,
    rotary: Option<RotaryTable>,
    k_cache: &mut CudaSlice<bf16>,
    v_cache: &mut CudaSlice<bf16>,
    layout: &KvLayout,
    plan: &DeviceAttentionPlan,
) -> Result<(), AttentionError> {
    let rows = qkv.len() / row_stride.max(1);
    let caches = (k_cache.len(), v_cache.len());
    check_kv_write(
        rows,
        row_stride,
        q_heads,
        rotary.as_ref(),
        caches,
        layout,
        plan,
    )?;
    let slot_mapping = plan.slot_mapping();
    let positions = plan.positions();
    let rotary = rotary.map(|table| RotaryInput {
        positions: &positions,
        cos_sin: table.cos_sin,
        interleaved: table.interleaved,
    });
    kv_write::write_kv(
        kernels,
        stream,
        qkv,
        row_stride,
        q_heads,
        rotary,
        &slot_mapping,
        plan.padded_rows(),
        k_cache,
        v_cache,
        layout,
    )?;
    Ok(())
}

/// The host checks of a KV write of `plan`'s rows from `qkv_rows` rows of `row_stride`
/// (`q_heads` query heads, then the layout's keys and values) into caches of `caches`
/// (K, V) elements: the rows fit qkv, the heads a row, every slot the pool and every
/// position the rotary table.
fn check_kv_write(
    qkv_rows: usize,
    row_stride: usize,
    q_heads: usize,
    rotary: Option<&RotaryTable>,
    caches: (usize, usize),
    layout: &KvLayout,
    plan: &DeviceAttentionPlan,
) -> Result<(), AttentionError> {
    let columns = (q_heads + 2 * layout.num_kv_heads as usize) * layout.head_dim as usize;
    if columns > row_stride {
        return Err(AttentionError::Shape(format!(
            "{q_heads} query heads and {} KV heads of {} take {columns} columns, past rows of \
             {row_stride}",
            layout.num_kv_heads, layout.head_dim
        )));
    }
    if plan.padded_rows() > qkv_rows {
        return Err(PlanError::RowsExceedBuffer {
            planned: plan.padded_rows(),
            buffer: "qkv",
            rows: qkv_rows,
        }
        .into());
    }
    let slots = layout.num_blocks * layout.block_size;
    if let Some(slot) = plan.max_slot().filter(|&s| s as u64 >= slots) {
        return Err(AttentionError::OutsidePool {
            what: "slot",
            index: slot as u64,
            limit: slots,
        });
    }
    if let Some(table) = rotary {
        let rows = table.cos_sin.len() / layout.head_dim as usize;
        if plan
            .max_position()
            .is_some_and(|p| p as usize >= rows.min(table.positions))
        {
            return Err(AttentionError::Shape(format!(
                "position {} past the rotary table's {} positions",
                plan.max_position().unwrap_or(0),
                rows.min(table.positions)
            )));
        }
    }
    check_caches(caches.0, caches.1, layout)
}

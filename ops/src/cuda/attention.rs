//! Paged attention on the GPU: the plan uploaded to the device and the attention op.
//!
//! [`DeviceAttentionPlan`] is the device copy of one step's host [`AttentionPlan`] (real
//! tokens only); [`GpuPagedAttention::forward`] and [`write_kv`] check on the host, with
//! plain integers and no device sync, that the plan fits the buffers and the pool before
//! they launch anything (DESIGN.md rule 3).

use crate::attention::{AttentionPlan, PlanError};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::attention::{
    self as kernel, AttentionMeta, AttentionWork, DecodeKernel, Heads, SeqRows, WorkCounts,
};
use peregrine_kernels::cuda::kv_write::{self, RotaryInput};
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::{Gpu, GpuError};
use std::sync::{Arc, Mutex};

/// Why an attention call or KV write was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum AttentionError {
    /// The plan does not fit its buffers (more planned rows than q, o or qkv hold).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The driver reported an error.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    /// The plan names a block or slot past the pool the caches hold.
    #[error("attention plan names {what} {index} but the pool has {limit}")]
    OutsidePool {
        /// `"block"` or `"slot"`.
        what: &'static str,
        /// The largest block id or slot the plan names.
        index: u64,
        /// Blocks (or slots) in the pool, or the i32 table's limit.
        limit: u64,
    },
    /// Heads, head size, strides or columns that do not match the layout or the buffers.
    #[error("attention shape: {0}")]
    Shape(String),
}

/// One step's attention metadata on the device, uploaded from the host plan: slot mapping,
/// positions, per-sequence rows and contexts, flattened block tables, the kernels' work lists,
/// and the host numbers the checks need. Build one per step, use it for every layer, on the
/// stream of the `Gpu` it was uploaded with (the split scratch is allocated on that stream,
/// at the first forward or at `reserve_scratch`).
pub struct DeviceAttentionPlan {
    rows: usize,
    num_seqs: usize,
    max_context_len: usize,
    /// Largest block id any sequence's table holds, if any.
    max_block: Option<u32>,
    /// Largest slot the slot mapping names, if any.
    max_slot: Option<i64>,
    /// Largest position any row has, if any.
    max_position: Option<u32>,
    counts: WorkCounts,
    /// Every i32 array, one after another, in one upload (see `IntArrays`).
    ints: CudaSlice<i32>,
    /// Every i64 array: the slot mapping, then the table starts.
    longs: CudaSlice<i64>,
    at: Offsets,
    /// Split-partition scratch, sized from the plan at the first call that knows the heads
    /// (or by `reserve_scratch`) and reused by every later layer.
    scratch: Mutex<Option<CudaSlice<f32>>>,
    stream: Arc<CudaStream>,
}

/// Where each array starts in the packed uploads, and how long it is.
#[derive(Clone, Copy, Debug, Default)]
struct Offsets {
    positions: (usize, usize),
    q_start: (usize, usize),
    q_len: (usize, usize),
    context_len: (usize, usize),
    block_table: (usize, usize),
    split: (usize, usize),
    decode: (usize, usize),
    prefill: (usize, usize),
    slot_mapping: (usize, usize),
    table_start: (usize, usize),
}

/// Appends `part` to `all` and returns its (start, length).
fn pack<T: Copy>(all: &mut Vec<T>, part: &[T]) -> (usize, usize) {
    all.extend_from_slice(part);
    (all.len() - part.len(), part.len())
}

/// A device copy of `host`, padded to one element so that an empty list still allocates.
fn upload_padded<T: cudarc::driver::DeviceRepr + Copy + Default>(
    gpu: &Gpu,
    host: &[T],
) -> Result<CudaSlice<T>, GpuError> {
    if host.is_empty() {
        gpu.upload(&[T::default()])
    } else {
        gpu.upload(host)
    }
}

impl DeviceAttentionPlan {
    /// Uploads `plan` (planned over the real tokens) to `gpu`, with one-token steps going to
    /// the `decode` kernel. Block ids go into an `i32` table; the ops check them against the
    /// pool (and `i32::MAX`) before every launch.
    pub fn upload(
        gpu: &Gpu,
        plan: &AttentionPlan,
        decode: DecodeKernel,
    ) -> Result<DeviceAttentionPlan, GpuError> {
        let seqs = plan.seqs();
        let positions: Vec<i32> = plan.positions().iter().map(|&p| p as i32).collect();
        let mut q_start = Vec::with_capacity(seqs.len());
        let mut q_len = Vec::with_capacity(seqs.len());
        let mut context_len = Vec::with_capacity(seqs.len());
        let mut table_start = Vec::with_capacity(seqs.len());
        let mut block_table = Vec::new();
        let mut shapes = Vec::with_capacity(seqs.len());
        for s in seqs {
            assert!(
                s.q_start + s.q_len <= i32::MAX as usize,
                "attention plan: rows past i32"
            );
            q_start.push(s.q_start as i32);
            q_len.push(s.q_len as i32);
            context_len.push(s.context_len as i32);
            table_start.push(block_table.len() as i64);
            // Ids past i32::MAX wrap here, but the ops refuse such a plan before launching.
            block_table.extend(s.block_table.iter().map(|&b| b as i32));
            shapes.push(SeqRows {
                q_len: s.q_len,
                context_len: s.context_len,
            });
        }
        let work = AttentionWork::new(&shapes, decode);
        // Two uploads a step rather than ten: each is a separate copy from pageable memory.
        let (mut ints, mut longs) = (Vec::new(), Vec::new());
        let at = Offsets {
            positions: pack(&mut ints, &positions),
            q_start: pack(&mut ints, &q_start),
            q_len: pack(&mut ints, &q_len),
            context_len: pack(&mut ints, &context_len),
            block_table: pack(&mut ints, &block_table),
            split: pack(&mut ints, &work.split),
            decode: pack(&mut ints, &work.decode),
            prefill: pack(&mut ints, &work.prefill),
            slot_mapping: pack(&mut longs, plan.slot_mapping()),
            table_start: pack(&mut longs, &table_start),
        };
        Ok(DeviceAttentionPlan {
            // The plan's rows, and every row a sequence names (the same number for a plan
            // built by `AttentionPlan::new`).
            rows: seqs
                .iter()
                .map(|s| s.q_start + s.q_len)
                .fold(plan.rows(), usize::max),
            num_seqs: seqs.len(),
            max_context_len: seqs.iter().map(|s| s.context_len).max().unwrap_or(0),
            max_block: seqs
                .iter()
                .flat_map(|s| s.block_table.iter())
                .copied()
                .max(),
            max_slot: plan.slot_mapping().iter().copied().max(),
            max_position: plan.positions().iter().copied().max(),
            counts: work.counts(),
            ints: upload_padded(gpu, &ints)?,
            longs: upload_padded(gpu, &longs)?,
            at,
            scratch: Mutex::new(None),
            stream: gpu.stream().clone(),
        })
    }

    /// Query rows planned: the real token count of the step.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Sequences planned.
    pub fn num_seqs(&self) -> usize {
        self.num_seqs
    }

    /// The longest context of the step.
    pub fn max_context_len(&self) -> usize {
        self.max_context_len
    }

    /// Position of every planned token (for rotary), `rows()` entries.
    pub fn positions(&self) -> CudaView<'_, i32> {
        self.int_array(self.at.positions)
    }

    /// Cache slot of every planned token, `rows()` entries.
    pub fn slot_mapping(&self) -> CudaView<'_, i64> {
        self.long_array(self.at.slot_mapping)
    }

    fn int_array(&self, (start, len): (usize, usize)) -> CudaView<'_, i32> {
        self.ints.slice(start..start + len)
    }

    fn long_array(&self, (start, len): (usize, usize)) -> CudaView<'_, i64> {
        self.longs.slice(start..start + len)
    }

    /// f32 elements of split scratch this plan needs for `num_heads` heads of `head_dim`.
    pub fn scratch_floats(&self, num_heads: usize, head_dim: usize) -> usize {
        self.counts.scratch_floats(num_heads, head_dim)
    }

    /// Allocates the split scratch for `num_heads` heads of `head_dim` now (a forward does
    /// it on first use otherwise); later forwards with no more heads reuse it.
    pub fn reserve_scratch(&self, num_heads: usize, head_dim: usize) -> Result<(), DriverError> {
        let mut slot = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.ensure_scratch(&mut slot, num_heads, head_dim)
    }

    fn ensure_scratch(
        &self,
        slot: &mut Option<CudaSlice<f32>>,
        num_heads: usize,
        head_dim: usize,
    ) -> Result<(), DriverError> {
        // One element at least: an all-prefill step still passes a valid pointer.
        let need = self.scratch_floats(num_heads, head_dim).max(1);
        if slot.as_ref().is_none_or(|s| s.len() < need) {
            // SAFETY: the split kernel writes every record before the combine kernel
            // reads it, so the scratch is never read uninitialised.
            *slot = Some(unsafe { self.stream.alloc::<f32>(need) }?);
        }
        Ok(())
    }

    /// Refuses the plan if it covers more rows than `q_rows` / `o_rows`
    /// (`AttentionPlan::check_fits`, on the host numbers kept at upload).
    fn check_fits(&self, q_rows: usize, o_rows: usize) -> Result<(), PlanError> {
        for (buffer, rows) in [("q", q_rows), ("o", o_rows)] {
            if self.rows > rows {
                return Err(PlanError::RowsExceedBuffer {
                    planned: self.rows,
                    buffer,
                    rows,
                });
            }
        }
        Ok(())
    }

    /// Refuses the plan if it names a block past the pool of `layout` (or past the i32
    /// block table).
    fn check_blocks(&self, layout: &KvLayout) -> Result<(), AttentionError> {
        let limit = layout.num_blocks.min(i32::MAX as u64 + 1);
        match self.max_block {
            Some(block) if block as u64 >= limit => Err(AttentionError::OutsidePool {
                what: "block",
                index: block as u64,
                limit,
            }),
            _ => Ok(()),
        }
    }

    fn meta(&self) -> AttentionMeta<'_> {
        AttentionMeta {
            q_start: self.int_array(self.at.q_start),
            q_len: self.int_array(self.at.q_len),
            context_len: self.int_array(self.at.context_len),
            table_start: self.long_array(self.at.table_start),
            block_table: self.int_array(self.at.block_table),
            split: self.int_array(self.at.split),
            decode: self.int_array(self.at.decode),
            prefill: self.int_array(self.at.prefill),
            num_seqs: self.num_seqs,
            counts: self.counts,
            rows: self.rows,
        }
    }
}

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
    /// `layout`. Checks first, on the host, that the plan's rows fit q and o and its blocks
    /// fit the pool; nothing is launched otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        q: &CudaView<bf16>,
        q_stride: usize,
        k_cache: &CudaSlice<bf16>,
        v_cache: &CudaSlice<bf16>,
        layout: &KvLayout,
        plan: &DeviceAttentionPlan,
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
        let mut scratch = plan.scratch.lock().unwrap_or_else(|e| e.into_inner());
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
    let columns = (q_heads + 2 * layout.num_kv_heads as usize) * layout.head_dim as usize;
    if columns > row_stride {
        return Err(AttentionError::Shape(format!(
            "{q_heads} query heads and {} KV heads of {} take {columns} columns, past rows of \
             {row_stride}",
            layout.num_kv_heads, layout.head_dim
        )));
    }
    let qkv_rows = qkv.len() / row_stride;
    if plan.rows() > qkv_rows {
        return Err(PlanError::RowsExceedBuffer {
            planned: plan.rows(),
            buffer: "qkv",
            rows: qkv_rows,
        }
        .into());
    }
    let slots = layout.num_blocks * layout.block_size;
    if let Some(slot) = plan.max_slot.filter(|&s| s as u64 >= slots) {
        return Err(AttentionError::OutsidePool {
            what: "slot",
            index: slot as u64,
            limit: slots,
        });
    }
    if let Some(table) = &rotary {
        let rows = table.cos_sin.len() / layout.head_dim as usize;
        if plan
            .max_position
            .is_some_and(|p| p as usize >= rows.min(table.positions))
        {
            return Err(AttentionError::Shape(format!(
                "position {} past the rotary table's {} positions",
                plan.max_position.unwrap_or(0),
                rows.min(table.positions)
            )));
        }
    }
    check_caches(k_cache.len(), v_cache.len(), layout)?;
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
        plan.rows(),
        k_cache,
        v_cache,
        layout,
    )?;
    Ok(())
}

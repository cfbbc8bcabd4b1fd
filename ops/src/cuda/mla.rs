//! The latent attention op on the GPU (DeepSeek's MLA, absorbed): run from the
//! device plan the runner that owns the stream built over the real tokens, its planned
//! rows checked on the host against the q and o it is given before anything launches.

use super::attention::{AttentionError, RotaryTable};
use super::plan::DeviceAttentionPlan;
use crate::attention::PlanError;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::mla::{self as kernel, MlaHeads, MlaProjections, MlaRotary};
use peregrine_kernels::cuda::CudaKernels;

/// Multi-head latent attention over a paged latent cache.
#[derive(Clone, Copy, Debug)]
pub struct GpuMlaAttention {
    /// Query heads.
    pub num_heads: usize,
    /// Width of the latent part of a cache row (`kv_lora_rank`).
    pub latent: usize,
    /// Softmax scale.
    pub scale: f32,
}

impl GpuMlaAttention {
    /// The rows this step writes and reads, for every padded row of `plan`: each head's
    /// rotary query rotated into its row of `q_lat` (`[rows, num_heads, latent + rope]`,
    /// whose absorbed part the caller writes) and each row's cache row (its normed latent,
    /// then its rotated key) written at its slot of `cache`. Refused on the host, nothing
    /// launched, when the rows exceed the buffers, a slot is past the pool or a position
    /// past the rotary table.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        projections: MlaProjections,
        rotary: RotaryTable,
        cache: &mut CudaSlice<bf16>,
        layout: &KvLayout,
        plan: &DeviceAttentionPlan,
        q_lat: &mut CudaViewMut<bf16>,
    ) -> Result<(), AttentionError> {
        let width = layout.head_dim as usize;
        let rope = width.saturating_sub(self.latent);
        if layout.num_kv_heads != 1 || projections.kv_norm.len() != self.latent || rope == 0 {
            return Err(AttentionError::Shape(format!(
                "a latent of {} (norm of {}) in cache rows of {} heads of {width}",
                self.latent,
                projections.kv_norm.len(),
                layout.num_kv_heads
            )));
        }
        let rows = plan.padded_rows();
        let reach = |stride: usize, cols: usize| rows.saturating_sub(1) * stride + cols;
        let q_cols = self.num_heads * (projections.nope + rope);
        for (buffer, len, need) in [
            (
                "q",
                projections.q.len(),
                reach(projections.q_stride, q_cols),
            ),
            (
                "kv_a",
                projections.kv_a.len(),
                reach(projections.kv_stride, width),
            ),
            ("q_lat", q_lat.len(), rows * self.num_heads * width),
        ] {
            if rows > 0 && len < need {
                return Err(PlanError::RowsExceedBuffer {
                    planned: rows,
                    buffer,
                    rows: len / need.div_ceil(rows.max(1)).max(1),
                }
                .into());
            }
        }
        let slots = layout.num_blocks * layout.block_size;
        if let Some(slot) = plan.max_slot().filter(|&s| s as u64 >= slots) {
            return Err(AttentionError::OutsidePool {
                what: "slot",
                index: slot as u64,
                limit: slots,
            });
        }
        let table_rows = (rotary.cos_sin.len() / rope).min(rotary.positions);
        if let Some(p) = plan.max_position().filter(|&p| p as usize >= table_rows) {
            return Err(AttentionError::Shape(format!(
                "position {p} past the rotary table's {table_rows} positions"
            )));
        }
        if (cache.len() as u64) < layout.layer_elems() {
            return Err(AttentionError::Shape(format!(
                "a cache of {} elements under a layer of {}",
                cache.len(),
                layout.layer_elems()
            )));
        }
        let (positions, slot_mapping) = (plan.positions(), plan.slot_mapping());
        let rot = MlaRotary {
            cos_sin: rotary.cos_sin,
            table_positions: table_rows,
            interleaved: rotary.interleaved,
            positions: &positions,
            slot_mapping: &slot_mapping,
        };
        let heads = self.num_heads;
        kernel::mla_prepare(
            kernels,
            stream,
            projections,
            rot,
            heads,
            rows,
            cache,
            layout,
            q_lat,
        )?;
        Ok(())
    }

    /// Attention of the planned rows of `q` (`[rows, num_heads, latent + rope]`) into `o`
    /// (`[rows, num_heads, latent]`) over one layer's latent `cache` laid out as `layout`
    /// (one KV head as wide as a cache row). Refused on the host, nothing launched, when
    /// the plan covers more rows than q or o hold, names a block past the pool, or plans
    /// rows of the prefill kernel where there is none for this device and shape
    /// ([`runs_prefill`](kernel::runs_prefill): there each sequence must feed one row).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        q: &CudaView<bf16>,
        cache: &CudaSlice<bf16>,
        layout: &KvLayout,
        plan: &DeviceAttentionPlan,
        o: &mut CudaViewMut<bf16>,
    ) -> Result<(), AttentionError> {
        let width = layout.head_dim as usize;
        let (nh, latent) = (self.num_heads, self.latent);
        let problem = if layout.num_kv_heads != 1 {
            Some(format!(
                "a latent cache has one row a token, not {} heads",
                layout.num_kv_heads
            ))
        } else if nh == 0 || latent == 0 || latent > width || width > kernel::MAX_WIDTH {
            Some(format!(
                "{nh} heads of a latent of {latent} over rows of {width}"
            ))
        } else if !latent.is_multiple_of(8) || !width.is_multiple_of(8) {
            Some(format!(
                "a latent of {latent} in rows of {width}: both must be multiples of 8"
            ))
        } else if !(kernel::COMBINE_THREADS as usize).is_multiple_of(latent) {
            Some(format!(
                "latent {latent} does not divide the combine's {} threads",
                kernel::COMBINE_THREADS
            ))
        } else if layout.block_size == 0 {
            Some("block size 0".into())
        } else if plan.live_counts().prefill > 0 && !kernel::runs_prefill(kernels, latent, width) {
            Some(format!(
                "latent attention of a latent of {latent} in rows of {width} runs one row a \
                 sequence (decode) only on this device"
            ))
        } else {
            None
        };
        if let Some(p) = problem {
            return Err(AttentionError::Shape(p));
        }
        plan.check_fits(q.len() / (nh * width), o.len() / (nh * latent))?;
        plan.check_blocks(layout)?;
        if (cache.len() as u64) < layout.layer_elems() {
            return Err(AttentionError::Shape(format!(
                "a cache of {} elements under a layer of {}",
                cache.len(),
                layout.layer_elems()
            )));
        }
        if plan.rows() == 0 {
            return Ok(());
        }
        let mut scratch = plan.scratch();
        plan.ensure_scratch(&mut scratch, nh, latent)?;
        let scratch = scratch.as_mut().expect("scratch allocated above");
        let heads = MlaHeads {
            num_heads: nh,
            latent,
            scale: self.scale,
        };
        kernel::mla_attention(
            kernels,
            stream,
            q,
            cache,
            layout,
            heads,
            &plan.meta(),
            scratch,
            o,
        )?;
        Ok(())
    }
}

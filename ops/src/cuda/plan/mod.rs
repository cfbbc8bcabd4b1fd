//! One step's attention metadata on the device, staged from the host [`AttentionPlan`]
//! (planned over the real tokens) into buffers the plan keeps from step to step.
//!
//! Two layouts, one staging path:
//! - **Growing** (eager steps): the arrays are packed one after another and the buffers
//!   grow when a step needs more, so a step allocates nothing once the largest has run.
//! - **Fixed** ([`DeviceAttentionPlan::fixed`], for captured graphs): every array is a
//!   [`StagedInput`] at its own offset, allocated once for the largest captured batch, with
//!   its batch axis declared. A batch is padded up to a captured size: positions and
//!   per-sequence entries repeat the last real one, slot mappings point at the scratch slot.
//!   The grids are those of the captured size; the kernels read how many work items are
//!   live from the device and the blocks past them return.
//!
//! Either way a step is two copies to the device (the `i32` arrays and the `i64` arrays).

use crate::attention::{AttentionPlan, PlanError};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError};
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::attention::{
    AttentionMeta, AttentionWork, DecodeKernel, SeqRows, WorkCounts, LIVE_COUNTS, PARTITION_TOKENS,
    SPLIT_MAX_ROWS,
};
use peregrine_runtime::cuda::Gpu;

use std::sync::{Arc, Mutex};

use super::attention_error::AttentionError;
use fixed::{stage_fixed, FixedInputs, FixedStep};
use host::{SeqArrays, StepRows};

mod fixed;
mod host;

/// What a fixed-layout plan has room for: the steps of a decode (or verification) graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanCapacity {
    /// Query rows, and sequences (at most one row each is what decode graphs run; more
    /// rows per sequence fit as long as the rows do).
    pub rows: usize,
    /// Whether every step is a decode step (one row a sequence), as in a decode graph: its
    /// attention launches the split kernel of one new token a sequence. Other graphs'
    /// steps (verification) have up to [`SPLIT_MAX_ROWS`] rows a sequence, cut into decode
    /// rows, and launch the split kernel that reads a sequence's earlier rows of the step
    /// from qkv.
    pub decode_only: bool,
    /// The longest context a sequence may have: longer steps run eagerly.
    pub max_context: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The slot padded rows write their keys and values into, one no sequence owns.
    pub scratch_slot: i64,
}

impl PlanCapacity {
    /// Block ids one sequence's table may hold.
    pub fn blocks_per_seq(&self) -> usize {
        self.max_context.div_ceil(self.block_size)
    }

    /// The grids (and scratch layout) of a step of one-row sequences padded to `rows` rows,
    /// with contexts up to `max_context` tokens, whose rows go to the `decode` kernel: a grid
    /// is empty where no such step has work (no combine when a context fits one partition).
    pub fn grid(&self, rows: usize, max_context: usize, decode: DecodeKernel) -> WorkCounts {
        let partitions = max_context.div_ceil(PARTITION_TOKENS);
        match decode {
            DecodeKernel::Split => WorkCounts {
                split: rows * partitions,
                decode: if partitions > 1 { rows } else { 0 },
                prefill: 0,
            },
            DecodeKernel::Prefill => WorkCounts {
                split: 0,
                decode: 0,
                prefill: rows,
            },
        }
    }
}

/// Where each array starts in the packed `i32` and `i64` buffers, and how long it is.
#[derive(Clone, Copy, Debug, Default)]
struct Offsets {
    tokens: (usize, usize),
    logit_rows: (usize, usize),
    positions: (usize, usize),
    q_start: (usize, usize),
    q_len: (usize, usize),
    context_len: (usize, usize),
    step_tokens: (usize, usize),
    block_table: (usize, usize),
    split: (usize, usize),
    decode: (usize, usize),
    prefill: (usize, usize),
    live: (usize, usize),
    slot_mapping: (usize, usize),
    table_start: (usize, usize),
}

/// The host numbers of the staged step that the checks need (docs/architecture.md, rule 3).
#[derive(Clone, Copy, Debug, Default)]
struct StepNumbers {
    /// Query rows planned: the real tokens.
    rows: usize,
    /// Rows the token-wise kernels run over: the real ones, or the captured size.
    padded_rows: usize,
    /// Rows whose logits are computed (padded like the rows in a fixed plan).
    logit_rows: usize,
    /// Sequences as the kernels see them (after any cut).
    num_seqs: usize,
    /// The most step tokens of one of them (`PlannedSeq::step_tokens`).
    step_rows: usize,
    max_context_len: usize,
    max_block: Option<u32>,
    max_slot: Option<i64>,
    max_position: Option<u32>,
}

impl StepNumbers {
    /// The numbers of a step over the kernels' `plan` (after any cut), run over
    /// `padded_rows` rows with `logit_rows` logit rows.
    fn of(plan: &AttentionPlan, padded_rows: usize, logit_rows: usize) -> StepNumbers {
        StepNumbers {
            rows: plan.rows(),
            padded_rows,
            logit_rows,
            num_seqs: plan.seqs().len(),
            step_rows: plan.seqs().iter().map(|s| s.step_tokens).max().unwrap_or(0),
            max_context_len: plan.seqs().iter().map(|s| s.context_len).max().unwrap_or(0),
            max_block: plan
                .seqs()
                .iter()
                .flat_map(|s| s.block_table.iter())
                .copied()
                .max(),
            max_slot: plan.slot_mapping().iter().copied().max(),
            max_position: plan.positions().iter().copied().max(),
        }
    }
}

/// One step's attention metadata on the device (see the module docs). Stage each step with
/// [`DeviceAttentionPlan::stage`], then use it for every layer, on the stream of the `Gpu`
/// it was made with.
pub struct DeviceAttentionPlan {
    step: StepNumbers,
    /// This step's work items.
    live: WorkCounts,
    /// The work items the kernels are launched for (and the scratch is laid out by).
    grid: WorkCounts,
    decode_kernel: DecodeKernel,
    /// Sequences of up to this many rows are cut into one-row sequences where one-row
    /// sequences go to the split kernel.
    cut_rows: usize,
    fixed: Option<FixedInputs>,
    at: Offsets,
    host_ints: Vec<i32>,
    host_longs: Vec<i64>,
    ints: CudaSlice<i32>,
    longs: CudaSlice<i64>,
    /// Split-partition scratch: at the grid's size for a fixed layout, else grown at the
    /// first call that knows the heads (or by `reserve_scratch`).
    scratch: Mutex<Option<CudaSlice<f32>>>,
    stream: Arc<CudaStream>,
}

/// Appends `part` to `all` and returns its (start, length).
fn pack<T: Copy>(all: &mut Vec<T>, part: &[T]) -> (usize, usize) {
    all.extend_from_slice(part);
    (all.len() - part.len(), part.len())
}

/// The live counts as the kernels read them (`[split, decode, prefill]`).
fn live_array(c: WorkCounts) -> [i32; LIVE_COUNTS] {
    [c.split as i32, c.decode as i32, c.prefill as i32]
}

impl DeviceAttentionPlan {
    /// An empty plan of the growing layout, for eager steps; one-token sequences go to the
    /// `decode` kernel.
    pub fn growing(gpu: &Gpu, decode: DecodeKernel) -> Result<DeviceAttentionPlan, DriverError> {
        Ok(DeviceAttentionPlan {
            step: StepNumbers::default(),
            live: WorkCounts::default(),
            grid: WorkCounts::default(),
            decode_kernel: decode,
            cut_rows: SPLIT_MAX_ROWS,
            fixed: None,
            at: Offsets::default(),
            host_ints: Vec::new(),
            host_longs: Vec::new(),
            ints: gpu.stream().alloc_zeros(1)?,
            longs: gpu.stream().alloc_zeros(1)?,
            scratch: Mutex::new(None),
            stream: gpu.stream().clone(),
        })
    }

    /// [`DeviceAttentionPlan::growing`] staged with `plan` alone (token ids 0, no logit
    /// rows): for the attention ops, which read neither.
    pub fn upload(
        gpu: &Gpu,
        plan: &AttentionPlan,
        decode: DecodeKernel,
    ) -> Result<DeviceAttentionPlan, AttentionError> {
        let mut dplan = DeviceAttentionPlan::growing(gpu, decode)?;
        let tokens = vec![0; plan.rows()];
        dplan.stage(&tokens, plan, &[])?;
        Ok(dplan)
    }

    /// The same plan, cutting every sequence, however long, into one-row sequences where
    /// one-row sequences go to the split kernel: for latent attention, whose GPU kernel
    /// runs decode rows only (each row then sees the keys up to its own position).
    pub fn cutting_every_sequence(mut self) -> DeviceAttentionPlan {
        self.cut_rows = usize::MAX;
        self
    }

    /// Stages a step into a growing plan: `tokens` (one per row) over `plan` (planned over
    /// the real tokens), asking the logits of `logit_rows`.
    pub fn stage(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> Result<(), AttentionError> {
        if self.fixed.is_some() {
            return Err(AttentionError::Shape(
                "a fixed plan stages a step padded to a captured size".into(),
            ));
        }
        let step = StepRows::new(tokens, plan, logit_rows)?;
        self.stage_step(&step, plan.rows(), 0, false)
    }

    /// Stages `plan` (planned over the real tokens) into a fixed plan for a graph of
    /// `padded_rows` rows (the token-wise kernels run over all of them) whose grids serve
    /// contexts up to `max_context`. Refused, with nothing staged, when the step does not
    /// fit them.
    pub fn stage_padded(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        padded_rows: usize,
        max_context: usize,
    ) -> Result<(), AttentionError> {
        let step = StepRows::new(tokens, plan, logit_rows)?;
        self.stage_fixed(&step, padded_rows, max_context, false)
    }

    /// [`stage_padded`](Self::stage_padded) but for the token ids, which stay as the device
    /// holds them: the step's tokens were written there by the step before it (a decode
    /// graph's argmax, [`token_ids_mut`](Self::token_ids_mut)), queued ahead of this copy.
    pub fn stage_fed(
        &mut self,
        plan: &AttentionPlan,
        logit_rows: &[usize],
        padded_rows: usize,
        max_context: usize,
    ) -> Result<(), AttentionError> {
        let placeholders = vec![0; plan.rows()];
        let step = StepRows::new(&placeholders, plan, logit_rows)?;
        self.stage_fixed(&step, padded_rows, max_context, true)
    }

    /// [`stage_step`](Self::stage_step) into a fixed plan, refused for a growing one or
    /// past the contexts its grids serve.
    fn stage_fixed(
        &mut self,
        step: &StepRows,
        padded_rows: usize,
        max_context: usize,
        keep_tokens: bool,
    ) -> Result<(), AttentionError> {
        match &self.fixed {
            None => Err(AttentionError::Shape(
                "a growing plan stages the real rows only".into(),
            )),
            Some(f) if max_context > f.capacity.max_context => Err(AttentionError::Shape(format!(
                "grids for contexts of {max_context} tokens past the plan's {}",
                f.capacity.max_context
            ))),
            Some(_) => self.stage_step(step, padded_rows, max_context, keep_tokens),
        }
    }

    /// [`stage`](Self::stage), [`stage_padded`](Self::stage_padded) or
    /// [`stage_fed`](Self::stage_fed) (`keep_tokens`: the token ids are not copied),
    /// checked.
    fn stage_step(
        &mut self,
        rows: &StepRows,
        padded_rows: usize,
        max_context: usize,
        keep_tokens: bool,
    ) -> Result<(), AttentionError> {
        // Where one-row sequences go to the split kernel, so do the rows of short
        // sequences, cut into one-row sequences (positions, slots and rows unchanged).
        let cut = match self.decode_kernel {
            DecodeKernel::Split => rows.plan.one_row_sequences(self.cut_rows),
            DecodeKernel::Prefill => None,
        };
        let plan = cut.as_ref().unwrap_or(rows.plan);
        let shapes: Vec<SeqRows> = plan
            .seqs()
            .iter()
            .map(|s| SeqRows {
                q_len: s.q_len,
                context_len: s.context_len,
            })
            .collect();
        let work = AttentionWork::new(&shapes, self.decode_kernel);
        let positions: Vec<i32> = plan.positions().iter().map(|&p| p as i32).collect();
        let logit_rows = match self.fixed {
            Some(_) => padded_rows,
            None => rows.logit_rows.len(),
        };
        let step = StepNumbers::of(plan, padded_rows, logit_rows);
        let (ints_len, longs_len) = match self.fixed.as_mut() {
            None => self.pack_growing(rows, plan, &positions, &work)?,
            Some(f) => {
                let (ints, longs) = (&mut self.host_ints, &mut self.host_longs);
                let grid = f
                    .capacity
                    .grid(padded_rows, max_context, self.decode_kernel);
                let step = FixedStep {
                    plan,
                    rows,
                    work: &work,
                    positions: &positions,
                    padded: padded_rows,
                    max_context,
                    grid,
                };
                stage_fixed(f, ints, longs, &self.at, &step)?;
                self.grid = grid;
                let table = self.at.block_table.0 + padded_rows * f.capacity.blocks_per_seq();
                (table, longs.len())
            }
        };
        let scratch_slot = self.fixed.as_ref().map(|f| f.capacity.scratch_slot);
        self.step = StepNumbers {
            max_slot: match scratch_slot {
                Some(slot) if padded_rows > plan.rows() => step.max_slot.max(Some(slot)),
                _ => step.max_slot,
            },
            ..step
        };
        self.live = work.counts();
        self.copy_staged(keep_tokens, ints_len, longs_len)
    }

    /// Packs a growing plan's arrays of the step (`rows` over the kernels' `plan`, its
    /// `positions` and `work`) one after another, growing the device buffers to hold them;
    /// the lengths to copy.
    fn pack_growing(
        &mut self,
        rows: &StepRows,
        plan: &AttentionPlan,
        positions: &[i32],
        work: &AttentionWork,
    ) -> Result<(usize, usize), AttentionError> {
        let seq = SeqArrays::new(plan, None);
        let (ints, longs) = (&mut self.host_ints, &mut self.host_longs);
        ints.clear();
        longs.clear();
        self.at = Offsets {
            tokens: pack(ints, &rows.tokens),
            logit_rows: pack(ints, &rows.logit_rows),
            positions: pack(ints, positions),
            q_start: pack(ints, &seq.q_start),
            q_len: pack(ints, &seq.q_len),
            context_len: pack(ints, &seq.context_len),
            step_tokens: pack(ints, &seq.step_tokens),
            block_table: pack(ints, &seq.block_table),
            split: pack(ints, &work.split),
            decode: pack(ints, &work.decode),
            prefill: pack(ints, &work.prefill),
            live: pack(ints, &live_array(work.counts())),
            slot_mapping: pack(longs, plan.slot_mapping()),
            table_start: pack(longs, &seq.table_start),
        };
        self.grid = work.counts();
        grow(&self.stream, &mut self.ints, ints.len())?;
        grow(&self.stream, &mut self.longs, longs.len())?;
        Ok((ints.len(), longs.len()))
    }

    /// Copies the staged step to the device: the first `ints_len` and `longs_len` entries,
    /// less the token ids when `keep_tokens`.
    fn copy_staged(
        &mut self,
        keep_tokens: bool,
        ints_len: usize,
        longs_len: usize,
    ) -> Result<(), AttentionError> {
        // One copy of each kind: the rows a fixed plan's step uses, all of a growing one's
        // (around the token ids where they stay: they are packed first).
        let (tokens_at, tokens_len) = self.at.tokens;
        let from = if keep_tokens {
            assert_eq!(tokens_at, 0, "the token ids are not packed first");
            tokens_len
        } else {
            0
        };
        self.stream.memcpy_htod(
            &self.host_ints[from..ints_len],
            &mut self.ints.slice_mut(from..ints_len),
        )?;
        if longs_len > 0 {
            self.stream.memcpy_htod(
                &self.host_longs[..longs_len],
                &mut self.longs.slice_mut(0..longs_len),
            )?;
        }
        Ok(())
    }

    /// The token id of every padded row, for a kernel to write: a decode graph's argmax
    /// writes there the tokens of the step after it ([`DeviceAttentionPlan::stage_fed`]).
    pub fn token_ids_mut(&mut self) -> CudaViewMut<'_, i32> {
        let start = self.at.tokens.0;
        self.ints.slice_mut(start..start + self.step.padded_rows)
    }

    /// The kernel one-row sequences go to.
    pub fn decode_kernel(&self) -> DecodeKernel {
        self.decode_kernel
    }

    /// Whether the split kernel writes this step's keys and values itself (its
    /// `forward_writing_kv`): every row goes to the split kernel, a decode step's and a
    /// verification step's alike (its rows cut into the decode rows they would be, each
    /// reading its sequence's earlier rows of this step from qkv, never from a slot that
    /// another block of the launch writes), [`step_rows`](Self::step_rows) at most
    /// [`SPLIT_MAX_ROWS`]. A fixed plan of the split kernel has no prefill items, so every
    /// step a graph replays answers as its capture did.
    pub fn fuses_kv_write(&self) -> bool {
        self.decode_kernel == DecodeKernel::Split
            && self.live.prefill == 0
            && self.step_rows() <= SPLIT_MAX_ROWS
    }

    /// The most step tokens of one sequence ([`step_tokens`](Self::step_tokens)) that the
    /// split kernel's launch must hold: this step's, or in a fixed plan any step's it
    /// stages (1 in a decode graph's, else the most rows a cut sequence has, unbounded
    /// where every sequence is cut), so that a graph's kernel serves every step it
    /// replays.
    pub fn step_rows(&self) -> usize {
        match &self.fixed {
            Some(f) if f.capacity.decode_only => 1,
            Some(_) => self.cut_rows,
            None => self.step.step_rows,
        }
    }

    /// This step's tokens at the end of each sequence's context (the kernels' sequences,
    /// after any cut): [`PlannedSeq::step_tokens`](crate::attention::PlannedSeq::step_tokens).
    pub fn step_tokens(&self) -> CudaView<'_, i32> {
        self.int_array(self.at.step_tokens)
    }

    /// Query rows planned: the real token count of the step.
    pub fn rows(&self) -> usize {
        self.step.rows
    }

    /// Rows the token-wise kernels (the KV write, rotary) run over: [`rows`](Self::rows),
    /// or the captured size a graph pads the step to.
    pub fn padded_rows(&self) -> usize {
        self.step.padded_rows
    }

    /// Sequences planned.
    pub fn num_seqs(&self) -> usize {
        self.step.num_seqs
    }

    /// The longest context of the step.
    pub fn max_context_len(&self) -> usize {
        self.step.max_context_len
    }

    /// This step's work items.
    pub fn live_counts(&self) -> WorkCounts {
        self.live
    }

    /// Token id of every row, `padded_rows()` entries.
    pub fn token_ids(&self) -> CudaView<'_, i32> {
        self.int_array((self.at.tokens.0, self.step.padded_rows))
    }

    /// The rows whose logits the step computes: those asked for, or, in a fixed plan, the
    /// captured size of them (padded by repeating the last).
    pub fn logit_rows(&self) -> CudaView<'_, i32> {
        self.int_array((self.at.logit_rows.0, self.step.logit_rows))
    }

    /// Position of every row, `padded_rows()` entries.
    pub fn positions(&self) -> CudaView<'_, i32> {
        self.int_array((self.at.positions.0, self.step.padded_rows))
    }

    /// Cache slot of every row, `padded_rows()` entries (padded rows: the scratch slot).
    pub fn slot_mapping(&self) -> CudaView<'_, i64> {
        self.long_array((self.at.slot_mapping.0, self.step.padded_rows))
    }

    /// Largest slot the step writes, if any.
    pub(super) fn max_slot(&self) -> Option<i64> {
        self.step.max_slot
    }

    /// Largest position of the step, if any.
    pub(super) fn max_position(&self) -> Option<u32> {
        self.step.max_position
    }

    fn int_array(&self, (start, len): (usize, usize)) -> CudaView<'_, i32> {
        self.ints.slice(start..start + len)
    }

    fn long_array(&self, (start, len): (usize, usize)) -> CudaView<'_, i64> {
        self.longs.slice(start..start + len)
    }

    /// f32 elements of split scratch the grid needs for `num_heads` heads of `head_dim`.
    pub fn scratch_floats(&self, num_heads: usize, head_dim: usize) -> usize {
        self.grid.scratch_floats(num_heads, head_dim)
    }

    /// Allocates the split scratch for `num_heads` heads of `head_dim` now (a forward does
    /// it on first use otherwise); later forwards with no more heads reuse it.
    pub fn reserve_scratch(&self, num_heads: usize, head_dim: usize) -> Result<(), DriverError> {
        let mut slot = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.ensure_scratch(&mut slot, num_heads, head_dim)
    }

    /// The scratch, grown to the grid's need if this is a growing plan (a fixed plan's was
    /// allocated at its capacity and never moves).
    pub(super) fn ensure_scratch(
        &self,
        slot: &mut Option<CudaSlice<f32>>,
        num_heads: usize,
        head_dim: usize,
    ) -> Result<(), DriverError> {
        // One element at least: an all-prefill step still passes a valid pointer.
        let need = self.scratch_floats(num_heads, head_dim).max(1);
        if slot.as_ref().is_none_or(|s| s.len() < need) {
            assert!(
                self.fixed.is_none() || slot.is_none(),
                "a fixed plan's scratch cannot grow: the graphs read its address"
            );
            // SAFETY: the split kernel writes every record before the combine kernel
            // reads it, so the scratch is never read uninitialised.
            *slot = Some(unsafe { self.stream.alloc::<f32>(need) }?);
        }
        Ok(())
    }

    /// The scratch's lock.
    pub(super) fn scratch(&self) -> std::sync::MutexGuard<'_, Option<CudaSlice<f32>>> {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses the plan if it covers more rows than `q_rows` / `o_rows`
    /// (`AttentionPlan::check_fits`, on the host numbers kept at staging): its padded rows,
    /// which its grid covers, so that a plan padded for a graph is refused over the q and o
    /// of a step's real rows (docs/architecture.md, rule 3).
    pub(super) fn check_fits(&self, q_rows: usize, o_rows: usize) -> Result<(), PlanError> {
        let planned = self.step.padded_rows.max(self.step.rows);
        for (buffer, rows) in [("q", q_rows), ("o", o_rows)] {
            if planned > rows {
                return Err(PlanError::RowsExceedBuffer {
                    planned,
                    buffer,
                    rows,
                });
            }
        }
        Ok(())
    }

    /// Refuses the plan if it names a block past the pool of `layout` (or past the i32
    /// block table).
    pub(super) fn check_blocks(&self, layout: &KvLayout) -> Result<(), AttentionError> {
        let limit = layout.num_blocks.min(i32::MAX as u64 + 1);
        match self.step.max_block {
            Some(block) if block as u64 >= limit => Err(AttentionError::OutsidePool {
                what: "block",
                index: block as u64,
                limit,
            }),
            _ => Ok(()),
        }
    }

    pub(super) fn meta(&self) -> AttentionMeta<'_> {
        AttentionMeta {
            q_start: self.int_array(self.at.q_start),
            q_len: self.int_array(self.at.q_len),
            context_len: self.int_array(self.at.context_len),
            table_start: self.long_array(self.at.table_start),
            block_table: self.int_array(self.at.block_table),
            split: self.int_array(self.at.split),
            decode: self.int_array(self.at.decode),
            prefill: self.int_array(self.at.prefill),
            live: self.int_array(self.at.live),
            num_seqs: self.step.num_seqs,
            counts: self.grid,
            rows: self.step.rows,
        }
    }
}

/// Makes `buffer` hold at least `len` elements (a growing plan's buffers; the contents need
/// not survive: the step's copy follows).
fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buffer: &mut CudaSlice<T>,
    len: usize,
) -> Result<(), DriverError> {
    if buffer.len() < len {
        *buffer = stream.alloc_zeros(len.max(buffer.len() * 3 / 2))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_grid_launches_only_what_its_steps_can_use() {
        let cap = PlanCapacity {
            rows: 64,
            decode_only: true,
            max_context: 8192,
            block_size: 16,
            scratch_slot: 0,
        };
        assert_eq!(cap.blocks_per_seq(), 512);
        let short = cap.grid(8, 512, DecodeKernel::Split);
        assert_eq!((short.split, short.decode, short.prefill), (8, 0, 0));
        let long = cap.grid(8, 8192, DecodeKernel::Split);
        assert_eq!((long.split, long.decode, long.prefill), (128, 8, 0));
        let invariant = cap.grid(8, 8192, DecodeKernel::Prefill);
        assert_eq!(
            (invariant.split, invariant.decode, invariant.prefill),
            (0, 0, 8)
        );
    }
}

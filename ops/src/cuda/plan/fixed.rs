//! The fixed layout of a plan (for captured graphs): every array a staged input at its own
//! offset, allocated once for the largest captured batch, and a step staged into it padded
//! to a captured size.

use super::host::{SeqArrays, StepRows};
use super::{
    live_array, pack, AttentionError, DeviceAttentionPlan, Offsets, PlanCapacity, StepNumbers,
};
use crate::attention::AttentionPlan;
use peregrine_kernels::cuda::attention::{
    AttentionWork, DecodeKernel, WorkCounts, LIVE_COUNTS, SPLIT_MAX_ROWS,
};
use peregrine_runtime::cuda::Gpu;
use peregrine_runtime::{Padding, StageError, StagedInput};
use std::sync::Mutex;

/// The fixed layout's inputs, each with its batch axis.
pub(super) struct FixedInputs {
    pub(super) capacity: PlanCapacity,
    tokens: StagedInput<i32>,
    logit_rows: StagedInput<i32>,
    positions: StagedInput<i32>,
    q_start: StagedInput<i32>,
    q_len: StagedInput<i32>,
    context_len: StagedInput<i32>,
    step_tokens: StagedInput<i32>,
    block_table: StagedInput<i32>,
    split: StagedInput<i32>,
    decode: StagedInput<i32>,
    prefill: StagedInput<i32>,
    slot_mapping: StagedInput<i64>,
    table_start: StagedInput<i64>,
}

impl DeviceAttentionPlan {
    /// A plan of the fixed layout with room for `capacity`, its scratch allocated for
    /// `num_heads` heads of `head_dim`, for captured graphs: its buffers never move.
    pub fn fixed(
        gpu: &Gpu,
        decode: DecodeKernel,
        capacity: PlanCapacity,
        num_heads: usize,
        head_dim: usize,
    ) -> Result<DeviceAttentionPlan, AttentionError> {
        let stage = |e: StageError| AttentionError::Shape(e.to_string());
        let n = capacity.rows;
        let grid = capacity.grid(n, capacity.max_context, decode);
        let repeat = |name, shape: &[usize]| StagedInput::new(name, shape, 0, Padding::RepeatLast);
        let fill = |name, shape: &[usize]| StagedInput::new(name, shape, 0, Padding::Fill(0));
        let inputs = FixedInputs {
            capacity,
            tokens: repeat("token_ids", &[n]).map_err(stage)?,
            logit_rows: repeat("logit_rows", &[n]).map_err(stage)?,
            positions: repeat("positions", &[n]).map_err(stage)?,
            q_start: repeat("q_start", &[n]).map_err(stage)?,
            q_len: repeat("q_len", &[n]).map_err(stage)?,
            context_len: repeat("context_len", &[n]).map_err(stage)?,
            step_tokens: repeat("step_tokens", &[n]).map_err(stage)?,
            block_table: repeat("block_table", &[n, capacity.blocks_per_seq()]).map_err(stage)?,
            split: fill("split_work", &[grid.split.max(1), 2]).map_err(stage)?,
            decode: fill("decode_work", &[grid.decode.max(1), 2]).map_err(stage)?,
            prefill: fill("prefill_work", &[grid.prefill.max(1), 2]).map_err(stage)?,
            slot_mapping: StagedInput::new(
                "slot_mapping",
                &[n],
                0,
                Padding::Fill(capacity.scratch_slot),
            )
            .map_err(stage)?,
            table_start: StagedInput::new("table_start", &[n], 0, Padding::RepeatLast)
                .map_err(stage)?,
        };
        let (mut ints, mut longs) = (Vec::new(), Vec::new());
        let at = Offsets {
            tokens: pack(&mut ints, inputs.tokens.as_slice()),
            logit_rows: pack(&mut ints, inputs.logit_rows.as_slice()),
            positions: pack(&mut ints, inputs.positions.as_slice()),
            q_start: pack(&mut ints, inputs.q_start.as_slice()),
            q_len: pack(&mut ints, inputs.q_len.as_slice()),
            context_len: pack(&mut ints, inputs.context_len.as_slice()),
            step_tokens: pack(&mut ints, inputs.step_tokens.as_slice()),
            split: pack(&mut ints, inputs.split.as_slice()),
            decode: pack(&mut ints, inputs.decode.as_slice()),
            prefill: pack(&mut ints, inputs.prefill.as_slice()),
            live: pack(&mut ints, &[0; LIVE_COUNTS]),
            // Last, so that a step copies its padded rows of the table and nothing after.
            block_table: pack(&mut ints, inputs.block_table.as_slice()),
            slot_mapping: pack(&mut longs, inputs.slot_mapping.as_slice()),
            table_start: pack(&mut longs, inputs.table_start.as_slice()),
        };
        let plan = DeviceAttentionPlan {
            step: StepNumbers::default(),
            live: WorkCounts::default(),
            grid,
            decode_kernel: decode,
            cut_rows: SPLIT_MAX_ROWS,
            fixed: Some(inputs),
            at,
            ints: gpu.stream().clone_htod(&ints)?,
            longs: gpu.stream().clone_htod(&longs)?,
            host_ints: ints,
            host_longs: longs,
            scratch: Mutex::new(None),
            stream: gpu.stream().clone(),
        };
        plan.reserve_scratch(num_heads, head_dim)?;
        Ok(plan)
    }
}

/// One step for a fixed plan: the host plan and its work lists, padded to `padded` rows,
/// for grids `grid` that serve contexts up to `max_context`.
pub(super) struct FixedStep<'a> {
    /// The plan the kernels see: the step's, or its short sequences cut into rows.
    pub(super) plan: &'a AttentionPlan,
    pub(super) rows: &'a StepRows<'a>,
    pub(super) work: &'a AttentionWork,
    pub(super) positions: &'a [i32],
    pub(super) padded: usize,
    pub(super) max_context: usize,
    pub(super) grid: WorkCounts,
}

/// Stages `step` into the fixed inputs `f` and packs them into the host arrays at their
/// offsets `at`; refused when it does not fit.
pub(super) fn stage_fixed(
    f: &mut FixedInputs,
    ints: &mut [i32],
    longs: &mut [i64],
    at: &Offsets,
    step: &FixedStep,
) -> Result<(), AttentionError> {
    let FixedStep {
        plan,
        rows: step_rows,
        work,
        positions,
        padded,
        ..
    } = *step;
    check_fits(f.capacity, step)?;
    let (rows, seqs) = (plan.rows(), plan.seqs().len());
    let cap = f.capacity;
    let stage = |e: StageError| AttentionError::Shape(e.to_string());
    let bps = cap.blocks_per_seq();
    let mut seq = SeqArrays::new(plan, Some(bps));
    for (i, start) in seq.table_start.iter_mut().enumerate() {
        *start = (i * bps) as i64;
    }
    // The per-sequence arrays pad to the captured size too (repeating the last sequence),
    // though the work lists name only the real sequences.
    let real_logits = step_rows.logit_rows.len();
    for (offset, input, real, real_batch) in [
        (at.tokens, &mut f.tokens, &step_rows.tokens[..], rows),
        (
            at.logit_rows,
            &mut f.logit_rows,
            &step_rows.logit_rows[..],
            real_logits,
        ),
        (at.positions, &mut f.positions, positions, rows),
        (at.q_start, &mut f.q_start, &seq.q_start[..], seqs),
        (at.q_len, &mut f.q_len, &seq.q_len[..], seqs),
        (
            at.context_len,
            &mut f.context_len,
            &seq.context_len[..],
            seqs,
        ),
        (
            at.step_tokens,
            &mut f.step_tokens,
            &seq.step_tokens[..],
            seqs,
        ),
        (
            at.block_table,
            &mut f.block_table,
            &seq.block_table[..],
            seqs,
        ),
    ] {
        put(ints, offset, input, real, real_batch, padded).map_err(stage)?;
    }
    for (input, offset, list) in [
        (&mut f.split, at.split, &work.split),
        (&mut f.decode, at.decode, &work.decode),
        (&mut f.prefill, at.prefill, &work.prefill),
    ] {
        let most = input.max_batch();
        put(ints, offset, input, list, list.len() / 2, most).map_err(stage)?;
    }
    let (start, len) = at.live;
    ints[start..start + len].copy_from_slice(&live_array(work.counts()));
    for (offset, input, real, real_batch) in [
        (
            at.slot_mapping,
            &mut f.slot_mapping,
            plan.slot_mapping(),
            rows,
        ),
        (
            at.table_start,
            &mut f.table_start,
            &seq.table_start[..],
            seqs,
        ),
    ] {
        put(longs, offset, input, real, real_batch, padded).map_err(stage)?;
    }
    Ok(())
}

/// Refuses `step` where it does not fit the plan's capacity `cap` or its grids.
fn check_fits(cap: PlanCapacity, step: &FixedStep) -> Result<(), AttentionError> {
    let FixedStep {
        plan,
        work,
        padded,
        max_context,
        grid,
        ..
    } = *step;
    let counts = work.counts();
    let (rows, seqs) = (plan.rows(), plan.seqs().len());
    let context = plan.seqs().iter().map(|s| s.context_len).max().unwrap_or(0);
    let step_rows = plan.seqs().iter().map(|s| s.step_tokens).max().unwrap_or(0);
    // A decode graph's kernel holds one step token a sequence; other graphs' sequences of
    // more rows than the split kernel takes are refused as prefill items.
    let most_step_rows = if cap.decode_only { 1 } else { usize::MAX };
    for (what, n, most) in [
        ("padded rows", padded, cap.rows),
        ("rows", rows, padded),
        ("sequences", seqs, padded),
        ("context", context, max_context),
        ("rows of a sequence", step_rows, most_step_rows),
        ("split items", counts.split, grid.split),
        ("decode items", counts.decode, grid.decode),
        ("prefill items", counts.prefill, grid.prefill),
    ] {
        if n > most {
            return Err(AttentionError::Shape(format!(
                "a step of {what} {n} does not fit a graph plan with room for {most}"
            )));
        }
    }
    Ok(())
}

/// Stages `real` (`real_batch` entries along its batch axis) into `input`, padded to
/// `batch`, and packs its first `batch` entries into `dst` at the offset `start`.
fn put<T: Copy + Default>(
    dst: &mut [T],
    (start, _): (usize, usize),
    input: &mut StagedInput<T>,
    real: &[T],
    real_batch: usize,
    batch: usize,
) -> Result<(), StageError> {
    input.stage(real, real_batch, batch)?;
    let len = input.as_slice().len() / input.max_batch().max(1) * batch;
    dst[start..start + len].copy_from_slice(&input.as_slice()[..len]);
    Ok(())
}

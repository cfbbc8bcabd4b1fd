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
use peregrine_runtime::{Padding, StageError, StagedInput};
use std::sync::{Arc, Mutex};

use super::attention_error::AttentionError;

/// What a fixed-layout plan has room for: the steps of a decode (or verification) graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanCapacity {
    /// Query rows, and sequences (at most one row each is what decode graphs run; more
    /// rows per sequence fit as long as the rows do).
    pub rows: usize,
    /// Whether every step is a decode step (one row a sequence), as in a decode graph: the
    /// split kernel then writes the step's keys and values itself. A verification graph's
    /// sequences have several rows, whose keys the KV write stores first.
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

/// The fixed layout's inputs, each with its batch axis.
struct FixedInputs {
    capacity: PlanCapacity,
    tokens: StagedInput<i32>,
    logit_rows: StagedInput<i32>,
    positions: StagedInput<i32>,
    q_start: StagedInput<i32>,
    q_len: StagedInput<i32>,
    context_len: StagedInput<i32>,
    block_table: StagedInput<i32>,
    split: StagedInput<i32>,
    decode: StagedInput<i32>,
    prefill: StagedInput<i32>,
    slot_mapping: StagedInput<i64>,
    table_start: StagedInput<i64>,
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
    /// Whether sequences of several rows were cut into one-row sequences for the split
    /// kernel ([`AttentionPlan::one_row_sequences`]).
    cut: bool,
    max_context_len: usize,
    max_block: Option<u32>,
    max_slot: Option<i64>,
    max_position: Option<u32>,
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

/// A step's token ids and logit rows as the kernels read them, with its plan.
struct StepRows<'a> {
    plan: &'a AttentionPlan,
    tokens: Vec<i32>,
    logit_rows: Vec<i32>,
}

impl<'a> StepRows<'a> {
    /// Refuses token ids that are not one per planned row, and logit rows past them.
    fn new(
        tokens: &[u32],
        plan: &'a AttentionPlan,
        logit_rows: &[usize],
    ) -> Result<StepRows<'a>, AttentionError> {
        if tokens.len() != plan.rows() {
            return Err(AttentionError::Shape(format!(
                "{} token ids for {} planned rows",
                tokens.len(),
                plan.rows()
            )));
        }
        if let Some(&row) = logit_rows.iter().find(|&&r| r >= plan.rows()) {
            return Err(AttentionError::Shape(format!(
                "logit row {row} of {} planned rows",
                plan.rows()
            )));
        }
        Ok(StepRows {
            plan,
            tokens: tokens.iter().map(|&t| t as i32).collect(),
            logit_rows: logit_rows.iter().map(|&r| r as i32).collect(),
        })
    }
}

/// A plan's per-sequence arrays on the host.
#[derive(Default)]
struct SeqArrays {
    q_start: Vec<i32>,
    q_len: Vec<i32>,
    context_len: Vec<i32>,
    table_start: Vec<i64>,
    block_table: Vec<i32>,
}

impl SeqArrays {
    /// The arrays of `plan`, each table starting `table_stride` entries after the last
    /// (its own length when `None`) and padded with its last id up to that stride. Without
    /// a stride, a sequence whose table is the one before it (the rows of a cut sequence)
    /// shares its entries.
    fn new(plan: &AttentionPlan, table_stride: Option<usize>) -> SeqArrays {
        let mut a = SeqArrays::default();
        let mut previous: Option<&[u32]> = None;
        for s in plan.seqs() {
            let table: &[u32] = &s.block_table;
            if table_stride.is_none() && previous == Some(table) {
                assert!(
                    s.q_start + s.q_len <= i32::MAX as usize,
                    "attention plan: rows past i32"
                );
                a.q_start.push(s.q_start as i32);
                a.q_len.push(s.q_len as i32);
                a.context_len.push(s.context_len as i32);
                let last = *a.table_start.last().expect("a sequence before");
                a.table_start.push(last);
                continue;
            }
            previous = Some(table);
            assert!(
                s.q_start + s.q_len <= i32::MAX as usize,
                "attention plan: rows past i32"
            );
            a.q_start.push(s.q_start as i32);
            a.q_len.push(s.q_len as i32);
            a.context_len.push(s.context_len as i32);
            a.table_start.push(a.block_table.len() as i64);
            // Ids past i32::MAX wrap here, but the ops refuse such a plan before launching.
            let start = a.block_table.len();
            a.block_table
                .extend(s.block_table.iter().map(|&b| b as i32));
            if let Some(stride) = table_stride {
                // Entries past the table are never read (the context bounds them).
                let last = s.block_table.last().map_or(0, |&b| b as i32);
                a.block_table.resize(start + stride, last);
            }
        }
        a
    }
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
        let step = StepNumbers {
            rows: plan.rows(),
            padded_rows,
            logit_rows: if self.fixed.is_some() {
                padded_rows
            } else {
                rows.logit_rows.len()
            },
            num_seqs: plan.seqs().len(),
            cut: cut.is_some(),
            max_context_len: plan.seqs().iter().map(|s| s.context_len).max().unwrap_or(0),
            max_block: plan
                .seqs()
                .iter()
                .flat_map(|s| s.block_table.iter())
                .copied()
                .max(),
            max_slot: plan.slot_mapping().iter().copied().max(),
            max_position: plan.positions().iter().copied().max(),
        };
        let (ints_len, longs_len) = match self.fixed.as_mut() {
            None => {
                let seq = SeqArrays::new(plan, None);
                let (ints, longs) = (&mut self.host_ints, &mut self.host_longs);
                ints.clear();
                longs.clear();
                self.at = Offsets {
                    tokens: pack(ints, &rows.tokens),
                    logit_rows: pack(ints, &rows.logit_rows),
                    positions: pack(ints, &positions),
                    q_start: pack(ints, &seq.q_start),
                    q_len: pack(ints, &seq.q_len),
                    context_len: pack(ints, &seq.context_len),
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
                (ints.len(), longs.len())
            }
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
    /// `forward_writing_kv`): a step of one-row sequences alone, through the split kernel,
    /// and in a fixed plan one whose every step is such (a decode graph). Where rows of
    /// one sequence were cut apart, each reads the others' keys from the cache, so the KV
    /// write runs first.
    pub fn fuses_kv_write(&self) -> bool {
        let decode_only = self.fixed.as_ref().is_none_or(|f| f.capacity.decode_only);
        self.decode_kernel == DecodeKernel::Split
            && decode_only
            && !self.step.cut
            && self.live.prefill == 0
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

/// One step for a fixed plan: the host plan and its work lists, padded to `padded` rows,
/// for grids `grid` that serve contexts up to `max_context`.
struct FixedStep<'a> {
    /// The plan the kernels see: the step's, or its short sequences cut into rows.
    plan: &'a AttentionPlan,
    rows: &'a StepRows<'a>,
    work: &'a AttentionWork,
    positions: &'a [i32],
    padded: usize,
    max_context: usize,
    grid: WorkCounts,
}

/// Stages `step` into the fixed inputs `f` and packs them into the host arrays at their
/// offsets `at`; refused when it does not fit.
fn stage_fixed(
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
        max_context,
        grid,
    } = *step;
    let cap = f.capacity;
    let too_big = |what: &str, n: usize, most: usize| {
        AttentionError::Shape(format!(
            "a step of {what} {n} does not fit a graph plan with room for {most}"
        ))
    };
    let counts = work.counts();
    let (rows, seqs) = (plan.rows(), plan.seqs().len());
    let context = plan.seqs().iter().map(|s| s.context_len).max().unwrap_or(0);
    for (what, n, most) in [
        ("padded rows", padded, cap.rows),
        ("rows", rows, padded),
        ("sequences", seqs, padded),
        ("context", context, max_context),
        ("split items", counts.split, grid.split),
        ("decode items", counts.decode, grid.decode),
        ("prefill items", counts.prefill, grid.prefill),
    ] {
        if n > most {
            return Err(too_big(what, n, most));
        }
    }
    let stage = |e: StageError| AttentionError::Shape(e.to_string());
    let bps = cap.blocks_per_seq();
    let mut seq = SeqArrays::new(plan, Some(bps));
    for (i, start) in seq.table_start.iter_mut().enumerate() {
        *start = (i * bps) as i64;
    }
    // Each input is staged (padded along its batch axis) and its first `batch` entries
    // packed at its offset.
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
    let (tokens, logit_rows) = (&step_rows.tokens, &step_rows.logit_rows);
    put(ints, at.tokens, &mut f.tokens, tokens, rows, padded).map_err(stage)?;
    let (real_logits, rows_at) = (logit_rows.len(), at.logit_rows);
    put(
        ints,
        rows_at,
        &mut f.logit_rows,
        logit_rows,
        real_logits,
        padded,
    )
    .map_err(stage)?;
    put(
        ints,
        at.positions,
        &mut f.positions,
        positions,
        rows,
        padded,
    )
    .map_err(stage)?;
    // The per-sequence arrays pad to the captured size too (repeating the last sequence),
    // though the work lists name only the real sequences.
    put(ints, at.q_start, &mut f.q_start, &seq.q_start, seqs, padded).map_err(stage)?;
    put(ints, at.q_len, &mut f.q_len, &seq.q_len, seqs, padded).map_err(stage)?;
    let context = &seq.context_len;
    put(
        ints,
        at.context_len,
        &mut f.context_len,
        context,
        seqs,
        padded,
    )
    .map_err(stage)?;
    let table = &seq.block_table;
    put(
        ints,
        at.block_table,
        &mut f.block_table,
        table,
        seqs,
        padded,
    )
    .map_err(stage)?;
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
    let slots = plan.slot_mapping();
    put(
        longs,
        at.slot_mapping,
        &mut f.slot_mapping,
        slots,
        rows,
        padded,
    )
    .map_err(stage)?;
    let starts = &seq.table_start;
    put(
        longs,
        at.table_start,
        &mut f.table_start,
        starts,
        seqs,
        padded,
    )
    .map_err(stage)?;
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

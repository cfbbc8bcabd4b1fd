//! Greedy decode steps with the next one queued ahead (vLLM's async scheduling): while a
//! step's tokens travel to the host, the device already runs the step after it, the same
//! sequences one position further, through the same graph. A decode graph's argmax writes
//! each token as the next step's token id and into page-locked host memory, so no copy
//! operation stands between two graphs on the stream (a small device-to-host copy costs
//! the stream about 9 us, a device-to-device one 2 us: `scripts/stream_op_costs.py`); the
//! next step's positions, slots and block tables are staged from the host as for any
//! replay. Launches alternate between the graph's two variants, which publish to two
//! host buffers, so the host reads one step's tokens while the next step writes the
//! other's.

use super::{CapturedDecode, GraphBuffers, GraphKind};
use crate::llama::check_inputs;
use crate::llama::cuda::{GpuForwardError, LlamaCore};
use cudarc::driver::CudaView;
use peregrine_kernels::cuda::sampling::ArgmaxCopies;
use peregrine_ops::cuda::attention::AttentionError;
use peregrine_ops::sampling::TokenMask;
use peregrine_ops::AttentionPlan;

/// The grammar masks of a greedy step's real rows (`None`: a row that takes the plain
/// argmax), waited for once the step's forward is queued, so that the host computes them
/// while the device runs it.
pub type StepMasks<'a> = Box<dyn FnOnce() -> anyhow::Result<Vec<Option<TokenMask>>> + 'a>;

/// What takes the layer inputs a greedy step recorded for its real rows (f32
/// `[rows, layers * hidden]`, as [`super::ReplayedStep::aux`]): queued on the stream after
/// the step and before the step queued ahead of it, which overwrites them.
pub type AuxHandOff<'a> =
    Box<dyn for<'v> FnOnce(CudaView<'v, f32>) -> Result<(), GpuForwardError> + 'a>;

/// A decode step that [`CapturedDecode::greedy_step`] queued ahead: its ids are read by
/// passing it back as [`GreedyInput::Queued`].
#[derive(Debug, PartialEq, Eq)]
pub struct QueuedStep {
    /// The size of the graph it runs through.
    size: usize,
    /// Its real rows (one per sequence).
    rows: usize,
    /// The variant it was launched as: where its tokens are published.
    variant: usize,
    /// The buffers' step count once it was queued: any later step overwrites its ids.
    step: u64,
}

impl QueuedStep {
    /// Its real rows: one per sequence.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The size of the graph it runs through.
    pub fn graph_size(&self) -> usize {
        self.size
    }
}

/// Where the tokens of a greedy decode step come from.
#[derive(Debug)]
pub enum GreedyInput<'a> {
    /// From the host: one token per sequence of the plan.
    Host {
        tokens: &'a [u32],
        plan: &'a AttentionPlan,
    },
    /// The step queued ahead by the call before, already on the device.
    Queued(QueuedStep),
}

impl CapturedDecode {
    /// Runs a greedy decode step through the graph and returns the argmax of each of its
    /// real rows, among what its mask of `masks` allows where it has one (the masked rows'
    /// logits are forbidden in place and the argmax taken again, before `next` reads it).
    /// With `next` (the same sequences, in the same order, each one position
    /// further), it first queues `next` through this graph, fed with this step's tokens on
    /// the device, and returns it for the next call to read as [`GreedyInput::Queued`];
    /// any other step over the graphs' buffers in between makes that call fail, as the
    /// tokens are gone.
    ///
    /// Refused, with nothing launched, for a verification graph, when either step does not
    /// fit the graph, when `next` has other rows than this step, or when a queued step is
    /// not this graph's or not the last one queued.
    pub fn greedy_step(
        &self,
        input: GreedyInput,
        next: Option<&AttentionPlan>,
        masks: Option<StepMasks>,
    ) -> Result<(Vec<u32>, Option<QueuedStep>), GpuForwardError> {
        self.greedy_step_handing_off(input, next, masks, None)
    }

    /// [`CapturedDecode::greedy_step`] that also gives the layer inputs the step recorded
    /// to `hand_off` (an EAGLE-3 head's features), before `next` is queued. Refused, with
    /// nothing launched, with a hand-off where the graph records no layer inputs.
    pub fn greedy_step_handing_off(
        &self,
        input: GreedyInput,
        next: Option<&AttentionPlan>,
        masks: Option<StepMasks>,
        hand_off: Option<AuxHandOff>,
    ) -> Result<(Vec<u32>, Option<QueuedStep>), GpuForwardError> {
        if self.kind != GraphKind::Decode {
            return Err(AttentionError::Shape(
                "a verification graph hands no tokens on to a next step".into(),
            )
            .into());
        }
        let variants = self.graphs.len();
        let hidden = self.core.config.hidden_size;
        let mut b = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        if hand_off.is_some() && b.work.aux.is_none() {
            return Err(AttentionError::Shape(
                "layer inputs handed off from a graph that records none".into(),
            )
            .into());
        }
        // This step's rows and variant, and for a step from the host what to launch.
        let (rows, variant, launch) = match input {
            GreedyInput::Host { tokens, plan } => {
                check_inputs(tokens, plan, &[], self.core.config.vocab_size)?;
                let variant = b.next_variant(variants);
                let (context, graph) = self.serving(tokens.len(), plan, variant)?;
                (tokens.len(), variant, Some((tokens, plan, context, graph)))
            }
            GreedyInput::Queued(queued) => {
                self.check_queued(&queued, &b)?;
                (queued.rows, queued.variant, None)
            }
        };
        let next_variant = (variant + 1) % variants;
        let next = match next {
            Some(plan) if plan.seqs().len() != rows => {
                return Err(AttentionError::Shape(format!(
                    "a step queued ahead of {} sequences after one of {rows}",
                    plan.seqs().len()
                ))
                .into())
            }
            Some(plan) => Some((plan, self.serving(rows, plan, next_variant)?)),
            None => None,
        };
        let stream = self.core.gpu.stream();
        if let Some((tokens, plan, context, graph)) = launch {
            b.stage(tokens, plan, self.size, context)?;
            b.launch_graph(graph)?;
            b.done[variant].record(stream)?;
        }
        if let (Some(hand_off), Some(aux)) = (hand_off, b.aux(rows, hidden)) {
            hand_off(aux)?;
        }
        if let Some(masks) = masks {
            let masks = masks().map_err(|e| GpuForwardError::Masks(format!("{e:#}")))?;
            b.mask_argmax(&self.core, rows, variant, &masks)?;
        }
        let queued = match next {
            Some((plan, (context, graph))) => {
                let rows: Vec<usize> = (0..rows).collect();
                b.plan.stage_fed(plan, &rows, self.size, context)?;
                b.launch_graph(graph)?;
                b.done[next_variant].record(stream)?;
                Some(QueuedStep {
                    size: self.size,
                    rows: rows.len(),
                    variant: next_variant,
                    step: b.steps,
                })
            }
            None => None,
        };
        b.done[variant].synchronize()?;
        Ok((b.published[variant].read(rows), queued))
    }

    /// Refuses a step queued on another graph, or one whose ids a later step overwrote.
    fn check_queued(&self, queued: &QueuedStep, b: &GraphBuffers) -> Result<(), GpuForwardError> {
        if queued.size != self.size {
            return Err(AttentionError::Shape(format!(
                "a step queued on the graph of {} rows read through the one of {}",
                queued.size, self.size
            ))
            .into());
        }
        if queued.step != b.steps {
            return Err(AttentionError::Shape(format!(
                "a step queued ahead was followed by {} other steps over the graphs' buffers, \
                 which overwrote its ids",
                b.steps - queued.step
            ))
            .into());
        }
        Ok(())
    }
}

impl GraphBuffers {
    /// Forbids in the last decode step's logits (its `rows` real rows, launched as
    /// `variant`) what each row's mask of `masks` forbids, and takes its argmax again into
    /// the next step's token ids and the variant's published buffer; nothing when no row
    /// has a mask.
    fn mask_argmax(
        &mut self,
        core: &LlamaCore,
        rows: usize,
        variant: usize,
        masks: &[Option<TokenMask>],
    ) -> Result<(), GpuForwardError> {
        if masks.len() != rows {
            return Err(GpuForwardError::Masks(format!(
                "{} masks for a step of {rows} rows",
                masks.len()
            )));
        }
        if masks.iter().all(Option::is_none) {
            return Ok(());
        }
        let vocab = core.config.vocab_size;
        let stream = core.gpu.stream();
        self.work
            .mask_logits(&core.kernels, &core.gpu, vocab, masks)?;
        let copies = ArgmaxCopies {
            fed: Some(self.plan.token_ids_mut()),
            published: Some(&self.published[variant]),
        };
        self.work
            .argmax_copying(&core.kernels, stream, rows, vocab, copies)?;
        self.done[variant].record(stream)?;
        Ok(())
    }
}

//! A greedy proposal's steps queued back to back on the device: each draft step after the
//! first is fed the step before's greedy draft (as a target id) and `pre` by a kernel on
//! the head's stream ([`draft_feed`]), not through the host, and the drafts of every step
//! are read back once at the end. The steps replay one decode graph (one row a sequence,
//! padded to its size); step 1 is fed from the host or from a graph of step 0 queued just
//! before it, whose results stay on the device.

use crate::draft_head::cuda::chain_buffers::MAX_CHAIN_STEPS;
use crate::draft_head::cuda::graph::{CapturedHead, HeadGraphBuffers, HeadGraphKind};
use crate::draft_head::cuda::hand_off::DraftHandOff;
use crate::draft_head::cuda::DraftHeadKind;
use crate::draft_head::HandedDraft;
use crate::llama::cuda::GpuForwardError;
use crate::llama::{check_inputs, ForwardError};
use peregrine_kernels::cuda::elementwise::{draft_feed, DraftFeedOut};
use peregrine_ops::cuda::attention::AttentionError;
use peregrine_ops::AttentionPlan;
use std::sync::MutexGuard;

/// Where a chain's step 1 takes its inputs.
pub enum ChainStart<'a, C: DraftHeadKind> {
    /// From the host: one token and one row of `pre` (`[seqs, H]`) a sequence.
    Host {
        /// Step 1's token of each sequence.
        tokens: &'a [u32],
        /// Step 1's `pre` of each sequence.
        pre: &'a [f32],
    },
    /// From step 0, queued first through `graph` (a graph of step 0) as its
    /// [`replay_first`](CapturedHead::replay_first) would run it: each sequence's logit
    /// row of `rows` (its last) feeds its step 1.
    First {
        /// The graph of step 0.
        graph: &'a CapturedHead<C>,
        /// Step 0's tokens.
        tokens: &'a [u32],
        /// Step 0's feature ring rows, one a token.
        features: &'a [u64],
        /// Step 0's plan, over its real rows.
        plan: &'a AttentionPlan,
        /// Each sequence's logit row.
        rows: &'a [usize],
    },
}

impl<C: DraftHeadKind> CapturedHead<C> {
    /// Runs the draft steps of `plans` (one row a sequence each, the same sequences in the
    /// same order, each one position past the one before) through this decode graph, back
    /// to back on the device, step 1 fed from `start` and every later step from the one
    /// before; returns each sequence's drafts, step 0's first where `start` runs it.
    /// Refused, before anything is launched, when a step does not fit the graph.
    pub fn replay_chain(
        &self,
        start: ChainStart<'_, C>,
        plans: &[AttentionPlan],
    ) -> Result<Vec<Vec<u32>>, GpuForwardError> {
        let (b, recorded, n) = self.queue_chain(start, plans)?;
        let chain = b.chain.as_ref().expect("decode graphs keep chain buffers");
        let all = self
            .core
            .gpu()
            .download(&chain.drafts.slice(0..recorded * chain.rows))?;
        Ok((0..n)
            .map(|j| {
                (0..recorded)
                    .map(|s| all[s * chain.rows + j] as u32)
                    .collect()
            })
            .collect())
    }

    /// Drafts a chain of `steps` steps through this graph leaves: `steps` times the rows of
    /// its buffers (0 where they keep no chain).
    pub fn chain_len(&self, steps: usize) -> usize {
        let b = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        b.chain.as_ref().map_or(0, |c| steps * c.rows)
    }

    /// [`CapturedHead::replay_chain`] that leaves the drafts on the device: copied into
    /// `hand_off` on the head's stream, after the steps, with nothing read back. Returns
    /// where each sequence's drafts lie there, step 0's first where `start` runs it.
    pub fn replay_chain_handing_off(
        &self,
        start: ChainStart<'_, C>,
        plans: &[AttentionPlan],
        hand_off: &DraftHandOff,
    ) -> Result<Vec<Vec<HandedDraft>>, GpuForwardError> {
        let (b, recorded, n) = self.queue_chain(start, plans)?;
        let chain = b.chain.as_ref().expect("decode graphs keep chain buffers");
        let stream = self.core.gpu().stream();
        let generation = hand_off.write(stream, &chain.drafts.slice(0..recorded * chain.rows))?;
        Ok((0..n)
            .map(|j| {
                (0..recorded)
                    .map(|s| HandedDraft {
                        generation,
                        index: s * chain.rows + j,
                    })
                    .collect()
            })
            .collect())
    }

    /// Queues the steps of [`CapturedHead::replay_chain`]; returns the buffers (their
    /// chain holding the drafts), the steps recorded and the sequences.
    fn queue_chain(
        &self,
        start: ChainStart<'_, C>,
        plans: &[AttentionPlan],
    ) -> Result<(ChainBuffersHeld<'_, C>, usize, usize), GpuForwardError> {
        let core = &*self.core;
        let n = plans.first().map_or(0, |p| p.seqs().len());
        let steps = plans.len() + usize::from(matches!(start, ChainStart::First { .. }));
        let shape = |what: &str| -> GpuForwardError { AttentionError::Shape(what.into()).into() };
        if self.kind != HeadGraphKind::Decode || n == 0 || steps > MAX_CHAIN_STEPS {
            return Err(shape("a chain runs 1 to 16 steps through a decode graph"));
        }
        let mut contexts = Vec::with_capacity(plans.len());
        for plan in plans {
            let placeholders = vec![0; plan.rows()];
            check_inputs(&placeholders, plan, &[], core.vocab_size())?;
            if plan.seqs().len() != n || plan.seqs().iter().any(|s| s.q_len != 1) {
                return Err(shape("a chain's steps run one row per sequence"));
            }
            // docs/architecture.md, rule 3: the real rows fit q and o, which hold the size.
            plan.check_fits(self.size(), self.size())
                .map_err(AttentionError::from)?;
            core.check_positions(plan)?;
            contexts.push(self.graphs.serving(plan)?);
        }
        let h = core.hidden_size();
        let mut b = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        let mut recorded = 0;
        match start {
            ChainStart::Host { tokens, pre } => {
                if tokens.len() != n || pre.len() != n * h {
                    return Err(ForwardError::HiddenShape {
                        what: "pre",
                        len: pre.len(),
                        rows: tokens.len(),
                        width: h,
                    }
                    .into());
                }
                let (context, _) = contexts[0];
                b.stage(core, tokens, pre, &plans[0], self.size(), context)?;
            }
            ChainStart::First {
                graph,
                tokens,
                features,
                plan,
                rows,
            } => {
                if rows.len() != n {
                    return Err(shape("step 0 feeds one row a sequence"));
                }
                let mut first = graph.queue_first(tokens, features, plan, rows)?;
                let padded: Vec<i32> = (0..self.size())
                    .map(|j| rows[j.min(n - 1)] as i32)
                    .collect();
                let (context, _) = contexts[0];
                b.plan
                    .stage_fed(&plans[0], &own(n), self.size(), context)
                    .map_err(GpuForwardError::from)?;
                feed_first(core, &mut first, &mut b, &padded)?;
                recorded = 1;
            }
        }
        for (i, (plan, (context, graph))) in plans.iter().zip(&contexts).enumerate() {
            if i > 0 {
                b.plan
                    .stage_fed(plan, &own(n), self.size(), *context)
                    .map_err(GpuForwardError::from)?;
            }
            graph.launch()?;
            feed_own(core, &mut b, recorded, self.size())?;
            recorded += 1;
        }
        Ok((b, recorded, n))
    }
}

/// A decode graph's buffers, locked while a chain's drafts are in them.
type ChainBuffersHeld<'a, C> = MutexGuard<'a, HeadGraphBuffers<C>>;

/// `0..n`: every real row of a decode step is a logit row.
fn own(n: usize) -> Vec<usize> {
    (0..n).collect()
}

/// Queues the feed of the step staged in `b` from its own last step, recording that
/// step's drafts as step `step` of the chain.
fn feed_own<C: DraftHeadKind>(
    core: &C,
    b: &mut HeadGraphBuffers<C>,
    step: usize,
    size: usize,
) -> Result<(), GpuForwardError> {
    let h = core.hidden_size();
    let HeadGraphBuffers {
        work, plan, chain, ..
    } = b;
    let chain = chain.as_mut().expect("decode graphs keep chain buffers");
    let (layer, features) = C::parts(work);
    let recorded = step * chain.rows..step * chain.rows + size;
    draft_feed(
        core.kernels(),
        core.gpu().stream(),
        (
            &layer.residual.slice(0..size * h),
            &layer.ids.slice(0..size),
        ),
        &chain.own_rows.slice(0..size),
        &chain.to_target.slice(..),
        DraftFeedOut {
            pre: &mut features.pre.slice_mut(0..size * h),
            tokens: &mut plan.token_ids_mut(),
            drafts: &mut chain.drafts.slice_mut(recorded),
        },
        h,
    )?;
    Ok(())
}

/// Queues the feed of the step staged in `b` from step 0's rows `rows` (padded to the
/// step's size) in `first`, recording step 0's drafts as the chain's first.
fn feed_first<C: DraftHeadKind>(
    core: &C,
    first: &mut HeadGraphBuffers<C>,
    b: &mut HeadGraphBuffers<C>,
    rows: &[i32],
) -> Result<(), GpuForwardError> {
    let (h, size) = (core.hidden_size(), rows.len());
    let HeadGraphBuffers {
        work, plan, chain, ..
    } = b;
    let chain = chain.as_mut().expect("decode graphs keep chain buffers");
    let stream = core.gpu().stream();
    stream.memcpy_htod(rows, &mut chain.first_rows.slice_mut(0..size))?;
    let (from, _) = C::parts(&mut first.work);
    let (_, features) = C::parts(work);
    draft_feed(
        core.kernels(),
        stream,
        (&from.residual.slice(..), &from.ids.slice(..)),
        &chain.first_rows.slice(0..size),
        &chain.to_target.slice(..),
        DraftFeedOut {
            pre: &mut features.pre.slice_mut(0..size * h),
            tokens: &mut plan.token_ids_mut(),
            drafts: &mut chain.drafts.slice_mut(0..size),
        },
        h,
    )?;
    Ok(())
}

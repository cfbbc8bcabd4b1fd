//! A draft head on the GPU (an EAGLE-3 head, or a multi-token prediction layer), as the
//! CUDA backend loads it beside the target: its one-layer cache in the blocks of the
//! target's pool, its decode steps and its
//! decode-shaped step 0 (up to the rows a sequence verifies, greedy, fed the feature ring)
//! replayed through CUDA graphs where one serves the batch, and a catch-up larger than its
//! buffers run in forwards that fit them.

use super::backend_draft::forwards;
use super::head_runner::{HeadCall, HeadRunner, HeadStep};
use crate::backend::{HeadLimits, PoolInfo};
use crate::graphs::{is_decode_step, CaptureSizes, GraphCaptureManager};
use crate::messages::Drafted;
use anyhow::Context;
use peregrine_kernels::cuda::attention::audit;
use peregrine_models::draft_head::cuda::chain::ChainStart;
use peregrine_models::draft_head::cuda::chain_buffers::MAX_CHAIN_STEPS;
use peregrine_models::draft_head::cuda::graph::CapturedHead;
use peregrine_models::draft_head::cuda::hand_off::DraftHandOff;
use peregrine_models::draft_head::cuda::head::GpuDraftHead;
use peregrine_models::draft_head::cuda::{DraftHeadKind, GpuHeadDrafts};
use peregrine_models::eagle3::cuda::HeadCore;
use peregrine_models::eagle3::{DraftVocab, FeatureKind, HeadInput};
use peregrine_models::graph::cuda::{GraphLimits, SharedKvCache};
use peregrine_ops::{AttentionPlan, SeqSpec};
use std::sync::{Arc, Mutex};

/// The largest step the head's buffers hold.
#[derive(Clone, Copy, Debug)]
pub struct HeadCapacity {
    /// Tokens of one forward.
    pub max_tokens: usize,
    /// Rows of one forward that ask drafts.
    pub max_logit_rows: usize,
    /// The most rows a sequence runs through a graph of step 0: 1 + the drafts a step
    /// verifies (1: no such graphs).
    pub first_rows: usize,
}

/// A draft head on the GPU with its KV cache.
pub struct GpuHead<K: DraftHeadKind = HeadCore> {
    head: GpuDraftHead<K>,
    cache: SharedKvCache,
    capacity: HeadCapacity,
    /// The slot the padded rows of a replayed graph write: in the target pool's scratch
    /// block, which no sequence owns.
    scratch_slot: i64,
    /// The longest context a graph serves.
    max_context: usize,
    /// The cache's block size and blocks, which plans are made over.
    block_size: usize,
    num_blocks: u64,
    graphs: Option<GraphCaptureManager<CapturedHead<K>>>,
    /// The graphs of step 0, by rows (captured with the decode graphs where the head reads
    /// a feature ring and sequences verify drafts).
    first_graphs: Option<GraphCaptureManager<CapturedHead<K>>>,
    /// Where a chain from a step-0 graph leaves its drafts for the target, if anywhere
    /// (else they are read back).
    hand_off: Option<Arc<DraftHandOff>>,
}

impl<K: DraftHeadKind> GpuHead<K> {
    /// The `head` the CUDA backend loaded beside the target, with a one-layer cache
    /// of the head's shape in the blocks of the target's `pool` (the scratch block
    /// included), address-audited, sized for `limits`.
    pub fn beside(
        head: GpuDraftHead<K>,
        pool: &PoolInfo,
        limits: HeadLimits,
    ) -> anyhow::Result<GpuHead<K>> {
        let layout = head.kv_layout(pool.layout.num_blocks, pool.layout.block_size);
        audit(&layout, 2).map_err(|e| anyhow::anyhow!("{} KV address audit: {e}", K::NAME))?;
        let cache = head.new_cache(layout)?;
        tracing::info!(
            head = K::NAME,
            blocks = layout.num_blocks,
            bytes_per_layer = cache.bytes_per_layer(),
            "draft head loaded beside the target"
        );
        let capacity = HeadCapacity {
            max_tokens: limits.max_tokens,
            max_logit_rows: limits.max_logit_rows,
            first_rows: limits.verify_rows,
        };
        let scratch_slot = pool
            .scratch_slot()
            .ok_or_else(|| anyhow::anyhow!("the pool has no scratch block"))?;
        let max_context = limits.max_seq_len_to_capture.min(head.max_positions());
        let cache = Arc::new(Mutex::new(cache));
        Ok(GpuHead::new(
            head,
            cache,
            capacity,
            scratch_slot,
            max_context,
        ))
    }

    /// `head` over `cache` (one layer of the head's shape in the blocks of the target's
    /// pool), its buffers holding `capacity`; graphs serve contexts up to `max_context` and
    /// their padded rows write into `scratch_slot`.
    pub fn new(
        head: GpuDraftHead<K>,
        cache: SharedKvCache,
        capacity: HeadCapacity,
        scratch_slot: i64,
        max_context: usize,
    ) -> GpuHead<K> {
        let layout = *cache.lock().unwrap_or_else(|e| e.into_inner()).layout();
        GpuHead {
            head,
            cache,
            capacity,
            scratch_slot,
            max_context,
            block_size: layout.block_size as usize,
            num_blocks: layout.num_blocks,
            graphs: None,
            first_graphs: None,
            hand_off: None,
        }
    }

    /// Leaves the drafts of a chain from a step-0 graph in `hand_off` for the target's
    /// verification to read on the device, rather than reading them back.
    pub fn handing_drafts_to(mut self, hand_off: Arc<DraftHandOff>) -> GpuHead<K> {
        self.hand_off = Some(hand_off);
        self
    }

    /// Runs one step of the head: through a graph where one serves it, else eagerly
    /// (in forwards the buffers hold, for a catch-up past them); also says which.
    fn run_step(
        &mut self,
        specs: &[SeqSpec],
        tokens: &[u32],
        input: HeadInput,
        rows: &[usize],
        logits: bool,
    ) -> anyhow::Result<(HeadStep, &'static str)> {
        let (block_size, num_blocks) = (self.block_size, self.num_blocks);
        let plan = AttentionPlan::new(specs, block_size, num_blocks)?;
        if let Some(out) = self.replay(&plan, tokens, input, rows, logits)? {
            return Ok((out, "graph"));
        }
        if let Some(out) = self.replay_first(&plan, tokens, input, rows, logits)? {
            return Ok((out, "step-0 graph"));
        }
        let cap = self.capacity;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let fits = tokens.len() <= cap.max_tokens
            && specs.len() <= cap.max_logit_rows
            && rows.len() <= cap.max_logit_rows;
        if fits {
            let out = self
                .head
                .forward_greedy(tokens, input, &plan, &mut cache, rows, logits)
                .with_context(|| format!("{} forward", K::NAME))?;
            let out = HeadStep {
                greedy: out.drafts,
                logits: out.logits,
                pre: out.pre,
            };
            return Ok((out, "eager"));
        }
        // A catch-up past the buffers: in forwards they hold.
        let h = self.hidden_size();
        let (kind, features) = input.host().unwrap_or((FeatureKind::Aux, &[]));
        let width = features.len() / tokens.len().max(1);
        let v = self.head.vocab().len();
        let mut drafts = vec![0; rows.len()];
        let mut all_logits = logits.then(|| vec![0.0; rows.len() * v]);
        let mut pre = vec![0.0; tokens.len() * h];
        // The forward row each token lands on, in the forward being run.
        let mut local_row = vec![None; tokens.len()];
        for pieces in forwards(specs, cap.max_tokens, cap.max_logit_rows) {
            let piece_specs: Vec<SeqSpec> = pieces.iter().map(|(_, p, _)| *p).collect();
            let plan = AttentionPlan::new(&piece_specs, block_size, num_blocks)?;
            // Where each row of this forward comes from.
            let from: Vec<usize> = pieces
                .iter()
                .flat_map(|(_, p, start)| *start..*start + p.num_new)
                .collect();
            let ids: Vec<u32> = from.iter().map(|&t| tokens[t]).collect();
            let feats: Vec<f32> = from
                .iter()
                .flat_map(|&t| &features[t * width..(t + 1) * width])
                .copied()
                .collect();
            let ring_rows: Vec<u64> = match input {
                HeadInput::Ring(all) => from.iter().map(|&t| all[t]).collect(),
                HeadInput::Aux(_) | HeadInput::Pre(_) => Vec::new(),
            };
            local_row.fill(None);
            for (j, &t) in from.iter().enumerate() {
                local_row[t] = Some(j);
            }
            let (wanted, local): (Vec<usize>, Vec<usize>) = rows
                .iter()
                .enumerate()
                .filter_map(|(i, &r)| local_row.get(r).copied().flatten().map(|j| (i, j)))
                .unzip();
            let input = match (input, kind) {
                (HeadInput::Ring(_), _) => HeadInput::Ring(&ring_rows),
                (_, FeatureKind::Aux) => HeadInput::Aux(&feats),
                (_, FeatureKind::Pre) => HeadInput::Pre(&feats),
            };
            let out = self
                .head
                .forward_greedy(&ids, input, &plan, &mut cache, &local, logits)
                .with_context(|| format!("{} forward", K::NAME))?;
            for (j, (&i, d)) in wanted.iter().zip(out.drafts).enumerate() {
                drafts[i] = d;
                if let (Some(all), Some(got)) = (&mut all_logits, &out.logits) {
                    all[i * v..(i + 1) * v].copy_from_slice(&got[j * v..(j + 1) * v]);
                }
            }
            for (j, &t) in from.iter().enumerate() {
                pre[t * h..(t + 1) * h].copy_from_slice(&out.pre[j * h..(j + 1) * h]);
            }
        }
        let out = HeadStep {
            greedy: drafts,
            logits: all_logits,
            pre,
        };
        Ok((out, "eager in pieces"))
    }

    /// Replays the graph of step 0 that serves this step, if one does: features of the
    /// feature ring, no logits asked, each sequence's rows within `first_rows`, its last
    /// row its logit row.
    fn replay_first(
        &self,
        plan: &AttentionPlan,
        tokens: &[u32],
        input: HeadInput,
        rows: &[usize],
        logits: bool,
    ) -> anyhow::Result<Option<HeadStep>> {
        let (Some(graphs), HeadInput::Ring(features), false) = (&self.first_graphs, input, logits)
        else {
            return Ok(None);
        };
        if !self.first_graph_rows(plan, rows) {
            return Ok(None);
        }
        through_graph(graphs, tokens.len(), plan, |graph| {
            graph
                .replay_first(tokens, features, plan, rows)
                .with_context(|| format!("{} step-0 graph replay", K::NAME))
        })
    }

    /// Whether a step 0 of `plan` whose logit rows are `rows` has the rows a graph of step
    /// 0 runs: each sequence's last as its logit row, none with more than `first_rows`.
    fn first_graph_rows(&self, plan: &AttentionPlan, rows: &[usize]) -> bool {
        let seqs = plan.seqs();
        let lasts = seqs.iter().scan(0, |end, s| {
            *end += s.q_len;
            Some(*end - 1)
        });
        seqs.iter().all(|s| s.q_len <= self.capacity.first_rows) && lasts.eq(rows.iter().copied())
    }

    /// The graph of step 0 that serves `first` over `plan`, with its feature ring rows.
    fn first_graph<'a>(
        &'a self,
        first: &HeadCall<'a>,
        plan: &AttentionPlan,
    ) -> Option<(&'a CapturedHead<K>, &'a [u64])> {
        let (graphs, HeadInput::Ring(features)) = (self.first_graphs.as_ref()?, first.input) else {
            return None;
        };
        let (_, graph) = graphs.graph_for(first.tokens.len())?;
        let longest = plan.seqs().iter().map(|s| s.context_len).max().unwrap_or(0);
        (self.first_graph_rows(plan, first.rows) && longest <= graph.max_context())
            .then_some((graph, features))
    }

    /// Replays the graph that serves a decode step fed `pre`, if one does.
    fn replay(
        &self,
        plan: &AttentionPlan,
        tokens: &[u32],
        input: HeadInput,
        rows: &[usize],
        logits: bool,
    ) -> anyhow::Result<Option<HeadStep>> {
        let (Some(graphs), HeadInput::Pre(pre)) = (&self.graphs, input) else {
            return Ok(None);
        };
        if !is_decode_step(tokens, plan, rows) {
            return Ok(None);
        }
        through_graph(graphs, plan.seqs().len(), plan, |graph| {
            graph
                .replay(tokens, pre, plan, logits)
                .with_context(|| format!("{} graph replay", K::NAME))
        })
    }
}

/// The decode graph of `graphs` that holds `n` sequences at contexts up to `longest`.
fn chain_graph<C: DraftHeadKind>(
    graphs: Option<&GraphCaptureManager<CapturedHead<C>>>,
    n: usize,
    longest: usize,
) -> Option<&CapturedHead<C>> {
    let (_, graph) = graphs?.graph_for(n)?;
    (longest <= graph.max_context()).then_some(graph)
}

/// Runs `replay` on the graph of `graphs` that holds `n` (rows or sequences) and the
/// longest context of `plan`, if one does.
fn through_graph<C: DraftHeadKind>(
    graphs: &GraphCaptureManager<CapturedHead<C>>,
    n: usize,
    plan: &AttentionPlan,
    replay: impl FnOnce(&CapturedHead<C>) -> anyhow::Result<GpuHeadDrafts>,
) -> anyhow::Result<Option<HeadStep>> {
    let longest = plan.seqs().iter().map(|s| s.context_len).max().unwrap_or(0);
    match graphs.graph_for(n) {
        Some((_, graph)) if longest <= graph.max_context() => {
            let out = replay(graph)?;
            Ok(Some(HeadStep {
                greedy: out.drafts,
                logits: out.logits,
                pre: out.pre,
            }))
        }
        _ => Ok(None),
    }
}

impl<K: DraftHeadKind> HeadRunner for GpuHead<K> {
    fn aux_width(&self) -> usize {
        self.head.aux_width()
    }

    fn hidden_size(&self) -> usize {
        self.head.hidden_size()
    }

    fn vocab(&self) -> &DraftVocab {
        self.head.vocab()
    }

    fn aux_layers(&self) -> &[usize] {
        self.head.aux_layers()
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn kv_bytes_per_block(&self) -> u64 {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        // bf16 elements.
        super::block_bytes(cache.layout(), 2)
    }

    fn run(
        &mut self,
        specs: &[SeqSpec],
        tokens: &[u32],
        input: HeadInput,
        rows: &[usize],
        logits: bool,
    ) -> anyhow::Result<HeadStep> {
        let started = std::time::Instant::now();
        let (out, path) = self.run_step(specs, tokens, input, rows, logits)?;
        tracing::trace!(
            path,
            seqs = specs.len(),
            tokens = tokens.len(),
            us = started.elapsed().as_micros() as u64,
            "head step"
        );
        Ok(out)
    }

    fn run_chain(
        &mut self,
        first: HeadCall<'_>,
        later: usize,
    ) -> anyhow::Result<Option<Vec<Drafted>>> {
        let (block_size, num_blocks) = (self.block_size, self.num_blocks);
        if later == 0 || 1 + later > MAX_CHAIN_STEPS {
            return Ok(None);
        }
        // Step s (1..=later) of a sequence: one row, s positions past step 0's last.
        let specs: Vec<Vec<SeqSpec>> = (1..=later)
            .map(|s| {
                let step = first.specs.iter().map(|p| SeqSpec {
                    num_cached: p.num_cached + p.num_new - 1 + s,
                    num_new: 1,
                    block_table: p.block_table,
                });
                step.collect()
            })
            .collect();
        let plans = specs
            .iter()
            .map(|specs| AttentionPlan::new(specs, block_size, num_blocks))
            .collect::<Result<Vec<_>, _>>()?;
        let longest = plans
            .iter()
            .flat_map(|p| p.seqs().iter().map(|s| s.context_len))
            .max()
            .unwrap_or(0);
        let n = first.specs.len();
        if chain_graph(self.graphs.as_ref(), n, longest).is_none() {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        let plan = AttentionPlan::new(first.specs, block_size, num_blocks)?;
        let (path, drafts) = match self.first_graph(&first, &plan) {
            Some((graph0, features)) => {
                let start = ChainStart::First {
                    graph: graph0,
                    tokens: first.tokens,
                    features,
                    plan: &plan,
                    rows: first.rows,
                };
                let graph = chain_graph(self.graphs.as_ref(), n, longest).expect("checked above");
                let hand_off = self
                    .hand_off
                    .as_deref()
                    .filter(|h| graph.chain_len(1 + later) <= h.capacity());
                match hand_off {
                    Some(hand_off) => {
                        let places = graph.replay_chain_handing_off(start, &plans, hand_off);
                        let drafts =
                            places.map(|p| p.into_iter().map(Drafted::on_device).collect());
                        ("chain from a step-0 graph, handed off", drafts)
                    }
                    None => {
                        let drafts = graph.replay_chain(start, &plans);
                        let drafts = drafts.map(|d| d.into_iter().map(Drafted::greedy).collect());
                        ("chain from a step-0 graph", drafts)
                    }
                }
            }
            None => {
                // Step 0 on its own, its drafts and `pre` fed to the chain from the host.
                let (step0, _) =
                    self.run_step(first.specs, first.tokens, first.input, first.rows, false)?;
                let h = self.hidden_size();
                let pre: Vec<f32> = first
                    .rows
                    .iter()
                    .flat_map(|&r| step0.pre[r * h..(r + 1) * h].iter().copied())
                    .collect();
                let start = ChainStart::Host {
                    tokens: &step0.greedy,
                    pre: &pre,
                };
                let graph = chain_graph(self.graphs.as_ref(), n, longest).expect("checked above");
                let drafts = graph.replay_chain(start, &plans).map(|later| {
                    let firsts = step0.greedy.iter();
                    let whole = firsts.zip(later).map(|(&d, rest)| [vec![d], rest].concat());
                    whole.map(Drafted::greedy).collect()
                });
                ("chain after step 0", drafts)
            }
        };
        let drafts = drafts.with_context(|| format!("{} chain replay", K::NAME))?;
        tracing::trace!(
            path,
            seqs = first.specs.len(),
            steps = 1 + later,
            us = started.elapsed().as_micros() as u64,
            "head step"
        );
        Ok(Some(drafts))
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        let Some(sizes) = sizes else {
            self.graphs = None;
            self.first_graphs = None;
            return Ok(());
        };
        let limits = GraphLimits {
            max_rows: sizes.largest(),
            max_context: self.max_context,
            scratch_slot: self.scratch_slot,
        };
        let (head, cache) = (&mut self.head, &self.cache);
        let graphs = GraphCaptureManager::capture(sizes.clone(), |size| {
            head.capture_decode(size, limits, cache)
        })
        .with_context(|| format!("capturing the {}'s graphs", K::NAME))?;
        let per_seq = self.capacity.first_rows;
        let first_graphs = match (head.feature_ring(), per_seq) {
            (Some(_), 2..) => {
                let rows = sizes.scaled(per_seq);
                let limits = GraphLimits {
                    max_rows: rows.largest(),
                    ..limits
                };
                let graphs = GraphCaptureManager::capture(rows, |size| {
                    head.capture_first(size, limits, cache)
                });
                Some(graphs.with_context(|| format!("capturing the {}'s step-0 graphs", K::NAME))?)
            }
            _ => None,
        };
        self.graphs = Some(graphs);
        self.first_graphs = first_graphs;
        Ok(())
    }

    fn holds_ring_row(&self, row: u64) -> bool {
        self.head.feature_ring().is_some_and(|ring| ring.holds(row))
    }

    #[cfg(feature = "fault-hooks")]
    fn zero_kv_above(&mut self, specs: &[SeqSpec], above: u32) -> anyhow::Result<()> {
        let gpu = self.head.gpu().clone();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let block = (cache.layout().block_size * cache.layout().slot_elems()) as usize;
        let (k, v) = cache.layer_mut(0);
        for b in super::head_runner::blocks_above(specs, above) {
            let range = b as usize * block..(b as usize + 1) * block;
            gpu.stream().memset_zeros(&mut k.slice_mut(range.clone()))?;
            // A latent cache keeps no values.
            if range.end <= v.len() {
                gpu.stream().memset_zeros(&mut v.slice_mut(range))?;
            }
        }
        Ok(())
    }
}

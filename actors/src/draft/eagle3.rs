//! Drafting with an EAGLE-3 head (the chain of k drafts of vLLM's `EagleProposer.propose`),
//! on the CPU or (run by the CUDA backend) the GPU, its one-layer KV cache over the
//! target's block ids in a pool of the head's shape.
//!
//! The target records the inputs of the head's aux layers for every row it runs; they
//! arrive here with each `Propose` (as values from the CPU backend, or as the numbers of
//! the rows of the feature ring the CUDA backend stored them into, which the GPU head
//! gathers on the device) and wait, per request, until the token after each position is
//! known. Step 0 then runs every waiting row whose position the target has
//! verified (rows of rejected drafts are dropped): the row at position j pairs the
//! target's features at j with token j + 1 (the last one being the token the target just
//! produced), which also fills the head's KV cache. The scheduler proposes every request
//! it plans, prompt chunks and requests with no room for drafts included. A prompt
//! chunk's rows run in the next proposal, so that a prefix another request shares holds
//! the head's KV; a decoding request whose drafts are paused (planned with none where it
//! has room: drafting does not pay at this batch size) leaves its rows waiting, up to
//! [`LAZY_ROWS`], and they run in the step that drafts for it again, or the one of its
//! last token: a step planned without drafts then runs no head at all, and costs what a
//! step without speculation does, with the features' hand-off. (A request that stops on
//! an end-of-sequence token while paused leaves its last rows out of the head's KV, so a
//! later request that shares its blocks through the prefix cache fails their check and
//! drafts nothing.) Once step 0 has reached the last token, its last row gives the first
//! draft; steps 1.. run one row per request at the next position, fed the previous `pre`.
//! Drafting is greedy over the draft vocabulary, mapped to target ids through `d2t`, for
//! greedy requests; a sampled request's drafts are drawn from the head's distribution at
//! its temperature (`DraftSampler`: the top draft logits, its own seeded stream) and go to
//! verification with that distribution.
//!
//! Steps 1.. replay captured graphs of the head's decode step when graphs are captured
//! and a size holds the batch, padded up to it (the padded rows repeat the last real
//! row's token and `pre`, and write their KV into the target pool's scratch block, which
//! no sequence owns); step 0, and a batch past the largest size, run eagerly. A greedy
//! proposal whose every request drafts as many (two or more) runs whole where the runner
//! can queue its steps back to back ([`HeadRunner::run_chain`]: on the GPU, step 0
//! through its graph where one serves it, then the decode graph replayed once a step, each
//! step fed the one before's draft and `pre` on the device, the drafts read back once).
//!
//! A request whose prompt prefix was served from the prefix cache (the target did not
//! recompute it) drafts from the head KV its shared blocks hold, once `head_blocks` has
//! checked that they hold it for this very prefix; the KV allocator leaves a hit's last
//! block to be recomputed, so the features at the position before the first computed
//! token are there. A request whose features have a gap, or whose shared blocks fail the
//! check, gets no drafts; its output is unchanged.

use super::head_blocks::{HeadBlocks, SeqBlocks};
use super::head_features::{Pending, StepFeatures};
use super::head_runner::{CpuHead, HeadCall, HeadRunner, HeadStep};
use super::DraftMethod;
use crate::backend::PoolInfo;
use crate::graphs::CaptureSizes;
use crate::messages::{Drafted, HiddenRows, ProposeSeq, RequestId};
use crate::metrics::{self, HeadSteps};
use peregrine_models::eagle3::{Eagle3Head, HeadInput};
use peregrine_models::ModelConfig;
use peregrine_ops::sampling::{DraftDist, DraftSampler};
use peregrine_ops::{KvCache, SeqSpec};
use std::collections::HashMap;
use std::time::Instant;

/// Rows a request whose drafts are paused lets wait before its step 0 runs them
/// anyway (one forward over them, in place of one a step), so that the features held on
/// the host stay bounded.
pub const LAZY_ROWS: usize = 128;

/// What the head holds for one request.
#[derive(Default)]
struct HeadSeq {
    /// Positions whose step-0 KV is in the head's cache: `0..computed`.
    computed: usize,
    /// Target features of positions `computed..`, one row each.
    pending: Pending,
    /// The features had a gap: no drafts for this request.
    broken: bool,
    /// Positions `0..computed` came from the prefix cache: their head KV is checked at the
    /// next proposal.
    unchecked_prefix: bool,
    /// The blocks it marked or checked.
    blocks: SeqBlocks,
    /// A sampled request's draft sampler, made at its first sampled draft.
    sampler: Option<DraftSampler>,
    /// The most rows its next step 0 runs when it only follows verification: 1 + the
    /// drafts it was given (more are rows that waited, or a prompt's).
    next_rows: usize,
}

/// The EAGLE-3 method, its head run by `R` (on the CPU by default).
pub struct Eagle3<R = CpuHead> {
    runner: R,
    /// Width of one row of target features.
    width: usize,
    seqs: HashMap<RequestId, HeadSeq>,
    /// Which blocks hold the head's KV for what content.
    blocks: HeadBlocks,
    /// The last proposal's step 0 ran rows beyond those of the last verifications.
    caught_up: bool,
    /// The fault hook's block id threshold.
    #[cfg(feature = "fault-hooks")]
    fault_above: Option<u32>,
}

impl Eagle3<CpuHead> {
    /// The `head` on the CPU for `target`, with a one-layer cache of as many blocks as the
    /// target's `pool` (its scratch block included), of the same size.
    pub fn new(head: Eagle3Head, target: &ModelConfig, pool: &PoolInfo) -> anyhow::Result<Self> {
        Ok(Eagle3::with_runner(CpuHead::new(head, target, pool)?))
    }

    /// The head's KV cache, in the blocks of the target's pool.
    pub fn cache(&self) -> &KvCache {
        self.runner.cache()
    }
}

impl<R: HeadRunner> Eagle3<R> {
    /// The method over a head run by `runner`.
    pub fn with_runner(runner: R) -> Eagle3<R> {
        Eagle3 {
            width: runner.aux_width(),
            blocks: HeadBlocks::new(runner.block_size()),
            caught_up: false,
            runner,
            seqs: HashMap::new(),
            #[cfg(feature = "fault-hooks")]
            fault_above: None,
        }
    }

    /// Fault hook (feature `fault-hooks`): after every head forward, zero the head's KV in
    /// every block above `block` that a sequence of the step uses, so that its draft steps
    /// read zeros there (the failure of a kernel that reads the wrong block past an id
    /// limit).
    #[cfg(feature = "fault-hooks")]
    pub fn with_kv_fault_above(mut self, block: u32) -> Eagle3<R> {
        self.fault_above = Some(block);
        self
    }

    /// One forward of the head ([`HeadRunner::run`]), then the fault hook where it is set.
    fn run_head(
        &mut self,
        specs: &[SeqSpec],
        tokens: &[u32],
        input: HeadInput,
        rows: &[usize],
        logits: bool,
    ) -> anyhow::Result<HeadStep> {
        let step = self.runner.run(specs, tokens, input, rows, logits)?;
        #[cfg(feature = "fault-hooks")]
        if let Some(above) = self.fault_above {
            self.runner.zero_kv_above(specs, above)?;
        }
        Ok(step)
    }
}

/// One draft: its token and, for a sampled request, the distribution it was drawn from.
type Draft = (u32, Option<DraftDist>);

/// Appends `draft` to a request's drafts.
fn push_draft(drafted: &mut Drafted, (token, dist): Draft) {
    drafted.tokens.push(token);
    if let (Some(dists), Some(dist)) = (&mut drafted.dists, dist) {
        dists.push(dist);
    }
}

impl<R: HeadRunner> Eagle3<R> {
    /// The draft of each of `which` (indices into `live`, logit row `j` for `which[j]`) of
    /// `step` that drafts: the greedy one, or for a sampled request one drawn by its draft
    /// sampler from the row's logits.
    fn pick(
        &mut self,
        seqs: &[ProposeSeq],
        live: &[usize],
        which: &[usize],
        drafting: &[bool],
        step: &HeadStep,
    ) -> anyhow::Result<Vec<Option<Draft>>> {
        let v = self.runner.vocab().len();
        let mut out = Vec::with_capacity(which.len());
        for (j, &k) in which.iter().enumerate() {
            if !drafting[k] {
                out.push(None);
                continue;
            }
            let s = &seqs[live[k]];
            let (Some(sampling), Some(logits)) = (s.sampling, &step.logits) else {
                out.push(Some((step.greedy[j], None)));
                continue;
            };
            let state = self.seqs.get_mut(&s.id).expect("live above");
            let sampler = match &mut state.sampler {
                Some(sampler) => sampler,
                slot => slot.insert(DraftSampler::new(sampling.temperature, sampling.seed)?),
            };
            let vocab = self.runner.vocab();
            let (token, dist) = sampler.draw(&logits[j * v..(j + 1) * v], |i| vocab.target(i));
            out.push(Some((token, Some(dist))));
        }
        Ok(out)
    }

    /// After step 0 ran the rows of `live` (indices into `seqs`, each up to its `ends`
    /// position): the head holds them, and a request that drafts (`drafting`) may run
    /// 1 + its drafts rows in its next step 0.
    fn settle(&mut self, seqs: &[ProposeSeq], live: &[usize], ends: &[usize], drafting: &[bool]) {
        for (k, &i) in live.iter().enumerate() {
            let s = &seqs[i];
            let state = self.seqs.get_mut(&s.id).expect("live above");
            state.computed = ends[k];
            state.next_rows = 1 + if drafting[k] { s.max_drafts } else { 0 };
            state.pending.truncate(0, self.width);
            self.blocks
                .mark(&mut state.blocks, &s.tokens, &s.block_table, state.computed);
        }
    }
}

impl<R: HeadRunner> DraftMethod for Eagle3<R> {
    fn hidden_layers(&self) -> Option<Vec<usize>> {
        Some(self.runner.aux_layers().to_vec())
    }

    fn kv_bytes_per_block(&self) -> Option<u64> {
        Some(self.runner.kv_bytes_per_block())
    }

    fn receive_hidden(&mut self, rows: Vec<HiddenRows>) {
        let w = self.width;
        for r in rows {
            let fresh = !self.seqs.contains_key(&r.id);
            let s = self.seqs.entry(r.id).or_default();
            if fresh && r.first_pos > 0 {
                // Served from the prefix cache up to first_pos.
                s.computed = r.first_pos;
                s.unchecked_prefix = true;
            }
            let end = s.computed + s.pending.rows(w);
            if r.first_pos > end {
                s.broken = true;
            } else if r.first_pos < s.computed {
                // The target ran positions the head has seen again (a recompute, which
                // may start past a prefix hit): take them afresh.
                s.computed = r.first_pos;
                s.pending.truncate(0, w);
                s.unchecked_prefix = r.first_pos > 0;
                self.blocks.rewind(&mut s.blocks, r.first_pos);
            } else {
                // Rows past first_pos are those of rejected drafts.
                s.pending.truncate(r.first_pos - s.computed, w);
            }
            s.broken |= !s.pending.extend(r.data, w);
        }
    }

    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>> {
        let w = self.width;
        self.caught_up = false;
        let mut drafts: Vec<Drafted> = seqs
            .iter()
            .map(|s| Drafted {
                tokens: Vec::new(),
                dists: s.sampling.map(|_| Vec::new()),
                on_device: None,
            })
            .collect();
        // Step 0: the rows at positions the target has run, up to the one before the
        // last token (whose successor, the next token, is not known yet).
        let (mut live, mut ends, mut drafting) = (vec![], vec![], vec![]);
        let (mut specs, mut tokens, mut rows) = (vec![], vec![], vec![]);
        let mut features = StepFeatures::default();
        for (i, s) in seqs.iter().enumerate() {
            let len = s.tokens.len();
            let Some(state) = self.seqs.get_mut(&s.id) else {
                continue;
            };
            if std::mem::take(&mut state.unchecked_prefix) {
                let valid = !state.broken
                    && self.blocks.check_prefix(
                        &mut state.blocks,
                        &s.tokens,
                        &s.block_table,
                        state.computed,
                    );
                state.broken |= !valid;
            }
            if let Some(row) = state.pending.oldest_ring_row() {
                if !state.broken && !self.runner.holds_ring_row(row) {
                    tracing::warn!(
                        request = %s.id,
                        row,
                        "the feature ring overwrote rows before step 0 read them: no drafts"
                    );
                    state.broken = true;
                }
            }
            if state.broken {
                continue;
            }
            // The head writes only into the blocks it now holds alone.
            self.blocks.take_table(&mut state.blocks, &s.block_table);
            let have = state.computed + state.pending.rows(w);
            // Every row whose next token is known runs, a prompt chunk's in the step after
            // the target computed it; a request whose drafts are paused lets its rows wait
            // until it drafts again, its last token is due or they reach LAZY_ROWS.
            let end = have.min(len.saturating_sub(1));
            let lazy = s.drafts_paused && end.saturating_sub(state.computed) < LAZY_ROWS;
            if end <= state.computed || lazy {
                continue;
            }
            self.caught_up |= end - state.computed > state.next_rows.max(1);
            state.pending.truncate(end - state.computed, w);
            specs.push(SeqSpec {
                num_cached: state.computed,
                num_new: end - state.computed,
                block_table: &s.block_table,
            });
            tokens.extend_from_slice(&s.tokens[state.computed + 1..=end]);
            features.push(&state.pending);
            rows.push(tokens.len() - 1);
            live.push(i);
            ends.push(end);
            // Drafts come once the head has caught up with the last token.
            drafting.push(end == len - 1 && s.max_drafts > 0);
        }
        if live.is_empty() {
            return Ok(drafts);
        }
        // The logits come back where a sampled request drafts.
        let sampled = |k: &usize| drafting[*k] && seqs[live[*k]].sampling.is_some();
        let logits = (0..live.len()).any(|k| sampled(&k));
        let input = features.input()?;
        // A greedy proposal whose every request drafts as many runs whole where the runner
        // queues its steps back to back.
        let wanted = seqs[live[0]].max_drafts;
        let chains = !logits
            && wanted > 1
            && (0..live.len()).all(|k| drafting[k] && seqs[live[k]].max_drafts == wanted);
        #[cfg(feature = "fault-hooks")]
        let chains = chains && self.fault_above.is_none();
        if chains {
            let started = Instant::now();
            let call = HeadCall {
                specs: &specs,
                tokens: &tokens,
                input,
                rows: &rows,
            };
            if let Some(chained) = self.runner.run_chain(call, wanted - 1)? {
                metrics::record_head_step(HeadSteps::Chain, started.elapsed());
                for (&i, chained) in live.iter().zip(chained) {
                    drafts[i] = chained;
                }
                self.settle(seqs, &live, &ends, &drafting);
                return Ok(drafts);
            }
        }
        let started = Instant::now();
        let step = self.run_head(&specs, &tokens, input, &rows, logits)?;
        metrics::record_head_step(HeadSteps::First, started.elapsed());
        let h = self.runner.hidden_size();
        let mut last_pre: Vec<Vec<f32>> = rows
            .iter()
            .map(|&r| step.pre[r * h..(r + 1) * h].to_vec())
            .collect();
        let all: Vec<usize> = (0..live.len()).collect();
        let firsts = self.pick(seqs, &live, &all, &drafting, &step)?;
        for (&i, first) in live.iter().zip(firsts) {
            if let Some(first) = first {
                push_draft(&mut drafts[i], first);
            }
        }
        self.settle(seqs, &live, &ends, &drafting);
        // Steps 1..: one row per request that wants more, at the next position.
        loop {
            let more: Vec<usize> = (0..live.len())
                .filter(|&k| drafting[k] && drafts[live[k]].tokens.len() < seqs[live[k]].max_drafts)
                .collect();
            if more.is_empty() {
                return Ok(drafts);
            }
            let specs: Vec<SeqSpec> = more
                .iter()
                .map(|&k| {
                    let s = &seqs[live[k]];
                    SeqSpec {
                        num_cached: s.tokens.len() - 2 + drafts[live[k]].tokens.len(),
                        num_new: 1,
                        block_table: &s.block_table,
                    }
                })
                .collect();
            let tokens: Vec<u32> = more
                .iter()
                .map(|&k| *drafts[live[k]].tokens.last().expect("step 0 drafted"))
                .collect();
            let input: Vec<f32> = more.iter().flat_map(|&k| last_pre[k].clone()).collect();
            let rows: Vec<usize> = (0..more.len()).collect();
            let logits = more.iter().any(sampled);
            let started = Instant::now();
            let step = self.run_head(&specs, &tokens, HeadInput::Pre(&input), &rows, logits)?;
            metrics::record_head_step(HeadSteps::Next, started.elapsed());
            let next = self.pick(seqs, &live, &more, &drafting, &step)?;
            for (j, (&k, d)) in more.iter().zip(next).enumerate() {
                push_draft(&mut drafts[live[k]], d.expect("a request that drafts"));
                last_pre[k] = step.pre[j * h..(j + 1) * h].to_vec();
            }
        }
    }

    fn release(&mut self, id: RequestId) {
        self.seqs.remove(&id);
    }

    fn caught_up(&self) -> bool {
        self.caught_up
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        self.runner.capture_graphs(sizes)
    }
}

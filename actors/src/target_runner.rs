//! The TargetRunner: owns the target model, its KV cache and (on a GPU) its stream, on a
//! dedicated OS thread, because device work blocks. Each step it turns the scheduler's
//! `ScheduledBatch` into one forward over the real tokens and samples the sequences that
//! asked for a token, or verifies their drafts (K+1 rows each) with their own samplers,
//! and scores the prompt tokens of the requests that asked (`prompt_scores.rs`).

mod decode_ahead;
mod device_drafts;
mod grammar;
mod prompt_scores;

use crate::actor_thread::{recv_spinning, reply_spinning, spawn_actor_thread, Spin, Stopped};
use crate::backend::{
    ModelBackend, RowMasks, RowSampling, StepInput, StepOutput, StepSource, Wanted,
};
use crate::graphs::CaptureSizes;
use crate::messages::{
    AheadUse, GeneratedToken, GrammarStatus, HiddenData, HiddenRows, PromptLogprobs, RequestId,
    RunnerMsg, SamplingSetup, ScheduledBatch, ScheduledSeq, SeqOutput, StepDone,
};
use anyhow::anyhow;
use decode_ahead::AheadStep;
use device_drafts::{fed_rows, row_groups};
use grammar::{after_tokens, masks_of, verification_masks, Chosen};
use peregrine_models::draft_head::HandedDraft;
use peregrine_ops::sampling::{accept_greedy, log_softmax, verify, DraftDist, Sampler, Verdict};
use peregrine_ops::{AttentionPlan, SeqSpec};
use peregrine_structured::GrammarMatcher;
use prompt_scores::Scoring;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Per-request sampling state, kept from a request's first step until it is released, so
/// that a preempted and recomputed request continues the same random stream.
struct SeqSampling {
    sampler: Sampler,
    prompt: Arc<[u32]>,
    output: Vec<u32>,
    logprobs: Option<usize>,
    /// Alternatives per prompt token scored, where the request scores its prompt.
    prompt_logprobs: Option<usize>,
    /// The position of the next prompt token to score (from 1: the first follows
    /// nothing); a prompt computed again after a preemption is not scored twice.
    scored: usize,
    max_tokens: usize,
    /// Where a constrained request is in its grammar.
    grammar: Option<GrammarMatcher>,
}

impl SeqSampling {
    /// After the step chose `tokens` (the last `admitted` drafts its grammar consumed for a
    /// verification, `accepted` of them accepted): records them as output and moves its
    /// grammar past them, appending the tokens the grammar forces next where `take_forced`
    /// (else the next steps' masks allow one token each).
    fn chose(
        &mut self,
        tokens: &mut Vec<GeneratedToken>,
        admitted: usize,
        accepted: usize,
        take_forced: bool,
    ) -> GrammarStatus {
        self.output.extend(tokens.iter().map(|t| t.id));
        let room = self.max_tokens.saturating_sub(self.output.len());
        let Some(grammar) = self.grammar.as_mut() else {
            return GrammarStatus::Open;
        };
        after_tokens(Chosen {
            grammar,
            sampler: &mut self.sampler,
            tokens,
            output: &mut self.output,
            admitted,
            accepted,
            room,
            fast_forward: take_forced && self.logprobs.is_none(),
        })
    }
}

/// A sequence of the step being run: the scheduler's [`ScheduledSeq`] with the whole
/// block table the runner holds for it.
struct RunSeq {
    id: RequestId,
    tokens: Vec<u32>,
    num_cached: usize,
    /// The sequence's blocks, covering `num_cached + tokens.len()`.
    block_table: Vec<u32>,
    /// How many of them it held before this step (the rest are new).
    kept_blocks: usize,
    sample: bool,
    num_drafts: usize,
    /// The distributions the drafts were sampled from (`None`: greedy drafts).
    draft_dists: Option<Vec<DraftDist>>,
    /// Where the drafts lie on the device, where the proposal left them there: the last
    /// `num_drafts` of `tokens` are placeholders until they are read or fed.
    drafts_on_device: Option<Vec<HandedDraft>>,
}

/// The runner's state, living on its thread.
pub struct TargetRunner {
    model: Box<dyn ModelBackend>,
    block_size: usize,
    seqs: HashMap<RequestId, SeqSampling>,
    /// Each running sequence's block table, kept from step to step: a step's
    /// [`ScheduledSeq`] says how much of it stays and which blocks come after.
    tables: HashMap<RequestId, Vec<u32>>,
    /// Which greedy decode steps queue their successor ahead ([`decode_ahead`]).
    decode_ahead: DecodeAhead,
    /// The step queued ahead after the last one, if any.
    ahead: Option<AheadStep>,
    /// The hidden states the step being run recorded, for its `StepDone`.
    hidden: Option<HiddenData>,
    /// The prompt tokens the step being run scored, for its `StepDone`.
    scores: Vec<PromptLogprobs>,
}

/// Which greedy decode steps queue the step after them ahead ([`decode_ahead`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeAhead {
    /// Steps whose sequences are all free (no grammar).
    pub free: bool,
    /// Steps holding constrained sequences too, their argmax masked.
    pub constrained: bool,
}

impl DecodeAhead {
    /// No step queues anything ahead.
    pub const OFF: DecodeAhead = DecodeAhead {
        free: false,
        constrained: false,
    };
}

/// Sends steps to the runner's thread.
#[derive(Clone)]
pub struct TargetRunnerHandle {
    tx: crossbeam_channel::Sender<RunnerMsg>,
    /// How long [`TargetRunnerHandle::step`] spins on the result before it sleeps.
    step_spin: Duration,
}

impl TargetRunner {
    /// Starts the runner on its own thread, driving `model` and its pool; the thread stops
    /// (and drops the model) once every handle is dropped. The runner polls for its next
    /// step, and a handle for a step's result, as `spin` says ([`Spin::for_device`]).
    /// Greedy decode steps that `decode_ahead` names queue the one after them before their
    /// tokens are read, where the backend can ([`Wanted::Argmax`]).
    pub fn spawn(
        model: Box<dyn ModelBackend>,
        block_size: usize,
        spin: Spin,
        decode_ahead: DecodeAhead,
    ) -> (TargetRunnerHandle, Stopped) {
        let mut runner = TargetRunner {
            model,
            block_size,
            seqs: HashMap::new(),
            tables: HashMap::new(),
            decode_ahead,
            ahead: None,
            hidden: None,
            scores: Vec::new(),
        };
        let (tx, rx) = crossbeam_channel::unbounded::<RunnerMsg>();
        let stopped = spawn_actor_thread("target-runner", move || {
            while let Some(msg) = recv_spinning(&rx, spin.for_next_step) {
                match msg {
                    RunnerMsg::Step(batch, reply) => {
                        let _ = reply.send(runner.step(batch));
                    }
                    RunnerMsg::CaptureGraphs(sizes, reply) => {
                        // A capture drops the step the backend queued ahead.
                        runner.ahead = None;
                        let _ = reply.send(runner.model.capture_graphs(sizes.as_ref()));
                    }
                }
            }
        });
        let handle = TargetRunnerHandle {
            tx,
            step_spin: spin.for_step,
        };
        (handle, stopped)
    }

    /// Runs one step.
    fn step(&mut self, batch: ScheduledBatch) -> anyhow::Result<StepDone> {
        // A backend that moves blocks drops the step it queued ahead (`move_kv`), so the
        // runner does too, even when the batch is the one it queued (a request held for
        // its loads left the rest of the batch as it was).
        let (ahead, dropped) = match batch.kv_moves.is_empty() {
            true => (self.ahead.take(), false),
            false => (None, self.ahead.take().is_some()),
        };
        let copying = Instant::now();
        let moved = self.model.move_kv(&batch.kv_moves);
        let mut copied = (!batch.kv_moves.is_empty()).then(|| copying.elapsed());
        for id in &batch.released {
            self.seqs.remove(id);
            self.tables.remove(id);
        }
        moved?;
        // A batch of no sequences (each one waits on a load) waits for a load, which is no
        // step's copying time.
        let waits = batch.seqs.is_empty();
        let loading = Instant::now();
        let loads = self.model.finish_loads(waits)?;
        if !loads.is_empty() && !waits {
            *copied.get_or_insert_default() += loading.elapsed();
        }
        if let Some(copied) = copied {
            crate::metrics::record_tier_copies(copied);
        }
        if batch.seqs.is_empty() {
            return Ok(StepDone {
                step: batch.step,
                sampled: Vec::new(),
                hidden: Vec::new(),
                ahead: match ahead.is_some() || dropped {
                    true => AheadUse::Dropped,
                    false => AheadUse::None,
                },
                prompt_logprobs: Vec::new(),
                loads,
            });
        }
        for seq in &batch.seqs {
            if let Some(setup) = &seq.setup {
                self.seqs.insert(seq.id, new_state(setup)?);
            }
            let held = self.tables.get(&seq.id).map_or(0, Vec::len);
            if seq.kept_blocks > held {
                return Err(anyhow!(
                    "{} keeps {} blocks but the runner holds {held}",
                    seq.id,
                    seq.kept_blocks
                ));
            }
        }
        // Each table leaves the map for the step and returns to it whatever the outcome.
        let mut seqs: Vec<RunSeq> = batch.seqs.into_iter().map(|s| self.resolve(s)).collect();
        self.hidden = None;
        self.scores.clear();
        let result = self
            .read_drafts_unless_fed(&mut seqs)
            .and_then(|()| self.run(&seqs, ahead, batch.queue_ahead));
        let hidden = self
            .hidden
            .take()
            .map(|h| split_hidden(&h, &seqs))
            .unwrap_or_default();
        self.tables
            .extend(seqs.into_iter().map(|s| (s.id, s.block_table)));
        let (sampled, ahead) = result?;
        let ahead = match (ahead, dropped) {
            (AheadUse::None, true) => AheadUse::Dropped,
            (used, _) => used,
        };
        Ok(StepDone {
            step: batch.step,
            sampled,
            hidden,
            ahead,
            prompt_logprobs: std::mem::take(&mut self.scores),
            loads,
        })
    }

    /// `seq` with the table the runner holds for it, changed as the scheduler says.
    fn resolve(&mut self, seq: ScheduledSeq) -> RunSeq {
        let mut block_table = self.tables.remove(&seq.id).unwrap_or_default();
        block_table.truncate(seq.kept_blocks);
        block_table.extend(seq.new_blocks);
        RunSeq {
            id: seq.id,
            tokens: seq.tokens,
            num_cached: seq.num_cached,
            block_table,
            kept_blocks: seq.kept_blocks,
            sample: seq.sample,
            num_drafts: seq.num_drafts,
            draft_dists: seq.draft_dists,
            drafts_on_device: seq.drafts_on_device,
        }
    }

    /// Runs the forward of `seqs` and samples or verifies each sampled one, scoring the
    /// prompt tokens asked for; says how the step queued `ahead` of this one served it.
    /// A greedy step queues the one after it only where `queue_next`.
    fn run(
        &mut self,
        seqs: &[RunSeq],
        ahead: Option<AheadStep>,
        queue_next: bool,
    ) -> anyhow::Result<(Vec<SeqOutput>, AheadUse)> {
        let scoring = prompt_scores::scoring(seqs, &self.seqs)?;
        // The sampled sequences' states leave the map for the step (the backend borrows
        // them all at once) and return to it whatever the step's outcome.
        let mut states = Vec::new();
        for s in seqs.iter().filter(|s| s.sample) {
            match self.seqs.remove(&s.id) {
                Some(state) => states.push((s, state)),
                None => {
                    self.seqs
                        .extend(states.into_iter().map(|(s, st)| (s.id, st)));
                    return Err(anyhow!("{} was scheduled to sample before its setup", s.id));
                }
            }
        }
        let speculative = seqs.iter().any(|s| s.num_drafts > 0);
        let queues_ahead = match self.decode_ahead {
            DecodeAhead { free: false, .. } => false,
            DecodeAhead {
                constrained: true, ..
            } => greedy_under_masks(&states),
            DecodeAhead {
                constrained: false, ..
            } => argmax_only(&states),
        };
        let outputs = if queues_ahead && !speculative && scoring.is_empty() {
            self.greedy_ahead_step(seqs, &mut states, ahead, queue_next)
        } else {
            self.step_alone(seqs, &mut states, &scoring)
                .map(|outputs| (outputs, ahead.map_or(AheadUse::None, |_| AheadUse::Dropped)))
        };
        self.seqs
            .extend(states.into_iter().map(|(s, state)| (s.id, state)));
        if outputs.is_ok() {
            prompt_scores::record(&scoring, &mut self.seqs);
        }
        outputs
    }

    /// Runs `seqs` as one forward, sampling or verifying each sampled sequence and scoring
    /// the prompt tokens of `scoring`.
    fn step_alone(
        &mut self,
        seqs: &[RunSeq],
        states: &mut [(&RunSeq, SeqSampling)],
        scoring: &[Scoring],
    ) -> anyhow::Result<Vec<SeqOutput>> {
        let all: Vec<&RunSeq> = seqs.iter().collect();
        let (plan, tokens, rows) = self.step_inputs(&all)?;
        if seqs.iter().any(|s| s.num_drafts > 0) || !scoring.is_empty() {
            self.verify_step(&tokens, &plan, &rows, states, scoring)
        } else {
            self.sample_step(&tokens, &plan, &rows, states)
        }
    }

    /// What a forward over `seqs` takes: its plan, the tokens, and each sampled
    /// sequence's rows (its last one, or its last `num_drafts + 1` when it carries drafts
    /// to verify).
    fn step_inputs(
        &self,
        seqs: &[&RunSeq],
    ) -> anyhow::Result<(AttentionPlan, Vec<u32>, Vec<usize>)> {
        let plan = self.plan_of(seqs, |s| s.num_cached)?;
        let tokens: Vec<u32> = seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let mut rows = Vec::new();
        let mut end = 0;
        for s in seqs {
            end += s.tokens.len();
            if s.sample {
                rows.extend(end - 1 - s.num_drafts.min(s.tokens.len() - 1)..end);
            }
        }
        Ok((plan, tokens, rows))
    }

    /// Runs `input` on the model, keeping the hidden states it recorded for the step's
    /// `StepDone`.
    fn forward(&mut self, input: StepInput) -> anyhow::Result<StepOutput> {
        let mut output = self.model.run(input)?;
        if let Some(hidden) = output.hidden.take() {
            self.hidden = Some(hidden);
        }
        Ok(output)
    }

    /// The forward of `tokens` and the argmax of each of `rows`, unmasked, queuing nothing.
    fn plain_argmax(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        rows: &[usize],
    ) -> anyhow::Result<Vec<u32>> {
        let wanted = Wanted::Argmax {
            next: None,
            masks: RowMasks::None,
        };
        self.forward(fresh(tokens, plan, rows, wanted))?.argmax()
    }

    /// The plan of `seqs`' tokens, with `cached` tokens of each before them.
    fn plan_of(
        &self,
        seqs: &[&RunSeq],
        cached: impl Fn(&RunSeq) -> usize,
    ) -> anyhow::Result<AttentionPlan> {
        let specs: Vec<SeqSpec> = seqs
            .iter()
            .map(|s| SeqSpec {
                num_cached: cached(s),
                num_new: s.tokens.len(),
                block_table: &s.block_table,
            })
            .collect();
        let num_blocks = self.model.pool().layout.num_blocks;
        Ok(AttentionPlan::new(&specs, self.block_size, num_blocks)?)
    }

    /// One token per sampled sequence: each row's argmax where [`argmax_only`] holds (on
    /// the GPU the decode graph's own, one download of the ids), else chosen by the
    /// backend's sampler.
    fn sample_step(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        rows: &[usize],
        states: &mut [(&RunSeq, SeqSampling)],
    ) -> anyhow::Result<Vec<SeqOutput>> {
        let generated = if argmax_only(states) {
            // Each token is its row's argmax, which a decode graph computes in itself.
            let ids = self.plain_argmax(tokens, plan, rows)?;
            ids.into_iter()
                .map(|id| GeneratedToken { id, logprobs: None })
                .collect()
        } else {
            self.sample_masked(tokens, plan, rows, states)?
        };
        if generated.len() != states.len() {
            return Err(anyhow!(
                "{} tokens for {} sampled rows",
                generated.len(),
                states.len()
            ));
        }
        Ok(states
            .iter_mut()
            .zip(generated)
            .map(|((s, state), token)| {
                let mut tokens = vec![token];
                let grammar = state.chose(&mut tokens, 0, 0, true);
                SeqOutput {
                    id: s.id,
                    tokens,
                    num_drafts: 0,
                    num_accepted: 0,
                    grammar,
                }
            })
            .collect())
    }

    /// The forward of `tokens`, each sampled row's token chosen by its sampler among what
    /// its grammar allows; the masks are computed on a host thread while the forward runs.
    fn sample_masked(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        rows: &[usize],
        states: &mut [(&RunSeq, SeqSampling)],
    ) -> anyhow::Result<Vec<GeneratedToken>> {
        let mut sampling = Vec::with_capacity(states.len());
        let mut grammars = Vec::with_capacity(states.len());
        for (_, state) in states.iter_mut() {
            let SeqSampling {
                sampler,
                prompt,
                output,
                logprobs,
                grammar,
                ..
            } = state;
            sampling.push(RowSampling {
                sampler,
                prompt,
                output,
                logprobs: *logprobs,
            });
            grammars.push(grammar.as_mut());
        }
        std::thread::scope(|scope| {
            let wanted = Wanted::Sampled(&mut sampling, masks_of(scope, grammars));
            self.forward(fresh(tokens, plan, rows, wanted))?.sampled()
        })
    }

    /// Verifies every sampled sequence's drafts with its own sampler over host logits
    /// (a sequence without drafts has its token sampled there), or, when every sequence is
    /// greedy without penalties or logprobs and no prompt is scored, from each row's
    /// argmax. The rows of `scoring` come back with the others and score their prompt
    /// tokens.
    fn verify_step(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        rows: &[usize],
        states: &mut [(&RunSeq, SeqSampling)],
        scoring: &[Scoring],
    ) -> anyhow::Result<Vec<SeqOutput>> {
        if scoring.is_empty() && argmax_only(states) {
            return self.verify_greedy(tokens, plan, rows, states);
        }
        let all_rows = prompt_scores::logit_rows(rows, scoring);
        let vocab = self.model.config().vocab_size;
        // Each constrained sequence's masks over its drafts, computed while the forward runs.
        let checked: Vec<_> = states
            .iter_mut()
            .map(|(s, state)| (state.grammar.as_mut(), drafts_of(s)))
            .collect();
        let constrained = checked.iter().any(|(grammar, _)| grammar.is_some());
        let count = checked.len();
        let (logits, mut draft_masks) = std::thread::scope(|scope| {
            let masks = constrained.then(|| scope.spawn(move || verification_masks(checked)));
            let logits = self.forward(fresh(tokens, plan, &all_rows, Wanted::Logits));
            let masks = match masks {
                Some(thread) => thread
                    .join()
                    .map_err(|_| anyhow!("the thread computing grammar masks panicked"))?,
                None => vec![None; count],
            };
            anyhow::Ok((logits?.logits()?, masks))
        })?;
        if logits.len() != all_rows.len() * vocab {
            return Err(anyhow!(
                "{} logits for {} rows of {vocab}",
                logits.len(),
                all_rows.len()
            ));
        }
        let row = |at: usize| {
            let index = all_rows
                .binary_search(&at)
                .map_err(|_| anyhow!("row {at} is not among the step's logit rows"))?;
            anyhow::Ok(&logits[index * vocab..(index + 1) * vocab])
        };
        self.scores = prompt_scores::scores(scoring, row)?;
        let sampled_rows: Vec<&[f32]> = rows.iter().map(|&at| row(at)).collect::<Result<_, _>>()?;
        let mut rows = sampled_rows.into_iter();
        let mut outputs = Vec::with_capacity(states.len());
        for ((s, state), masks) in states.iter_mut().zip(draft_masks.iter_mut()) {
            let drafts = drafts_of(s);
            let n = drafts.len();
            let raw: Vec<&[f32]> = rows.by_ref().take(n + 1).collect();
            // A constrained row is judged on its masked logits (its logprobs on the raw).
            let masked: Vec<Vec<f32>> = match masks.as_ref() {
                Some(masks) => masks
                    .masks
                    .iter()
                    .zip(&raw)
                    .map(|(mask, row)| mask.applied(row))
                    .collect(),
                None => Vec::new(),
            };
            let own: Vec<&[f32]> = (0..raw.len())
                .map(|i| masked.get(i).map_or(raw[i], Vec::as_slice))
                .collect();
            // Sampled drafts are verified against the distributions they came from.
            let dists = match s.draft_dists.as_deref() {
                Some(d) if d.len() != n => {
                    return Err(anyhow!(
                        "{}: {} draft distributions for {n} drafts",
                        s.id,
                        d.len()
                    ))
                }
                dists => dists,
            };
            let verdict = verify(
                &mut state.sampler,
                &own,
                drafts,
                dists,
                &state.prompt,
                &state.output,
            );
            let mut generated = verdict
                .tokens
                .iter()
                .zip(&raw)
                .map(|(&id, row)| GeneratedToken {
                    id,
                    logprobs: state.logprobs.and_then(|k| log_softmax(row, id, k)),
                })
                .collect();
            let admitted = masks.as_ref().map_or(0, |m| m.admitted);
            let grammar = state.chose(&mut generated, admitted, verdict.accepted, true);
            outputs.push(SeqOutput {
                id: s.id,
                tokens: generated,
                num_drafts: n,
                num_accepted: verdict.accepted,
                grammar,
            });
        }
        Ok(outputs)
    }

    /// Greedy verification from each row's argmax (the backend moves only the ids); drafts
    /// left on the device are fed there and read back with the ids.
    fn verify_greedy(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        rows: &[usize],
        states: &mut [(&RunSeq, SeqSampling)],
    ) -> anyhow::Result<Vec<SeqOutput>> {
        let fed = fed_rows(states.iter().map(|(s, _)| *s), rows)?;
        let (targets, judged) = match fed.is_empty() {
            true => (self.plain_argmax(tokens, plan, rows)?, None),
            false => {
                let groups = row_groups(states.iter().map(|(s, _)| *s));
                let (ids, accepted) = self.model.verify_fed(tokens, plan, rows, &fed, &groups)?;
                if let Some(hidden) = self.model.take_hidden() {
                    self.hidden = Some(hidden);
                }
                (ids, Some(accepted))
            }
        };
        if targets.len() != rows.len() {
            return Err(anyhow!("{} tokens for {} rows", targets.len(), rows.len()));
        }
        let mut targets = targets.as_slice();
        let mut outputs = Vec::with_capacity(states.len());
        for (k, (s, state)) in states.iter_mut().enumerate() {
            let n = s.num_drafts.min(s.tokens.len() - 1);
            let (own, rest) = targets.split_at(n + 1);
            targets = rest;
            // Judged on the device where the drafts were fed there.
            let verdict = match &judged {
                Some(accepted) => Verdict {
                    accepted: accepted[k].min(n),
                    tokens: own[..=accepted[k].min(n)].to_vec(),
                },
                None => accept_greedy(own, &s.tokens[s.tokens.len() - n..]),
            };
            state.output.extend(&verdict.tokens);
            outputs.push(SeqOutput {
                id: s.id,
                tokens: verdict
                    .tokens
                    .iter()
                    .map(|&id| GeneratedToken { id, logprobs: None })
                    .collect(),
                num_drafts: n,
                num_accepted: verdict.accepted,
                grammar: GrammarStatus::Open,
            });
        }
        Ok(outputs)
    }
}

/// Cuts the hidden states of a step's rows (`[tokens of seqs, width]`) into one piece
/// per sequence, at its positions.
fn split_hidden(hidden: &HiddenData, seqs: &[RunSeq]) -> Vec<HiddenRows> {
    let num_tokens: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    let width = match hidden {
        HiddenData::Host(values) => values.len() / num_tokens.max(1),
        HiddenData::Ring { .. } => 1,
    };
    let mut start = 0;
    seqs.iter()
        .map(|s| {
            let rows = start..start + s.tokens.len();
            start = rows.end;
            HiddenRows {
                id: s.id,
                first_pos: s.num_cached,
                data: hidden.slice(rows.start, rows.end, width),
            }
        })
        .collect()
}

/// Whether every sampled sequence's token is its row's argmax: greedy, without penalties,
/// logprobs, a grammar, or biases from its next token on (`min_tokens` passed, no
/// `logit_bias`); its sampler then draws nothing, so it need not see the logits.
fn argmax_only(states: &[(&RunSeq, SeqSampling)]) -> bool {
    states.iter().all(|(_, state)| takes_argmax(state))
}

/// Whether the sequence's token is its row's argmax ([`argmax_only`], one sequence).
fn takes_argmax(state: &SeqSampling) -> bool {
    greedy_under_mask(state) && state.grammar.is_none()
}

/// Whether every sampled sequence's token is the argmax of its row under its grammar's
/// mask, if it has one: [`argmax_only`] but for the grammars.
fn greedy_under_masks(states: &[(&RunSeq, SeqSampling)]) -> bool {
    states.iter().all(|(_, state)| greedy_under_mask(state))
}

/// [`greedy_under_masks`] of one sequence.
fn greedy_under_mask(state: &SeqSampling) -> bool {
    let params = state.sampler.params();
    params.is_greedy()
        && !params.has_penalties()
        && !params.biases_after(state.output.len())
        && state.logprobs.is_none()
}

/// The drafts `s` carries to verify: the last of its tokens.
fn drafts_of(s: &RunSeq) -> &[u32] {
    let n = s.num_drafts.min(s.tokens.len() - 1);
    &s.tokens[s.tokens.len() - n..]
}

/// A step of `tokens` over `plan` giving `wanted` of `logit_rows`.
fn fresh<'a, 's>(
    tokens: &'a [u32],
    plan: &'a AttentionPlan,
    logit_rows: &'a [usize],
    wanted: Wanted<'a, 's>,
) -> StepInput<'a, 's> {
    StepInput {
        source: StepSource::Fresh {
            tokens,
            plan,
            logit_rows,
        },
        wanted,
    }
}

fn new_state(setup: &SamplingSetup) -> anyhow::Result<SeqSampling> {
    Ok(SeqSampling {
        sampler: Sampler::new(&setup.params)?,
        prompt: setup.prompt.clone(),
        output: Vec::new(),
        logprobs: setup.logprobs,
        prompt_logprobs: setup.prompt_logprobs,
        scored: 1,
        max_tokens: setup.max_tokens,
        grammar: setup.grammar.as_ref().map(|grammar| grammar.matcher()),
    })
}

impl TargetRunnerHandle {
    /// Captures graphs for `sizes` on the runner's thread, between two steps (`None`:
    /// drops them); on failure the graphs held before stay.
    pub async fn capture_graphs(&self, sizes: Option<CaptureSizes>) -> anyhow::Result<()> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(RunnerMsg::CaptureGraphs(sizes, reply))
            .map_err(|_| anyhow!("the target runner has stopped"))?;
        rx.await
            .map_err(|_| anyhow!("the target runner dropped a capture"))?
    }

    /// Runs `batch` on the runner's thread and waits for its result, polling for it first
    /// where the runner's steps run on a device (which holds the calling task's worker
    /// thread meanwhile: see [`reply_spinning`]).
    pub async fn step(&self, batch: ScheduledBatch) -> anyhow::Result<StepDone> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(RunnerMsg::Step(batch, reply))
            .map_err(|_| anyhow!("the target runner has stopped"))?;
        reply_spinning(rx, self.step_spin)
            .await
            .ok_or_else(|| anyhow!("the target runner dropped a step"))?
    }
}

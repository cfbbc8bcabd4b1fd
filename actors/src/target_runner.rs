//! The TargetRunner: owns the target model, its KV cache and (on a GPU) its stream, on a
//! dedicated OS thread, because device work blocks. Each step it turns the scheduler's
//! `ScheduledBatch` into one forward over the real tokens and samples the sequences that
//! asked for a token.

use crate::messages::{
    GeneratedToken, RequestId, RunnerMsg, SamplingSetup, ScheduledBatch, StepDone,
};
use anyhow::{anyhow, Context};
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::{log_softmax, Sampler};
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Per-request sampling state, kept from a request's first step until it is released, so
/// that a preempted and recomputed request continues the same random stream.
struct SeqSampling {
    sampler: Sampler,
    prompt: Arc<[u32]>,
    output: Vec<u32>,
    logprobs: Option<usize>,
}

/// The runner's state, living on its thread.
pub struct TargetRunner {
    model: LlamaModel,
    cache: KvCache,
    block_size: usize,
    seqs: HashMap<RequestId, SeqSampling>,
}

/// Sends steps to the runner's thread.
#[derive(Clone)]
pub struct TargetRunnerHandle {
    tx: crossbeam_channel::Sender<RunnerMsg>,
}

impl TargetRunner {
    /// Starts the runner on its own thread with a cache of `num_blocks` blocks.
    pub fn spawn(model: LlamaModel, num_blocks: u32, block_size: usize) -> TargetRunnerHandle {
        let layout = model.kv_layout(num_blocks as u64, block_size as u64);
        let cache = KvCache::new(model.config().num_layers, layout);
        let mut runner = TargetRunner {
            model,
            cache,
            block_size,
            seqs: HashMap::new(),
        };
        let (tx, rx) = crossbeam_channel::unbounded::<RunnerMsg>();
        std::thread::Builder::new()
            .name("target-runner".into())
            .spawn(move || {
                for msg in rx {
                    match msg {
                        RunnerMsg::Step(batch, reply) => {
                            let _ = reply.send(runner.step(batch));
                        }
                    }
                }
            })
            .expect("spawning the target runner thread");
        TargetRunnerHandle { tx }
    }

    /// Runs one step.
    fn step(&mut self, batch: ScheduledBatch) -> anyhow::Result<StepDone> {
        for id in &batch.released {
            self.seqs.remove(id);
        }
        for seq in &batch.seqs {
            if let Some(setup) = &seq.setup {
                self.seqs.insert(seq.id, new_state(setup)?);
            }
        }
        let specs: Vec<SeqSpec> = batch
            .seqs
            .iter()
            .map(|s| SeqSpec {
                num_cached: s.num_cached,
                num_new: s.tokens.len(),
                block_table: &s.block_table,
            })
            .collect();
        let plan = AttentionPlan::new(&specs, self.block_size, self.cache.layout().num_blocks)?;
        let tokens: Vec<u32> = batch
            .seqs
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let mut rows = Vec::new();
        let mut end = 0;
        for s in &batch.seqs {
            end += s.tokens.len();
            if s.sample {
                rows.push(end - 1);
            }
        }
        let logits = self.model.forward(&tokens, &plan, &mut self.cache, &rows)?;
        let vocab = self.model.config().vocab_size;
        let mut sampled = Vec::with_capacity(rows.len());
        let mut rows_logits = logits.chunks(vocab);
        for s in batch.seqs.iter().filter(|s| s.sample) {
            let row = rows_logits.next().context("a sampled row without logits")?;
            let state = self
                .seqs
                .get_mut(&s.id)
                .ok_or_else(|| anyhow!("{} was scheduled to sample before its setup", s.id))?;
            let id = state.sampler.sample(row, &state.prompt, &state.output);
            state.output.push(id);
            let logprobs = state.logprobs.and_then(|n| log_softmax(row, id, n));
            sampled.push((s.id, GeneratedToken { id, logprobs }));
        }
        Ok(StepDone {
            step: batch.step,
            sampled,
        })
    }
}

fn new_state(setup: &SamplingSetup) -> anyhow::Result<SeqSampling> {
    Ok(SeqSampling {
        sampler: Sampler::new(&setup.params)?,
        prompt: setup.prompt.clone(),
        output: Vec::new(),
        logprobs: setup.logprobs,
    })
}

impl TargetRunnerHandle {
    /// Runs `batch` on the runner's thread and waits for its result.
    pub async fn step(&self, batch: ScheduledBatch) -> anyhow::Result<StepDone> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(RunnerMsg::Step(batch, reply))
            .map_err(|_| anyhow!("the target runner has stopped"))?;
        rx.await
            .map_err(|_| anyhow!("the target runner dropped a step"))?
    }
}

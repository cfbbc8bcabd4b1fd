//! One request at a time, start to finish: prefill the prompt, then decode token by token
//! over the paged KV cache. `peregrine generate` runs on it; the serving runtime's
//! scheduler and target runner replace it for batched serving.

mod block_pool;

use crate::messages::FinishReason;
use anyhow::{bail, Context};
use block_pool::BlockPool;
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::{Sampler, SamplingParams};
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use std::time::Instant;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// How to pick each token.
    pub params: SamplingParams,
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end generation besides the model's end-of-sequence ids.
    pub stop_token_ids: Vec<u32>,
    /// Keep going past the model's end-of-sequence ids.
    pub ignore_eos: bool,
}

/// Counts and timings of one generation.
#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Seconds from the start to the first generated token (the prompt's forward).
    pub prefill_seconds: f64,
    /// Seconds spent on the tokens after the first.
    pub decode_seconds: f64,
    pub finish_reason: FinishReason,
}

impl GenerationStats {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_seconds
    }

    /// Generated tokens per second after the first one.
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_seconds
    }
}

/// A model with its own KV cache and block pool.
pub struct Generator {
    model: LlamaModel,
    cache: KvCache,
    pool: BlockPool,
    block_size: usize,
}

impl Generator {
    /// A generator whose cache holds `num_blocks` blocks of `block_size` tokens.
    pub fn new(model: LlamaModel, num_blocks: u32, block_size: usize) -> Generator {
        let layout = model.kv_layout(num_blocks as u64, block_size as u64);
        let cache = KvCache::new(model.config().num_layers, layout);
        Generator {
            model,
            cache,
            pool: BlockPool::new(num_blocks),
            block_size,
        }
    }

    /// The model.
    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    /// Generates for `request`, calling `on_token` with each new token as it is chosen.
    /// Returns the generated ids and the statistics.
    pub fn generate(
        &mut self,
        request: &GenerationRequest,
        mut on_token: impl FnMut(u32),
    ) -> anyhow::Result<(Vec<u32>, GenerationStats)> {
        let prompt = &request.prompt;
        let max_len = self.model.config().max_model_len;
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        if prompt.len() + request.max_tokens > max_len {
            bail!(
                "the prompt ({} tokens) plus max_tokens ({}) exceeds the model's maximum length of {max_len}",
                prompt.len(),
                request.max_tokens
            );
        }
        let mut sampler = Sampler::new(&request.params)?;
        let eos = self.model.config().eos_token_ids.clone();
        let is_stop = |t: u32| {
            request.stop_token_ids.contains(&t) || (!request.ignore_eos && eos.contains(&t))
        };
        let mut blocks = self.pool.empty();
        let mut output = Vec::with_capacity(request.max_tokens);
        let start = Instant::now();
        let mut first_token_at = start;
        let mut fed: &[u32] = prompt;
        let mut cached = 0;
        let mut finish_reason = FinishReason::Length;
        let mut last;
        while output.len() < request.max_tokens {
            blocks
                .grow_to((cached + fed.len()).div_ceil(self.block_size))
                .context("generation needs more KV cache")?;
            let spec = SeqSpec {
                num_cached: cached,
                num_new: fed.len(),
                block_table: blocks.ids(),
            };
            let plan =
                AttentionPlan::new(&[spec], self.block_size, self.cache.layout().num_blocks)?;
            let logits = self
                .model
                .forward(fed, &plan, &mut self.cache, &[fed.len() - 1])?;
            cached += fed.len();
            let token = sampler.sample(&logits, prompt, &output);
            if output.is_empty() {
                first_token_at = Instant::now();
            }
            output.push(token);
            on_token(token);
            if is_stop(token) {
                finish_reason = FinishReason::Stop;
                break;
            }
            last = [token];
            fed = &last;
        }
        let stats = GenerationStats {
            prompt_tokens: prompt.len(),
            generated_tokens: output.len(),
            prefill_seconds: (first_token_at - start).as_secs_f64(),
            decode_seconds: first_token_at.elapsed().as_secs_f64(),
            finish_reason,
        };
        Ok((output, stats))
    }
}

//! `peregrine perplexity`: the model's perplexity on a text, by llama-perplexity's default
//! method (llama.cpp's tools/perplexity/perplexity.cpp): the text tokenized once with the
//! tokenizer's special tokens, cut into whole chunks of --ctx-size tokens, each chunk's
//! first token set to BOS where the tokenizer adds one, each chunk run from an empty KV
//! cache, and the tokens from ctx/2 + 1 to ctx - 1 scored against the logits of the
//! positions before them.

mod estimate;

use crate::cli::PerplexityArgs;
use crate::commands::resolve_model;
use anyhow::{bail, ensure, Context};
use estimate::Estimate;
use peregrine_models::tokenizer::Tokenizer;
use peregrine_models::LlamaModel;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use std::io::Write;

/// Tokens per KV block of the chunk's cache.
const BLOCK_SIZE: usize = 16;

/// Scores the text and prints the running estimate after each chunk (`[1]12.3456,...`),
/// then `Final estimate: PPL = X +/- Y`, as llama-perplexity does.
pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    let n_ctx = args.ctx_size;
    ensure!(
        n_ctx >= 3,
        "--ctx-size {n_ctx}: expected at least 3 (a chunk scores its tokens from ctx/2 + 1 \
         to ctx - 1, none below 3)"
    );
    ensure!(args.batch_size > 0, "--batch-size 0: expected at least 1");
    ensure!(args.chunks != Some(0), "--chunks 0: expected at least 1");
    let mut text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    if text.ends_with('\n') {
        text.pop();
    }
    let dir = resolve_model(&args.model)?;
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let tokens = tokenizer.encode(&text, true)?;
    if tokens.len() < 2 * n_ctx {
        bail!(
            "{} tokenizes to {} tokens; a context of {n_ctx} needs at least {} (2 x --ctx-size, \
             as llama-perplexity asks)",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    let adds_bos = tokenizer.adds_bos()?;
    let bos = tokenizer.bos_token_id().filter(|_| adds_bos);
    let model = LlamaModel::load(&dir).with_context(|| format!("loading {}", dir.display()))?;
    if n_ctx > model.config().max_model_len {
        tracing::warn!(
            "the model serves {} tokens at most; --ctx-size is {n_ctx}",
            model.config().max_model_len
        );
    }
    let chunks = (tokens.len() / n_ctx).min(args.chunks.unwrap_or(usize::MAX));
    eprintln!(
        "perplexity: {} tokens, {chunks} chunks of {n_ctx}, {}",
        tokens.len(),
        bos.map_or("no BOS".to_string(), |id| format!("BOS {id} first"))
    );
    let num_blocks = n_ctx.div_ceil(BLOCK_SIZE);
    let dtype = crate::commands::kv_dtype::cpu_kv_dtype(args.kv_cache_dtype, model.kv_rows())?;
    let layout = model.kv_layout(num_blocks as u64, BLOCK_SIZE as u64);
    let mut cache =
        KvCache::try_with_dtype(model.config().num_layers, layout, model.kv_rows(), dtype)?;
    let table: Vec<u32> = (0..num_blocks as u32).collect();
    let mut estimate = Estimate::default();
    let mut stdout = std::io::stdout().lock();
    for (i, chunk) in tokens.chunks_exact(n_ctx).take(chunks).enumerate() {
        let mut input = chunk.to_vec();
        if let Some(bos) = bos {
            input[0] = bos;
        }
        let chunk = Chunk {
            tokens: &input,
            block_table: &table,
            batch: args.batch_size,
        };
        chunk.score(&model, &mut cache, &mut estimate)?;
        write!(stdout, "[{}]{:.4},", i + 1, estimate.perplexity())?;
        stdout.flush()?;
    }
    writeln!(stdout)?;
    let ppl = estimate.perplexity();
    let error = estimate.standard_error().with_context(|| {
        format!(
            "PPL = {ppl:.4} over {} tokens has no standard error (their log-likelihoods do not vary)",
            estimate.count()
        )
    })?;
    writeln!(stdout, "Final estimate: PPL = {ppl:.4} +/- {error:.5}")?;
    Ok(())
}

/// One chunk of the text as the model reads it.
struct Chunk<'a> {
    /// The chunk's tokens, its first one BOS where the tokenizer adds one.
    tokens: &'a [u32],
    /// The KV blocks the chunk's keys and values go to.
    block_table: &'a [u32],
    /// Rows per forward.
    batch: usize,
}

impl Chunk<'_> {
    /// Runs the chunk from position 0 (the cache's earlier contents unread), `batch` rows a
    /// forward, and adds each token from n_ctx/2 + 1 on, scored against the logits of the
    /// position before it, to `estimate`.
    fn score(
        &self,
        model: &LlamaModel,
        cache: &mut KvCache,
        estimate: &mut Estimate,
    ) -> anyhow::Result<()> {
        let n_ctx = self.tokens.len();
        let first = n_ctx / 2;
        let vocab = model.config().vocab_size;
        let num_blocks = cache.layout().num_blocks;
        for start in (0..n_ctx).step_by(self.batch) {
            let end = (start + self.batch).min(n_ctx);
            let spec = SeqSpec {
                num_cached: start,
                num_new: end - start,
                block_table: self.block_table,
            };
            let plan = AttentionPlan::new(&[spec], BLOCK_SIZE, num_blocks)?;
            // Positions whose next token is scored: first ..= n_ctx - 2.
            let positions = start.max(first)..end.min(n_ctx - 1);
            let rows: Vec<usize> = positions.clone().map(|p| p - start).collect();
            let logits = model.forward(&self.tokens[start..end], &plan, cache, &rows)?;
            for (row, p) in logits.chunks_exact(vocab).zip(positions) {
                estimate.add(row, self.tokens[p + 1]);
            }
        }
        Ok(())
    }
}

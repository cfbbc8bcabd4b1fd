//! `peregrine generate`: one prompt, streamed to stdout, then the speeds.

use crate::cli::GenerateArgs;
use anyhow::Context;
use peregrine_actors::{GenerationRequest, Generator};
use peregrine_config::CacheConfig;
use peregrine_models::chat_template::{ChatMessage, ChatTemplate};
use peregrine_models::tokenizer::Tokenizer;
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::SamplingParams;
use std::io::Write;

/// The request `generate` runs: the tokenizer's end-of-sequence ids end it (besides the
/// model's own) unless `ignore_eos`.
fn request(
    prompt: Vec<u32>,
    params: SamplingParams,
    max_tokens: usize,
    tokenizer_eos: &[u32],
    ignore_eos: bool,
) -> GenerationRequest {
    let stop_token_ids = if ignore_eos {
        Vec::new()
    } else {
        tokenizer_eos.to_vec()
    };
    GenerationRequest {
        prompt,
        params,
        max_tokens,
        stop_token_ids,
        ignore_eos,
    }
}

/// Loads the model, generates, and prints the text as it comes.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
    };
    params.validate()?;
    let dir = super::resolve_model(&args.model)?;
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let text = if args.chat {
        let template = ChatTemplate::from_dir(&dir)?
            .with_context(|| format!("{} has no chat template; drop --chat", dir.display()))?;
        let message = ChatMessage {
            role: "user".into(),
            content: args.prompt.clone(),
        };
        template.render(&[message], true)?
    } else {
        args.prompt.clone()
    };
    // A chat template writes its own special tokens; a plain prompt gets the tokenizer's.
    let prompt = tokenizer.encode(&text, !args.chat)?;
    let model = LlamaModel::load(&dir).with_context(|| format!("loading {}", dir.display()))?;
    let cache = CacheConfig {
        block_size: args.block_size,
        kv_cache_memory: None,
    };
    let blocks = cache.num_blocks(model.kv_bytes_per_token(), prompt.len() + args.max_tokens)?;
    let mut generator = Generator::new(model, blocks, args.block_size);
    let request = request(
        prompt,
        params,
        args.max_tokens,
        tokenizer.eos_token_ids(),
        args.ignore_eos,
    );
    let mut stream = tokenizer.decode_stream(true);
    let mut stdout = std::io::stdout().lock();
    let mut failed = None;
    let (_, stats) = generator.generate(&request, |token| match stream.step(token) {
        Ok(Some(piece)) => {
            // A closed stdout (a pipe into `head`) should not stop the measurement.
            let _ = write!(stdout, "{piece}").and_then(|_| stdout.flush());
        }
        Ok(None) => {}
        Err(e) => failed = Some(e),
    })?;
    if let Some(e) = failed {
        return Err(e.context("detokenizing"));
    }
    let _ = writeln!(stdout, "{}", stream.finish()?).and_then(|_| stdout.flush());
    drop(stdout);
    eprintln!(
        "prompt: {} tokens, {:.1} tokens/s | decode: {} tokens, {:.1} tokens/s | finish: {:?}",
        stats.prompt_tokens,
        stats.prefill_tokens_per_second(),
        stats.generated_tokens,
        stats.decode_tokens_per_second(),
        stats.finish_reason,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignore_eos_drops_the_tokenizers_end_of_sequence_ids_too() {
        let params = SamplingParams::greedy();
        let ignoring = request(vec![1], params.clone(), 5, &[2, 3], true);
        assert!(ignoring.ignore_eos);
        assert!(ignoring.stop_token_ids.is_empty(), "{ignoring:?}");
        let stopping = request(vec![1], params, 5, &[2, 3], false);
        assert_eq!(stopping.stop_token_ids, [2, 3]);
        assert!(!stopping.ignore_eos);
    }
}

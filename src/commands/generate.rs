//! `peregrine generate`: one prompt through the engine `serve` runs (the same backends,
//! graphs and speculation), its text streamed to stdout, then the speeds.

use crate::cli::GenerateArgs;
use crate::commands::engine::{load_backend, start};
use crate::commands::model_dir;
use anyhow::{bail, Context};
use peregrine_actors::messages::{
    FinishReason, GenerateRequest, RequestEvent, RequestId, RequestSpec, SchedulerMsg,
};
use peregrine_config::ServeConfig;
use peregrine_models::chat_template::{ChatMessage, ChatTemplate};
use peregrine_models::tokenizer::Tokenizer;
use peregrine_ops::sampling::SamplingParams;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

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
        ..SamplingParams::default()
    };
    params.validate()?;
    let config = engine_config(ServeConfig::load(&args.engine)?)?;
    let (dir, _) = model_dir(&config)?;
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let text = if args.chat {
        let template = ChatTemplate::from_dir(&dir)?
            .with_context(|| format!("{} has no chat template; drop --chat", dir.display()))?;
        let message = ChatMessage {
            role: "user".into(),
            content: args.prompt.clone(),
            ..ChatMessage::default()
        };
        template.render(&[message], true)?
    } else {
        args.prompt.clone()
    };
    // A chat template writes its own special tokens; a plain prompt gets the tokenizer's.
    let prompt = tokenizer.encode(&text, !args.chat)?;
    let spec = request(
        prompt,
        params,
        args.max_tokens,
        tokenizer.eos_token_ids(),
        args.ignore_eos,
    );
    let backend = load_backend(&config, &dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let stats = runtime.block_on(async {
        let engine = start(&config, &dir, backend).await?;
        let stats = stream(&engine.scheduler, spec, &tokenizer).await;
        engine.shutdown().await;
        stats
    })?;
    eprintln!(
        "prompt: {} tokens, {:.1} tokens/s | decode: {} tokens, {:.1} tokens/s | finish: {:?}",
        stats.prompt_tokens,
        stats.prompt_tokens as f64 / stats.to_first.as_secs_f64(),
        stats.generated_tokens,
        stats.generated_tokens.saturating_sub(1) as f64 / stats.after_first.as_secs_f64(),
        stats.finish,
    );
    Ok(())
}

/// `config` for one request: the settings only a server has must be left at their
/// defaults (generate listens nowhere), and graphs are captured for batch size 1 alone
/// unless `cudagraph_sizes` lists others.
fn engine_config(mut config: ServeConfig) -> anyhow::Result<ServeConfig> {
    let default = ServeConfig::default();
    let serving_only = [
        ("host", config.host != default.host),
        ("port", config.port != default.port),
        ("api_keys", config.api_keys != default.api_keys),
        ("admin_token", config.admin_token != default.admin_token),
        ("served_model_name", config.served_model_name.is_some()),
        (
            "max_waiting_requests",
            config.max_waiting_requests != default.max_waiting_requests,
        ),
        (
            "shutdown_timeout",
            config.shutdown_timeout != default.shutdown_timeout,
        ),
    ];
    if let Some((field, _)) = serving_only.iter().find(|(_, set)| *set) {
        bail!("{field} is a setting of `serve`: `generate` serves no clients; leave it out");
    }
    config.cudagraph_sizes.get_or_insert_with(|| vec![1]);
    Ok(config)
}

/// The request `generate` runs: the tokenizer's end-of-sequence ids end it (besides the
/// model's own) unless `ignore_eos`.
fn request(
    prompt: Vec<u32>,
    params: SamplingParams,
    max_tokens: usize,
    tokenizer_eos: &[u32],
    ignore_eos: bool,
) -> RequestSpec {
    let stop_token_ids = if ignore_eos {
        Vec::new()
    } else {
        tokenizer_eos.to_vec()
    };
    RequestSpec {
        prompt: Arc::from(prompt),
        params,
        max_tokens,
        stop_token_ids,
        ignore_eos,
        logprobs: None,
        prompt_logprobs: None,
        priority: 0,
        grammar: None,
    }
}

/// Counts and times of the request.
struct Stats {
    prompt_tokens: usize,
    generated_tokens: usize,
    /// From submission to the first token (the prompt's forward).
    to_first: Duration,
    /// From the first token to the last.
    after_first: Duration,
    finish: FinishReason,
}

/// Submits `spec` to the engine's `scheduler` and prints its text to stdout as it comes.
async fn stream(
    scheduler: &mpsc::Sender<SchedulerMsg>,
    spec: RequestSpec,
    tokenizer: &Tokenizer,
) -> anyhow::Result<Stats> {
    let prompt_tokens = spec.prompt.len();
    let (events, mut rx) = mpsc::unbounded_channel();
    let start = Instant::now();
    let request = GenerateRequest {
        id: RequestId(0),
        spec,
        arrival: start,
        events,
    };
    let (reply, accepted) = oneshot::channel();
    scheduler
        .send(SchedulerMsg::Submit(request, reply))
        .await
        .context("the engine stopped")?;
    accepted.await.context("the engine stopped")??;
    let mut decoder = tokenizer.decode_stream(true);
    let mut stdout = std::io::stdout().lock();
    let mut first = None;
    let mut generated_tokens = 0;
    loop {
        match rx.recv().await.context("the engine dropped the request")? {
            RequestEvent::Tokens(tokens) => {
                first.get_or_insert_with(Instant::now);
                generated_tokens += tokens.len();
                for token in tokens {
                    if let Some(piece) = decoder.step(token.id).context("detokenizing")? {
                        // A closed stdout (a pipe into `head`) should not stop the run.
                        let _ = write!(stdout, "{piece}").and_then(|_| stdout.flush());
                    }
                }
            }
            // Not asked for.
            RequestEvent::PromptLogprobs(_) => {}
            RequestEvent::Finished { reason, .. } => {
                let _ = writeln!(stdout, "{}", decoder.finish()?).and_then(|_| stdout.flush());
                if matches!(reason, FinishReason::Abort | FinishReason::Error) {
                    bail!("the engine ended the request ({})", reason.as_str());
                }
                let first = first.unwrap_or_else(Instant::now);
                return Ok(Stats {
                    prompt_tokens,
                    generated_tokens,
                    to_first: first - start,
                    after_first: first.elapsed(),
                    finish: reason,
                });
            }
        }
    }
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

    #[test]
    fn serving_only_settings_are_refused_and_graphs_default_to_batch_one() {
        let config = engine_config(ServeConfig::default()).unwrap();
        assert_eq!(config.cudagraph_sizes, Some(vec![1]));
        let listed = ServeConfig {
            cudagraph_sizes: Some(vec![1, 2]),
            ..ServeConfig::default()
        };
        assert_eq!(
            engine_config(listed).unwrap().cudagraph_sizes,
            Some(vec![1, 2])
        );
        let port = ServeConfig {
            port: 9000,
            ..ServeConfig::default()
        };
        let err = engine_config(port).unwrap_err().to_string();
        assert!(err.contains("port") && err.contains("serve"), "{err}");
    }
}

//! Validation of the fields both generation endpoints share, and the defaults for the ones
//! a request leaves out. Every error is a 400 whose `param` names the field.

use std::sync::Arc;

use peregrine_ops::sampling::{SamplingError, SamplingParams};

use super::biases::{self, Vocabulary};
use super::errors::ApiError;
use super::protocol::request::{GenerationFields, StreamOptions};
use super::sse::StreamUsage;
use super::state::{GatewayConfig, SequenceLimits};
use crate::messages::RequestSpec;
use crate::messages::SubmitError;

/// The most alternatives a request may ask for per token (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: i64 = 20;

/// A validated generation request.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What goes to the scheduler.
    pub submission: RequestSpec,
    /// Stop strings, none empty.
    pub stop: Vec<String>,
    /// Answer as server-sent events.
    pub stream: bool,
    /// Which usage the stream reports.
    pub usage: StreamUsage,
    /// Add the speculation counts to `usage`.
    pub spec_decode_details: bool,
    /// Add the prompt's and the generated token ids to the response.
    pub return_token_ids: bool,
    /// Report the prompt's tokens' logprobs (vLLM's `prompt_logprobs`) with this many
    /// alternatives each; the engine scores the prompt with at least as many.
    pub prompt_logprobs: Option<usize>,
    /// Detokenize with special tokens kept (a reply read for tool calls, whose markers may
    /// be special tokens), the tokens that end the output left out.
    pub keep_special_tokens: bool,
    /// Choices to generate (`n`), each a request of its own (`gateway/choices.rs`).
    pub n: usize,
}

/// The most choices one request may ask for (`n`), as OpenAI's API allows.
pub const MAX_CHOICES: usize = 128;

/// What an endpoint adds to the shared fields.
#[derive(Debug)]
pub struct EndpointInput {
    /// The tokenized prompt (not empty).
    pub prompt: Vec<u32>,
    /// The requested maximum output length and the name of the field that gave it.
    pub max_tokens: Option<(&'static str, i64)>,
    /// Alternatives per token, when logprobs are asked for (already range-checked).
    pub logprobs: Option<usize>,
    /// `max_tokens: 0` is allowed: a completion that echoes its prompt gives the prompt
    /// alone (scoring it, with `logprobs`), as OpenAI's legacy completions do.
    pub zero_max_tokens: bool,
    /// The served vocabulary (`logit_bias` and `min_tokens` are checked against it).
    pub vocabulary: Vocabulary,
}

/// 404 about `model` unless `requested` is absent or the served model's name.
pub fn check_model(requested: Option<&str>, config: &GatewayConfig) -> Result<(), ApiError> {
    match requested {
        Some(name) if name != config.served_model_name => Err(ApiError::not_found(format!(
            "The model '{name}' does not exist; this server serves '{}'",
            config.served_model_name
        ))
        .with_param("model")),
        _ => Ok(()),
    }
}

/// A logprobs count in `0..=MAX_LOGPROBS`, or a 400 naming `param`.
pub fn logprobs_count(param: &'static str, value: i64) -> Result<usize, ApiError> {
    usize::try_from(value)
        .ok()
        .filter(|_| value <= MAX_LOGPROBS)
        .ok_or_else(|| {
            ApiError::invalid(
                param,
                format!("`{param}` must be between 0 and {MAX_LOGPROBS}, got {value}"),
            )
        })
}

/// Checks `fields` (all but `model`: see [`check_model`]) and fills in the defaults of
/// `config`, within `limits`.
pub fn plan(
    fields: GenerationFields,
    input: EndpointInput,
    config: &GatewayConfig,
    limits: SequenceLimits,
) -> Result<Plan, ApiError> {
    let least = usize::from(!input.zero_max_tokens);
    let max_tokens = max_tokens(input.max_tokens, least, input.prompt.len(), config, limits)?;
    let stop_token_ids = fields.stop_token_ids.clone().unwrap_or_default();
    let ignore_eos = fields.ignore_eos.unwrap_or(false);
    let (min_tokens, min_tokens_stop_ids) = biases::min_tokens(
        fields.min_tokens,
        max_tokens,
        &stop_token_ids,
        ignore_eos,
        &input.vocabulary,
    )?;
    let params = SamplingParams {
        logit_bias: biases::logit_bias(fields.logit_bias.as_ref(), &input.vocabulary)?,
        min_tokens,
        min_tokens_stop_ids,
        ..sampling(&fields, &config.default_sampling)?
    };
    let stop = fields.stop.map(|stop| stop.into_vec()).unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    let n = choices(fields.n)?;
    let stream = fields.stream.unwrap_or(false);
    if fields.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    let prompt_logprobs = fields
        .prompt_logprobs
        .map(|count| logprobs_count("prompt_logprobs", count))
        .transpose()?;
    if prompt_logprobs.is_some() && stream {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            "`prompt_logprobs` are not available with `stream: true` (as in vLLM)",
        ));
    }
    Ok(Plan {
        submission: RequestSpec {
            prompt: Arc::from(input.prompt),
            params,
            max_tokens,
            stop_token_ids,
            ignore_eos,
            logprobs: input.logprobs,
            prompt_logprobs,
            priority: fields.priority.unwrap_or(0),
            grammar: None,
        },
        stop,
        stream,
        usage: stream_usage(fields.stream_options.as_ref()),
        spec_decode_details: fields.return_spec_decode_stats.unwrap_or(false),
        return_token_ids: fields.return_token_ids.unwrap_or(false),
        prompt_logprobs,
        keep_special_tokens: false,
        n,
    })
}

/// The number of choices `n` asks for: 1 when it is left out.
fn choices(n: Option<i64>) -> Result<usize, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid(
            "n",
            format!("`n` must be between 1 and {MAX_CHOICES}, not {n}"),
        )),
    }
}

/// The usage `options` ask for: at the end with `include_usage`, and in every chunk with
/// `continuous_usage_stats` too (vLLM's, which needs `include_usage`).
fn stream_usage(options: Option<&StreamOptions>) -> StreamUsage {
    let at_end = options.and_then(|o| o.include_usage).unwrap_or(false);
    let continuous = options.and_then(|o| o.continuous_usage_stats);
    StreamUsage {
        at_end,
        every_chunk: at_end && continuous.unwrap_or(false),
    }
}

/// The request's sampling parameters over `defaults`, validated.
fn sampling(
    fields: &GenerationFields,
    defaults: &SamplingParams,
) -> Result<SamplingParams, ApiError> {
    let params = SamplingParams {
        temperature: fields.temperature.unwrap_or(defaults.temperature),
        top_k: fields.top_k.unwrap_or(defaults.top_k),
        top_p: fields.top_p.unwrap_or(defaults.top_p),
        min_p: fields.min_p.unwrap_or(defaults.min_p),
        repetition_penalty: fields
            .repetition_penalty
            .unwrap_or(defaults.repetition_penalty),
        presence_penalty: fields.presence_penalty.unwrap_or(defaults.presence_penalty),
        frequency_penalty: fields
            .frequency_penalty
            .unwrap_or(defaults.frequency_penalty),
        // A signed seed keeps its 64 bits: -1 and 2^64 - 1 are one seed.
        seed: fields.seed.map(|seed| seed as u64).or(defaults.seed),
        ..SamplingParams::default()
    };
    params.validate().map_err(|err| match err {
        SamplingError::Invalid { field, .. } => ApiError::invalid(field, err.to_string()),
        SamplingError::Entropy(_) => ApiError::internal(err.to_string()),
    })?;
    Ok(params)
}

/// The output limit: the request's (at least `least`, and fitting with the prompt both in
/// the context and in the KV cache), else the configured default capped at what both
/// leave, else all of that.
fn max_tokens(
    requested: Option<(&'static str, i64)>,
    least: usize,
    prompt: usize,
    config: &GatewayConfig,
    limits: SequenceLimits,
) -> Result<usize, ApiError> {
    let context_room = limits.max_model_len.saturating_sub(prompt);
    let cache_room = limits.kv_cache_tokens.saturating_sub(prompt);
    // What refuses `max_tokens` more than fits, naming `param` (or the prompt, when it
    // fills the context or the cache alone: then no output fits).
    let refuse = |param: &str, max_tokens: usize| {
        let (room, err) = if max_tokens > context_room {
            let err = SubmitError::TooLong {
                prompt,
                max_tokens,
                max_model_len: limits.max_model_len,
            };
            (context_room, err)
        } else {
            let err = SubmitError::CacheTooSmall {
                prompt,
                max_tokens,
                cache_tokens: limits.kv_cache_tokens,
            };
            (cache_room, err)
        };
        let blamed = if room == 0 { "prompt" } else { param };
        ApiError::invalid(blamed, err.to_string())
    };
    let room = context_room.min(cache_room);
    match requested {
        Some((param, value)) => {
            let wanted = usize::try_from(value)
                .ok()
                .filter(|&wanted| wanted >= least)
                .ok_or_else(|| {
                    let why = format!("`{param}` must be at least {least}, got {value}");
                    ApiError::invalid(param, why)
                })?;
            if wanted > room {
                return Err(refuse(param, wanted));
            }
            Ok(wanted)
        }
        None if room == 0 => Err(refuse("max_tokens", 1)),
        None => Ok(config
            .default_max_tokens
            .map_or(room, |default| default.clamp(1, room))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::body::parse;
    use serde_json::json;

    fn config() -> GatewayConfig {
        GatewayConfig {
            served_model_name: "tiny".into(),
            api_keys: Vec::new(),
            admin_token: None,
            default_sampling: SamplingParams {
                top_k: 7,
                ..SamplingParams::default()
            },
            default_max_tokens: Some(50),
            max_request_body: 1 << 20,
            request_body_timeout: std::time::Duration::from_secs(1),
            max_prompt_chars: None,
        }
    }

    fn vocabulary() -> Vocabulary {
        Vocabulary {
            size: 64,
            eos_token_ids: vec![0],
        }
    }

    fn plan_of(body: serde_json::Value, prompt: usize) -> Result<Plan, ApiError> {
        let fields: GenerationFields = parse(&body)?;
        let requested = fields.max_tokens.map(|n| ("max_tokens", n));
        let input = EndpointInput {
            prompt: vec![1; prompt],
            max_tokens: requested,
            logprobs: None,
            zero_max_tokens: false,
            vocabulary: vocabulary(),
        };
        plan(fields, input, &config(), LIMITS)
    }

    /// A 64-token context over a cache of 256 tokens.
    const LIMITS: SequenceLimits = SequenceLimits {
        max_model_len: 64,
        kv_cache_tokens: 256,
    };

    #[test]
    fn defaults_fill_the_gaps() {
        let plan = plan_of(json!({"temperature": 0.5, "stop": "x"}), 4).unwrap();
        let submission = plan.submission;
        assert_eq!(submission.params.temperature, 0.5);
        assert_eq!(submission.params.top_k, 7, "from the configured default");
        assert_eq!(submission.max_tokens, 50);
        assert_eq!(plan.stop, ["x"]);
        let plan = plan_of(json!({}), 40).unwrap();
        assert_eq!(
            plan.submission.max_tokens, 24,
            "the default is capped by the context"
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (json!({"max_tokens": -1}), "max_tokens"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"temperature": -0.5}), "temperature"),
            (json!({"top_p": 1.5}), "top_p"),
            (json!({"stop": ["a", ""]}), "stop"),
            (
                json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
        ];
        for (body, param) in cases {
            let err = plan_of(body.clone(), 4).unwrap_err();
            assert_eq!(
                (err.status().as_u16(), err.param()),
                (400, Some(param)),
                "{body}"
            );
        }
    }

    #[test]
    fn too_long_names_both_numbers() {
        let err = plan_of(json!({"max_tokens": 30}), 40).unwrap_err();
        assert_eq!(err.param(), Some("max_tokens"));
        assert!(
            err.message().contains("40") && err.message().contains("30"),
            "{err}"
        );
        let err = plan_of(json!({}), 64).unwrap_err();
        assert!(err.message().contains("64 tokens"), "{err}");
    }

    #[test]
    fn a_cache_smaller_than_the_context_bounds_max_tokens() {
        let small = SequenceLimits {
            max_model_len: 64,
            kv_cache_tokens: 32,
        };
        let plan_in = |body: serde_json::Value, prompt: usize| {
            let fields: GenerationFields = parse(&body)?;
            let input = EndpointInput {
                prompt: vec![1; prompt],
                max_tokens: fields.max_tokens.map(|n| ("max_tokens", n)),
                logprobs: None,
                zero_max_tokens: false,
                vocabulary: vocabulary(),
            };
            let mut config = config();
            config.default_max_tokens = None;
            plan(fields, input, &config, small)
        };
        let plan = plan_in(json!({}), 10).unwrap();
        assert_eq!(
            plan.submission.max_tokens, 22,
            "the default is what the cache holds"
        );
        assert_eq!(
            plan_in(json!({"max_tokens": 22}), 10)
                .unwrap()
                .submission
                .max_tokens,
            22
        );
        let err = plan_in(json!({"max_tokens": 23}), 10).unwrap_err();
        assert_eq!(err.param(), Some("max_tokens"));
        assert!(
            err.message().contains("(10 tokens)")
                && err.message().contains("(23)")
                && err.message().contains("32 tokens"),
            "{err}"
        );
        let err = plan_in(json!({}), 32).unwrap_err();
        assert_eq!(
            err.param(),
            Some("prompt"),
            "the prompt fills the cache: {err}"
        );
        let err = plan_in(json!({"max_tokens": 60}), 10).unwrap_err();
        assert!(err.message().contains("maximum model length"), "{err}");
    }

    #[test]
    fn the_model_must_be_the_served_one() {
        let err = check_model(Some("other"), &config()).unwrap_err();
        assert_eq!((err.status().as_u16(), err.param()), (404, Some("model")));
        assert!(err.message().contains("The model 'other' does not exist"));
        assert!(check_model(Some("tiny"), &config()).is_ok());
        assert!(check_model(None, &config()).is_ok());
    }

    #[test]
    fn logprobs_counts_are_bounded() {
        assert_eq!(logprobs_count("logprobs", 5).unwrap(), 5);
        assert!(logprobs_count("logprobs", 21).is_err());
        assert!(logprobs_count("top_logprobs", -1).is_err());
    }
}

//! A chat request read, checked, rendered with the model's chat template and submitted:
//! what `/v1/chat/completions` and `/v1/responses` (whose requests are translated into the
//! chat shape) both serve from. The messages are tokenized without extra special tokens
//! (the template writes them), as vLLM does; `required` and a named function are enforced
//! by a grammar in the model's own call format.

use serde_json::Value;

use super::body::parse;
use super::constraints;
use super::context::RequestContext;
use super::errors::ApiError;
use super::generation::Generation;
use super::grammar;
use super::params::{check_model, logprobs_count, plan, EndpointInput};
use super::prompt::ChatTools;
use super::protocol::request::{ChatFields, GenerationFields};
use super::state::GatewayState;
use super::tools;
use super::unsupported;

/// A submitted chat request and how its reply is to be written.
pub struct ChatRun {
    /// The running request.
    pub generation: Generation,
    /// Whether the reply is read for tool calls.
    pub reads_calls: bool,
    /// Answer as server-sent events.
    pub stream: bool,
    /// End the stream with a usage chunk.
    pub include_usage: bool,
    /// Whether logprobs were asked for.
    pub logprobs: bool,
    /// Put the generated token ids on the reply.
    pub token_ids: bool,
    /// The prompt's ids, where token ids were asked for.
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The served model's name.
    pub model: String,
}

/// Reads the chat request `body`, renders and tokenizes it, and submits it as `context`.
pub async fn submit(
    state: &GatewayState,
    body: &Value,
    context: &RequestContext,
) -> Result<ChatRun, ApiError> {
    state.ensure_accepting()?;
    unsupported::check(body)?;
    let settings = state.model.tools;
    let tools = tools::read(body, &settings)?;
    let forced = match &tools {
        Some(tools) => tools.forced(&settings, &state.model.tokenizer)?,
        None => None,
    };
    let constraint = match (constraints::requested(body)?, forced) {
        (Some(asked), Some(_)) => {
            return Err(ApiError::invalid(
                asked
                    .param
                    .split('.')
                    .next()
                    .unwrap_or(&asked.param)
                    .to_owned(),
                "a request whose `tool_choice` forces a call takes no other output constraint",
            ))
        }
        (asked, forced) => asked.or(forced),
    };
    let reads_calls = tools.as_ref().is_some_and(|t| t.reads_calls());
    let chat_tools = tools.map_or_else(ChatTools::default, |t| ChatTools {
        declared: t.declared,
        tools: t.tools,
    });
    let fields: GenerationFields = parse(body)?;
    let own: ChatFields = parse(body)?;
    let config = state.config.get();
    check_model(fields.model.as_deref(), &config)?;
    let logprobs = match (own.logprobs.unwrap_or(false), own.top_logprobs) {
        (true, top) => Some(logprobs_count("top_logprobs", top.unwrap_or(0))?),
        (false, Some(top)) if top > 0 => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ))
        }
        (false, _) => None,
    };
    let (messages, add_generation_prompt) =
        (own.messages, own.add_generation_prompt.unwrap_or(true));
    let prompter = state.prompter(&config);
    let prompt = state
        .blocking
        .run(move || prompter.chat(messages, chat_tools, add_generation_prompt, false))
        .await?;
    if prompt.is_empty() {
        return Err(ApiError::invalid("messages", "the rendered chat is empty"));
    }
    let max_tokens = match own.max_completion_tokens {
        Some(value) => Some(("max_completion_tokens", value)),
        None => fields.max_tokens.map(|value| ("max_tokens", value)),
    };
    let input = EndpointInput {
        prompt,
        max_tokens,
        logprobs,
    };
    let mut plan = plan(fields, input, &config, state.model.sequence_limits())?;
    if let Some(requested) = constraint {
        plan.submission.grammar = Some(grammar::compile(state, requested).await?);
    }
    plan.keep_special_tokens = reads_calls;
    let (stream, include_usage) = (plan.stream, plan.include_usage);
    let token_ids = plan.return_token_ids;
    let prompt_token_ids = token_ids.then(|| plan.submission.prompt.to_vec());
    let generation = Generation::start(state, context, plan).await?;
    Ok(ChatRun {
        generation,
        reads_calls,
        stream,
        include_usage,
        logprobs: logprobs.is_some(),
        token_ids,
        prompt_token_ids,
        model: config.served_model_name.clone(),
    })
}

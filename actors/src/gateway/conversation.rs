//! A chat as both chat APIs ask for it, OpenAI's `/v1/chat/completions` and Anthropic's
//! `/v1/messages`: each reads its body into a [`Conversation`], which is rendered with the
//! model's chat template, planned within the limits, given the grammar that a forced tool
//! call or an output constraint needs, and submitted. The reply is read for calls
//! (`tool_output.rs`) where the tools ask for it.

use std::sync::Arc;

use super::choices::Choices;
use super::constraints::Requested;
use super::context::RequestContext;
use super::errors::ApiError;
use super::grammar;
use super::params::{check_model, plan, EndpointInput};
use super::prompt::ChatTools;
use super::protocol::request::{GenerationFields, MessageIn};
use super::sse::StreamUsage;
use super::state::{GatewayConfig, GatewayState};
use super::tools::ToolRequest;

/// A chat request in the gateway's own terms.
pub struct Conversation {
    /// The fields both generation endpoints share.
    pub fields: GenerationFields,
    /// The messages, in OpenAI's roles.
    pub messages: Vec<MessageIn>,
    /// The tools offered and what is asked of them, where there are any.
    pub tools: Option<ToolRequest>,
    /// An output constraint asked for besides the tools (`response_format`, ...).
    pub constraint: Option<Requested>,
    /// The output limit and the name of the field that gave it.
    pub max_tokens: Option<(&'static str, i64)>,
    /// Alternatives per token, when logprobs are asked for (already range-checked).
    pub logprobs: Option<usize>,
    /// End the prompt with the assistant's header.
    pub add_generation_prompt: bool,
}

/// A conversation submitted to the engine.
pub struct Submitted {
    /// Its output, one generation per choice, to be read.
    pub choices: Choices,
    /// Answer as server-sent events.
    pub stream: bool,
    /// Which usage an OpenAI stream reports.
    pub usage: StreamUsage,
    /// Put the prompt's and the output's token ids in the response.
    pub return_token_ids: bool,
    /// Put the prompt's tokens' logprobs in the response, with this many alternatives
    /// each (vLLM's `prompt_logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// The prompt's token ids.
    pub prompt: Arc<[u32]>,
    /// Whether the output is read for tool calls.
    pub reads_calls: bool,
    /// The served model's name.
    pub model: String,
}

/// The prompt `conversation` renders to: its tokens, as [`submit`] would send them.
pub async fn prompt_tokens(
    state: &GatewayState,
    conversation: Conversation,
) -> Result<Vec<u32>, ApiError> {
    let config = state.config.get();
    check_model(conversation.fields.model.as_deref(), &config)?;
    let Conversation {
        messages,
        tools,
        add_generation_prompt,
        ..
    } = conversation;
    render(state, &config, messages, tools, add_generation_prompt).await
}

/// `messages` rendered with the model's template, offering `tools`, and tokenized (off the
/// HTTP threads); refused when that leaves nothing.
async fn render(
    state: &GatewayState,
    config: &GatewayConfig,
    messages: Vec<MessageIn>,
    tools: Option<ToolRequest>,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ApiError> {
    let chat_tools = tools.map_or_else(ChatTools::default, |t| ChatTools {
        declared: t.declared,
        tools: t.tools,
    });
    let prompter = state.prompter(config);
    let prompt = state
        .blocking
        .run(move || prompter.chat(messages, chat_tools, add_generation_prompt, false))
        .await?;
    if prompt.is_empty() {
        return Err(ApiError::invalid("messages", "the rendered chat is empty"));
    }
    Ok(prompt)
}

/// Renders, checks and submits `conversation` as the request of `context`.
pub async fn submit(
    state: &GatewayState,
    context: &RequestContext,
    conversation: Conversation,
) -> Result<Submitted, ApiError> {
    let Conversation {
        fields,
        messages,
        tools,
        constraint,
        max_tokens,
        logprobs,
        add_generation_prompt,
    } = conversation;
    let forced = match &tools {
        Some(tools) => tools.forced(&state.model.tools, &state.model.tokenizer)?,
        None => None,
    };
    let constraint = match (constraint, forced) {
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
    let reads_calls = tools.as_ref().is_some_and(ToolRequest::reads_calls);
    let config = state.config.get();
    check_model(fields.model.as_deref(), &config)?;
    let prompt = render(state, &config, messages, tools, add_generation_prompt).await?;
    let input = EndpointInput {
        prompt,
        max_tokens,
        logprobs,
        zero_max_tokens: false,
        vocabulary: state.model.vocabulary(),
    };
    let mut plan = plan(fields, input, &config, state.model.sequence_limits())?;
    if let Some(requested) = constraint {
        plan.submission.grammar = Some(grammar::compile(state, requested).await?);
    }
    plan.keep_special_tokens = reads_calls;
    let (stream, usage) = (plan.stream, plan.usage);
    let (return_token_ids, prompt_logprobs) = (plan.return_token_ids, plan.prompt_logprobs);
    let prompt = Arc::clone(&plan.submission.prompt);
    let choices = Choices::start(state, context, vec![plan]).await?;
    Ok(Submitted {
        choices,
        stream,
        usage,
        return_token_ids,
        prompt_logprobs,
        prompt,
        reads_calls,
        model: config.served_model_name.clone(),
    })
}

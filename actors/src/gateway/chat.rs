//! `POST /v1/chat/completions`, whole and streamed: the messages are rendered with the
//! model's chat template and tokenized without extra special tokens (the template writes
//! them), as vLLM does. A request with tools has its reply read for calls in the model's
//! format (`tool_output.rs`); `required` and a named function are enforced by a grammar.

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use serde_json::Value;

use super::auth::ApiKeyAuth;
use super::body::{parse, JsonBody};
use super::constraints;
use super::context::RequestContext;
use super::conversation::{self, Conversation, Submitted};
use super::errors::ApiError;
use super::generation::{Delta, Output};
use super::logprobs;
use super::params::logprobs_count;
use super::peer::PeerProbe;
use super::protocol::request::{ChatFields, GenerationFields};
use super::protocol::response::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatDelta, Envelope, UsageOut,
};
use super::sse::{self, ChunkFormat};
use super::state::GatewayState;
use super::tool_output::{self, CallDeltas, CallIds};
use super::tools;
use super::unsupported;

/// The handler.
pub async fn create(
    _auth: ApiKeyAuth,
    request: HttpRequest,
    state: web::Data<GatewayState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let peer = request.conn_data::<PeerProbe>().cloned();
    let context = RequestContext::new(&state.engine, "chatcmpl-");
    context.run(handle(&state, body.0, &context, peer)).await
}

async fn handle(
    state: &GatewayState,
    body: Value,
    context: &RequestContext,
    peer: Option<PeerProbe>,
) -> Result<HttpResponse, ApiError> {
    state.ensure_accepting()?;
    let conversation = read(state, &body)?;
    let logprobs = conversation.logprobs;
    let settings = state.model.tools;
    let Submitted {
        choices,
        stream,
        usage: stream_usage,
        return_token_ids: token_ids,
        prompt_logprobs,
        prompt,
        reads_calls,
        model,
    } = conversation::submit(state, context, conversation).await?;
    let ids = CallIds::of("call", &context.public_id);
    let count = choices.generations.len();
    let mut format = ChatFormat {
        id: context.public_id.clone(),
        created: context.created,
        model,
        system_fingerprint: state.system_fingerprint.clone(),
        running: None,
        logprobs: logprobs.is_some(),
        token_ids,
        prompt_token_ids: token_ids.then(|| prompt.to_vec()),
        index: 0,
        calls: match reads_calls {
            true => (0..count)
                .map(|index| CallDeltas::new(settings.format, ids.for_choice(index)))
                .collect(),
            false => Vec::new(),
        },
    };
    if stream {
        return Ok(sse::respond_choices(
            choices,
            format,
            stream_usage,
            context.span.clone(),
            peer,
        ));
    }
    let (outputs, usage) = choices.collect_while_connected(peer).await?;
    // One prompt: vLLM reports its tokens' logprobs once, beside the choices.
    let scored = prompt_logprobs.zip(outputs.first());
    let prompt_logprobs = scored.map(|(top, first)| logprobs::prompt_logprobs(&first.prompt, top));
    let choices = outputs
        .into_iter()
        .enumerate()
        .map(|(index, output)| {
            let Output {
                text,
                tokens,
                token_ids,
                reason,
                ..
            } = output;
            let (content, tool_calls) = match reads_calls {
                true => tool_output::whole(settings.format, &text, &ids.for_choice(index)),
                false => (Some(text), None),
            };
            let reason = tool_output::finish_reason(reason, tool_calls.is_some());
            ChatChoice {
                index,
                logprobs: format.logprobs.then(|| logprobs::chat(&tokens)),
                message: AssistantMessage {
                    role: "assistant",
                    content,
                    tool_calls,
                },
                finish_reason: Some(reason),
                token_ids: format.token_ids.then_some(token_ids),
            }
        })
        .collect();
    let mut whole = format.wrap("chat.completion", choices, Some(usage));
    whole.prompt_logprobs = prompt_logprobs;
    Ok(HttpResponse::Ok().json(whole))
}

/// A chat completions request `body` read and checked into the [`Conversation`] it asks
/// for (also what `/v1/responses` serves, translated into this shape).
pub fn read(state: &GatewayState, body: &Value) -> Result<Conversation, ApiError> {
    unsupported::check(body)?;
    unsupported::refuse_any(body, unsupported::REFUSED_IN_CHAT)?;
    let settings = state.model.tools;
    let tools = tools::read(body, &settings)?;
    let constraint = constraints::requested(body)?;
    let fields: GenerationFields = parse(body)?;
    let own: ChatFields = parse(body)?;
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
    let max_tokens = match own.max_completion_tokens {
        Some(value) => Some(("max_completion_tokens", value)),
        None => fields.max_tokens.map(|value| ("max_tokens", value)),
    };
    Ok(Conversation {
        fields,
        messages: own.messages,
        tools,
        constraint,
        max_tokens,
        logprobs,
        add_generation_prompt: own.add_generation_prompt.unwrap_or(true),
    })
}

/// The chat wording of responses and chunks.
struct ChatFormat {
    id: String,
    created: u64,
    model: String,
    system_fingerprint: String,
    /// The usage so far, put on every chunk (`continuous_usage_stats`).
    running: Option<UsageOut>,
    logprobs: bool,
    /// Put each choice's token ids on it.
    token_ids: bool,
    /// The prompt's ids, until the first response or chunk takes them.
    prompt_token_ids: Option<Vec<u32>>,
    /// The choice the next chunk is about.
    index: usize,
    /// Each choice's calls, where the replies are read for them (else none).
    calls: Vec<CallDeltas>,
}

impl ChatFormat {
    fn wrap<C>(
        &mut self,
        object: &'static str,
        choices: Vec<C>,
        usage: Option<UsageOut>,
    ) -> Envelope<C> {
        Envelope {
            id: self.id.clone(),
            object,
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.system_fingerprint.clone(),
            choices,
            usage,
            prompt_token_ids: self.prompt_token_ids.take(),
            prompt_logprobs: None,
        }
    }

    fn event(&mut self, choice: ChatChunkChoice) -> Bytes {
        let usage = self.running.clone();
        sse::event(&self.wrap("chat.completion.chunk", vec![choice], usage))
    }

    /// The events of a reply read for calls: one per delta the text adds (the first
    /// carrying the chunk's logprobs and token ids), and at the end one with the reason.
    fn call_events(&mut self, delta: &Delta, finish_reason: Option<&'static str>) -> Bytes {
        let index = self.index;
        let Some(calls) = self.calls.get_mut(index) else {
            return Bytes::new();
        };
        let mut deltas = calls.push(&delta.text);
        if finish_reason.is_some() {
            deltas.extend(calls.finish());
        }
        let made_calls = calls.made_calls();
        let mut events = Vec::new();
        let mut logprobs = self.logprobs.then(|| logprobs::chat(&delta.tokens));
        let mut token_ids = self.token_ids.then(|| delta.token_ids.clone());
        for chat_delta in deltas {
            let choice = ChatChunkChoice {
                index,
                delta: chat_delta,
                logprobs: logprobs.take(),
                finish_reason: None,
                token_ids: token_ids.take(),
            };
            events.extend_from_slice(&self.event(choice));
        }
        if let Some(reason) = finish_reason {
            let choice = ChatChunkChoice {
                index,
                delta: ChatDelta::default(),
                logprobs: logprobs.take(),
                finish_reason: Some(tool_output::finish_reason(reason, made_calls)),
                token_ids: token_ids.take(),
            };
            events.extend_from_slice(&self.event(choice));
        }
        Bytes::from(events)
    }
}

impl ChunkFormat for ChatFormat {
    fn opening(&mut self) -> Option<Bytes> {
        let choice = ChatChunkChoice {
            index: self.index,
            delta: ChatDelta {
                role: Some("assistant"),
                content: Some(String::new()),
                tool_calls: None,
            },
            logprobs: None,
            finish_reason: None,
            token_ids: None,
        };
        Some(self.event(choice))
    }

    fn chunk(&mut self, delta: &Delta, finish_reason: Option<&'static str>) -> Bytes {
        if !self.calls.is_empty() {
            return self.call_events(delta, finish_reason);
        }
        let choice = ChatChunkChoice {
            index: self.index,
            delta: ChatDelta {
                content: (!delta.text.is_empty()).then(|| delta.text.clone()),
                ..ChatDelta::default()
            },
            logprobs: self.logprobs.then(|| logprobs::chat(&delta.tokens)),
            finish_reason,
            token_ids: self.token_ids.then(|| delta.token_ids.clone()),
        };
        self.event(choice)
    }

    fn choice(&mut self, index: usize) {
        self.index = index;
    }

    fn usage(&mut self, usage: UsageOut) -> Bytes {
        let no_choices: Vec<ChatChunkChoice> = Vec::new();
        sse::event(&self.wrap("chat.completion.chunk", no_choices, Some(usage)))
    }

    fn running_usage(&mut self, usage: UsageOut) {
        self.running = Some(usage);
    }
}

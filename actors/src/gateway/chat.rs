//! `POST /v1/chat/completions`, whole and streamed: the request is read and submitted by
//! `chat_request.rs`; a request with tools has its reply read for calls in the model's
//! format (`tool_output.rs`).

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use serde_json::Value;

use super::auth::ApiKeyAuth;
use super::body::JsonBody;
use super::chat_request;
use super::context::RequestContext;
use super::errors::ApiError;
use super::generation::{Delta, Output};
use super::logprobs;
use super::peer::PeerProbe;
use super::protocol::response::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatDelta, Envelope, UsageOut,
};
use super::sse::{self, ChunkFormat};
use super::state::GatewayState;
use super::tool_output::{self, CallDeltas, CallIds};

/// The handler.
pub async fn create(
    _auth: ApiKeyAuth,
    request: HttpRequest,
    state: web::Data<GatewayState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let peer = request.conn_data::<PeerProbe>().cloned();
    let context = RequestContext::new(&state.engine, "chatcmpl");
    context.run(handle(&state, body.0, &context, peer)).await
}

async fn handle(
    state: &GatewayState,
    body: Value,
    context: &RequestContext,
    peer: Option<PeerProbe>,
) -> Result<HttpResponse, ApiError> {
    let run = chat_request::submit(state, &body, context).await?;
    let format_of_calls = state.model.tools.format;
    let ids = CallIds::of(&context.public_id);
    let mut format = ChatFormat {
        id: context.public_id.clone(),
        created: context.created,
        model: run.model,
        logprobs: run.logprobs,
        token_ids: run.token_ids,
        prompt_token_ids: run.prompt_token_ids,
        calls: run
            .reads_calls
            .then(|| CallDeltas::new(format_of_calls, ids.clone())),
    };
    if run.stream {
        return Ok(sse::respond(
            run.generation,
            format,
            run.include_usage,
            context.span.clone(),
            peer,
        ));
    }
    let Output {
        text,
        tokens,
        token_ids,
        reason,
        usage,
    } = run.generation.collect_while_connected(peer).await?;
    let (content, tool_calls) = match run.reads_calls {
        true => tool_output::whole(format_of_calls, &text, &ids),
        false => (Some(text), None),
    };
    let reason = tool_output::finish_reason(reason, tool_calls.is_some());
    let choice = ChatChoice {
        index: 0,
        logprobs: format.logprobs.then(|| logprobs::chat(&tokens)),
        message: AssistantMessage {
            role: "assistant",
            content,
            tool_calls,
        },
        finish_reason: Some(reason),
        token_ids: format.token_ids.then_some(token_ids),
    };
    Ok(HttpResponse::Ok().json(format.wrap("chat.completion", vec![choice], Some(usage))))
}

/// The chat wording of responses and chunks.
struct ChatFormat {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    /// Put each choice's token ids on it.
    token_ids: bool,
    /// The prompt's ids, until the first response or chunk takes them.
    prompt_token_ids: Option<Vec<u32>>,
    /// The reply's calls, where it is read for them.
    calls: Option<CallDeltas>,
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
            choices,
            usage,
            prompt_token_ids: self.prompt_token_ids.take(),
        }
    }

    fn event(&mut self, choice: ChatChunkChoice) -> Bytes {
        sse::event(&self.wrap("chat.completion.chunk", vec![choice], None))
    }

    /// The events of a reply read for calls: one per delta the text adds (the first
    /// carrying the chunk's logprobs and token ids), and at the end one with the reason.
    fn call_events(&mut self, delta: &Delta, finish_reason: Option<&'static str>) -> Bytes {
        let Some(calls) = self.calls.as_mut() else {
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
                index: 0,
                delta: chat_delta,
                logprobs: logprobs.take(),
                finish_reason: None,
                token_ids: token_ids.take(),
            };
            events.extend_from_slice(&self.event(choice));
        }
        if let Some(reason) = finish_reason {
            let choice = ChatChunkChoice {
                index: 0,
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
            index: 0,
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
        if self.calls.is_some() {
            return self.call_events(delta, finish_reason);
        }
        let choice = ChatChunkChoice {
            index: 0,
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

    fn usage(&mut self, usage: UsageOut) -> Bytes {
        let no_choices: Vec<ChatChunkChoice> = Vec::new();
        sse::event(&self.wrap("chat.completion.chunk", no_choices, Some(usage)))
    }
}

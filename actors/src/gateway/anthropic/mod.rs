//! `POST /v1/messages`, Anthropic's Messages API, whole and streamed, and
//! `POST /v1/messages/count_tokens`: the request is translated into the chat the chat
//! completions endpoint renders (`translate.rs`), so it shares its template, tool calls and
//! forced-call grammars (`conversation.rs`); only the request, answer, event and error
//! shapes are Anthropic's own.

mod errors;
mod request;
mod response;
mod stream;
mod translate;

#[cfg(test)]
mod tests;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use self::errors::{MessagesError, Worded};
use self::request::{MessagesRequest, REFUSED};
use self::response::MessageOut;
use self::stream::MessageEvents;
use super::auth::ApiKeyAuth;
use super::body::{parse, JsonBody};
use super::context::RequestContext;
use super::conversation;
use super::errors::ApiError;
use super::peer::PeerProbe;
use super::sse;
use super::state::GatewayState;
use super::tool_output::{CallDeltas, CallIds};
use super::unsupported;

/// The handler: the key may come as `x-api-key`, and every refusal is in Anthropic's shape.
pub async fn create(
    _auth: Worded<ApiKeyAuth>,
    request: HttpRequest,
    state: web::Data<GatewayState>,
    body: Worded<JsonBody>,
) -> Result<HttpResponse, MessagesError> {
    let peer = request.conn_data::<PeerProbe>().cloned();
    let context = RequestContext::new(&state.engine, "msg_");
    let Worded(JsonBody(body)) = body;
    context
        .run(handle(&state, body, &context, peer))
        .await
        .map_err(MessagesError)
}

/// `count_tokens`: the tokens the request's prompt (system, messages and tools, rendered
/// as `/v1/messages` renders them) would take, as `{"input_tokens": N}`.
pub async fn count_tokens(
    _auth: Worded<ApiKeyAuth>,
    state: web::Data<GatewayState>,
    body: Worded<JsonBody>,
) -> Result<HttpResponse, MessagesError> {
    let Worded(JsonBody(mut body)) = body;
    let counted = async {
        unsupported::refuse_any(&body, REFUSED)?;
        // The count takes no output length; the translation needs one.
        if let Some(fields) = body.as_object_mut() {
            fields.entry("max_tokens").or_insert(serde_json::json!(1));
        }
        let request: MessagesRequest = parse(&body)?;
        let conversation = translate::conversation(request, &state.model.tools)?;
        conversation::prompt_tokens(&state, conversation).await
    };
    let prompt = counted.await.map_err(MessagesError)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"input_tokens": prompt.len()})))
}

async fn handle(
    state: &GatewayState,
    body: Value,
    context: &RequestContext,
    peer: Option<PeerProbe>,
) -> Result<HttpResponse, ApiError> {
    state.ensure_accepting()?;
    unsupported::refuse_any(&body, REFUSED)?;
    let request: MessagesRequest = parse(&body)?;
    let settings = state.model.tools;
    let conversation = translate::conversation(request, &settings)?;
    let submitted = conversation::submit(state, context, conversation).await?;
    let ids = CallIds::of("toolu", &context.public_id);
    let calls = submitted.reads_calls.then_some(settings.format);
    let start = MessageOut::start(
        context.public_id.clone(),
        submitted.model,
        submitted.prompt.len(),
    );
    if submitted.stream {
        let events = MessageEvents::new(start, calls.map(|format| CallDeltas::new(format, ids)));
        let span = context.span.clone();
        return Ok(sse::respond(
            submitted.choices.single(),
            events,
            false,
            span,
            peer,
        ));
    }
    let output = submitted
        .choices
        .single()
        .collect_while_connected(peer)
        .await?;
    Ok(HttpResponse::Ok().json(start.whole(output, calls, &ids)))
}

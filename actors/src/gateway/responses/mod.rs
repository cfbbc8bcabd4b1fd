//! `POST /v1/responses`, OpenAI's Responses API, whole and streamed: the request is
//! translated into the chat request it is served as (`request.rs`), read as chat
//! completions read theirs (`chat.rs`) and submitted as every chat is (`conversation.rs`); the reply becomes the response's output items
//! (`output.rs`), written whole or as the API's typed events (`stream.rs`). Nothing is
//! stored: each request carries its whole conversation.

mod output;
mod request;
mod shapes;
mod stream;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use super::auth::ApiKeyAuth;
use super::body::JsonBody;
use super::chat;
use super::context::RequestContext;
use super::conversation;
use super::errors::ApiError;
use super::peer::PeerProbe;
use super::sse;
use super::state::GatewayState;
use output::OutputBuilder;
use shapes::ResponseObject;
use stream::ResponseStream;

/// The handler.
pub async fn create(
    _auth: ApiKeyAuth,
    request: HttpRequest,
    state: web::Data<GatewayState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let peer = request.conn_data::<PeerProbe>().cloned();
    let context = RequestContext::new(&state.engine, "resp_");
    context.run(handle(&state, body.0, &context, peer)).await
}

async fn handle(
    state: &GatewayState,
    body: Value,
    context: &RequestContext,
    peer: Option<PeerProbe>,
) -> Result<HttpResponse, ApiError> {
    let translated = request::translate(&body)?;
    state.ensure_accepting()?;
    let conversation = chat::read(state, &translated.chat).map_err(request::renamed)?;
    let run = conversation::submit(state, context, conversation)
        .await
        .map_err(request::renamed)?;
    let id = context.public_id.clone();
    let response = ResponseObject::started(id, context.created, run.model, translated.echo);
    let calls = run.reads_calls.then_some(state.model.tools.format);
    let mut output = OutputBuilder::new(&context.public_id, calls);
    if run.stream {
        let format = ResponseStream::new(response, output);
        let span = context.span.clone();
        return Ok(sse::respond(run.choices.single(), format, true, span, peer));
    }
    let whole = run.choices.single().collect_while_connected(peer).await?;
    output.push(&whole.text);
    output.finish(whole.reason != "length");
    let items = output.items().to_vec();
    Ok(HttpResponse::Ok().json(response.finished(items, whole.reason, whole.usage)))
}

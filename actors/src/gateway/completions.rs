//! `POST /v1/completions`, whole and streamed.

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use serde_json::Value;

use super::auth::ApiKeyAuth;
use super::body::{parse, JsonBody};
use super::constraints;
use super::context::RequestContext;
use super::errors::ApiError;
use super::generation::{Delta, Generation, Output};
use super::grammar;
use super::logprobs;
use super::params::{check_model, logprobs_count, plan, EndpointInput};
use super::peer::PeerProbe;
use super::protocol::request::{CompletionFields, GenerationFields};
use super::protocol::response::{CompletionChoice, Envelope, UsageOut};
use super::sse::{self, ChunkFormat};
use super::state::GatewayState;
use super::unsupported;

/// The handler.
pub async fn create(
    _auth: ApiKeyAuth,
    request: HttpRequest,
    state: web::Data<GatewayState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let peer = request.conn_data::<PeerProbe>().cloned();
    let context = RequestContext::new(&state.engine, "cmpl-");
    context.run(handle(&state, body.0, &context, peer)).await
}

async fn handle(
    state: &GatewayState,
    body: Value,
    context: &RequestContext,
    peer: Option<PeerProbe>,
) -> Result<HttpResponse, ApiError> {
    state.ensure_accepting()?;
    unsupported::check(&body)?;
    refuse_tools(&body)?;
    let constraint = constraints::requested(&body)?;
    let fields: GenerationFields = parse(&body)?;
    let own: CompletionFields = parse(&body)?;
    let config = state.config.get();
    check_model(fields.model.as_deref(), &config)?;
    let logprobs = own
        .logprobs
        .map(|count| logprobs_count("logprobs", count))
        .transpose()?;
    let add_special_tokens = own.add_special_tokens.unwrap_or(true);
    let (prompt, prompter) = (own.prompt, state.prompter(&config));
    let prompt = state
        .blocking
        .run(move || prompter.completion(prompt, add_special_tokens))
        .await?;
    let input = EndpointInput {
        prompt,
        max_tokens: fields.max_tokens.map(|value| ("max_tokens", value)),
        logprobs,
        vocabulary: state.model.vocabulary(),
    };
    let mut plan = plan(fields, input, &config, state.model.sequence_limits())?;
    if let Some(requested) = constraint {
        plan.submission.grammar = Some(grammar::compile(state, requested).await?);
    }
    let (stream, stream_usage) = (plan.stream, plan.usage);
    let token_ids = plan.return_token_ids;
    let prompt_token_ids = token_ids.then(|| plan.submission.prompt.to_vec());
    let generation = Generation::start(state, context, plan).await?;
    let mut format = CompletionFormat {
        id: context.public_id.clone(),
        created: context.created,
        model: config.served_model_name.clone(),
        system_fingerprint: state.system_fingerprint.clone(),
        running: None,
        logprobs: logprobs.is_some(),
        offset: 0,
        token_ids,
        prompt_token_ids,
    };
    if stream {
        return Ok(sse::respond(
            generation,
            format,
            stream_usage,
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
        ..
    } = generation.collect_while_connected(peer).await?;
    let delta = Delta {
        text,
        tokens,
        token_ids,
    };
    let whole = format.envelope(&delta, Some(reason), Some(usage));
    Ok(HttpResponse::Ok().json(whole))
}

/// Tools are a chat feature: a completion request that offers them is refused, naming the
/// field, rather than served without them.
fn refuse_tools(body: &Value) -> Result<(), ApiError> {
    for field in ["tools", "tool_choice"] {
        let asks = match body.get(field) {
            None | Some(Value::Null) => false,
            Some(Value::Array(tools)) => !tools.is_empty(),
            Some(choice) => choice != "none",
        };
        if asks {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` is served on /v1/chat/completions, not on /v1/completions"),
            ));
        }
    }
    Ok(())
}

/// The completions wording of responses and chunks.
struct CompletionFormat {
    id: String,
    created: u64,
    model: String,
    system_fingerprint: String,
    /// The usage so far, put on every chunk (`continuous_usage_stats`).
    running: Option<UsageOut>,
    logprobs: bool,
    /// Characters of text before the next token, for `text_offset`.
    offset: usize,
    /// Put each choice's token ids on it.
    token_ids: bool,
    /// The prompt's ids, until the first choice takes them.
    prompt_token_ids: Option<Vec<u32>>,
}

impl CompletionFormat {
    fn envelope(
        &mut self,
        delta: &Delta,
        finish_reason: Option<&'static str>,
        usage: Option<UsageOut>,
    ) -> Envelope<CompletionChoice> {
        let logprobs = self
            .logprobs
            .then(|| logprobs::completion(&delta.tokens, &mut self.offset));
        let choice = CompletionChoice {
            index: 0,
            text: delta.text.clone(),
            logprobs,
            finish_reason,
            prompt_token_ids: self.prompt_token_ids.take(),
            token_ids: self.token_ids.then(|| delta.token_ids.clone()),
        };
        self.wrap(vec![choice], usage)
    }

    fn wrap(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<UsageOut>,
    ) -> Envelope<CompletionChoice> {
        Envelope {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.system_fingerprint.clone(),
            choices,
            usage,
            prompt_token_ids: None,
        }
    }
}

impl ChunkFormat for CompletionFormat {
    fn opening(&mut self) -> Option<Bytes> {
        None
    }

    fn chunk(&mut self, delta: &Delta, finish_reason: Option<&'static str>) -> Bytes {
        let usage = self.running.clone();
        sse::event(&self.envelope(delta, finish_reason, usage))
    }

    fn running_usage(&mut self, usage: UsageOut) {
        self.running = Some(usage);
    }

    fn usage(&mut self, usage: UsageOut) -> Bytes {
        sse::event(&self.wrap(Vec::new(), Some(usage)))
    }
}

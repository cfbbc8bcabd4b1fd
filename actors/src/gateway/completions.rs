//! `POST /v1/completions`, whole and streamed: one prompt or a list of them, `n` choices
//! each, the prompt's text before each output with `echo` (and with `logprobs`, the
//! prompt's tokens' logprobs before the output's: `max_tokens: 0` then scores a prompt).

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use serde_json::Value;

use super::auth::ApiKeyAuth;
use super::body::{parse, JsonBody};
use super::choices::Choices;
use super::constraints;
use super::context::RequestContext;
use super::errors::ApiError;
use super::generation::Delta;
use super::grammar;
use super::logprobs;
use super::params::{check_model, logprobs_count, plan, EndpointInput, Plan, MAX_CHOICES};
use super::peer::PeerProbe;
use super::protocol::request::{CompletionFields, GenerationFields, Prompt};
use super::protocol::response::{CompletionChoice, CompletionLogprobs, Envelope, UsageOut};
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
    let echo = own.echo.unwrap_or(false);
    // The prompt's logprobs come before the output's (OpenAI's `echo` with `logprobs`).
    let echo_logprobs = logprobs.filter(|_| echo);
    let given = echo.then(|| given_texts(&own.prompt)).flatten();
    let (prompt, prompter) = (own.prompt, state.prompter(&config));
    let prompts = state
        .blocking
        .run(move || prompter.completions(prompt, add_special_tokens))
        .await?;
    let echoed = match (echo, given) {
        (false, _) => Vec::new(),
        (true, Some(texts)) => texts,
        (true, None) => prompts
            .iter()
            .map(|ids| state.model.tokenizer.decode(ids, false).unwrap_or_default())
            .collect(),
    };
    let mut plans = prompts
        .into_iter()
        .map(|prompt| {
            let input = EndpointInput {
                prompt,
                max_tokens: fields.max_tokens.map(|value| ("max_tokens", value)),
                logprobs,
                zero_max_tokens: echo,
                vocabulary: state.model.vocabulary(),
            };
            let mut plan = plan(
                fields.clone(),
                input,
                &config,
                state.model.sequence_limits(),
            )?;
            let scored = &mut plan.submission.prompt_logprobs;
            *scored = (*scored).max(echo_logprobs);
            Ok(plan)
        })
        .collect::<Result<Vec<Plan>, ApiError>>()?;
    check_choices(plans.len(), plans[0].n)?;
    if let Some(requested) = constraint {
        let grammar = grammar::compile(state, requested).await?;
        for plan in &mut plans {
            plan.submission.grammar = Some(Arc::clone(&grammar));
        }
    }
    let plan = &plans[0];
    let (stream, stream_usage) = (plan.stream, plan.usage);
    let (token_ids, prompt_logprobs) = (plan.return_token_ids, plan.prompt_logprobs);
    let prompt_token_ids = match token_ids {
        true => plans.iter().map(|p| p.submission.prompt.to_vec()).collect(),
        false => Vec::new(),
    };
    let choices = Choices::start(state, context, plans).await?;
    let count = choices.generations.len();
    let mut format = CompletionFormat {
        id: context.public_id.clone(),
        created: context.created,
        model: config.served_model_name.clone(),
        system_fingerprint: state.system_fingerprint.clone(),
        running: None,
        logprobs: logprobs.is_some(),
        echo_logprobs,
        prompt_logprobs,
        index: 0,
        offsets: vec![0; count],
        token_ids,
        prompt_token_ids,
        per_prompt: choices.per_prompt,
        prompt_sent: vec![false; count],
        echoed,
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
    let choices = outputs
        .into_iter()
        .enumerate()
        .map(|(index, output)| {
            let delta = Delta {
                prompt: output.prompt,
                text: output.text,
                tokens: output.tokens,
                token_ids: output.token_ids,
            };
            format.choice(index);
            format.choice_of(&delta, Some(output.reason))
        })
        .collect();
    let whole = format.wrap(choices, Some(usage));
    Ok(HttpResponse::Ok().json(whole))
}

/// The texts of a prompt given as text (`None` for token ids), which `echo` repeats.
fn given_texts(prompt: &Prompt) -> Option<Vec<String>> {
    match prompt {
        Prompt::Text(text) => Some(vec![text.clone()]),
        Prompt::Texts(texts) => Some(texts.clone()),
        Prompt::Tokens(_) | Prompt::TokenLists(_) => None,
    }
}

/// Refuses more than [`MAX_CHOICES`] choices in all (`prompts` times `n`), naming `n`
/// where it asked for several, else `prompt`.
fn check_choices(prompts: usize, n: usize) -> Result<(), ApiError> {
    if prompts * n <= MAX_CHOICES {
        return Ok(());
    }
    let param = if n > 1 { "n" } else { "prompt" };
    Err(ApiError::invalid(
        param,
        format!(
            "{prompts} prompts of {n} choices each make {} choices, over the limit of \
             {MAX_CHOICES}",
            prompts * n
        ),
    ))
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
    /// Put the prompt's tokens' logprobs, with this many alternatives each, before the
    /// output's in each choice's first chunk (`echo` with `logprobs`).
    echo_logprobs: Option<usize>,
    /// Put vLLM's `prompt_logprobs`, with this many alternatives each, on each choice.
    prompt_logprobs: Option<usize>,
    /// The choice the next chunk is about.
    index: usize,
    /// Each choice's characters of text before its next token, for `text_offset`.
    offsets: Vec<usize>,
    /// Put each choice's token ids on it.
    token_ids: bool,
    /// Each prompt's ids, put on the first chunk of each of its choices where asked for
    /// (else none).
    prompt_token_ids: Vec<Vec<u32>>,
    /// Choices per prompt.
    per_prompt: usize,
    /// Whether each choice has had its first chunk (its prompt's ids, its echo).
    prompt_sent: Vec<bool>,
    /// Each prompt's text, put before the output of each of its choices (`echo`; else
    /// none).
    echoed: Vec<String>,
}

impl CompletionFormat {
    /// The current choice with `delta`.
    fn choice_of(
        &mut self,
        delta: &Delta,
        finish_reason: Option<&'static str>,
    ) -> CompletionChoice {
        let index = self.index;
        let first = !std::mem::replace(&mut self.prompt_sent[index], true);
        let offset = &mut self.offsets[index];
        let logprobs = self.logprobs.then(|| {
            let mut logprobs = match self.echo_logprobs.filter(|_| first) {
                Some(top) => logprobs::echoed(&delta.prompt, top, offset),
                None => CompletionLogprobs::default(),
            };
            logprobs.append(logprobs::completion(&delta.tokens, offset));
            logprobs
        });
        let prompt = index / self.per_prompt.max(1);
        let echo = self.echoed.get(prompt).filter(|_| first);
        CompletionChoice {
            index,
            text: echo.map_or_else(String::new, String::clone) + &delta.text,
            logprobs,
            finish_reason,
            prompt_token_ids: self.prompt_token_ids.get(prompt).filter(|_| first).cloned(),
            token_ids: self.token_ids.then(|| delta.token_ids.clone()),
            prompt_logprobs: self
                .prompt_logprobs
                .map(|top| logprobs::prompt_logprobs(&delta.prompt, top)),
        }
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
            prompt_logprobs: None,
        }
    }
}

impl ChunkFormat for CompletionFormat {
    fn opening(&mut self) -> Option<Bytes> {
        None
    }

    fn choice(&mut self, index: usize) {
        self.index = index;
    }

    fn chunk(&mut self, delta: &Delta, finish_reason: Option<&'static str>) -> Bytes {
        let choice = self.choice_of(delta, finish_reason);
        sse::event(&self.wrap(vec![choice], self.running.clone()))
    }

    fn running_usage(&mut self, usage: UsageOut) {
        self.running = Some(usage);
    }

    fn usage(&mut self, usage: UsageOut) -> Bytes {
        sse::event(&self.wrap(Vec::new(), Some(usage)))
    }
}

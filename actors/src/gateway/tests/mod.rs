//! The gateway's HTTP layer against a fake scheduler that answers each submission with
//! scripted tokens, and a byte-level BPE tokenizer built in the test.

mod admin;
mod aliases;
mod auth;
mod chat;
mod choices;
mod completions;
mod fingerprint;
mod hosts;
mod info;
mod limits;
mod messages;
mod prompt_logprobs;
mod refused;
mod responses;
mod streaming;
mod structured;
mod token_ids;
mod tokenize;
mod tools;
mod validation;

use std::sync::{Arc, Mutex};

use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::{test, web};
use bytes::Bytes;
use peregrine_models::chat_template::ChatTemplate;
use peregrine_models::tokenizer::Tokenizer;
use peregrine_ops::sampling::{SamplingParams, TokenLogprobs};
use peregrine_structured::{GrammarCompiler, GrammarLimits};
use serde_json::Value;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;
use tokio::sync::mpsc;

use super::{
    app, AdminHooks, AllowedHosts, AllowedOrigins, BoxFuture, EngineClient, GatewayConfig,
    GatewayState, ModelInfo, SharedConfig, ToolSettings,
};
use crate::health::EngineHealth;
use crate::messages::{
    FinishReason, GeneratedToken, PromptLogprobs, RequestEvent, RequestId, RequestSpec,
    SchedulerMsg, SubmitError, Usage,
};

/// The context length of the test model.
pub const MAX_MODEL_LEN: usize = 128;
/// The tokens the test engine's KV cache holds: more than one context, so that only a
/// test that lowers it meets the cache's limit.
pub const KV_CACHE_TOKENS: usize = 4 * MAX_MODEL_LEN;
/// The served model's name.
pub const MODEL: &str = "tiny";
/// Where the test model was loaded from, as `/v1/models` reports it (`root`).
pub const ROOT: &str = "/models/tiny";
/// The largest request body the test gateway reads.
pub const BODY_LIMIT: usize = 1 << 20;
/// How long the test gateway waits for a request body.
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// The prompt tokens the fake scheduler reports as served from the prefix cache.
pub const CACHED_TOKENS: usize = 3;
/// A ChatML-like template.
pub const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\
<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// How the fake scheduler answers a submission.
#[derive(Clone, Debug)]
pub enum Script {
    /// Refuse it.
    Refuse(SubmitError),
    /// Generate the tokens of `text`, `per_event` at a time, then finish with `finish`.
    Generate {
        text: String,
        per_event: usize,
        finish: FinishReason,
    },
    /// Send the first token of `text` and keep the request open.
    Hang { text: String },
}

impl Script {
    /// Generates `text` two tokens per event and finishes with `length`.
    pub fn text(text: &str) -> Self {
        Script::Generate {
            text: text.to_owned(),
            per_event: 2,
            finish: FinishReason::Length,
        }
    }
}

/// What the fake scheduler saw of a submission.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub id: RequestId,
    /// The prompt, as a vector for easy comparison.
    pub prompt: Vec<u32>,
    pub spec: RequestSpec,
}

/// Admin hooks whose reload succeeds unless `refuse` is set.
struct FakeAdmin {
    refuse: Option<String>,
}

impl AdminHooks for FakeAdmin {
    fn reload(&self) -> BoxFuture<Result<String, String>> {
        let result = match &self.refuse {
            Some(reason) => Err(reason.clone()),
            None => Ok("max_num_seqs: 8 -> 16".to_owned()),
        };
        Box::pin(async move { result })
    }

    fn live_config(&self) -> Value {
        serde_json::json!({"api_keys": ["***"], "max_num_seqs": 8})
    }
}

/// A gateway over the fake scheduler.
pub struct Fixture {
    pub state: web::Data<GatewayState>,
    pub tokenizer: Arc<Tokenizer>,
    pub submitted: Arc<Mutex<Vec<Submitted>>>,
    pub stops: mpsc::UnboundedReceiver<RequestId>,
    /// Event senders of hanging requests, to see when the gateway lets go.
    pub held: Arc<Mutex<Vec<mpsc::UnboundedSender<RequestEvent>>>>,
    /// The liveness `/health` reports.
    pub health: EngineHealth,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// With the chat template, no API keys, admin token `admin`, reloads that succeed.
    pub fn new(script: Script) -> Self {
        Self::build(script, Some(TEMPLATE), None)
    }

    /// With the given template and a reload that is refused with `refuse`, if set.
    pub fn build(script: Script, template: Option<&str>, refuse: Option<&str>) -> Self {
        let dir = tokenizer_dir();
        let tokenizer = Arc::new(Tokenizer::from_dir(dir.path()).unwrap());
        let chat_template = template.map(|source| {
            let bos = Some("<|bos|>".to_owned());
            Arc::new(ChatTemplate::new(source, bos, Some("<|eos|>".to_owned())).unwrap())
        });
        let (sender, receiver) = mpsc::channel(16);
        let (stop_sender, stops) = mpsc::unbounded_channel();
        let submitted = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::new(Mutex::new(Vec::new()));
        let fake = FakeScheduler {
            script,
            tokenizer: Arc::clone(&tokenizer),
            submitted: Arc::clone(&submitted),
            stops: stop_sender,
            held: Arc::clone(&held),
        };
        tokio::spawn(fake.run(receiver));
        let config = SharedConfig::new(GatewayConfig {
            served_model_name: MODEL.to_owned(),
            api_keys: Vec::new(),
            admin_token: Some("admin".to_owned()),
            default_sampling: SamplingParams::default(),
            default_max_tokens: None,
            max_request_body: BODY_LIMIT,
            request_body_timeout: BODY_TIMEOUT,
            max_prompt_chars: None,
        });
        let tools = ToolSettings::for_model(chat_template.as_deref(), None, true);
        let model = ModelInfo {
            root: ROOT.to_owned(),
            tokenizer: Arc::clone(&tokenizer),
            chat_template,
            max_model_len: MAX_MODEL_LEN,
            kv_cache_tokens: KV_CACHE_TOKENS,
            grammars: GrammarCompiler::new(
                &tokenizer,
                tokenizer.vocab_size(),
                GrammarLimits::default(),
            )
            .map(Arc::new)
            .map_err(|err| format!("{err:#}")),
            tools,
        };
        let admin = Arc::new(FakeAdmin {
            refuse: refuse.map(str::to_owned),
        });
        let metrics = Arc::new(|| "peregrine:num_requests_running 0\n".to_owned());
        let health = EngineHealth::default();
        let state = GatewayState::new(
            EngineClient::new(sender, health.clone()),
            model,
            config,
            admin,
            metrics,
        );
        Self {
            state: web::Data::new(state),
            tokenizer,
            submitted,
            stops,
            held,
            health,
            _dir: dir,
        }
    }

    /// The gateway's service, as the server builds it, allowing no web origin.
    pub async fn app(
        &self,
    ) -> impl Service<
        actix_http::Request,
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
    > {
        self.app_for_origins(&[]).await
    }

    /// The gateway's service allowing the web origins `origins`.
    pub async fn app_for_origins(
        &self,
        origins: &[&str],
    ) -> impl Service<
        actix_http::Request,
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
    > {
        let origins: Vec<String> = origins.iter().map(|o| o.to_string()).collect();
        self.app_with(AllowedOrigins::new(&origins), AllowedHosts::default())
            .await
    }

    /// The gateway's service as a listener bound to a loopback address builds it, serving
    /// the `Host` names `hosts` besides the loopback ones.
    pub async fn app_on_loopback(
        &self,
        hosts: &[&str],
    ) -> impl Service<
        actix_http::Request,
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
    > {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        self.app_with(AllowedOrigins::default(), AllowedHosts::new(true, &hosts))
            .await
    }

    /// The gateway's service with these guards.
    async fn app_with(
        &self,
        origins: AllowedOrigins,
        hosts: AllowedHosts,
    ) -> impl Service<
        actix_http::Request,
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
    > {
        let (origins, hosts) = (web::Data::new(origins), web::Data::new(hosts));
        test::init_service(app(self.state.clone(), origins, hosts)).await
    }

    /// The last submission.
    pub fn last_submitted(&self) -> Submitted {
        self.submitted.lock().unwrap().last().cloned().unwrap()
    }

    /// Changes the live configuration.
    pub fn configure(&self, change: impl FnOnce(&mut GatewayConfig)) {
        let mut config = (*self.state.config.get()).clone();
        change(&mut config);
        self.state.config.set(config);
    }
}

/// Sends `req`; returns the status and body.
pub async fn call<S, B>(app: &S, req: actix_http::Request) -> (StatusCode, Bytes)
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let response = test::call_service(app, req).await;
    let status = response.status();
    (status, test::read_body(response).await)
}

/// POSTs `body` as JSON to `uri`.
pub fn post(uri: &str, body: Value) -> actix_http::Request {
    test::TestRequest::post()
        .uri(uri)
        .set_json(body)
        .to_request()
}

/// The body as JSON.
pub fn json(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|err| panic!("{err}: {body:?}"))
}

/// Checks an OpenAI error body: its status code, type and param; returns the message.
pub fn expect_error(
    (status, body): (StatusCode, Bytes),
    code: u16,
    kind: &str,
    param: Option<&str>,
) -> String {
    let body = json(&body);
    assert_eq!(status.as_u16(), code, "{body}");
    let error = &body["error"];
    assert_eq!(error["code"], code, "{body}");
    assert_eq!(error["type"], kind, "{body}");
    assert_eq!(error["param"].as_str(), param, "{body}");
    error["message"].as_str().unwrap().to_owned()
}

/// The JSON of each `data:` event of an SSE body, and whether it ended with `[DONE]`.
pub fn sse_events(body: &Bytes) -> (Vec<Value>, bool) {
    let text = std::str::from_utf8(body).unwrap();
    let mut events = Vec::new();
    let mut done = false;
    for event in text.split("\n\n").filter(|event| !event.is_empty()) {
        let data = event
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("{event:?}"));
        assert!(!done, "an event after [DONE]: {text}");
        if data == "[DONE]" {
            done = true;
        } else {
            events.push(serde_json::from_str(data).unwrap());
        }
    }
    (events, done)
}

struct FakeScheduler {
    script: Script,
    tokenizer: Arc<Tokenizer>,
    submitted: Arc<Mutex<Vec<Submitted>>>,
    stops: mpsc::UnboundedSender<RequestId>,
    held: Arc<Mutex<Vec<mpsc::UnboundedSender<RequestEvent>>>>,
}

impl FakeScheduler {
    async fn run(self, mut receiver: mpsc::Receiver<SchedulerMsg>) {
        while let Some(message) = receiver.recv().await {
            match message {
                SchedulerMsg::Submit(request, reply) => {
                    self.submitted.lock().unwrap().push(Submitted {
                        id: request.id,
                        prompt: request.spec.prompt.to_vec(),
                        spec: request.spec.clone(),
                    });
                    if let Script::Refuse(err) = &self.script {
                        let _ = reply.send(Err(err.clone()));
                        continue;
                    }
                    let _ = reply.send(Ok(()));
                    self.answer(&request.spec, request.events);
                }
                SchedulerMsg::Stop(id) => {
                    let _ = self.stops.send(id);
                }
                SchedulerMsg::Reconfigure(_, done) => {
                    let _ = done.send(());
                }
                SchedulerMsg::Drain { done, .. } => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Answers `spec`: its prompt's scores first where it asks for them (in two events),
    /// then the script's tokens (none for `max_tokens` 0).
    fn answer(&self, spec: &RequestSpec, events: mpsc::UnboundedSender<RequestEvent>) {
        let (prompt_tokens, logprobs) = (spec.prompt.len(), spec.logprobs);
        if let Some(top) = spec.prompt_logprobs {
            let scores: Vec<TokenLogprobs> = (1..prompt_tokens)
                .map(|position| prompt_score(spec.prompt[position], position, top))
                .collect();
            let half = scores.len() / 2;
            let pieces = [(1, &scores[..half]), (1 + half, &scores[half..])];
            for (first, scores) in pieces.into_iter().filter(|(_, s)| !s.is_empty()) {
                let _ = events.send(RequestEvent::PromptLogprobs(PromptLogprobs {
                    id: RequestId(0),
                    first,
                    scores: scores.to_vec(),
                }));
            }
        }
        let token = |id: u32| GeneratedToken {
            id,
            logprobs: logprobs.map(|top| TokenLogprobs {
                logprob: -0.25,
                rank: 1,
                top: (0..top as u32)
                    .map(|k| (id + k, -0.25 - k as f32))
                    .collect(),
            }),
        };
        match &self.script {
            Script::Refuse(_) => {}
            Script::Generate {
                text,
                per_event,
                finish,
            } => {
                let mut ids = self.tokenizer.encode(text, false).unwrap();
                if spec.max_tokens == 0 {
                    ids.clear();
                }
                for chunk in ids.chunks(*per_event) {
                    let _ = events.send(RequestEvent::Tokens(
                        chunk.iter().map(|&id| token(id)).collect(),
                    ));
                }
                let usage = Usage {
                    prompt_tokens,
                    completion_tokens: ids.len(),
                    cached_tokens: CACHED_TOKENS,
                    num_drafts: 2,
                    num_draft_tokens: 6,
                    num_accepted_tokens: 4,
                    ..Usage::default()
                };
                let _ = events.send(RequestEvent::Finished {
                    reason: *finish,
                    usage,
                });
            }
            Script::Hang { text } => {
                let ids = self.tokenizer.encode(text, false).unwrap();
                let _ = events.send(RequestEvent::Tokens(vec![token(ids[0])]));
                self.held.lock().unwrap().push(events);
            }
        }
    }
}

/// The fake score of prompt token `id` at `position`: logprob `-position / 10`, ranked
/// `position`, after `top` alternatives `id + 1`, `id + 2`, ... of logprob `-0.01 * k`.
pub fn prompt_score(id: u32, position: usize, top: usize) -> TokenLogprobs {
    TokenLogprobs {
        logprob: -(position as f32) / 10.0,
        rank: position,
        top: (1..=top as u32)
            .map(|k| (id + k, -0.01 * k as f32))
            .collect(),
    }
}

/// A byte-level BPE tokenizer (the 256 byte symbols, a few merges, three special tokens)
/// with `tokenizer_config.json` naming BOS and EOS, in a temp dir.
fn tokenizer_dir() -> tempfile::TempDir {
    let mut symbols: Vec<String> = ByteLevel::alphabet()
        .into_iter()
        .map(String::from)
        .collect();
    symbols.sort();
    let merges: Vec<(String, String)> = [("Ġ", "w"), ("h", "e"), ("l", "l"), ("he", "ll")]
        .iter()
        .map(|&(a, b)| (a.to_owned(), b.to_owned()))
        .collect();
    symbols.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
    let vocab: Vocab = symbols.into_iter().zip(0u32..).collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .unwrap();
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    tokenizer.add_special_tokens(&[
        AddedToken::from("<|bos|>", true),
        AddedToken::from("<|eos|>", true),
        AddedToken::from("<|im_end|>", true),
    ]);
    let dir = tempfile::tempdir().unwrap();
    tokenizer
        .save(dir.path().join("tokenizer.json"), false)
        .unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": "<|bos|>", "eos_token": "<|eos|>", "add_bos_token": true}"#,
    )
    .unwrap();
    dir
}

//! The HTTP side: the model list, and one streamed `/v1/completions` or
//! `/v1/chat/completions` request.

use super::job::Job;
use super::sse::{SseEvent, SseParser};
use super::stats::RequestMetrics;
use super::stream::{error_message, StreamTimer};
use anyhow::{bail, Context};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::Instant;

/// An OpenAI-compatible server.
#[derive(Clone)]
pub struct Server {
    /// The HTTP client (connections are pooled across requests).
    client: reqwest::Client,
    /// The base URL without a trailing slash.
    base: String,
    /// The Bearer token, if any.
    api_key: Option<String>,
}

impl Server {
    /// A client for the server at `url` (e.g. `http://127.0.0.1:8000`).
    pub fn new(url: &str, api_key: Option<String>) -> anyhow::Result<Self> {
        let base = url.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") && !base.starts_with("https://") {
            bail!("--url must start with http:// or https://, not {url:?}");
        }
        let client = reqwest::Client::builder()
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Self {
            client,
            base,
            api_key,
        })
    }

    /// A request to `path` with the API key attached.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.client.request(method, format!("{}{path}", self.base));
        match &self.api_key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    /// `GET path` with its URL, the response checked to be a success.
    async fn get(&self, path: &str) -> anyhow::Result<(String, reqwest::Response)> {
        let url = format!("{}{path}", self.base);
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .with_context(|| format!("cannot reach the server at {url} (is it running?)"))?;
        let response = ensure_success(response)
            .await
            .with_context(|| format!("GET {url} failed"))?;
        Ok((url, response))
    }

    /// The first model id `GET /v1/models` lists.
    pub async fn first_model(&self) -> anyhow::Result<String> {
        let (url, response) = self.get("/v1/models").await?;
        let models: Value = response
            .json()
            .await
            .with_context(|| format!("GET {url} did not return JSON"))?;
        match models["data"][0]["id"].as_str() {
            Some(id) => Ok(id.to_owned()),
            None => bail!("GET {url} listed no models; pass --model"),
        }
    }

    /// Sends one job, streamed with usage, and times it until `data: [DONE]`.
    pub async fn complete(&self, model: &str, job: &Job) -> anyhow::Result<RequestMetrics> {
        let mut body = job.body.clone();
        body.insert("model".into(), json!(model));
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
        let start = Instant::now();
        let response = self
            .request(reqwest::Method::POST, job.endpoint.path())
            .json(&body)
            .send()
            .await
            .with_context(|| format!("cannot reach the server at {}", self.base))?;
        let response = ensure_success(response).await?;
        let mut timer = StreamTimer::new(start);
        let mut parser = SseParser::default();
        let mut bytes = response.bytes_stream();
        while let Some(read) = bytes.next().await {
            let read = read.context("the stream broke")?;
            let now = Instant::now();
            for event in parser.push(&read) {
                match event {
                    SseEvent::Data(payload) => timer.on_chunk(&payload, now)?,
                    SseEvent::Done => return Ok(timer.finish(now, job.approx_tokens)),
                }
            }
        }
        bail!("the stream ended without data: [DONE]")
    }
}

impl Server {
    /// One greedy completion of `prompt` (`max_tokens` tokens, past any end-of-sequence
    /// token), not streamed: its text.
    pub async fn complete_greedy(
        &self,
        model: &str,
        prompt: &str,
        max_tokens: usize,
    ) -> anyhow::Result<String> {
        let body = json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": true,
            "temperature": 0,
        });
        let response = self
            .request(reqwest::Method::POST, "/v1/completions")
            .json(&body)
            .send()
            .await
            .with_context(|| format!("cannot reach the server at {}", self.base))?;
        let reply: Value = ensure_success(response)
            .await?
            .json()
            .await
            .context("the completion was not JSON")?;
        match reply["choices"][0]["text"].as_str() {
            Some(text) => Ok(text.to_owned()),
            None => bail!("the completion has no choices[0].text: {reply}"),
        }
    }

    /// The server's prompt-token counters, where its `/metrics` has Peregrine's
    /// (`None` from another server, or when they cannot be read).
    pub async fn prefill_counts(&self) -> Option<PrefillCounts> {
        PrefillCounts::parse(&self.metrics().await.ok()?)
    }

    /// The text of `GET /metrics` (Prometheus exposition format).
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let (url, response) = self.get("/metrics").await?;
        response
            .text()
            .await
            .with_context(|| format!("GET {url}: unreadable body"))
    }
}

/// The response itself when its status is a success; otherwise an error naming the
/// status and the server's message.
async fn ensure_success(response: reqwest::Response) -> anyhow::Result<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let message = match serde_json::from_str::<Value>(&body) {
        Ok(Value::Object(fields)) if fields.contains_key("error") => {
            error_message(&fields["error"])
        }
        Ok(value @ Value::Object(_)) => error_message(&value),
        _ => body.chars().take(200).collect(),
    };
    bail!("HTTP {status}: {message}")
}

/// What a server's `/metrics` counts of prompt tokens so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillCounts {
    /// Prompt tokens of the requests that finished.
    pub prompt_tokens: f64,
    /// Prompt tokens found in the prefix cache rather than computed.
    pub cached_tokens: f64,
}

impl PrefillCounts {
    /// The counters in `metrics` (Prometheus text); `None` without the prefix cache's
    /// (exported from the start), the prompt tokens 0 until a request has finished.
    pub fn parse(metrics: &str) -> Option<PrefillCounts> {
        let value = |name: &str| {
            metrics.lines().find_map(|line| {
                let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
                rest.trim().parse::<f64>().ok()
            })
        };
        Some(PrefillCounts {
            cached_tokens: value("peregrine:prefix_cache_hits_total")?,
            prompt_tokens: value("peregrine:prompt_tokens_total").unwrap_or(0.0),
        })
    }

    /// The prompt tokens computed (not found in the prefix cache) between `before` and
    /// these counts.
    pub fn computed_since(&self, before: &PrefillCounts) -> u64 {
        let prompt = self.prompt_tokens - before.prompt_tokens;
        let cached = self.cached_tokens - before.cached_tokens;
        (prompt - cached).max(0.0) as u64
    }
}

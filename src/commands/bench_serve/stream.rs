//! Reads one streamed completion or chat completion: the chunks' JSON and the time each
//! one came.

use super::stats::RequestMetrics;
use anyhow::bail;
use serde::Deserialize;
use serde_json::Value;
use std::time::Instant;

/// The fields of a `/v1/completions` or `/v1/chat/completions` stream chunk that the
/// benchmark uses.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
    error: Option<Value>,
}

/// One choice of a chunk: a completion's `text` or a chat's `delta`.
#[derive(Deserialize)]
struct Choice {
    text: Option<String>,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

/// What a chat chunk adds to the message.
#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A fragment of one tool call: its function's name when it starts, then pieces of the
/// arguments.
#[derive(Deserialize)]
struct ToolCallDelta {
    function: Option<FunctionDelta>,
}

/// The function part of a tool-call fragment.
#[derive(Deserialize)]
struct FunctionDelta {
    name: Option<String>,
    arguments: Option<String>,
}

/// Whether `text` is there and not empty.
fn non_empty(text: &Option<String>) -> bool {
    text.as_deref().is_some_and(|t| !t.is_empty())
}

impl Choice {
    /// Whether the choice carries generated output: text, chat content, or a tool call's
    /// name or arguments (a chat's opening `{"role": "assistant", "content": ""}` does
    /// not).
    fn has_tokens(&self) -> bool {
        non_empty(&self.text)
            || self.delta.as_ref().is_some_and(|delta| {
                non_empty(&delta.content)
                    || delta.tool_calls.iter().flatten().any(|call| {
                        call.function
                            .as_ref()
                            .is_some_and(|f| non_empty(&f.name) || non_empty(&f.arguments))
                    })
            })
    }
}

/// The token counts of the final usage chunk.
#[derive(Deserialize, Clone, Copy)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
}

/// The text of an OpenAI-style error: `{"message": ...}`, a bare string, or the JSON.
pub fn error_message(error: &Value) -> String {
    match error {
        Value::String(s) => s.clone(),
        Value::Object(fields) => match fields.get("message") {
            Some(Value::String(s)) => s.clone(),
            _ => error.to_string(),
        },
        _ => error.to_string(),
    }
}

/// Times the chunks of one request as they arrive.
pub struct StreamTimer {
    /// When the request was sent.
    start: Instant,
    /// When the first token-carrying chunk came.
    first: Option<Instant>,
    /// When the latest token-carrying chunk came.
    last: Option<Instant>,
    /// The gaps between token-carrying chunks, in seconds.
    itl: Vec<f64>,
    /// How many chunks carried tokens.
    token_chunks: usize,
    /// The latest usage the server sent.
    usage: Option<Usage>,
    /// The latest finish reason the server sent.
    finish_reason: Option<String>,
}

impl StreamTimer {
    /// Starts timing a request sent at `start`.
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            first: None,
            last: None,
            itl: Vec::new(),
            token_chunks: 0,
            usage: None,
            finish_reason: None,
        }
    }

    /// Records one `data:` payload that arrived at `now`; an unparsable payload or an
    /// error the server sent in the stream fails the request.
    pub fn on_chunk(&mut self, payload: &str, now: Instant) -> anyhow::Result<()> {
        let chunk: Chunk = match serde_json::from_str(payload) {
            Ok(chunk) => chunk,
            Err(e) => {
                let shown: String = payload.chars().take(200).collect();
                bail!("unparsable stream chunk ({e}): {shown}")
            }
        };
        if let Some(error) = chunk.error {
            bail!("error in the stream: {}", error_message(&error));
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        if let Some(reason) = chunk.choices.iter().find_map(|c| c.finish_reason.clone()) {
            self.finish_reason = Some(reason);
        }
        if chunk.choices.iter().any(Choice::has_tokens) {
            self.token_chunks += 1;
            match self.last {
                None => self.first = Some(now),
                Some(last) => self.itl.push((now - last).as_secs_f64()),
            }
            self.last = Some(now);
        }
        Ok(())
    }

    /// The request's numbers once `data: [DONE]` came at `now`. Token counts come from
    /// the usage chunk, else the estimate and the number of token-carrying chunks.
    pub fn finish(self, now: Instant, approx_input_tokens: usize) -> RequestMetrics {
        let e2e = (now - self.start).as_secs_f64();
        RequestMetrics {
            input_tokens: self.usage.map_or(approx_input_tokens, |u| u.prompt_tokens),
            output_tokens: self
                .usage
                .map_or(self.token_chunks, |u| u.completion_tokens),
            ttft: self.first.map_or(e2e, |t| (t - self.start).as_secs_f64()),
            e2e,
            itl: self.itl,
            finish_reason: self.finish_reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn times_text_chunks_and_reads_usage() {
        let t0 = Instant::now();
        let mut timer = StreamTimer::new(t0);
        let text =
            |s: &str| format!("{{\"choices\":[{{\"index\":0,\"text\":\"{s}\"}}],\"usage\":null}}");
        timer.on_chunk(&text(""), at(t0, 50)).unwrap();
        timer.on_chunk(&text("a"), at(t0, 100)).unwrap();
        timer.on_chunk(&text("b"), at(t0, 130)).unwrap();
        timer.on_chunk(&text("c"), at(t0, 170)).unwrap();
        let finish = "{\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}";
        timer.on_chunk(finish, at(t0, 175)).unwrap();
        timer
            .on_chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4,\"total_tokens\":16}}", at(t0, 180))
            .unwrap();
        let m = timer.finish(at(t0, 190), 99);
        assert_eq!((m.input_tokens, m.output_tokens), (12, 4));
        assert!((m.ttft - 0.1).abs() < 1e-9 && (m.e2e - 0.19).abs() < 1e-9);
        assert_eq!(m.itl.len(), 2);
        assert!((m.itl[0] - 0.03).abs() < 1e-9 && (m.itl[1] - 0.04).abs() < 1e-9);
        assert_eq!(m.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn counts_chunks_without_usage() {
        let t0 = Instant::now();
        let mut timer = StreamTimer::new(t0);
        timer
            .on_chunk("{\"choices\":[{\"text\":\"x\"}]}", at(t0, 10))
            .unwrap();
        timer
            .on_chunk("{\"choices\":[{\"text\":\"y\"}]}", at(t0, 20))
            .unwrap();
        let m = timer.finish(at(t0, 20), 7);
        assert_eq!((m.input_tokens, m.output_tokens), (7, 2));
        assert_eq!(m.finish_reason, None);
    }

    #[test]
    fn times_chat_content_and_reads_the_finish_reason() {
        let t0 = Instant::now();
        let mut timer = StreamTimer::new(t0);
        let chunk = |delta: Value, reason: Value| {
            json!({"object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]})
            .to_string()
        };
        let opening = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
        timer.on_chunk(&opening, at(t0, 40)).unwrap();
        timer
            .on_chunk(&chunk(json!({"content": "{\""}), Value::Null), at(t0, 60))
            .unwrap();
        timer
            .on_chunk(
                &chunk(json!({"content": "a\"}"}), json!("stop")),
                at(t0, 75),
            )
            .unwrap();
        let m = timer.finish(at(t0, 80), 3);
        assert!(
            (m.ttft - 0.06).abs() < 1e-9,
            "the opening chunk is no token"
        );
        assert_eq!(m.itl.len(), 1);
        assert!((m.itl[0] - 0.015).abs() < 1e-9);
        assert_eq!((m.input_tokens, m.output_tokens), (3, 2));
        assert_eq!(m.finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn tool_call_deltas_carry_tokens() {
        let t0 = Instant::now();
        let mut timer = StreamTimer::new(t0);
        let call = |function: Value| {
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "call_0", "type": "function", "function": function}]}}]})
            .to_string()
        };
        let steps = [
            (call(json!({"name": "get_weather", "arguments": ""})), 30),
            (call(json!({"arguments": "{\"city\": "})), 50),
            (call(json!({"arguments": ""})), 60),
            (call(json!({"arguments": "\"Oslo\"}"})), 90),
        ];
        for (payload, ms) in &steps {
            timer.on_chunk(payload, at(t0, *ms)).unwrap();
        }
        let finish = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]});
        timer.on_chunk(&finish.to_string(), at(t0, 95)).unwrap();
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9}});
        timer.on_chunk(&usage.to_string(), at(t0, 96)).unwrap();
        let m = timer.finish(at(t0, 100), 3);
        assert!((m.ttft - 0.03).abs() < 1e-9);
        assert_eq!(
            m.itl.len(),
            2,
            "the empty fragment and the finish chunk carry none"
        );
        assert!((m.itl[0] - 0.02).abs() < 1e-9 && (m.itl[1] - 0.04).abs() < 1e-9);
        assert_eq!((m.input_tokens, m.output_tokens), (20, 9));
        assert_eq!(m.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn stream_errors_fail_the_request() {
        let mut timer = StreamTimer::new(Instant::now());
        let e = timer.on_chunk(
            "{\"error\":{\"message\":\"out of blocks\"}}",
            Instant::now(),
        );
        assert_eq!(
            e.unwrap_err().to_string(),
            "error in the stream: out of blocks"
        );
        let e = timer
            .on_chunk("not json", Instant::now())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("unparsable stream chunk") && e.ends_with("not json"),
            "{e}"
        );
    }
}

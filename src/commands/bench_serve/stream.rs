//! Reads one streamed completion: the chunks' JSON and the time each one came.

use super::stats::RequestMetrics;
use anyhow::bail;
use serde::Deserialize;
use serde_json::Value;
use std::time::Instant;

/// The fields of a `/v1/completions` stream chunk that the benchmark uses.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
    error: Option<Value>,
}

/// One choice of a chunk.
#[derive(Deserialize)]
struct Choice {
    text: Option<String>,
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
    /// When the first chunk with text came.
    first: Option<Instant>,
    /// When the latest chunk with text came.
    last: Option<Instant>,
    /// The gaps between chunks with text, in seconds.
    itl: Vec<f64>,
    /// How many chunks had text.
    text_chunks: usize,
    /// The latest usage the server sent.
    usage: Option<Usage>,
}

impl StreamTimer {
    /// Starts timing a request sent at `start`.
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            first: None,
            last: None,
            itl: Vec::new(),
            text_chunks: 0,
            usage: None,
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
        let has_text = chunk
            .choices
            .iter()
            .any(|c| c.text.as_deref().is_some_and(|t| !t.is_empty()));
        if has_text {
            self.text_chunks += 1;
            match self.last {
                None => self.first = Some(now),
                Some(last) => self.itl.push((now - last).as_secs_f64()),
            }
            self.last = Some(now);
        }
        Ok(())
    }

    /// The request's numbers once `data: [DONE]` came at `now`. Token counts come from
    /// the usage chunk, else the estimate and the number of chunks with text.
    pub fn finish(self, now: Instant, approx_input_tokens: usize) -> RequestMetrics {
        let e2e = (now - self.start).as_secs_f64();
        RequestMetrics {
            input_tokens: self.usage.map_or(approx_input_tokens, |u| u.prompt_tokens),
            output_tokens: self.usage.map_or(self.text_chunks, |u| u.completion_tokens),
            ttft: self.first.map_or(e2e, |t| (t - self.start).as_secs_f64()),
            e2e,
            itl: self.itl,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        timer
            .on_chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4,\"total_tokens\":16}}", at(t0, 180))
            .unwrap();
        let m = timer.finish(at(t0, 190), 99);
        assert_eq!((m.input_tokens, m.output_tokens), (12, 4));
        assert!((m.ttft - 0.1).abs() < 1e-9 && (m.e2e - 0.19).abs() < 1e-9);
        assert_eq!(m.itl.len(), 2);
        assert!((m.itl[0] - 0.03).abs() < 1e-9 && (m.itl[1] - 0.04).abs() < 1e-9);
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

//! The whole client path against a fake OpenAI server: a few lines of HTTP/1.1 over a
//! tokio `TcpListener`, streaming one word (or tool-call fragment) per chunk with events
//! split across writes.

use super::run;
use crate::cli::BenchServeArgs;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the fake server saw: each request's head and JSON body.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// Starts the fake server on its own thread; returns its URL and what it sees.
fn start_fake_server() -> (String, Seen) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Seen::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                tokio::spawn(serve_one(socket, log.clone()));
            }
        });
    });
    (url, seen)
}

/// Reads one request and answers it: the model list, a 400 for a prompt containing
/// "fail", or a stream of `max_tokens` token chunks (one-word text, chat content, or
/// tool-call fragments when tools are offered), a usage chunk and `[DONE]`.
async fn serve_one(mut socket: TcpStream, seen: Seen) {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await.unwrap();
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await.unwrap();
        buf.extend_from_slice(&chunk[..n]);
    }
    let body: Value = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
    seen.lock().unwrap().push((head.clone(), body.clone()));
    if head.starts_with("get /v1/models") {
        let models = json!({"object": "list", "data": [{"id": "fake-model"}]}).to_string();
        let reply = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{models}", models.len());
        socket.write_all(reply.as_bytes()).await.unwrap();
        return;
    }
    if head.starts_with("get /metrics") {
        let reply = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        socket.write_all(reply.as_bytes()).await.unwrap();
        return;
    }
    let prompt = body["prompt"].as_str().unwrap_or_default();
    if prompt.contains("fail") {
        let error = json!({"error": {"message": "prompt refused", "type": "invalid_request_error", "param": "prompt", "code": null}}).to_string();
        let reply = format!("HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{error}", error.len());
        socket.write_all(reply.as_bytes()).await.unwrap();
        return;
    }
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    socket.write_all(head.as_bytes()).await.unwrap();
    let max_tokens = body["max_tokens"].as_u64().unwrap();
    let chat = body.get("messages").is_some();
    let reason = finish_reason(&body);
    let tools = reason == "tool_calls";
    if chat {
        let opening = json!({"role": "assistant", "content": ""});
        send(&mut socket, chat_chunk(opening, Value::Null)).await;
    }
    for i in 0..max_tokens {
        let last: Value = (i + 1 == max_tokens).then_some(reason).into();
        let chunk = match (chat, tools) {
            (false, _) => {
                json!({"object": "text_completion", "choices": [{"index": 0, "text": " word", "finish_reason": last}], "usage": null})
            }
            (true, false) => chat_chunk(json!({"content": " word"}), last),
            (true, true) => {
                let function = if i == 0 {
                    json!({"name": "get_weather", "arguments": ""})
                } else {
                    json!({"arguments": "x"})
                };
                let call =
                    json!({"index": 0, "id": "call_0", "type": "function", "function": function});
                chat_chunk(json!({"tool_calls": [call]}), last)
            }
        };
        send(&mut socket, chunk).await;
    }
    let prompt_tokens = if chat {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().split_whitespace().count())
            .sum()
    } else {
        prompt.split_whitespace().count()
    };
    let usage = json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens, "total_tokens": prompt_tokens as u64 + max_tokens}});
    let tail = format!("data: {usage}\n\ndata: [DONE]\n\n");
    socket.write_all(tail.as_bytes()).await.unwrap();
}

/// The fake's finish reason: `tool_calls` when tools are offered, `stop` for another
/// constraint (its output is complete), `length` otherwise.
fn finish_reason(body: &Value) -> &'static str {
    let constraint = [
        "response_format",
        "guided_choice",
        "guided_regex",
        "json_schema",
    ];
    if body["tools"].as_array().is_some_and(|t| !t.is_empty()) {
        "tool_calls"
    } else if constraint.iter().any(|field| body.get(field).is_some()) {
        "stop"
    } else {
        "length"
    }
}

/// A chat stream chunk with one choice.
fn chat_chunk(delta: Value, finish_reason: Value) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})
}

/// Writes one event in two halves, a little apart.
async fn send(socket: &mut TcpStream, chunk: Value) {
    let event = format!("data: {chunk}\n\n");
    let (a, b) = event.split_at(event.len() / 2);
    socket.write_all(a.as_bytes()).await.unwrap();
    socket.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
    socket.write_all(b.as_bytes()).await.unwrap();
}

/// Arguments for `num_prompts` random prompts against `url`, writing `result_file`.
fn args(url: &str, result_file: &Path) -> BenchServeArgs {
    BenchServeArgs {
        url: url.to_owned(),
        model: None,
        num_prompts: 6,
        concurrency: 3,
        input_len: 8,
        output_len: 4,
        dataset: None,
        seed: 1,
        n: 1,
        result_file: Some(result_file.to_owned()),
        api_key: Some("secret".into()),
    }
}

/// What the fake server saw, less the `/metrics` reads around each run.
fn without_metrics(seen: &Seen) -> Vec<(String, Value)> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(head, _)| !head.starts_with("get /metrics"))
        .cloned()
        .collect()
}

#[test]
fn n_asks_every_request_for_that_many_choices() {
    let (url, seen) = start_fake_server();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("result.json");
    let mut a = args(&url, &out);
    a.n = 3;
    run(a).unwrap();
    let seen = without_metrics(&seen);
    assert_eq!(seen.len(), 7);
    for (_, body) in seen.iter().skip(1) {
        assert_eq!(body["n"], 3, "{body}");
    }
    let command = read_json(&out)["command"].as_str().unwrap().to_owned();
    assert!(command.contains("--output-len 4 --n 3"), "{command}");
    let mut a = args(&url, &out);
    a.n = 0;
    assert!(run(a).is_err());
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn random_prompts_against_fake_server() {
    let (url, seen) = start_fake_server();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("result.json");
    run(args(&url, &out)).unwrap();
    let result = read_json(&out);
    assert_eq!(
        (result["completed"].as_u64(), result["failed"].as_u64()),
        (Some(6), Some(0))
    );
    assert_eq!(result["total_input_tokens"], 48);
    assert_eq!(result["total_output_tokens"], 24);
    assert_eq!(result["model_id"], "fake-model");
    assert_eq!(result["itls"][0].as_array().unwrap().len(), 3);
    assert!(result["p99_tpot_ms"].as_f64().unwrap() > 0.0);
    assert!(result["mean_ttft_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(result["constrained_requests"], 0);
    assert_eq!(result["finish_reason_counts"], json!({"length": 6}));
    assert_eq!(
        result["constraints"],
        json!([null, null, null, null, null, null])
    );
    let command = result["command"].as_str().unwrap();
    assert!(
        command
            .contains("--model fake-model --num-prompts 6 --concurrency 3 --input-len 8 --seed 1"),
        "{command}"
    );
    assert!(
        command.ends_with("--api-key <KEY>") && !command.contains("secret"),
        "{command}"
    );

    let seen = without_metrics(&seen);
    assert_eq!(seen.len(), 7, "one model list and six completions");
    assert_eq!(result["server_prompt_tokens_computed"], Value::Null);
    for (head, body) in seen.iter().skip(1) {
        assert!(
            head.starts_with("post /v1/completions")
                && head.contains("authorization: bearer secret")
        );
        assert_eq!(body["model"], "fake-model");
        assert_eq!(
            (
                body["stream"].clone(),
                body["stream_options"]["include_usage"].clone()
            ),
            (json!(true), json!(true))
        );
        assert_eq!(
            (
                body["temperature"].clone(),
                body["ignore_eos"].clone(),
                body["max_tokens"].clone()
            ),
            (json!(0), json!(true), json!(4))
        );
    }
}

#[test]
fn failed_requests_are_counted_with_their_error() {
    let (url, _) = start_fake_server();
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("d.jsonl");
    std::fs::write(
        &dataset,
        "{\"prompt\": \"a b c\", \"max_tokens\": 2}\n{\"prompt\": \"please fail\"}\n",
    )
    .unwrap();
    let out = dir.path().join("result.json");
    let mut a = args(&url, &out);
    a.model = Some("m".into());
    a.dataset = Some(dataset);
    a.num_prompts = 4;
    run(a).unwrap();
    let result = read_json(&out);
    assert_eq!(
        (result["completed"].as_u64(), result["failed"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(result["output_lens"], json!([2, null, 2, null]));
    assert_eq!(result["errors"][1], "HTTP 400 Bad Request: prompt refused");
    assert_eq!(result["errors"][0], "");
}

#[test]
fn unreachable_server_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("result.json");
    let error = format!("{:#}", run(args(&url, &out)).unwrap_err());
    assert!(
        error.starts_with(&format!("cannot reach the server at {url}/v1/models")),
        "{error}"
    );
    // With --model there is no model list: every request fails, and so does the run.
    let mut a = args(&url, &out);
    a.model = Some("m".into());
    let error = format!("{:#}", run(a).unwrap_err());
    assert!(
        error.starts_with("all 6 requests failed; the first error: cannot reach the server"),
        "{error}"
    );
    assert_eq!(read_json(&out)["failed"], 6);
}

/// Writes `lines` as a dataset in `dir`.
fn write_dataset(dir: &Path, lines: &[Value]) -> std::path::PathBuf {
    let path = dir.join("d.jsonl");
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n") + "\n").unwrap();
    path
}

#[test]
fn constrained_dataset_against_fake_server() {
    let (url, seen) = start_fake_server();
    let dir = tempfile::tempdir().unwrap();
    let messages = json!([
        {"role": "system", "content": "answer in JSON"},
        {"role": "user", "content": "a b c"}
    ]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let lines = [
        json!({"prompt": "pick one", "guided_choice": ["yes", "no"], "max_tokens": 3}),
        json!({"messages": messages, "response_format": {"type": "json_object"},
               "temperature": 0.5, "max_tokens": 4}),
        json!({"prompt": "weather in Oslo", "tools": tools, "tool_choice": "auto",
               "parallel_tool_calls": false, "max_tokens": 5}),
        json!({"prompt": "plain words here", "max_tokens": 2, "ignore_eos": true}),
    ];
    let out = dir.path().join("result.json");
    let mut a = args(&url, &out);
    a.model = Some("m".into());
    a.dataset = Some(write_dataset(dir.path(), &lines));
    (a.num_prompts, a.concurrency) = (4, 1);
    run(a).unwrap();

    let result = read_json(&out);
    assert_eq!(
        (result["completed"].as_u64(), result["failed"].as_u64()),
        (Some(4), Some(0)),
        "{}",
        result["errors"]
    );
    assert_eq!(result["constrained_requests"], 3);
    assert_eq!(
        result["constraint_counts"],
        json!({"json_schema": 0, "json_object": 1, "regex": 0, "choice": 1, "grammar": 0, "tools": 1})
    );
    assert_eq!(
        result["constraints"],
        json!(["choice", "json_object", "tools", null])
    );
    assert_eq!(
        result["finish_reason_counts"],
        json!({"length": 1, "stop": 2, "tool_calls": 1})
    );
    assert_eq!(
        result["finish_reasons"],
        json!(["stop", "stop", "tool_calls", "length"])
    );
    assert_eq!(result["output_lens"], json!([3, 4, 5, 2]));
    assert_eq!(result["input_lens"], json!([2, 6, 3, 3]));
    // Every token-carrying chunk is timed: chat content and tool-call fragments, not the
    // chat's opening role chunk.
    let itls: Vec<usize> = result["itls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|itl| itl.as_array().unwrap().len())
        .collect();
    assert_eq!(itls, [2, 3, 4, 1]);
    for ttft in result["ttfts"].as_array().unwrap() {
        assert!(ttft.as_f64().unwrap() > 0.0);
    }

    let seen = without_metrics(&seen);
    let paths: Vec<&str> = seen
        .iter()
        .map(|(head, _)| head.split(" http/").next().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "post /v1/completions",
            "post /v1/chat/completions",
            "post /v1/chat/completions",
            "post /v1/completions"
        ]
    );
    let streamed = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}});
    let want = [
        json!({"prompt": "pick one", "guided_choice": ["yes", "no"], "max_tokens": 3,
               "ignore_eos": false, "temperature": 0}),
        json!({"messages": messages, "response_format": {"type": "json_object"},
               "temperature": 0.5, "max_tokens": 4, "ignore_eos": false}),
        json!({"messages": [{"role": "user", "content": "weather in Oslo"}], "tools": tools,
               "tool_choice": "auto", "parallel_tool_calls": false, "max_tokens": 5,
               "ignore_eos": false, "temperature": 0}),
        json!({"prompt": "plain words here", "max_tokens": 2, "ignore_eos": true,
               "temperature": 0}),
    ];
    for ((_, body), mut want) in seen.iter().zip(want) {
        want.as_object_mut()
            .unwrap()
            .extend(streamed.as_object().unwrap().clone());
        assert_eq!(body, &want);
    }
}

#[test]
fn a_misspelt_dataset_field_is_named_before_sending() {
    let (url, seen) = start_fake_server();
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("d.jsonl");
    let text = "{\"prompt\": \"fine\"}\n{\"prompt\": \"typo\", \"guided_regexp\": \"a+\"}\n";
    std::fs::write(&dataset, text).unwrap();
    let mut a = args(&url, &dir.path().join("result.json"));
    a.dataset = Some(dataset.clone());
    let error = format!("{:#}", run(a).unwrap_err());
    assert!(
        error.starts_with(&format!(
            "in the dataset {}: line 2, column 34: not a dataset line",
            dataset.display()
        )) && error.contains("unknown field `guided_regexp`"),
        "{error}"
    );
    assert!(seen.lock().unwrap().is_empty());
}

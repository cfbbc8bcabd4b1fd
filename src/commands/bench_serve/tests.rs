//! The whole client path against a fake OpenAI server: a few lines of HTTP/1.1 over a
//! tokio `TcpListener`, streaming one word per chunk with events split across writes.

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
/// "fail", or a stream of `max_tokens` one-word chunks, a usage chunk and `[DONE]`.
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
    for _ in 0..max_tokens {
        let event = format!(
            "data: {}\n\n",
            json!({"object": "text_completion", "choices": [{"index": 0, "text": " word", "finish_reason": null}], "usage": null})
        );
        let (a, b) = event.split_at(event.len() / 2);
        socket.write_all(a.as_bytes()).await.unwrap();
        socket.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        socket.write_all(b.as_bytes()).await.unwrap();
    }
    let prompt_tokens = prompt.split_whitespace().count();
    let usage = json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens, "total_tokens": prompt_tokens as u64 + max_tokens}});
    let tail = format!("data: {usage}\n\ndata: [DONE]\n\n");
    socket.write_all(tail.as_bytes()).await.unwrap();
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
        result_file: Some(result_file.to_owned()),
        api_key: Some("secret".into()),
    }
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

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 7, "one model list and six completions");
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

//! Server-sent event streams: chunks, `[DONE]`, the usage chunk, held-back stop strings,
//! and what a disconnect releases.

use std::pin::Pin;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::http::header::CONTENT_TYPE;
use actix_web::test;
use futures_util::future::poll_fn;
use serde_json::{json, Value};

use super::{post, sse_events, Fixture, Script, CACHED_TOKENS, MODEL};
use crate::messages::FinishReason;

/// The text of each chunk's first choice (`text` or `delta.content`).
fn texts(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .map(|chunk| {
            let choice = &chunk["choices"][0];
            let text = choice["text"]
                .as_str()
                .or(choice["delta"]["content"].as_str());
            text.unwrap_or_default().to_owned()
        })
        .collect()
}

#[actix_web::test]
async fn completion_stream_sends_chunks_then_done_with_usage() {
    let fixture = Fixture::new(Script::text("Hello world"));
    let app = fixture.app().await;
    let request = json!({"model": MODEL, "prompt": "Say hi", "stream": true,
        "stream_options": {"include_usage": true}});
    let response = test::call_service(&app, post("/v1/completions", request)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers().get(CONTENT_TYPE).unwrap(),
        "text/event-stream"
    );
    let (events, done) = sse_events(&test::read_body(response).await);
    assert!(done, "ends with [DONE]");
    let (usage, chunks) = events.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    let completion = fixture
        .tokenizer
        .encode("Hello world", false)
        .unwrap()
        .len();
    assert_eq!(usage["usage"]["completion_tokens"], completion);
    assert!(chunks.len() > 2, "{chunks:?}");
    assert_eq!(texts(chunks).concat(), "Hello world");
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("cmpl-"));
    let (last, rest) = chunks.split_last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    for chunk in rest {
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["object"], "text_completion");
        assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
        assert!(chunk.get("usage").is_none());
    }
}

#[actix_web::test]
async fn stream_holds_back_a_possible_stop_string() {
    let mut fixture = Fixture::new(Script::Generate {
        text: "Hello world. More".into(),
        per_event: 1,
        finish: FinishReason::Length,
    });
    let app = fixture.app().await;
    let request = json!({"prompt": "x", "stream": true, "stop": "world"});
    let body = test::call_and_read_body(&app, post("/v1/completions", request)).await;
    let (chunks, done) = sse_events(&body);
    assert!(done);
    let texts = texts(&chunks);
    assert_eq!(texts.concat(), "Hello ");
    assert!(texts.iter().all(|text| !text.contains('w')), "{texts:?}");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    let stopped = tokio::time::timeout(Duration::from_secs(5), fixture.stops.recv()).await;
    assert_eq!(stopped.unwrap(), Some(fixture.last_submitted().id));
}

#[actix_web::test]
async fn chat_stream_starts_with_the_role() {
    let fixture = Fixture::new(Script::text("Hi there"));
    let app = fixture.app().await;
    let request = json!({"messages": [{"role": "user", "content": "Hello"}], "stream": true});
    let body = test::call_and_read_body(&app, post("/v1/chat/completions", request)).await;
    let (chunks, done) = sse_events(&body);
    assert!(done);
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert!(chunks[0]["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(chunks
        .iter()
        .all(|chunk| chunk["object"] == "chat.completion.chunk"));
    assert_eq!(texts(&chunks).concat(), "Hi there");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(last.get("usage").is_none(), "no usage chunk unless asked");
}

#[actix_web::test]
async fn dropping_the_stream_releases_the_request() {
    let fixture = Fixture::new(Script::Hang {
        text: "Hello".into(),
    });
    let app = fixture.app().await;
    let request = json!({"prompt": "x", "stream": true});
    let response = test::call_service(&app, post("/v1/completions", request)).await;
    let mut body = response.into_body();
    let first = poll_fn(|cx| Pin::new(&mut body).poll_next(cx)).await;
    let first = first.unwrap().map_err(|_| "the body failed").unwrap();
    assert!(first.starts_with(b"data: {"), "{first:?}");
    let events = fixture.held.lock().unwrap()[0].clone();
    assert!(!events.is_closed(), "the stream holds the request");
    drop(body);
    assert!(
        events.is_closed(),
        "the client went away: nothing holds the receiver"
    );
}

#[actix_web::test]
async fn a_stop_string_keeps_the_engines_usage_in_the_usage_chunk() {
    let fixture = Fixture::new(Script::Generate {
        text: "Hello world. More".into(),
        per_event: 1,
        finish: FinishReason::Length,
    });
    let app = fixture.app().await;
    for (uri, extra) in [
        ("/v1/completions", json!({"prompt": "x"})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}]}),
        ),
    ] {
        let mut request = json!({"stream": true, "stop": "world",
            "stream_options": {"include_usage": true}});
        request
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let body = test::call_and_read_body(&app, post(uri, request)).await;
        let (events, done) = sse_events(&body);
        assert!(done, "{uri}");
        let usage = &events.last().unwrap()["usage"];
        assert_eq!(
            usage["prompt_tokens_details"],
            json!({"cached_tokens": CACHED_TOKENS}),
            "{uri}: {usage}"
        );
        let generated = fixture.tokenizer.encode("Hello world", false).unwrap();
        assert_eq!(usage["completion_tokens"], generated.len(), "{uri}");
    }
}

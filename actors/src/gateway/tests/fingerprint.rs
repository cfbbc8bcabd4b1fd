//! `system_fingerprint` on every completion and chat response and chunk, and vLLM's
//! `stream_options.continuous_usage_stats`: the usage so far on every chunk.

use actix_web::test;
use serde_json::{json, Value};

use super::{call, json, post, sse_events, Fixture, Script};

/// A body for `uri` (completions or chat) with `extra` over it.
fn body(uri: &str, extra: Value) -> Value {
    let mut body = match uri {
        "/v1/completions" => json!({"prompt": "Say hi", "max_tokens": 8}),
        _ => json!({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}),
    };
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

const ENDPOINTS: [&str; 2] = ["/v1/completions", "/v1/chat/completions"];

#[actix_web::test]
async fn every_response_and_chunk_carries_the_servers_fingerprint() {
    let fixture = Fixture::new(Script::text("Hello world"));
    let app = fixture.app().await;
    let expected = fixture.state.system_fingerprint.clone();
    assert!(expected.starts_with("fp_"), "{expected}");
    for uri in ENDPOINTS {
        let (status, whole) = call(&app, post(uri, body(uri, json!({})))).await;
        assert_eq!(status, 200, "{uri}: {whole:?}");
        assert_eq!(json(&whole)["system_fingerprint"], expected, "{uri}");
        let stream = json!({"stream": true, "stream_options": {"include_usage": true}});
        let bytes = test::call_and_read_body(&app, post(uri, body(uri, stream))).await;
        let (chunks, done) = sse_events(&bytes);
        assert!(done && chunks.len() > 2, "{uri}: {chunks:?}");
        for chunk in &chunks {
            assert_eq!(chunk["system_fingerprint"], expected, "{uri}: {chunk}");
        }
    }
}

#[actix_web::test]
async fn continuous_usage_stats_put_the_usage_so_far_on_every_chunk() {
    let fixture = Fixture::new(Script::text("Hello world again"));
    let app = fixture.app().await;
    let completion = fixture
        .tokenizer
        .encode("Hello world again", false)
        .unwrap();
    for uri in ENDPOINTS {
        let options = json!({"include_usage": true, "continuous_usage_stats": true});
        let request = body(uri, json!({"stream": true, "stream_options": options}));
        let bytes = test::call_and_read_body(&app, post(uri, request)).await;
        let (chunks, done) = sse_events(&bytes);
        assert!(done && chunks.len() > 3, "{uri}: {chunks:?}");
        let usages: Vec<&Value> = chunks.iter().map(|chunk| &chunk["usage"]).collect();
        let prompt = usages[0]["prompt_tokens"].as_u64().unwrap();
        assert!(prompt > 0, "{uri}: {usages:?}");
        let mut before = 0;
        for usage in &usages {
            let done = usage["completion_tokens"]
                .as_u64()
                .unwrap_or_else(|| panic!("{uri}: {usage}"));
            assert_eq!(usage["prompt_tokens"], prompt, "{uri}: {usage}");
            assert_eq!(usage["total_tokens"], prompt + done, "{uri}: {usage}");
            assert!(done >= before, "{uri}: {usages:?}");
            before = done;
        }
        // Tokens arrive two an event: the usage grows along the stream, and the chunk
        // with the finish reason and the usage chunk after it hold the whole count.
        assert!(
            usages.iter().any(|u| u["completion_tokens"] == 2),
            "{uri}: {usages:?}"
        );
        let last = usages.len() - 1;
        for usage in &usages[last - 1..] {
            assert_eq!(usage["completion_tokens"], completion.len(), "{uri}");
        }
        assert_eq!(chunks[last]["choices"], json!([]), "{uri}");

        // Without include_usage, continuous_usage_stats adds nothing (as vLLM).
        let options = json!({"continuous_usage_stats": true});
        let request = body(uri, json!({"stream": true, "stream_options": options}));
        let bytes = test::call_and_read_body(&app, post(uri, request)).await;
        let (chunks, _) = sse_events(&bytes);
        assert!(
            chunks.iter().all(|c| c.get("usage").is_none()),
            "{uri}: {chunks:?}"
        );
    }
}

//! `/v1/completions` as whole responses, and the scheduler's refusals.

use std::time::Duration;

use peregrine_ops::sampling::SamplingParams;
use serde_json::{json, Value};

use super::{
    call, expect_error, json, post, sse_events, Fixture, Script, CACHED_TOKENS, MAX_MODEL_LEN,
    MODEL,
};
use crate::messages::{FinishReason, SubmitError};

#[actix_web::test]
async fn completion_whole_response_has_text_usage_and_defaults() {
    let fixture = Fixture::new(Script::text("Hello world"));
    let app = fixture.app().await;
    let request = json!({"model": MODEL, "prompt": "Say hi"});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200);
    let body = json(&body);
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"), "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], MODEL);
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], "Hello world");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["logprobs"], Value::Null);

    let prompt = fixture.tokenizer.encode("Say hi", true).unwrap();
    let completion = fixture
        .tokenizer
        .encode("Hello world", false)
        .unwrap()
        .len();
    let usage = json!({"prompt_tokens": prompt.len(), "completion_tokens": completion,
        "total_tokens": prompt.len() + completion,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}});
    assert_eq!(body["usage"], usage);
    let submitted = fixture.last_submitted();
    assert_eq!(submitted.prompt, prompt, "BOS added to a text prompt");
    assert_eq!(submitted.spec.max_tokens, MAX_MODEL_LEN - prompt.len());
    assert_eq!(submitted.spec.params, SamplingParams::default());
    assert_eq!(
        (
            submitted.spec.logprobs,
            submitted.spec.priority,
            submitted.spec.ignore_eos
        ),
        (None, 0, false)
    );
}

#[actix_web::test]
async fn completion_passes_request_fields_to_the_scheduler() {
    let fixture = Fixture::new(Script::text("ok"));
    fixture.configure(|config| config.default_sampling.top_k = 9);
    let app = fixture.app().await;
    let request = json!({"prompt": "x", "max_tokens": 5, "temperature": 0.5, "top_p": 0.75,
        "min_p": 0.125, "seed": 42, "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "repetition_penalty": 1.5, "stop_token_ids": [7], "ignore_eos": true, "priority": -3,
        "n": 1, "user": "someone", "logit_bias": {"12": -100, "3": 2.5}, "min_tokens": 2});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200, "{body:?}");
    let submitted = fixture.last_submitted();
    let expected = SamplingParams {
        temperature: 0.5,
        top_k: 9,
        top_p: 0.75,
        min_p: 0.125,
        repetition_penalty: 1.5,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        seed: Some(42),
        logit_bias: vec![(3, 2.5), (12, -100.0)],
        min_tokens: 2,
        // `ignore_eos`: the stop token only.
        min_tokens_stop_ids: vec![7],
    };
    assert_eq!(
        submitted.spec.params, expected,
        "top_k from the live default"
    );
    assert_eq!(submitted.spec.max_tokens, 5);
    assert_eq!(submitted.spec.stop_token_ids, [7]);
    assert!(submitted.spec.ignore_eos);
    assert_eq!(submitted.spec.priority, -3);
}

#[actix_web::test]
async fn completion_accepts_token_ids_and_lists_of_one() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let (status, _) = call(&app, post("/v1/completions", json!({"prompt": [5, 6, 7]}))).await;
    assert_eq!(status, 200);
    assert_eq!(fixture.last_submitted().prompt, [5, 6, 7]);
    let (status, _) = call(&app, post("/v1/completions", json!({"prompt": [[8, 9]]}))).await;
    assert_eq!(status, 200);
    assert_eq!(fixture.last_submitted().prompt, [8, 9]);
    let request = json!({"prompt": ["hi"], "add_special_tokens": false});
    let (status, _) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200);
    let hi = fixture.tokenizer.encode("hi", false).unwrap();
    assert_eq!(fixture.last_submitted().prompt, hi);

    let request = post("/v1/completions", json!({"prompt": [5, 999]}));
    let message = expect_error(
        call(&app, request).await,
        400,
        "invalid_request_error",
        Some("prompt"),
    );
    assert!(message.contains("999"), "{message}");
    let request = post("/v1/completions", json!({"prompt": []}));
    expect_error(
        call(&app, request).await,
        400,
        "invalid_request_error",
        Some("prompt"),
    );
}

#[actix_web::test]
async fn completion_stop_string_truncates_and_stops_the_request() {
    let mut fixture = Fixture::new(Script::text("Hello world. More text"));
    let app = fixture.app().await;
    let request = json!({"prompt": "Say hi", "stop": ["zzz", "world"]});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200);
    let body = json(&body);
    assert_eq!(body["choices"][0]["text"], "Hello ");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let generated = fixture
        .tokenizer
        .encode("Hello world", false)
        .unwrap()
        .len();
    assert_eq!(
        body["usage"]["completion_tokens"], generated,
        "counted up to the stop"
    );
    assert_eq!(
        body["usage"]["prompt_tokens_details"],
        json!({"cached_tokens": CACHED_TOKENS}),
        "the engine's cache report survives a stop string"
    );
    let stopped = tokio::time::timeout(Duration::from_secs(5), fixture.stops.recv()).await;
    assert_eq!(stopped.unwrap(), Some(fixture.last_submitted().id));
}

#[actix_web::test]
async fn eos_finish_is_stop() {
    let fixture = Fixture::new(Script::Generate {
        text: "done".into(),
        per_event: 1,
        finish: FinishReason::Stop,
    });
    let app = fixture.app().await;
    let (_, body) = call(&app, post("/v1/completions", json!({"prompt": "x"}))).await;
    let body = json(&body);
    assert_eq!(body["choices"][0]["text"], "done");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}

#[actix_web::test]
async fn completion_logprobs_have_openai_shape() {
    let fixture = Fixture::new(Script::text("Hello"));
    let app = fixture.app().await;
    let request = json!({"prompt": "x", "logprobs": 2});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200);
    let body = json(&body);
    let logprobs = &body["choices"][0]["logprobs"];
    let ids = fixture.tokenizer.encode("Hello", false).unwrap();
    let tokens: Vec<&str> = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|token| token.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), ids.len());
    assert_eq!(tokens.concat(), "Hello");
    assert_eq!(logprobs["token_logprobs"][0], -0.25);
    let top = logprobs["top_logprobs"][0].as_object().unwrap();
    assert!(top.len() == 2 || top.len() == 3, "{top:?}");
    assert_eq!(top[tokens[0]], -0.25);
    assert_eq!(logprobs["text_offset"][0], 0);
    assert_eq!(logprobs["text_offset"][1], tokens[0].len());
    assert_eq!(fixture.last_submitted().spec.logprobs, Some(2));

    let request = post("/v1/completions", json!({"prompt": "x", "logprobs": 21}));
    expect_error(
        call(&app, request).await,
        400,
        "invalid_request_error",
        Some("logprobs"),
    );
}

#[actix_web::test]
async fn scheduler_refusals_keep_their_status() {
    let too_long = SubmitError::TooLong {
        prompt: 3,
        max_tokens: 70,
        max_model_len: 72,
    };
    let cases = [
        (
            SubmitError::QueueFull { limit: 4 },
            429,
            "rate_limit_error",
            None,
        ),
        (too_long, 400, "invalid_request_error", Some("max_tokens")),
        (SubmitError::ShuttingDown, 503, "server_error", None),
    ];
    for (err, status, kind, param) in cases {
        let fixture = Fixture::new(Script::Refuse(err.clone()));
        let app = fixture.app().await;
        let request = post("/v1/completions", json!({"prompt": "x", "max_tokens": 4}));
        let message = expect_error(call(&app, request).await, status, kind, param);
        assert_eq!(message, err.to_string());
    }
}

#[actix_web::test]
async fn draining_refuses_new_generations() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    fixture.state.stop_accepting();
    for uri in ["/v1/completions", "/v1/chat/completions"] {
        let request = json!({"prompt": "x", "messages": [{"role": "user", "content": "x"}]});
        let message = expect_error(
            call(&app, post(uri, request)).await,
            503,
            "server_error",
            None,
        );
        assert!(message.contains("shutting down"), "{message}");
    }
    let health = actix_web::test::TestRequest::get()
        .uri("/health")
        .to_request();
    assert_eq!(call(&app, health).await.0, 200);
}

#[actix_web::test]
async fn speculation_counts_are_in_usage_only_when_asked_for() {
    let fixture = Fixture::new(Script::text("Hello world"));
    let app = fixture.app().await;
    let asked = json!({"prompt": "Say hi", "return_spec_decode_stats": true});
    let (status, body) = call(&app, post("/v1/completions", asked)).await;
    assert_eq!(status, 200);
    let details = json!({"num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 4});
    assert_eq!(json(&body)["usage"]["spec_decode_details"], details);
    let plain = json!({"prompt": "Say hi"});
    let (_, body) = call(&app, post("/v1/completions", plain)).await;
    assert!(json(&body)["usage"].get("spec_decode_details").is_none());
}

#[actix_web::test]
async fn echo_puts_each_prompt_before_its_choices() {
    let fixture = Fixture::new(Script::text(" and more"));
    let app = fixture.app().await;
    let request = json!({"prompt": ["Once upon", "A time"], "echo": true, "n": 2});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200);
    let texts: Vec<String> = json(&body)["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        texts,
        [
            "Once upon and more",
            "Once upon and more",
            "A time and more",
            "A time and more"
        ]
    );
    // Streamed: the echo opens each choice's first chunk; token ids are decoded.
    let ids = fixture.tokenizer.encode("Hi there", false).unwrap();
    let request = json!({"prompt": ids, "echo": true, "stream": true});
    let (_, body) = call(&app, post("/v1/completions", request)).await;
    let (events, done) = sse_events(&body);
    assert!(done);
    let first = events[0]["choices"][0]["text"].as_str().unwrap();
    assert!(first.starts_with("Hi there"), "{first:?}");
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "Hi there and more");
    // Not on chat.
    let request = json!({"messages": [{"role": "user", "content": "x"}], "echo": true});
    let message = expect_error(
        call(&app, post("/v1/chat/completions", request)).await,
        400,
        "invalid_request_error",
        Some("echo"),
    );
    assert!(message.contains("echo"), "{message}");
}

//! `/v1/chat/completions` as whole responses.

use serde_json::json;

use super::{call, expect_error, json, post, Fixture, Script, CACHED_TOKENS, MODEL};

#[actix_web::test]
async fn chat_renders_the_template_and_answers() {
    let fixture = Fixture::new(Script::text("Hi there"));
    let app = fixture.app().await;
    let request = json!({"model": MODEL, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]});
    let (status, body) = call(&app, post("/v1/chat/completions", request)).await;
    assert_eq!(status, 200);
    let body = json(&body);
    assert!(
        body["id"].as_str().unwrap().starts_with("chatcmpl-"),
        "{body}"
    );
    assert_eq!(body["object"], "chat.completion");
    let choice = &body["choices"][0];
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": "Hi there"})
    );
    assert_eq!(choice["finish_reason"], "length");
    let completion = fixture.tokenizer.encode("Hi there", false).unwrap().len();
    assert_eq!(body["usage"]["completion_tokens"], completion);

    let submitted = fixture.last_submitted();
    let rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n\
        <|im_start|>assistant\n";
    assert_eq!(
        fixture.tokenizer.decode(&submitted.prompt, false).unwrap(),
        rendered
    );
    assert_eq!(
        submitted.prompt,
        fixture.tokenizer.encode(rendered, false).unwrap()
    );
    assert_eq!(body["usage"]["prompt_tokens"], submitted.prompt.len());
}

#[actix_web::test]
async fn chat_content_parts_are_joined() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let parts = json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]);
    let request = json!({"messages": [{"role": "user", "content": parts}],
        "add_generation_prompt": false});
    let (status, _) = call(&app, post("/v1/chat/completions", request)).await;
    assert_eq!(status, 200);
    let prompt = fixture.last_submitted().prompt;
    let text = fixture.tokenizer.decode(&prompt, false).unwrap();
    assert_eq!(text, "<|im_start|>user\na\nb<|im_end|>\n");

    let image = json!([{"type": "image_url", "image_url": {"url": "http://x"}}]);
    let request = json!({"messages": [{"role": "user", "content": image}]});
    let param = Some("messages[0].content[0].type");
    let response = call(&app, post("/v1/chat/completions", request)).await;
    let message = expect_error(response, 400, "invalid_request_error", param);
    assert!(message.contains("image_url"), "{message}");
    let request = json!({"messages": []});
    let response = call(&app, post("/v1/chat/completions", request)).await;
    expect_error(response, 400, "invalid_request_error", Some("messages"));
}

#[actix_web::test]
async fn chat_logprobs_have_openai_shape() {
    let fixture = Fixture::new(Script::text("Hi"));
    let app = fixture.app().await;
    let request = json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
        "top_logprobs": 2});
    let (status, body) = call(&app, post("/v1/chat/completions", request)).await;
    assert_eq!(status, 200);
    let body = json(&body);
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 2, "{body}");
    assert_eq!(content[0]["token"], "H");
    assert_eq!(content[0]["bytes"], json!([72]));
    assert_eq!(content[0]["logprob"], -0.25);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(fixture.last_submitted().spec.logprobs, Some(2));

    let request = json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2});
    let response = call(&app, post("/v1/chat/completions", request)).await;
    expect_error(response, 400, "invalid_request_error", Some("top_logprobs"));
}

#[actix_web::test]
async fn max_completion_tokens_wins_over_max_tokens() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let messages = json!([{"role": "user", "content": "x"}]);
    let request = json!({"messages": messages, "max_tokens": 5, "max_completion_tokens": 7});
    let (status, _) = call(&app, post("/v1/chat/completions", request)).await;
    assert_eq!(status, 200);
    assert_eq!(fixture.last_submitted().spec.max_tokens, 7);
    let request = json!({"messages": messages, "max_completion_tokens": -2});
    let response = call(&app, post("/v1/chat/completions", request)).await;
    let param = Some("max_completion_tokens");
    let message = expect_error(response, 400, "invalid_request_error", param);
    assert!(message.contains("-2"), "{message}");
}

#[actix_web::test]
async fn chat_without_a_template_is_refused() {
    let fixture = Fixture::build(Script::text("ok"), None, None);
    let app = fixture.app().await;
    let request = json!({"messages": [{"role": "user", "content": "x"}]});
    let response = call(&app, post("/v1/chat/completions", request)).await;
    let message = expect_error(response, 400, "invalid_request_error", None);
    assert!(message.contains("no chat template"), "{message}");
}

#[actix_web::test]
async fn a_stop_string_keeps_the_engines_usage_details() {
    let fixture = Fixture::new(Script::text("Hello world. More text"));
    let app = fixture.app().await;
    let request = json!({"messages": [{"role": "user", "content": "x"}], "stop": "world",
        "return_spec_decode_stats": true});
    let (status, body) = call(&app, post("/v1/chat/completions", request)).await;
    assert_eq!(status, 200);
    let body = json(&body);
    assert_eq!(body["choices"][0]["message"]["content"], "Hello ");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let usage = &body["usage"];
    assert_eq!(
        usage["prompt_tokens_details"],
        json!({"cached_tokens": CACHED_TOKENS})
    );
    assert_eq!(usage["spec_decode_details"]["num_drafts"], 2, "{usage}");
    let generated = fixture.tokenizer.encode("Hello world", false).unwrap();
    assert_eq!(usage["completion_tokens"], generated.len());
}

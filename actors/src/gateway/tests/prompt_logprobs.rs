//! The prompt's logprobs: vLLM's `prompt_logprobs` on both endpoints (on each completion
//! choice, beside the chat choices), and OpenAI's `echo` with `logprobs` on completions,
//! whose logprobs cover the prompt's tokens before the output's, `max_tokens: 0` scoring a
//! prompt alone. The fake scheduler scores prompt token `p` `-p / 10`, ranked `p`, after
//! alternatives `id + 1`, `id + 2`, ... ([`prompt_score`]).

use serde_json::{json, Value};

use super::{
    call, expect_error, json, post, prompt_score, sse_events, Fixture, Script, CACHED_TOKENS,
};

/// `value` as the gateway writes it (an f32's shortest digits).
fn number(value: f32) -> Value {
    serde_json::from_str(&serde_json::to_string(&value).unwrap()).unwrap()
}

/// The text of token `id` in the test tokenizer, special tokens kept.
fn text_of(fixture: &Fixture, id: u32) -> String {
    fixture.tokenizer.decode(&[id], false).unwrap()
}

/// What `prompt_logprobs` must say of `prompt` with `top` alternatives each.
fn expected_prompt_logprobs(fixture: &Fixture, prompt: &[u32], top: usize) -> Value {
    let mut positions = vec![Value::Null];
    for (position, &id) in prompt.iter().enumerate().skip(1) {
        let score = prompt_score(id, position, top);
        let mut entries = serde_json::Map::new();
        let own = json!({"logprob": number(score.logprob), "rank": position,
            "decoded_token": text_of(fixture, id)});
        entries.insert(id.to_string(), own);
        for (at, (alternative, logprob)) in score.top.iter().enumerate() {
            let entry = json!({"logprob": number(*logprob), "rank": at + 1,
                "decoded_token": text_of(fixture, *alternative)});
            entries.insert(alternative.to_string(), entry);
        }
        positions.push(Value::Object(entries));
    }
    Value::Array(positions)
}

#[actix_web::test]
async fn prompt_logprobs_are_on_each_completion_choice_and_beside_the_chat_choices() {
    let fixture = Fixture::new(Script::text("Hello"));
    let app = fixture.app().await;
    let request = json!({"prompt": "Say hi", "prompt_logprobs": 2, "n": 2});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200, "{body:?}");
    let body = json(&body);
    let submitted = fixture.last_submitted();
    assert_eq!(submitted.spec.prompt_logprobs, Some(2));
    let want = expected_prompt_logprobs(&fixture, &submitted.prompt, 2);
    for choice in body["choices"].as_array().unwrap() {
        assert_eq!(choice["prompt_logprobs"], want, "{body}");
        assert_eq!(choice["text"], "Hello");
        assert_eq!(choice["logprobs"], Value::Null);
    }
    assert!(body.get("prompt_logprobs").is_none(), "{body}");

    // Chat: once, at the top level; 0 alternatives gives each prompt token alone.
    let request = json!({"messages": [{"role": "user", "content": "Hi"}],
        "prompt_logprobs": 0});
    let (status, body) = call(&app, post("/v1/chat/completions", request)).await;
    assert_eq!(status, 200, "{body:?}");
    let body = json(&body);
    let submitted = fixture.last_submitted();
    assert_eq!(submitted.spec.prompt_logprobs, Some(0));
    let want = expected_prompt_logprobs(&fixture, &submitted.prompt, 0);
    assert_eq!(body["prompt_logprobs"], want);
    assert!(
        body["choices"][0].get("prompt_logprobs").is_none(),
        "{body}"
    );
    assert_eq!(body["choices"][0]["message"]["content"], "Hello");

    // A prompt of one token has nothing scored: its one entry is null.
    let request = json!({"prompt": [5], "prompt_logprobs": 1, "max_tokens": 1});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200, "{body:?}");
    assert_eq!(json(&body)["choices"][0]["prompt_logprobs"], json!([null]));

    // Without the field: none asked of the engine, none in the response.
    let request = json!({"prompt": "Say hi"});
    let (_, body) = call(&app, post("/v1/completions", request)).await;
    assert!(json(&body)["choices"][0].get("prompt_logprobs").is_none());
    assert_eq!(fixture.last_submitted().spec.prompt_logprobs, None);
}

#[actix_web::test]
async fn prompt_logprobs_out_of_range_or_streamed_are_refused_on_both_endpoints() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let messages = json!([{"role": "user", "content": "x"}]);
    for uri in ["/v1/completions", "/v1/chat/completions"] {
        for (extra, needle) in [
            (json!({"prompt_logprobs": 21}), "21"),
            (json!({"prompt_logprobs": -1}), "-1"),
            (json!({"prompt_logprobs": 0, "stream": true}), "stream"),
        ] {
            let mut request = json!({"prompt": "x", "messages": messages});
            for (field, value) in extra.as_object().unwrap() {
                request[field] = value.clone();
            }
            let response = call(&app, post(uri, request.clone())).await;
            let message = expect_error(
                response,
                400,
                "invalid_request_error",
                Some("prompt_logprobs"),
            );
            assert!(message.contains(needle), "{uri} {request}: {message}");
        }
        let request = json!({"prompt": "x", "messages": messages, "prompt_logprobs": "2"});
        let (status, _) = call(&app, post(uri, request)).await;
        assert_eq!(status, 400, "{uri}: not a number");
    }
    assert!(fixture.submitted.lock().unwrap().is_empty());
}

#[actix_web::test]
async fn echo_with_logprobs_covers_the_prompt_then_the_output() {
    let fixture = Fixture::new(Script::text("Hello"));
    let app = fixture.app().await;
    let request = json!({"prompt": "Say hi", "echo": true, "logprobs": 1});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200, "{body:?}");
    let body = json(&body);
    let submitted = fixture.last_submitted();
    let prompt = submitted.prompt.clone();
    assert_eq!(
        submitted.spec.prompt_logprobs,
        Some(1),
        "the echo asks for scores"
    );
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], "Say hiHello");
    assert!(
        choice.get("prompt_logprobs").is_none(),
        "not asked for: {body}"
    );
    let logprobs = &choice["logprobs"];
    let output = fixture.tokenizer.encode("Hello", false).unwrap();
    let texts: Vec<String> = prompt
        .iter()
        .chain(&output)
        .map(|&id| text_of(&fixture, id))
        .collect();
    assert_eq!(logprobs["tokens"], json!(texts));
    // The first prompt token follows nothing: null, as OpenAI's.
    let token_logprobs = logprobs["token_logprobs"].as_array().unwrap();
    assert_eq!(token_logprobs.len(), prompt.len() + output.len());
    assert_eq!(token_logprobs[0], Value::Null);
    assert_eq!(logprobs["top_logprobs"][0], Value::Null);
    for position in 1..prompt.len() {
        let score = prompt_score(prompt[position], position, 1);
        assert_eq!(token_logprobs[position], number(score.logprob));
        // The one most likely alternative, then the token itself.
        let top = &logprobs["top_logprobs"][position];
        let mut want = serde_json::Map::new();
        want.insert(text_of(&fixture, score.top[0].0), number(score.top[0].1));
        want.insert(text_of(&fixture, prompt[position]), number(score.logprob));
        assert_eq!(top, &Value::Object(want), "position {position}");
    }
    // The output's logprobs follow (the fake's -0.25 each).
    for logprob in &token_logprobs[prompt.len()..] {
        assert_eq!(logprob, &json!(-0.25));
    }
    // Offsets run over every token's text, from 0.
    let mut offset = 0;
    for (at, text) in texts.iter().enumerate() {
        assert_eq!(logprobs["text_offset"][at], offset, "token {at}");
        offset += text.chars().count();
    }
}

#[actix_web::test]
async fn max_tokens_zero_with_echo_scores_the_prompt_alone() {
    let fixture = Fixture::new(Script::text("Hello"));
    let app = fixture.app().await;
    let prompt = fixture.tokenizer.encode("Say hi", false).unwrap();
    let request = json!({"prompt": prompt, "echo": true, "logprobs": 0, "max_tokens": 0,
        "prompt_logprobs": 2});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200, "{body:?}");
    let body = json(&body);
    let submitted = fixture.last_submitted();
    assert_eq!(submitted.spec.max_tokens, 0);
    assert_eq!(submitted.spec.prompt_logprobs, Some(2), "the larger count");
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], "Say hi");
    assert_eq!(choice["finish_reason"], "length");
    let logprobs = &choice["logprobs"];
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), prompt.len());
    assert_eq!(logprobs["token_logprobs"][0], Value::Null);
    // `logprobs: 0`: each prompt token alone.
    let position = prompt.len() - 1;
    let mut alone = serde_json::Map::new();
    let score = prompt_score(prompt[position], position, 0);
    alone.insert(text_of(&fixture, prompt[position]), number(score.logprob));
    assert_eq!(logprobs["top_logprobs"][position], Value::Object(alone));
    assert_eq!(
        choice["prompt_logprobs"],
        expected_prompt_logprobs(&fixture, &prompt, 2)
    );
    let usage = json!({"prompt_tokens": prompt.len(), "completion_tokens": 0,
        "total_tokens": prompt.len(),
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}});
    assert_eq!(body["usage"], usage);

    // Without `echo`, 0 tokens is no request.
    let request = json!({"prompt": "x", "max_tokens": 0, "logprobs": 1});
    let message = expect_error(
        call(&app, post("/v1/completions", request)).await,
        400,
        "invalid_request_error",
        Some("max_tokens"),
    );
    assert!(message.contains("at least 1"), "{message}");
}

#[actix_web::test]
async fn a_streamed_echo_with_logprobs_opens_each_choice_with_the_prompt() {
    let fixture = Fixture::new(Script::text("Hello world"));
    let app = fixture.app().await;
    let prompt = fixture.tokenizer.encode("Hi there", false).unwrap();
    let request = json!({"prompt": prompt, "echo": true, "logprobs": 1, "stream": true,
        "n": 2});
    let (status, body) = call(&app, post("/v1/completions", request)).await;
    assert_eq!(status, 200);
    let (events, done) = sse_events(&body);
    assert!(done);
    let output = fixture.tokenizer.encode("Hello world", false).unwrap();
    for index in 0..2 {
        let chunks: Vec<&Value> = events
            .iter()
            .map(|event| &event["choices"][0])
            .filter(|choice| choice["index"] == index)
            .collect();
        let first = &chunks[0];
        assert!(first["text"].as_str().unwrap().starts_with("Hi there"));
        assert_eq!(first["logprobs"]["token_logprobs"][0], Value::Null);
        let tokens: Vec<&Value> = chunks
            .iter()
            .flat_map(|chunk| chunk["logprobs"]["tokens"].as_array().unwrap())
            .collect();
        assert_eq!(tokens.len(), prompt.len() + output.len(), "choice {index}");
        let scored = chunks
            .iter()
            .flat_map(|chunk| chunk["logprobs"]["token_logprobs"].as_array().unwrap())
            .filter(|logprob| logprob.is_null())
            .count();
        assert_eq!(scored, 1, "only the first prompt token is unscored");
        // Offsets go on from the prompt's tokens into the output's.
        let offsets: Vec<u64> = chunks
            .iter()
            .flat_map(|chunk| chunk["logprobs"]["text_offset"].as_array().unwrap())
            .map(|offset| offset.as_u64().unwrap())
            .collect();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    }
}

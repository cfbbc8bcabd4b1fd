//! vLLM's `return_token_ids`: the prompt's and the generated ids in whole responses and
//! stream chunks of both endpoints, the ending token kept, and nothing when not asked.

use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceResponse};
use serde_json::{json, Value};

use super::{call, expect_error, json, post, sse_events, Fixture, Script};
use crate::messages::FinishReason;

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

/// Each endpoint with a body that asks it for a generation.
fn endpoints() -> [(&'static str, Value); 2] {
    [
        (COMPLETIONS, json!({"prompt": "Say hi"})),
        (
            CHAT,
            json!({"messages": [{"role": "user", "content": "Hello"}]}),
        ),
    ]
}

/// `base` with the fields of `extra` added.
fn with(base: &Value, extra: Value) -> Value {
    let mut body = base.clone();
    let fields = body.as_object_mut().unwrap();
    fields.extend(extra.as_object().unwrap().clone());
    body
}

/// A JSON list of token ids.
fn ids(value: &Value) -> Vec<u32> {
    let list = value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"));
    list.iter().map(|id| id.as_u64().unwrap() as u32).collect()
}

/// Whether `key` is a field anywhere in `value`.
fn mentions(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(fields) => fields
            .iter()
            .any(|(name, field)| name == key || mentions(field, key)),
        Value::Array(items) => items.iter().any(|item| mentions(item, key)),
        _ => false,
    }
}

/// The answer to `body` at `uri`, which must succeed: the whole response, or the stream's
/// chunks (which must end with `[DONE]`).
async fn answer<S, B>(app: &S, uri: &str, body: Value) -> Vec<Value>
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let streamed = body["stream"] == true;
    let (status, bytes) = call(app, post(uri, body)).await;
    assert_eq!(status, 200, "{uri}: {bytes:?}");
    if !streamed {
        return vec![json(&bytes)];
    }
    let (chunks, done) = sse_events(&bytes);
    assert!(done, "{uri}: {chunks:?}");
    chunks
}

/// The text of a whole response's choice.
fn text(uri: &str, choice: &Value) -> String {
    let text = if uri == CHAT {
        &choice["message"]["content"]
    } else {
        &choice["text"]
    };
    text.as_str().unwrap().to_owned()
}

/// The generated ids of a stream's chunks, in order (the usage chunk has no choice).
fn streamed_ids(chunks: &[Value]) -> Vec<u32> {
    let choices = chunks.iter().filter_map(|chunk| chunk["choices"].get(0));
    let lists = choices.filter_map(|choice| choice.get("token_ids"));
    lists.flat_map(ids).collect()
}

#[actix_web::test]
async fn completion_ids_are_the_outputs_and_the_prompts() {
    let fixture = Fixture::new(Script::text("Hello world"));
    let app = fixture.app().await;
    let request = json!({"prompt": "Say hi", "return_token_ids": true});
    let body = answer(&app, COMPLETIONS, request).await.remove(0);
    let choice = &body["choices"][0];
    let generated = ids(&choice["token_ids"]);
    assert_eq!(
        generated,
        fixture.tokenizer.encode("Hello world", false).unwrap()
    );
    assert_eq!(body["usage"]["completion_tokens"], generated.len());
    let decoded = fixture.tokenizer.decode(&generated, true).unwrap();
    assert_eq!(choice["text"], decoded);
    let prompt = ids(&choice["prompt_token_ids"]);
    assert_eq!(prompt, fixture.tokenizer.encode("Say hi", true).unwrap());
    assert_eq!(prompt, fixture.last_submitted().prompt);
    assert_eq!(body["usage"]["prompt_tokens"], prompt.len());
    assert!(
        body.get("prompt_token_ids").is_none(),
        "on the choice: {body}"
    );
}

#[actix_web::test]
async fn chat_ids_are_the_replys_and_the_rendered_prompts() {
    let fixture = Fixture::new(Script::text("Hi there"));
    let app = fixture.app().await;
    let request = with(&endpoints()[1].1, json!({"return_token_ids": true}));
    let body = answer(&app, CHAT, request).await.remove(0);
    let choice = &body["choices"][0];
    let generated = ids(&choice["token_ids"]);
    assert_eq!(
        generated,
        fixture.tokenizer.encode("Hi there", false).unwrap()
    );
    assert_eq!(body["usage"]["completion_tokens"], generated.len());
    let rendered = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n";
    let prompt = ids(&body["prompt_token_ids"]);
    assert_eq!(prompt, fixture.tokenizer.encode(rendered, false).unwrap());
    assert_eq!(prompt, fixture.last_submitted().prompt);
    assert_eq!(body["usage"]["prompt_tokens"], prompt.len());
    assert!(
        choice.get("prompt_token_ids").is_none(),
        "top-level: {body}"
    );
    assert!(choice["message"].get("token_ids").is_none(), "{body}");
}

#[actix_web::test]
async fn streamed_ids_are_the_whole_ids_with_the_eos_token_kept() {
    let fixture = Fixture::new(Script::Generate {
        text: "Hello world<|eos|>".into(),
        per_event: 3,
        finish: FinishReason::Stop,
    });
    let app = fixture.app().await;
    let eos = fixture.tokenizer.eos_token_ids()[0];
    let expected = fixture
        .tokenizer
        .encode("Hello world<|eos|>", false)
        .unwrap();
    assert_eq!(
        expected.last(),
        Some(&eos),
        "the engine's last token is EOS"
    );
    for (uri, base) in endpoints() {
        let asked = with(&base, json!({"temperature": 0, "return_token_ids": true}));
        let whole = answer(&app, uri, asked.clone()).await.remove(0);
        let choice = &whole["choices"][0];
        assert_eq!(
            text(uri, choice),
            "Hello world",
            "{uri}: the text skips EOS"
        );
        assert_eq!(
            ids(&choice["token_ids"]),
            expected,
            "{uri}: the ids keep it"
        );
        assert_eq!(whole["usage"]["completion_tokens"], expected.len(), "{uri}");

        let stream = json!({"stream": true, "stream_options": {"include_usage": true}});
        let chunks = answer(&app, uri, with(&asked, stream)).await;
        assert_eq!(streamed_ids(&chunks), expected, "{uri}: {chunks:?}");
        let (usage, chunks) = chunks.split_last().unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], expected.len(), "{uri}");
        assert!(!mentions(usage, "prompt_token_ids"), "{uri}: {usage}");
        let (first, rest) = chunks.split_first().unwrap();
        let (first_prompt, whole_prompt) = if uri == CHAT {
            (&first["prompt_token_ids"], &whole["prompt_token_ids"])
        } else {
            (
                &first["choices"][0]["prompt_token_ids"],
                &choice["prompt_token_ids"],
            )
        };
        assert_eq!(ids(first_prompt), ids(whole_prompt), "{uri}: {first}");
        assert!(
            rest.iter()
                .all(|chunk| !mentions(chunk, "prompt_token_ids")),
            "{uri}: only the first chunk has the prompt's ids: {rest:?}"
        );
        let with_ids = if uri == CHAT { rest } else { chunks };
        assert!(
            with_ids
                .iter()
                .all(|chunk| chunk["choices"][0]["token_ids"].is_array()),
            "{uri}: every output chunk has its ids: {chunks:?}"
        );
    }
}

#[actix_web::test]
async fn ids_end_at_the_token_that_completed_a_stop_string() {
    let fixture = Fixture::new(Script::Generate {
        text: "Hello world. More text".into(),
        per_event: 4,
        finish: FinishReason::Length,
    });
    let app = fixture.app().await;
    let expected = fixture.tokenizer.encode("Hello world", false).unwrap();
    for (uri, base) in endpoints() {
        let asked = with(&base, json!({"stop": "world", "return_token_ids": true}));
        let whole = answer(&app, uri, asked.clone()).await.remove(0);
        assert_eq!(text(uri, &whole["choices"][0]), "Hello ", "{uri}");
        assert_eq!(ids(&whole["choices"][0]["token_ids"]), expected, "{uri}");
        assert_eq!(whole["usage"]["completion_tokens"], expected.len(), "{uri}");
        let chunks = answer(&app, uri, with(&asked, json!({"stream": true}))).await;
        assert_eq!(streamed_ids(&chunks), expected, "{uri}: {chunks:?}");
    }
}

#[actix_web::test]
async fn no_ids_unless_asked() {
    let fixture = Fixture::new(Script::text("Hello world"));
    let app = fixture.app().await;
    for (uri, base) in endpoints() {
        for asked in [
            json!({}),
            json!({"return_token_ids": false}),
            json!({"return_token_ids": null}),
        ] {
            for stream in [false, true] {
                let body = with(&with(&base, asked.clone()), json!({"stream": stream}));
                for answer in answer(&app, uri, body).await {
                    assert!(!mentions(&answer, "token_ids"), "{uri} {asked}: {answer}");
                    assert!(!mentions(&answer, "prompt_token_ids"), "{uri}: {answer}");
                }
            }
        }
    }
}

#[actix_web::test]
async fn a_return_token_ids_that_is_not_a_boolean_is_named() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    for (uri, base) in endpoints() {
        for value in [json!("true"), json!(1)] {
            let request = post(uri, with(&base, json!({"return_token_ids": value})));
            let param = Some("return_token_ids");
            let message = expect_error(
                call(&app, request).await,
                400,
                "invalid_request_error",
                param,
            );
            assert!(message.contains("invalid type"), "{uri}: {message}");
        }
    }
    assert!(
        fixture.submitted.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
}

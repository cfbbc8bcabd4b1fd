//! `n` > 1 on both endpoints and lists of prompts on completions, whole and streamed: one
//! choice per request the engine runs, each with the seed plus its index, the later ones
//! submitted once the first has its first tokens; choices in order with their index (each
//! prompt's `n` in a row), usage summed with each prompt counted once.

use serde_json::{json, Value};

use super::{call, expect_error, json, post, sse_events, Fixture, Script, CACHED_TOKENS};

/// The completion tokens of `text` in the test tokenizer.
fn tokens(fixture: &Fixture, text: &str) -> usize {
    fixture.tokenizer.encode(text, false).unwrap().len()
}

#[actix_web::test]
async fn each_choice_is_a_request_seeded_by_its_index_and_usage_counts_the_prompt_once() {
    for (uri, body) in [
        ("/v1/completions", json!({"prompt": "Say hi"})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Say hi"}]}),
        ),
    ] {
        let fixture = Fixture::new(Script::text("Hello world"));
        let app = fixture.app().await;
        let mut request = body.clone();
        request["n"] = json!(3);
        request["seed"] = json!(-1);
        request["temperature"] = json!(0.8);
        let (status, response) = call(&app, post(uri, request)).await;
        assert_eq!(status, 200, "{uri}");
        let response = json(&response);
        let choices = response["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3, "{uri}: {response}");
        for (i, choice) in choices.iter().enumerate() {
            assert_eq!(choice["index"], i, "{uri}");
            let text = match uri {
                "/v1/completions" => &choice["text"],
                _ => &choice["message"]["content"],
            };
            assert_eq!(text, "Hello world", "{uri}");
            assert_eq!(choice["finish_reason"], "length", "{uri}");
        }
        let submitted = fixture.submitted.lock().unwrap().clone();
        assert_eq!(submitted.len(), 3, "{uri}");
        let seeds: Vec<Option<u64>> = submitted.iter().map(|s| s.spec.params.seed).collect();
        assert_eq!(
            seeds,
            [Some(u64::MAX), Some(0), Some(1)],
            "{uri}: seed + index"
        );
        let ids: std::collections::HashSet<_> = submitted.iter().map(|s| s.id).collect();
        assert_eq!(ids.len(), 3, "{uri}: one engine request per choice");
        assert!(submitted.iter().all(|s| s.prompt == submitted[0].prompt));
        let prompt = submitted[0].prompt.len();
        let completion = 3 * tokens(&fixture, "Hello world");
        let usage = json!({"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}});
        assert_eq!(response["usage"], usage, "{uri}");
    }
}

#[actix_web::test]
async fn a_request_without_a_seed_leaves_every_choice_unseeded() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    let request = json!({"prompt": "x", "n": 2});
    assert_eq!(call(&app, post("/v1/completions", request)).await.0, 200);
    let submitted = fixture.submitted.lock().unwrap().clone();
    assert_eq!(submitted.len(), 2);
    assert!(submitted.iter().all(|s| s.spec.params.seed.is_none()));
}

/// The text each choice index streamed, the finish reasons by index, the events' usage.
fn streamed(events: &[Value], field: &str) -> (Vec<String>, Vec<Value>, Vec<Value>) {
    let mut texts = vec![String::new(); 2];
    let mut reasons = vec![Value::Null; 2];
    let mut usages = Vec::new();
    for event in events {
        if !event["usage"].is_null() {
            usages.push(event["usage"].clone());
        }
        for choice in event["choices"].as_array().unwrap() {
            let index = choice["index"].as_u64().unwrap() as usize;
            let text = match field {
                "text" => &choice["text"],
                _ => &choice["delta"]["content"],
            };
            texts[index].push_str(text.as_str().unwrap_or(""));
            if !choice["finish_reason"].is_null() {
                assert!(reasons[index].is_null(), "choice {index} finished twice");
                reasons[index] = choice["finish_reason"].clone();
            }
        }
    }
    (texts, reasons, usages)
}

#[actix_web::test]
async fn streamed_choices_carry_their_index_and_end_with_the_summed_usage() {
    for (uri, body, field) in [
        ("/v1/completions", json!({"prompt": "Say hi"}), "text"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Say hi"}]}),
            "content",
        ),
    ] {
        let fixture = Fixture::new(Script::text("Hello there world"));
        let app = fixture.app().await;
        let mut request = body.clone();
        request["n"] = json!(2);
        request["stream"] = json!(true);
        request["stream_options"] = json!({"include_usage": true});
        let (status, response) = call(&app, post(uri, request)).await;
        assert_eq!(status, 200, "{uri}");
        let (events, done) = sse_events(&response);
        assert!(done, "{uri}");
        let (texts, reasons, usages) = streamed(&events, field);
        assert_eq!(texts, ["Hello there world"; 2], "{uri}");
        assert_eq!(reasons, [json!("length"), json!("length")], "{uri}");
        let last = events.last().unwrap();
        assert_eq!(last["choices"], json!([]), "{uri}: the usage comes last");
        assert_eq!(usages.len(), 1, "{uri}: one usage event");
        let prompt = fixture.submitted.lock().unwrap()[0].prompt.len();
        let completion = 2 * tokens(&fixture, "Hello there world");
        assert_eq!(usages[0]["prompt_tokens"], prompt, "{uri}");
        assert_eq!(usages[0]["completion_tokens"], completion, "{uri}");
        if field == "content" {
            // Chat opens each choice with the assistant's role.
            let roles: Vec<&Value> = events
                .iter()
                .filter(|e| e["choices"][0]["delta"]["role"] == "assistant")
                .map(|e| &e["choices"][0]["index"])
                .collect();
            assert_eq!(roles, [&json!(0), &json!(1)], "{uri}");
        }
    }
}

#[actix_web::test]
async fn continuous_usage_sums_the_choices_so_far() {
    let fixture = Fixture::new(Script::text("a b c d"));
    let app = fixture.app().await;
    let request = json!({"prompt": "x", "n": 2, "stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true}});
    let (_, response) = call(&app, post("/v1/completions", request)).await;
    let (events, _) = sse_events(&response);
    let completions: Vec<u64> = events
        .iter()
        .map(|e| e["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert!(
        completions.windows(2).all(|w| w[0] <= w[1]),
        "{completions:?}"
    );
    let total = 2 * tokens(&fixture, "a b c d") as u64;
    assert_eq!(*completions.last().unwrap(), total);
}

#[actix_web::test]
async fn a_list_of_prompts_gets_n_choices_each_in_prompt_order() {
    let fixture = Fixture::new(Script::text("done"));
    let app = fixture.app().await;
    let first = fixture.tokenizer.encode("first one", false).unwrap();
    let request = json!({"prompt": [first, [7, 8, 9]], "n": 2, "seed": 5,
        "return_token_ids": true});
    let (status, response) = call(&app, post("/v1/completions", request)).await;
    let response = json(&response);
    assert_eq!(status, 200, "{response}");
    let choices = response["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        let prompt = if i < 2 {
            json!(first)
        } else {
            json!([7, 8, 9])
        };
        assert_eq!(choice["prompt_token_ids"], prompt, "choice {i}");
    }
    let submitted = fixture.submitted.lock().unwrap().clone();
    assert_eq!(submitted.len(), 4);
    let mut prompts: Vec<(Vec<u32>, Option<u64>)> = submitted
        .iter()
        .map(|s| (s.prompt.clone(), s.spec.params.seed))
        .collect();
    prompts.sort();
    let mut want = vec![
        (first.clone(), Some(5)),
        (first.clone(), Some(6)),
        (vec![7, 8, 9], Some(5)),
        (vec![7, 8, 9], Some(6)),
    ];
    want.sort();
    assert_eq!(prompts, want);
    let completion = 4 * tokens(&fixture, "done");
    assert_eq!(response["usage"]["prompt_tokens"], first.len() + 3);
    assert_eq!(response["usage"]["completion_tokens"], completion);
}

#[actix_web::test]
async fn lists_and_counts_past_the_limits_are_named() {
    let fixture = Fixture::new(Script::text("ok"));
    let app = fixture.app().await;
    for (request, param, needle) in [
        (json!({"prompt": []}), "prompt", "empty"),
        (
            json!({"prompt": ["a", ""], "add_special_tokens": false}),
            "prompt",
            "prompt 1",
        ),
        (json!({"prompt": vec!["a"; 129]}), "prompt", "129 prompts"),
        (json!({"prompt": ["a", "b"], "n": 65}), "n", "130 choices"),
    ] {
        let message = expect_error(
            call(&app, post("/v1/completions", request.clone())).await,
            400,
            "invalid_request_error",
            Some(param),
        );
        assert!(message.contains(needle), "{request}: {message}");
    }
    assert!(fixture.submitted.lock().unwrap().is_empty());
}

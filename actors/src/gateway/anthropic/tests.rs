//! The translation of Messages requests into the chat, and the shaping of answers and
//! stream events, without a server.

use peregrine_structured::tools::ToolCallFormat;
use serde_json::{json, Value};

use super::request::{MessagesRequest, REFUSED};
use super::response::{stop_reason, MessageOut};
use super::stream::MessageEvents;
use super::translate::conversation;
use crate::gateway::body::parse;
use crate::gateway::conversation::Conversation;
use crate::gateway::errors::ApiError;
use crate::gateway::generation::{Delta, Finish, Output};
use crate::gateway::protocol::request::{Content, Stop};
use crate::gateway::protocol::response::UsageOut;
use crate::gateway::sse::ChunkFormat;
use crate::gateway::tool_output::{CallDeltas, CallIds};
use crate::gateway::tools::tests::SETTINGS;
use crate::gateway::tools::Choice;
use crate::gateway::unsupported::refuse_any;

fn weather() -> Value {
    json!({"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}})
}

/// A request with `extra` fields over a one-message body.
fn body(extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}]});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

fn translate(body: &Value) -> Result<Conversation, ApiError> {
    refuse_any(body, REFUSED)?;
    let request: MessagesRequest = parse(body)?;
    conversation(request, &SETTINGS)
}

fn text(content: &Option<Content>) -> &str {
    match content {
        Some(Content::Text(text)) => text,
        other => panic!("not text: {other:?}"),
    }
}

#[test]
fn system_blocks_and_sampling_fields_are_carried_over() {
    let request = body(json!({"system": [{"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
        "temperature": 0.5, "top_p": 0.9, "top_k": 7, "stop_sequences": ["END"],
        "metadata": {"user_id": "u"}, "stream": true}));
    let chat = translate(&request).unwrap();
    assert_eq!(chat.messages.len(), 2);
    assert_eq!(chat.messages[0].role, "system");
    assert_eq!(text(&chat.messages[0].content), "Be brief.\nBe kind.");
    assert_eq!(text(&chat.messages[1].content), "hi");
    let fields = &chat.fields;
    assert_eq!(
        (fields.temperature, fields.top_p, fields.top_k),
        (Some(0.5), Some(0.9), Some(7))
    );
    assert!(matches!(&fields.stop, Some(Stop::Many(stops)) if stops == &["END"]));
    assert_eq!(
        (fields.model.as_deref(), fields.stream),
        (Some("tiny"), Some(true))
    );
    assert_eq!(chat.max_tokens, Some(("max_tokens", 16)));
    assert!(chat.tools.is_none() && chat.constraint.is_none());
}

#[test]
fn tool_use_and_tool_result_blocks_become_calls_and_tool_messages() {
    let request = body(
        json!({"tools": [weather()], "tool_choice": {"type": "none"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                    "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                    "content": [{"type": "text", "text": "timeout"}]},
                {"type": "text", "text": "and tomorrow?"}]}]}),
    );
    let chat = translate(&request).unwrap();
    let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "tool", "user"]);
    let assistant = &chat.messages[1];
    assert_eq!(text(&assistant.content), "Checking.");
    let call = &assistant.tool_calls.as_ref().unwrap()[0];
    assert_eq!(call.id.as_deref(), Some("toolu_1"));
    assert_eq!(call.function.name, "get_weather");
    assert_eq!(call.function.arguments, Some(json!({"city": "Oslo"})));
    assert_eq!(chat.messages[2].tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(text(&chat.messages[2].content), "3 C");
    assert_eq!(text(&chat.messages[3].content), "Error: timeout");
    assert_eq!(text(&chat.messages[4].content), "and tomorrow?");
    let tools = chat.tools.unwrap();
    assert_eq!(tools.choice, Choice::None);
    assert_eq!(tools.tools[0].parameters, weather()["input_schema"]);
    assert_eq!(tools.declared[0]["function"]["name"], "get_weather");
}

#[test]
fn tool_choices_map_to_the_chats() {
    let cases = [
        (json!({"type": "auto"}), Choice::Auto, true),
        (json!({"type": "any"}), Choice::Required, true),
        (
            json!({"type": "any", "disable_parallel_tool_use": true}),
            Choice::Required,
            false,
        ),
        (
            json!({"type": "tool", "name": "get_weather"}),
            Choice::Named("get_weather".into()),
            true,
        ),
        (json!({"type": "none"}), Choice::None, true),
    ];
    for (choice, expected, parallel) in cases {
        let request = body(json!({"tools": [weather()], "tool_choice": choice}));
        let tools = translate(&request).unwrap().tools.unwrap();
        assert_eq!(
            (tools.choice, tools.parallel),
            (expected, parallel),
            "{choice}"
        );
    }
    let default = translate(&body(json!({"tools": [weather()]}))).unwrap();
    assert_eq!(default.tools.unwrap().choice, Choice::Auto);
}

#[test]
fn refusals_name_the_field_as_anthropic_spells_it() {
    let image = json!({"type": "image", "source": {"type": "base64", "data": "AA=="}});
    let cases = [
        (json!({"max_tokens": null}), "max_tokens"),
        (
            json!({"thinking": {"type": "enabled", "budget_tokens": 1024}}),
            "thinking",
        ),
        (
            json!({"output_format": {"type": "json_schema"}}),
            "output_format",
        ),
        (json!({"mcp_servers": [{"name": "m"}]}), "mcp_servers"),
        (
            json!({"messages": [{"role": "user", "content": [image]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "system", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a"},
                {"role": "assistant", "content": "prefill"}]}),
            "messages[1].role",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use",
                "name": "f", "input": {}}]}, {"role": "user", "content": "x"}]}),
            "messages[0].content[0].id",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use",
                "id": "t", "name": "f", "input": [1]}]}, {"role": "user", "content": "x"}]}),
            "messages[0].content[0].input",
        ),
        (json!({"system": [{"type": "image"}]}), "system[0].type"),
        (json!({"stop_sequences": [""]}), "stop_sequences"),
        (
            json!({"tools": [{"name": "bash", "type": "bash_20250124"}]}),
            "tools[0].type",
        ),
        (json!({"tools": [{"name": "f"}]}), "tools[0].input_schema"),
        (
            json!({"tools": [{"name": "a b", "input_schema": {}}]}),
            "tools[0].name",
        ),
        (
            json!({"tools": [{"name": "f", "input_schema": []}]}),
            "tools[0].input_schema",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "some"}}),
            "tool_choice.type",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "tool", "name": "other"}}),
            "tool_choice.name",
        ),
        (
            json!({"tools": [weather()],
                "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}}),
            "tool_choice.disable_parallel_tool_use",
        ),
        (json!({"tool_choice": {"type": "any"}}), "tool_choice"),
    ];
    for (extra, param) in cases {
        let err = translate(&body(extra.clone()))
            .err()
            .unwrap_or_else(|| panic!("{extra}"));
        assert_eq!(
            (err.status().as_u16(), err.param()),
            (400, Some(param)),
            "{extra}: {err}"
        );
    }
    let mut missing = body(json!({}));
    missing.as_object_mut().unwrap().remove("max_tokens");
    let err = translate(&missing).err().unwrap();
    assert_eq!(err.param(), Some("max_tokens"), "{err}");
    translate(&body(json!({"thinking": {"type": "disabled"}}))).unwrap();
}

#[test]
fn stop_reasons_are_anthropics() {
    assert_eq!(stop_reason("length", None, true), "max_tokens");
    assert_eq!(stop_reason("stop", Some("END"), false), "stop_sequence");
    assert_eq!(stop_reason("stop", None, true), "tool_use");
    assert_eq!(stop_reason("stop", None, false), "end_turn");
}

const REPLY: &str = "Checking.<tool_call>[{\"name\": \"get_weather\", \"arguments\": \
    {\"city\": \"Oslo\"}}]</tool_call>";

fn output(text: &str, reason: &'static str, stop_string: Option<&str>) -> Output {
    Output {
        prompt: Vec::new(),
        text: text.to_owned(),
        tokens: Vec::new(),
        token_ids: Vec::new(),
        reason,
        stop_string: stop_string.map(str::to_owned),
        usage: UsageOut::counted(5, 9),
    }
}

fn start() -> MessageOut {
    MessageOut::start("msg_abc".into(), "tiny".into(), 5)
}

#[test]
fn a_whole_answer_has_text_and_tool_use_blocks() {
    let ids = CallIds::of("toolu", "msg_abc");
    let whole = start().whole(
        output(REPLY, "stop", None),
        Some(ToolCallFormat::Hermes),
        &ids,
    );
    let whole = serde_json::to_value(whole).unwrap();
    assert_eq!(
        whole,
        json!({"id": "msg_abc", "type": "message", "role": "assistant", "model": "tiny",
            "content": [{"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_abc_0", "name": "get_weather",
                    "input": {"city": "Oslo"}}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 5, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0, "output_tokens": 9}})
    );
    let stopped = start().whole(output("Hi", "stop", Some("END")), None, &ids);
    let stopped = serde_json::to_value(stopped).unwrap();
    assert_eq!(
        (&stopped["stop_reason"], &stopped["stop_sequence"]),
        (&json!("stop_sequence"), &json!("END"))
    );
    let cut = "<tool_call>[{\"name\": \"get_weather\", \"arguments\": {\"ci";
    let cut = start().whole(
        output(cut, "length", None),
        Some(ToolCallFormat::Hermes),
        &ids,
    );
    let cut = serde_json::to_value(cut).unwrap();
    assert_eq!(cut["stop_reason"], "max_tokens");
    assert_eq!(
        cut["content"][0]["input"],
        json!({}),
        "a cut-off input is an object"
    );
}

/// The `(event, data)` pairs of a stream's bytes.
fn events(bytes: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(bytes).unwrap();
    text.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            let (name, data) = event.split_once('\n').unwrap();
            let name = name.strip_prefix("event: ").unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], name, "the data's type is the event's");
            (name.to_owned(), data)
        })
        .collect()
}

/// The events of `reply`, streamed `per_chunk` characters at a time.
fn streamed(reply: &str, per_chunk: usize, calls: bool, finish: Finish) -> Vec<(String, Value)> {
    let ids = CallIds::of("toolu", "msg_abc");
    let calls = calls.then(|| CallDeltas::new(ToolCallFormat::Hermes, ids));
    let mut format = MessageEvents::new(start(), calls);
    let mut bytes = format.opening().unwrap().to_vec();
    let chars: Vec<char> = reply.chars().collect();
    for piece in chars.chunks(per_chunk) {
        let delta = Delta {
            text: piece.iter().collect(),
            ..Delta::default()
        };
        bytes.extend_from_slice(&format.chunk(&delta, None));
    }
    for event in format.last(finish, false) {
        bytes.extend_from_slice(&event);
    }
    assert!(format.done().is_none(), "no [DONE]");
    events(&bytes)
}

fn finish(reason: &'static str, stop_string: Option<&str>) -> Finish {
    Finish {
        delta: Delta::default(),
        reason,
        stop_string: stop_string.map(str::to_owned),
        usage: UsageOut::counted(5, 9),
    }
}

#[test]
fn a_streamed_call_is_a_tool_use_block_whose_pieces_make_its_input() {
    for per_chunk in [1, 3, 1000] {
        let events = streamed(REPLY, per_chunk, true, finish("stop", None));
        let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names[0], "message_start");
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 5);
        assert_eq!(events[0].1["message"]["content"], json!([]));
        assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
        let (mut text, mut partial) = (String::new(), String::new());
        let mut starts = Vec::new();
        for (name, data) in &events {
            match name.as_str() {
                "content_block_start" => starts.push(data.clone()),
                "content_block_delta" => {
                    let delta = &data["delta"];
                    match delta["type"].as_str().unwrap() {
                        "text_delta" => {
                            assert_eq!(data["index"], 0);
                            text.push_str(delta["text"].as_str().unwrap());
                        }
                        _ => {
                            assert_eq!(data["index"], 1);
                            partial.push_str(delta["partial_json"].as_str().unwrap());
                        }
                    }
                }
                _ => {}
            }
        }
        assert_eq!(text, "Checking.", "per chunk {per_chunk}");
        assert_eq!(
            starts[0]["content_block"],
            json!({"type": "text", "text": ""})
        );
        assert_eq!(
            starts[1]["content_block"],
            json!({"type": "tool_use", "id": "toolu_abc_0", "name": "get_weather", "input": {}})
        );
        let input: Value = serde_json::from_str(&partial).unwrap();
        assert_eq!(input, json!({"city": "Oslo"}));
        let stops: Vec<&Value> = events
            .iter()
            .filter(|(name, _)| name == "content_block_stop")
            .map(|(_, data)| &data["index"])
            .collect();
        assert_eq!(stops, [0, 1]);
        let delta = &events[events.len() - 2].1;
        assert_eq!(
            delta["delta"],
            json!({"stop_reason": "tool_use", "stop_sequence": null})
        );
        assert_eq!(delta["usage"]["output_tokens"], 9);
    }
}

#[test]
fn a_streamed_text_ends_with_its_stop_reason_and_sequence() {
    let events = streamed("Hello there", 2, false, finish("stop", Some("END")));
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let mut expected = vec!["message_start", "ping", "content_block_start"];
    expected.extend(["content_block_delta"; 6]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    let delta = &events[events.len() - 2].1["delta"];
    assert_eq!(
        delta,
        &json!({"stop_reason": "stop_sequence", "stop_sequence": "END"})
    );
    let empty = streamed("", 1, false, finish("length", None));
    let names: Vec<&str> = empty.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["message_start", "ping", "message_delta", "message_stop"]
    );
    assert_eq!(empty[2].1["delta"]["stop_reason"], "max_tokens");
}

#[test]
fn a_failure_part_way_is_an_error_event() {
    let mut format = MessageEvents::new(start(), None);
    let bytes = format.error(&ApiError::internal("the engine failed"));
    let events = events(&bytes);
    assert_eq!(events[0].0, "error");
    assert_eq!(
        events[0].1["error"],
        json!({"type": "api_error", "message": "the engine failed"})
    );
}

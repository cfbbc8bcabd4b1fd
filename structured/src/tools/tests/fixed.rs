//! Fixed outputs of each format: what they parse into, as vLLM's parsers would read them,
//! and that streaming them split anywhere gives the same.

use super::super::{detect, parse, ToolCall, ToolCallFormat};
use super::{assert_stream_matches_parse, rng};

use ToolCallFormat::{DeepSeekV3, Hermes, Llama3Json, Mistral};

/// Checks `text` parses into `content` and the complete `calls` (name, arguments), and
/// streams into the same split anywhere.
fn check(format: ToolCallFormat, text: &str, content: Option<&str>, calls: &[(&str, &str)]) {
    let parsed = parse(format, text);
    let expected: Vec<ToolCall> = calls
        .iter()
        .map(|(name, arguments)| ToolCall {
            name: name.to_string(),
            arguments: arguments.to_string(),
            complete: true,
        })
        .collect();
    assert_eq!(parsed.content.as_deref(), content, "{format:?} {text:?}");
    assert_eq!(parsed.calls, expected, "{format:?} {text:?}");
    assert_stream_matches_parse(format, text, &mut rng("check"));
}

const WEATHER: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
const ADD: &str = r#"{"name": "add", "arguments": {"a": 1, "b": [2, 3.5e-1]}}"#;
const WEATHER_ARGS: &str = r#"{"city":"Paris"}"#;
const ADD_ARGS: &str = r#"{"a":1,"b":[2,3.5e-1]}"#;

#[test]
fn hermes_blocks_lists_and_text() {
    let one = format!("Sure.\n<tool_call>\n{WEATHER}\n</tool_call>");
    check(
        Hermes,
        &one,
        Some("Sure.\n"),
        &[("get_weather", WEATHER_ARGS)],
    );
    let two = format!("<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{ADD}\n</tool_call>\n");
    check(
        Hermes,
        &two,
        None,
        &[("get_weather", WEATHER_ARGS), ("add", ADD_ARGS)],
    );
    let list = format!("<tool_call>[{WEATHER}, {ADD}]</tool_call>");
    check(
        Hermes,
        &list,
        None,
        &[("get_weather", WEATHER_ARGS), ("add", ADD_ARGS)],
    );
    let ollama_list = format!("<tool_call>[\n{WEATHER},\n{ADD}\n]</tool_call>");
    check(
        Hermes,
        &ollama_list,
        None,
        &[("get_weather", WEATHER_ARGS), ("add", ADD_ARGS)],
    );
    let tight = format!("<tool_call>{WEATHER}</tool_call>");
    check(Hermes, &tight, None, &[("get_weather", WEATHER_ARGS)]);
    let unclosed = format!("<tool_call>\n{ADD}");
    check(Hermes, &unclosed, None, &[("add", ADD_ARGS)]);
    let missing_close = format!("<tool_call>\n{WEATHER}\n<tool_call>\n{ADD}\n</tool_call>");
    check(
        Hermes,
        &missing_close,
        None,
        &[("get_weather", WEATHER_ARGS), ("add", ADD_ARGS)],
    );
    let after = format!("<tool_call>\n{WEATHER}\n</tool_call>\nI asked for the weather.");
    check(
        Hermes,
        &after,
        Some("\nI asked for the weather."),
        &[("get_weather", WEATHER_ARGS)],
    );
    check(Hermes, "<tool_call>[]</tool_call>", None, &[]);
    // The call began with its arguments; the object around them need not close.
    check(
        Hermes,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}",
        None,
        &[("f", "{}")],
    );
}

#[test]
fn hermes_call_objects_in_any_key_order() {
    let params = r#"<tool_call>{"name": "f", "parameters": {"x": null}}</tool_call>"#;
    check(Hermes, params, None, &[("f", r#"{"x":null}"#)]);
    let reversed = r#"<tool_call>{"arguments": {"x": true}, "id": 7, "name": "f"}</tool_call>"#;
    check(Hermes, reversed, None, &[("f", r#"{"x":true}"#)]);
    let extra =
        r#"<tool_call>{"type": "function", "name": "f", "arguments": {}, "id": [1]}</tool_call>"#;
    check(Hermes, extra, None, &[("f", "{}")]);
    let no_args = r#"<tool_call>{"name": "f"}</tool_call>"#;
    check(Hermes, no_args, None, &[("f", "{}")]);
    let markers_in_strings = r#"<tool_call>{"name": "f", "arguments": {"q": "</tool_call> <tool_call> \"}"}}</tool_call>"#;
    check(
        Hermes,
        markers_in_strings,
        None,
        &[("f", r#"{"q":"</tool_call> <tool_call> \"}"}"#)],
    );
    let spaced = "<tool_call>\n{ \"name\" : \"f\" ,\n \"arguments\" : {\n  \"a b\" : [ 1 , { } ] ,\n  \"é\\u00e9\" : \"x\\ny\" } }\n</tool_call>";
    check(
        Hermes,
        spaced,
        None,
        &[("f", r#"{"a b":[1,{}],"é\u00e9":"x\ny"}"#)],
    );
}

#[test]
fn hermes_text_that_is_not_a_call_stays_content() {
    for text in [
        "Write <tool_call> tags to call tools.",
        "<tool_call>\n{\"foo\": 1}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>",
        "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",
        "a <tool_ b <tool_call",
        "",
        "  \n ",
    ] {
        check(Hermes, text, (!text.is_empty()).then_some(text), &[]);
    }
    let before = "  \n<tool_call>{\"foo\": 1}";
    check(Hermes, before, Some(before), &[]);
    let text_then_call = format!("Use <tool_call> like so: <tool_call>{WEATHER}</tool_call>");
    check(
        Hermes,
        &text_then_call,
        Some("Use <tool_call> like so: "),
        &[("get_weather", WEATHER_ARGS)],
    );
}

#[test]
fn calls_that_break_off_keep_what_was_streamed() {
    let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Par";
    let parsed = parse(Hermes, text);
    assert_eq!(parsed.content, None);
    assert_eq!(
        parsed.calls,
        [ToolCall {
            name: "f".into(),
            arguments: r#"{"city":"Par"#.into(),
            complete: false
        }]
    );
    let broken = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": x}}\n</tool_call>\nok";
    let parsed = parse(Hermes, broken);
    assert_eq!(parsed.content.as_deref(), Some("\nok"));
    assert_eq!(parsed.calls.len(), 1);
    assert_eq!(parsed.calls[0].arguments, r#"{"a":"#);
    assert!(!parsed.calls[0].complete);
    let mut rng = rng("calls_that_break_off");
    assert_stream_matches_parse(Hermes, text, &mut rng);
    assert_stream_matches_parse(Hermes, broken, &mut rng);
}

#[test]
fn llama3_json_calls() {
    let tagged = r#"<|python_tag|>{"name": "add", "arguments": {"a": 1}}; {"name": "get_weather", "parameters": {"city": "x;y"}}"#;
    check(
        Llama3Json,
        tagged,
        None,
        &[("add", r#"{"a":1}"#), ("get_weather", r#"{"city":"x;y"}"#)],
    );
    let bare = "\n {\"name\": \"add\", \"parameters\": {\"a\": 1}}";
    check(Llama3Json, bare, None, &[("add", r#"{"a":1}"#)]);
    let after_text = r#"Let me check.<|python_tag|>{"name": "add", "parameters": {}}"#;
    check(
        Llama3Json,
        after_text,
        Some("Let me check."),
        &[("add", "{}")],
    );
    let lines = "{\"name\": \"a\", \"parameters\": {}}\n{\"name\": \"b\", \"parameters\": {}}";
    check(Llama3Json, lines, None, &[("a", "{}"), ("b", "{}")]);
    let trailing = r#"{"name": "add", "parameters": {}}; and that is all"#;
    check(
        Llama3Json,
        trailing,
        Some("; and that is all"),
        &[("add", "{}")],
    );
    for text in [
        "{\"answer\": 42}",
        "Use {x} here",
        "{\"name\": \"f\", \"parameters\": [1]}",
    ] {
        check(Llama3Json, text, Some(text), &[]);
    }
}

#[test]
fn mistral_calls_in_both_forms() {
    let list = format!("[TOOL_CALLS][{ADD}, {WEATHER}]");
    check(
        Mistral,
        &list,
        None,
        &[("add", ADD_ARGS), ("get_weather", WEATHER_ARGS)],
    );
    let spaced = format!("[TOOL_CALLS] [{ADD}]");
    check(Mistral, &spaced, None, &[("add", ADD_ARGS)]);
    let newer = r#"Sure[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]get_weather[ARGS]{"city": "P"}"#;
    check(
        Mistral,
        newer,
        Some("Sure"),
        &[("add", r#"{"a":1}"#), ("get_weather", r#"{"city":"P"}"#)],
    );
    let v11 = r#"[TOOL_CALLS]add{"a": 1}"#;
    check(Mistral, v11, None, &[("add", r#"{"a":1}"#)]);
    let call_id = r#"[TOOL_CALLS]add[CALL_ID]a1B2c3D4e[ARGS]{"a": 1}"#;
    check(Mistral, call_id, None, &[("add", r#"{"a":1}"#)]);
    for text in [
        "[TOOL_CALLS]",
        "[TOOL_CALLS] hello",
        "[TOOL_CALLS]add[ARGS]5",
    ] {
        check(Mistral, text, Some(text), &[]);
    }
}

#[test]
fn deepseek_v3_calls() {
    let two = "Hi<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"P\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    check(
        DeepSeekV3,
        two,
        Some("Hi"),
        &[("add", r#"{"a":1}"#), ("get_weather", r#"{"city":"P"}"#)],
    );
    let bare = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n{\"a\": 1}<｜tool▁call▁end｜>";
    check(DeepSeekV3, bare, None, &[("add", r#"{"a":1}"#)]);
    let unended = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{}\n```<｜tool▁call▁end｜>\nDone";
    check(DeepSeekV3, unended, Some("\nDone"), &[("add", "{}")]);
    for text in [
        "<｜tool▁calls▁begin｜>oops",
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>\n{}",
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n[1]",
    ] {
        check(DeepSeekV3, text, Some(text), &[]);
    }
}

#[test]
fn formats_are_detected_from_templates_and_named_as_vllm_does() {
    let cases = [
        (
            "{% for tool in tools %}<tool_call>\n{{ tool | tojson }}</tool_call>",
            Some(Hermes),
        ),
        ("{{- '<|python_tag|>' + tool_call.name }}", Some(Llama3Json)),
        ("{%- if message.role == 'ipython' %}", Some(Llama3Json)),
        ("{{ '[TOOL_CALLS][' }}", Some(Mistral)),
        (
            "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}",
            Some(DeepSeekV3),
        ),
        (peregrine_models::tiny_tokenizer::CHATML, None),
    ];
    for (template, format) in cases {
        assert_eq!(detect(template), format, "{template}");
    }
    for format in ToolCallFormat::ALL {
        assert_eq!(
            ToolCallFormat::from_parser_name(format.parser_name()),
            Some(format)
        );
    }
    assert_eq!(ToolCallFormat::from_parser_name("pythonic"), None);
}

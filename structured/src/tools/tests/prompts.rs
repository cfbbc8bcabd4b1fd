//! The prompt texts for templates without tool syntax read back with the Hermes reader.

use serde_json::json;

use super::super::{
    parse, render_tool_calls, render_tool_result, tools_system_prompt, HermesStyle, Tool,
    ToolCallFormat,
};

fn weather() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: Some("The weather in a city.".into()),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        strict: false,
    }
}

#[test]
fn the_system_prompt_lists_the_tools_as_json_dumps_writes_them() {
    let tools = [
        weather(),
        Tool {
            description: None,
            ..weather()
        },
    ];
    for style in [HermesStyle::Blocks, HermesStyle::List] {
        let prompt = tools_system_prompt(&tools, style);
        let signature = r#"{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#;
        assert!(
            prompt.contains(&format!("<tools>\n{signature}\n")),
            "{prompt}"
        );
        assert!(prompt
            .contains(r#"{"type": "function", "function": {"name": "get_weather", "parameters""#));
        assert!(prompt.contains("<tool_call>"), "{prompt}");
    }
}

#[test]
fn rendered_calls_read_back_as_the_same_calls() {
    let calls = [
        ("get_weather", r#"{"city":"Paris","days":[1,2]}"#),
        ("add", "{\n  \"a\": 1.50,\n  \"b\": \"é\"\n}"),
        ("none", ""),
    ];
    let blocks = render_tool_calls(calls, HermesStyle::Blocks);
    assert_eq!(
        blocks,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n\
         <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1.5, \"b\": \"é\"}}\n</tool_call>\n\
         <tool_call>\n{\"name\": \"none\", \"arguments\": {}}\n</tool_call>"
    );
    let list = render_tool_calls(calls, HermesStyle::List);
    assert!(
        list.starts_with("<tool_call>[{\"name\": \"get_weather\""),
        "{list}"
    );
    for text in [blocks, list] {
        let parsed = parse(ToolCallFormat::Hermes, &text);
        let read: Vec<(&str, &str)> = parsed
            .calls
            .iter()
            .map(|call| (call.name.as_str(), call.arguments.as_str()))
            .collect();
        assert_eq!(
            read,
            [
                ("get_weather", r#"{"city":"Paris","days":[1,2]}"#),
                ("add", r#"{"a":1.5,"b":"é"}"#),
                ("none", "{}")
            ]
        );
        assert_eq!(parsed.content, None);
    }
}

#[test]
fn tool_results_are_wrapped_for_the_user_turn() {
    assert_eq!(
        render_tool_result("{\"temp\": 21}"),
        "<tool_response>\n{\"temp\": 21}\n</tool_response>"
    );
    assert!(parse(ToolCallFormat::Hermes, &render_tool_result("x"))
        .calls
        .is_empty());
}

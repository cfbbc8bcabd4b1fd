//! A Responses request read into the chat request it is served as: `instructions` and the
//! `input` items become chat messages (an assistant's `function_call` items its
//! `tool_calls`, a `function_call_output` a `tool` message), the flat function tools the
//! chat shape, `text.format` a `response_format` (unless `tool_choice` forces a call, which
//! leaves no text to shape), `max_output_tokens` the chat limit. The
//! server keeps no state, so `store: true`, `previous_response_id` and the other fields
//! that need stored responses, and the built-in tools, are refused by name; an error the
//! chat path finds names the Responses field it came from ([`renamed`]).

use serde_json::{json, Map, Value};

use super::shapes::Echo;
use crate::gateway::errors::ApiError;

/// A Responses request as a chat request, and what the response echoes of it.
#[derive(Debug)]
pub struct Translated {
    /// The chat completions body.
    pub chat: Value,
    /// The parameters the response object repeats.
    pub echo: Echo,
}

/// Reads the Responses body `body`.
pub fn translate(body: &Value) -> Result<Translated, ApiError> {
    let fields = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    refuse_stateful(fields)?;
    let instructions = match fields.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "instructions",
                "`instructions` must be a string",
            ))
        }
    };
    let mut chat = Map::new();
    let mut messages = Vec::new();
    if let Some(text) = &instructions {
        messages.push(json!({"role": "system", "content": text}));
    }
    match fields.get("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for (at, item) in items.iter().enumerate() {
                add_item(&mut messages, at, item)?;
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "input",
                "`input` must be a string or a list of items",
            ))
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    let tools = match fields.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tools)) => tools.clone(),
        Some(_) => return Err(ApiError::invalid("tools", "`tools` must be a list")),
    };
    let chat_tools = tools
        .iter()
        .enumerate()
        .map(|(at, tool)| chat_tool(at, tool))
        .collect::<Result<Vec<_>, _>>()?;
    if !chat_tools.is_empty() {
        chat.insert("tools".into(), Value::Array(chat_tools));
    }
    let tool_choice = fields.get("tool_choice").filter(|v| !v.is_null());
    if let Some(choice) = tool_choice {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    let text = fields.get("text").filter(|v| !v.is_null());
    let format = text.map(text_format).transpose()?.flatten();
    // `text.format` shapes the message's text; a call that `tool_choice` forces is all the
    // output there is, so the format has nothing to shape (as the Agents SDK sends both).
    let forces_call =
        !tools.is_empty() && tool_choice.is_some_and(|choice| choice != "none" && choice != "auto");
    if let Some(format) = format.filter(|_| !forces_call) {
        chat.insert("response_format".into(), format);
    }
    for (from, to) in [
        ("model", "model"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("stream", "stream"),
        ("max_output_tokens", "max_completion_tokens"),
    ] {
        if let Some(value) = fields.get(from).filter(|v| !v.is_null()) {
            chat.insert(to.into(), value.clone());
        }
    }
    let echoed = |field: &str| fields.get(field).cloned().unwrap_or(Value::Null);
    let echo = Echo {
        instructions: instructions.map(Value::String).unwrap_or(Value::Null),
        metadata: fields
            .get("metadata")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or_else(|| json!({})),
        parallel_tool_calls: fields
            .get("parallel_tool_calls")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        temperature: echoed("temperature"),
        top_p: echoed("top_p"),
        tool_choice: tool_choice.cloned().unwrap_or_else(|| json!("auto")),
        tools,
        max_output_tokens: echoed("max_output_tokens"),
        text: text
            .cloned()
            .unwrap_or_else(|| json!({"format": {"type": "text"}})),
        user: echoed("user"),
    };
    Ok(Translated {
        chat: Value::Object(chat),
        echo,
    })
}

/// A field that asks for something this stateless server does not do, and the values
/// that ask for nothing.
struct Stateful {
    field: &'static str,
    neutral: fn(&Value) -> bool,
    why: &'static str,
}

/// The fields refused unless neutral.
const STATEFUL: [Stateful; 10] = [
    Stateful {
        field: "store",
        neutral: |v| v == &Value::Bool(false),
        why: "the server keeps no responses; send `store: false`",
    },
    Stateful {
        field: "previous_response_id",
        neutral: |_| false,
        why: "the server keeps no responses; send the whole conversation in `input`",
    },
    Stateful {
        field: "conversation",
        neutral: |_| false,
        why: "the server keeps no conversations; send the whole conversation in `input`",
    },
    Stateful {
        field: "background",
        neutral: |v| v == &Value::Bool(false),
        why: "responses run in the foreground only",
    },
    Stateful {
        field: "prompt",
        neutral: |_| false,
        why: "the server keeps no prompt templates; send `instructions` and `input`",
    },
    Stateful {
        field: "include",
        neutral: |v| v.as_array().is_some_and(Vec::is_empty),
        why: "no extra output data is served; leave it out or send it empty",
    },
    Stateful {
        field: "reasoning",
        neutral: |v| {
            v.as_object()
                .is_some_and(|o| o.values().all(Value::is_null))
        },
        why: "reasoning settings are not served; leave it out",
    },
    Stateful {
        field: "truncation",
        neutral: |v| v == "disabled",
        why: "the input is never truncated; leave it out or send \"disabled\"",
    },
    Stateful {
        field: "top_logprobs",
        neutral: |v| v.as_i64() == Some(0),
        why: "logprobs are not served on this endpoint; leave it out or send 0",
    },
    Stateful {
        field: "max_tool_calls",
        neutral: |_| false,
        why: "no limit on tool calls is served; leave it out",
    },
];

/// Refuses the first field that needs stored state or asks for what is not served.
fn refuse_stateful(fields: &Map<String, Value>) -> Result<(), ApiError> {
    for rule in &STATEFUL {
        let Some(value) = fields.get(rule.field).filter(|v| !v.is_null()) else {
            continue;
        };
        if !(rule.neutral)(value) {
            return Err(ApiError::invalid(
                rule.field,
                format!("`{}` = {value} is not supported: {}", rule.field, rule.why),
            ));
        }
    }
    Ok(())
}

/// Adds `input[at]` to `messages`: a message, a call (joined to the assistant turn before
/// it) or a call's output.
fn add_item(messages: &mut Vec<Value>, at: usize, item: &Value) -> Result<(), ApiError> {
    let param = format!("input[{at}]");
    let fields = item
        .as_object()
        .ok_or_else(|| ApiError::invalid(&param, "each input item must be an object"))?;
    let kind = match fields.get("type") {
        None | Some(Value::Null) if fields.contains_key("role") => "message",
        Some(Value::String(kind)) => kind.as_str(),
        _ => {
            return Err(ApiError::invalid(
                format!("{param}.type"),
                "an input item needs a `type`",
            ))
        }
    };
    match kind {
        "message" => messages.push(message(&param, fields)?),
        "function_call" => {
            let call = json!({
                "id": text_field(&param, fields, "call_id")?,
                "type": "function",
                "function": {
                    "name": text_field(&param, fields, "name")?,
                    "arguments": arguments(&param, fields)?,
                },
            });
            match messages.last_mut() {
                Some(last) if last["role"] == "assistant" => {
                    match last["tool_calls"].as_array_mut() {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    }
                }
                _ => messages.push(json!({"role": "assistant", "content": null,
                    "tool_calls": [call]})),
            }
        }
        "function_call_output" => {
            let call_id = text_field(&param, fields, "call_id")?;
            let name = messages
                .iter()
                .filter_map(|m| m["tool_calls"].as_array())
                .flatten()
                .find(|call| call["id"] == call_id.as_str())
                .map(|call| call["function"]["name"].clone());
            let output = match fields.get("output") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => {
                    part_texts(&format!("{param}.output"), parts)?.join("\n")
                }
                _ => {
                    return Err(ApiError::invalid(
                        format!("{param}.output"),
                        "a `function_call_output` needs `output`, a string or text parts",
                    ))
                }
            };
            let mut tool = json!({"role": "tool", "tool_call_id": call_id, "content": output});
            if let Some(name) = name {
                tool["name"] = name;
            }
            messages.push(tool);
        }
        other => {
            return Err(ApiError::invalid(
                format!("{param}.type"),
                format!(
                    "input items of type {other:?} are not supported: send \"message\", \
                     \"function_call\" or \"function_call_output\" items (the server keeps no \
                     stored items and runs no built-in tools)"
                ),
            ))
        }
    }
    Ok(())
}

/// The roles a message item may have.
const ROLES: [&str; 4] = ["user", "system", "developer", "assistant"];

/// A message item as a chat message.
fn message(param: &str, fields: &Map<String, Value>) -> Result<Value, ApiError> {
    let role = fields.get("role").and_then(Value::as_str).unwrap_or("");
    if !ROLES.contains(&role) {
        return Err(ApiError::invalid(
            format!("{param}.role"),
            format!(
                "a message's `role` must be one of {}, got {}",
                ROLES.join(", "),
                fields.get("role").unwrap_or(&Value::Null)
            ),
        ));
    }
    let content = match fields.get("content") {
        Some(Value::String(text)) => Value::String(text.clone()),
        Some(Value::Array(parts)) => {
            let texts = part_texts(&format!("{param}.content"), parts)?;
            texts
                .into_iter()
                .map(|text| json!({"type": "text", "text": text}))
                .collect()
        }
        _ => {
            return Err(ApiError::invalid(
                format!("{param}.content"),
                "a message's `content` must be a string or a list of text parts",
            ))
        }
    };
    Ok(json!({"role": role, "content": content}))
}

/// The texts of `input_text` and `output_text` parts.
fn part_texts(param: &str, parts: &[Value]) -> Result<Vec<String>, ApiError> {
    parts
        .iter()
        .enumerate()
        .map(|(at, part)| {
            let kind = part.get("type").and_then(Value::as_str);
            if !matches!(kind, Some("input_text" | "output_text")) {
                return Err(ApiError::invalid(
                    format!("{param}[{at}].type"),
                    format!(
                        "only text parts (\"input_text\", \"output_text\") are supported, got {}",
                        part.get("type").unwrap_or(&Value::Null)
                    ),
                ));
            }
            part.get("text")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| {
                    ApiError::invalid(format!("{param}[{at}].text"), "a text part needs `text`")
                })
        })
        .collect()
}

/// A string field of an item.
fn text_field(param: &str, fields: &Map<String, Value>, name: &str) -> Result<String, ApiError> {
    fields
        .get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            ApiError::invalid(
                format!("{param}.{name}"),
                format!("a `function_call` item needs `{name}`, a string"),
            )
        })
}

/// A call's `arguments`: JSON text of an object (empty for none).
fn arguments(param: &str, fields: &Map<String, Value>) -> Result<String, ApiError> {
    let text = fields
        .get("arguments")
        .and_then(Value::as_str)
        .unwrap_or("");
    if text.trim().is_empty() {
        return Ok("{}".into());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(_)) => Ok(text.to_owned()),
        _ => Err(ApiError::invalid(
            format!("{param}.arguments"),
            "a call's `arguments` must be a JSON object, as text",
        )),
    }
}

/// `tools[at]`, a flat function tool, in the chat shape; built-in tools are refused.
fn chat_tool(at: usize, tool: &Value) -> Result<Value, ApiError> {
    let kind = tool.get("type").and_then(Value::as_str);
    if kind != Some("function") {
        return Err(ApiError::invalid(
            format!("tools[{at}].type"),
            format!(
                "only function tools are served (no built-in tools), got {}",
                tool.get("type").unwrap_or(&Value::Null)
            ),
        ));
    }
    let mut function = Map::new();
    for key in ["name", "description", "parameters", "strict"] {
        if let Some(value) = tool.get(key).filter(|v| !v.is_null()) {
            function.insert(key.into(), value.clone());
        }
    }
    Ok(json!({"type": "function", "function": function}))
}

/// `tool_choice` in the chat shape.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    let Some(named) = choice.as_object() else {
        return Ok(choice.clone());
    };
    match (named.get("type").and_then(Value::as_str), named.get("name")) {
        (Some("function"), Some(Value::String(name))) => {
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` must be \"none\", \"auto\", \"required\" or \
             {\"type\": \"function\", \"name\": ...} (no built-in tools are served)",
        )),
    }
}

/// `text`: its `format` as a chat `response_format` (`None`: plain text).
fn text_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let fields = text
        .as_object()
        .ok_or_else(|| ApiError::invalid("text", "`text` must be an object"))?;
    if let Some(verbosity) = fields.get("verbosity").filter(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            "text.verbosity",
            format!("`text.verbosity` = {verbosity} is not supported; leave it out"),
        ));
    }
    let Some(format) = fields.get("format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = format.get("type").and_then(Value::as_str);
    Ok(Some(match kind {
        Some("json_schema") => {
            let mut inner = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(value) = format.get(key).filter(|v| !v.is_null()) {
                    inner.insert(key.into(), value.clone());
                }
            }
            json!({"type": "json_schema", "json_schema": inner})
        }
        _ => format.clone(),
    }))
}

/// `err`, found in the chat request a Responses request was served as, naming the
/// Responses field its chat field came from.
pub fn renamed(err: ApiError) -> ApiError {
    match err.param().map(responses_param) {
        Some(param) => err.with_param(param),
        None => err,
    }
}

/// The Responses field a chat field came from.
fn responses_param(chat: &str) -> String {
    const RENAMES: [(&str, &str); 6] = [
        ("response_format.json_schema", "text.format"),
        ("response_format", "text.format"),
        ("max_completion_tokens", "max_output_tokens"),
        ("max_tokens", "max_output_tokens"),
        ("messages", "input"),
        ("prompt", "input"),
    ];
    for (from, to) in RENAMES {
        if let Some(rest) = chat.strip_prefix(from) {
            if rest.is_empty() || rest.starts_with('.') || rest.starts_with('[') {
                // A message's index is not its item's: the whole input is named.
                let keep = if to == "input" { "" } else { rest };
                return format!("{to}{keep}");
            }
        }
    }
    if let Some(rest) = chat.strip_prefix("tools[") {
        if let Some((index, field)) = rest.split_once(']') {
            let field = field.strip_prefix(".function").unwrap_or(field);
            return format!("tools[{index}]{field}");
        }
    }
    chat.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_of(body: Value) -> Value {
        translate(&body).unwrap().chat
    }

    fn weather() -> Value {
        json!({"type": "function", "name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": true})
    }

    #[test]
    fn a_string_input_with_instructions_is_a_system_and_a_user_message() {
        let chat = chat_of(
            json!({"model": "m", "input": "Hi", "instructions": "Be brief.",
            "max_output_tokens": 9, "temperature": 0.5, "top_p": 0.9, "stream": true,
            "metadata": {"k": "v"}, "user": "u", "store": false, "include": [],
            "truncation": "disabled"}),
        );
        assert_eq!(
            chat,
            json!({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"}], "max_completion_tokens": 9,
                "temperature": 0.5, "top_p": 0.9, "stream": true})
        );
    }

    #[test]
    fn calls_and_their_outputs_round_trip_into_chat_turns() {
        let chat = chat_of(json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                "arguments": "{\"city\": \"Oslo\"}", "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": ""},
            {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\": 3}"},
            {"type": "function_call_output", "call_id": "call_2",
                "output": [{"type": "input_text", "text": "noon"}]},
        ], "tools": [weather()], "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": false}));
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."}],
                    "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                        "arguments": "{\"city\": \"Oslo\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_time",
                        "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}",
                    "name": "get_weather"},
                {"role": "tool", "tool_call_id": "call_2", "content": "noon",
                    "name": "get_time"},
            ])
        );
        assert_eq!(
            chat["tools"],
            json!([{"type": "function", "function": {"name": "get_weather",
                "description": "Weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}}, "strict": true}}])
        );
        assert_eq!(
            chat["tool_choice"],
            json!({"type": "function", "function": {"name": "get_weather"}})
        );
        assert_eq!(chat["parallel_tool_calls"], false);
    }

    #[test]
    fn text_format_becomes_a_response_format() {
        let schema = json!({"type": "object"});
        let chat = chat_of(
            json!({"input": "x", "text": {"format": {"type": "json_schema",
            "name": "answer", "schema": schema, "strict": true}}}),
        );
        assert_eq!(
            chat["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                "strict": true}})
        );
        let chat = chat_of(json!({"input": "x", "text": {"format": {"type": "json_object"}}}));
        assert_eq!(chat["response_format"], json!({"type": "json_object"}));
        let chat = chat_of(json!({"input": "x", "text": {"format": {"type": "text"}}}));
        assert_eq!(chat["response_format"], json!({"type": "text"}));
        let format = json!({"format": {"type": "json_object"}});
        for (choice, kept) in [
            (json!("auto"), true),
            (json!("none"), true),
            (json!("required"), false),
            (json!({"type": "function", "name": "get_weather"}), false),
        ] {
            let chat = chat_of(json!({"input": "x", "text": format, "tools": [weather()],
                "tool_choice": choice}));
            assert_eq!(chat.get("response_format").is_some(), kept, "{choice}");
        }
    }

    #[test]
    fn the_echo_repeats_the_parameters_with_defaults() {
        let echo = translate(&json!({"input": "x"})).unwrap().echo;
        assert_eq!(
            serde_json::to_value(&echo).unwrap(),
            json!({"instructions": null, "metadata": {}, "parallel_tool_calls": true,
                "temperature": null, "top_p": null, "tool_choice": "auto", "tools": [],
                "max_output_tokens": null, "text": {"format": {"type": "text"}},
                "user": null})
        );
        let echo = translate(&json!({"input": "x", "tools": [weather()],
            "tool_choice": "required", "instructions": "i"}))
        .unwrap()
        .echo;
        assert_eq!(echo.tools, vec![weather()]);
        assert_eq!(echo.tool_choice, json!("required"));
        assert_eq!(echo.instructions, json!("i"));
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (json!({"input": "x", "store": true}), "store"),
            (
                json!({"input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (json!({"input": "x", "conversation": "c"}), "conversation"),
            (json!({"input": "x", "background": true}), "background"),
            (
                json!({"input": "x", "include": ["reasoning.encrypted_content"]}),
                "include",
            ),
            (
                json!({"input": "x", "reasoning": {"effort": "high"}}),
                "reasoning",
            ),
            (json!({"input": "x", "truncation": "auto"}), "truncation"),
            (json!({"input": "x", "top_logprobs": 2}), "top_logprobs"),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"input": "x", "tools": [weather(), {"type": "file_search"}]}),
                "tools[1].type",
            ),
            (
                json!({"input": "x", "tool_choice": {"type": "web_search_preview"}}),
                "tool_choice",
            ),
            (json!({"input": 3}), "input"),
            (json!({}), "input"),
            (
                json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
                "input[0].type",
            ),
            (
                json!({"input": [{"type": "reasoning", "summary": []}]}),
                "input[0].type",
            ),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0].role",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                "input[0].content[0].type",
            ),
            (
                json!({"input": ["x", {"type": "function_call", "call_id": "c", "name": "f",
                    "arguments": "[1]"}]}),
                "input[0]",
            ),
            (
                json!({"input": [{"type": "function_call", "call_id": "c", "name": "f",
                    "arguments": "not json"}]}),
                "input[0].arguments",
            ),
            (
                json!({"input": [{"type": "function_call", "name": "f"}]}),
                "input[0].call_id",
            ),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "c"}]}),
                "input[0].output",
            ),
            (
                json!({"input": "x", "text": {"verbosity": "high"}}),
                "text.verbosity",
            ),
            (json!({"input": "x", "instructions": 1}), "instructions"),
        ];
        for (body, param) in cases {
            let err = translate(&body).unwrap_err();
            assert_eq!(
                (err.status().as_u16(), err.param()),
                (400, Some(param)),
                "{body}: {}",
                err.message()
            );
        }
        let err = translate(&json!({"input": "x", "store": true})).unwrap_err();
        assert!(err.message().contains("`store`"), "{}", err.message());
    }

    #[test]
    fn chat_fields_are_renamed_to_the_responses_fields() {
        let cases = [
            ("response_format.json_schema.schema", "text.format.schema"),
            ("response_format.json_schema.name", "text.format.name"),
            ("response_format.type", "text.format.type"),
            ("response_format", "text.format"),
            ("max_completion_tokens", "max_output_tokens"),
            ("max_tokens", "max_output_tokens"),
            ("messages[3].tool_calls[0].function.arguments", "input"),
            ("messages", "input"),
            ("prompt", "input"),
            ("tools[2].function.name", "tools[2].name"),
            ("tools[0].function", "tools[0]"),
            ("tools[1].type", "tools[1].type"),
            ("tool_choice", "tool_choice"),
            ("temperature", "temperature"),
            ("prompt_logprobs", "prompt_logprobs"),
        ];
        for (chat, responses) in cases {
            assert_eq!(responses_param(chat), responses, "{chat}");
        }
        let err = renamed(ApiError::invalid("max_completion_tokens", "too many"));
        assert_eq!(err.param(), Some("max_output_tokens"));
        assert_eq!(err.message(), "too many");
    }
}

//! A chat with tools, for templates that have no tool syntax (SmolLM2's): the tools are
//! described in the system turn, an assistant's calls written into its text and a tool's
//! result carried back in a user turn, all in the Hermes format the output is read in, as
//! Ollama's templates do for such models. Templates that render `tools` themselves get the
//! messages as they are, with the tools.

use peregrine_models::chat_template::ChatMessage;
use peregrine_structured::tools::{
    render_tool_calls, render_tool_result, tools_system_prompt, HermesStyle, Tool,
};
use serde_json::Value;

/// The tools a chat offers, as a template that does not render them is given them.
pub struct ToolPrompt<'a> {
    /// The functions (none: the history's calls and results are still written as text).
    pub tools: &'a [Tool],
    /// How calls are laid out.
    pub style: HermesStyle,
}

/// `messages` with the tools in the system turn and the calls and results in the text.
pub fn written_out(messages: Vec<ChatMessage>, prompt: &ToolPrompt) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    for mut message in messages {
        match message.role.as_str() {
            "assistant" => {
                if let Some(calls) = message.tool_calls.take() {
                    let arguments: Vec<(String, String)> = calls.iter().map(call_text).collect();
                    let written = render_tool_calls(
                        arguments.iter().map(|(n, a)| (n.as_str(), a.as_str())),
                        prompt.style,
                    );
                    message.content = match message.content.is_empty() {
                        true => written,
                        false => format!("{}\n{written}", message.content),
                    };
                }
            }
            "tool" => {
                message.role = "user".into();
                message.content = render_tool_result(&message.content);
                message.tool_call_id = None;
                message.name = None;
            }
            _ => {}
        }
        out.push(message);
    }
    if !prompt.tools.is_empty() {
        let offer = tools_system_prompt(prompt.tools, prompt.style);
        match out.first_mut() {
            Some(first) if first.role == "system" || first.role == "developer" => {
                first.content = format!("{}\n\n{offer}", first.content);
            }
            _ => out.insert(
                0,
                ChatMessage {
                    role: "system".into(),
                    content: offer,
                    ..ChatMessage::default()
                },
            ),
        }
    }
    out
}

/// A call's name and its arguments as JSON text, from the template shape
/// `{"function": {"name", "arguments": {...}}}`.
fn call_text(call: &Value) -> (String, String) {
    let function = &call["function"];
    let name = function["name"].as_str().unwrap_or_default().to_owned();
    let arguments = match &function["arguments"] {
        Value::String(text) => text.clone(),
        Value::Null => "{}".to_owned(),
        other => other.to_string(),
    };
    (name, arguments)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }

    #[test]
    fn tools_calls_and_results_are_written_into_the_turns() {
        let tools: Vec<Tool> = vec![serde_json::from_value(
            json!({"name": "get_weather", "parameters": {"type": "object"}}),
        )
        .unwrap()];
        let mut asked = message("assistant", "");
        asked.tool_calls = Some(vec![json!({"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}})]);
        let mut answer = message("tool", "{\"temp\": 3}");
        answer.tool_call_id = Some("call_1".into());
        let chat = vec![
            message("system", "Be brief."),
            message("user", "Weather in Oslo?"),
            asked,
            answer,
        ];
        let prompt = ToolPrompt {
            tools: &tools,
            style: HermesStyle::List,
        };
        let out = written_out(chat, &prompt);
        assert_eq!(out.len(), 4);
        assert!(out[0].content.starts_with("Be brief.\n\n"));
        assert!(out[0].content.contains("\"name\": \"get_weather\""));
        assert_eq!(
            out[2].content,
            "<tool_call>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]</tool_call>"
        );
        assert_eq!(out[2].tool_calls, None);
        assert_eq!(out[3].role, "user");
        assert_eq!(
            out[3].content,
            "<tool_response>\n{\"temp\": 3}\n</tool_response>"
        );
        let alone = written_out(vec![message("user", "hi")], &prompt);
        assert_eq!(alone[0].role, "system");
        assert_eq!(alone[1].content, "hi");
    }
}

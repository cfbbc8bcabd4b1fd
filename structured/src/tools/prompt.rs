//! Tools, calls and results written into prompts for models whose chat templates have no
//! tool syntax (SmolLM2's): the tools go into the system turn, an assistant's calls and a
//! tool's result into the turns' text, all in the Hermes format that
//! [`ToolCallFormat::Hermes`](crate::tools::ToolCallFormat::Hermes) reads back, so that an
//! agent loop of several turns reads as the model expects.

use serde_json::{json, Map, Value};

use super::dumps::dumps;
use super::format::{HermesStyle, HERMES_CLOSE, HERMES_OPEN};
use super::types::Tool;

/// The system-turn text that offers `tools` and says how to call them, laid out as `style`.
/// The gateway appends it to the request's own system message (a blank line between) or
/// sends it as the system message where there is none.
pub fn tools_system_prompt(tools: &[Tool], style: HermesStyle) -> String {
    let signatures: Vec<String> = tools.iter().map(signature).collect();
    let signatures = signatures.join("\n");
    match style {
        HermesStyle::Blocks => format!(
            "# Tools\n\n\
             You may call one or more of these functions to help with the user's request. \
             Their signatures are inside <tools></tools> tags:\n\
             <tools>\n{signatures}\n</tools>\n\n\
             To call a function, write its name and arguments as a JSON object inside \
             <tool_call></tool_call> tags, one block per call:\n\
             {HERMES_OPEN}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n{HERMES_CLOSE}"
        ),
        HermesStyle::List => format!(
            "You can call functions to answer the question. You are given these functions, \
             inside <tools></tools> tags:\n\
             <tools>\n{signatures}\n</tools>\n\
             To call one or more of them, write the calls as a JSON list inside \
             <tool_call></tool_call> tags and nothing else, each call an object with the \
             function's name and its arguments, with values of the types the parameters ask for:\n\
             {HERMES_OPEN}[{{\"name\": \"function_name\", \"arguments\": {{\"argument\": \"value\"}}}}]{HERMES_CLOSE}\n\
             If no function fits the question, or it lacks an argument a function needs, say so \
             instead of calling one."
        ),
    }
}

/// An assistant turn's calls (each a name and its arguments as the request sent them) as
/// the model writes them, laid out as `style`. Arguments that are JSON are rewritten as
/// `json.dumps` spells it; others are written as they are.
pub fn render_tool_calls<'a>(
    calls: impl IntoIterator<Item = (&'a str, &'a str)>,
    style: HermesStyle,
) -> String {
    let objects: Vec<String> = calls
        .into_iter()
        .map(|(name, arguments)| {
            let arguments = match serde_json::from_str::<Value>(arguments) {
                Ok(value) => dumps(&value),
                Err(_) if arguments.trim().is_empty() => "{}".to_owned(),
                Err(_) => arguments.to_owned(),
            };
            format!("{{\"name\": {}, \"arguments\": {arguments}}}", dumps(&name))
        })
        .collect();
    match style {
        HermesStyle::Blocks => objects
            .iter()
            .map(|object| format!("{HERMES_OPEN}\n{object}\n{HERMES_CLOSE}"))
            .collect::<Vec<_>>()
            .join("\n"),
        HermesStyle::List => format!("{HERMES_OPEN}[{}]{HERMES_CLOSE}", objects.join(", ")),
    }
}

/// A `tool` message's result as the text of the `user` turn that carries it back to the
/// model; the results of several calls go into one turn, joined by a line break.
pub fn render_tool_result(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// A tool's signature: `{"type": "function", "function": {"name": ..., ...}}`.
fn signature(tool: &Tool) -> String {
    let mut function = Map::new();
    function.insert("name".into(), json!(tool.name));
    if let Some(description) = &tool.description {
        function.insert("description".into(), json!(description));
    }
    function.insert("parameters".into(), tool.parameters.clone());
    dumps(&json!({"type": "function", "function": function}))
}

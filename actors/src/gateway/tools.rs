//! A chat request's `tools`, `tool_choice` and `parallel_tool_calls`, read and checked as
//! OpenAI and vLLM take them: `tool_choice` is `"none"`, `"auto"` (the default when tools
//! are sent; served with `--enable-auto-tool-choice`, as vLLM), `"required"` or
//! `{"type": "function", "function": {"name"}}`. `required` and a named function are
//! enforced by a grammar in the model's own call format; every error is a 400 naming the
//! field.

use peregrine_models::chat_template::ChatTemplate;
use peregrine_models::tokenizer::Tokenizer;
use peregrine_structured::tools::{
    detect, forced_call_grammar, CallChoice, HermesStyle, Tool, ToolCallFormat,
};
use serde_json::{Map, Value};

use super::constraints::Requested;
use super::errors::ApiError;

/// How the served model writes tool calls, and whether `tool_choice: "auto"` is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolSettings {
    /// The call format its output is read in (`--tool-call-parser`).
    pub format: ToolCallFormat,
    /// How Hermes calls are laid out: blocks where the template writes its own tool
    /// syntax, one list (as SmolLM2 was trained) where tools go into the system turn.
    pub style: HermesStyle,
    /// Whether the template renders `tools` itself; otherwise the gateway writes them
    /// into the system turn, and calls and results into the turns' text.
    pub template_renders_tools: bool,
    /// `--enable-auto-tool-choice`.
    pub auto: bool,
}

impl ToolSettings {
    /// The settings of a model with `template`: the format `parser` names, else the one
    /// its template writes, else Hermes (which the system-turn description asks for).
    pub fn for_model(
        template: Option<&ChatTemplate>,
        parser: Option<ToolCallFormat>,
        auto: bool,
    ) -> ToolSettings {
        let renders = template.is_some_and(ChatTemplate::renders_tools);
        let detected = template.and_then(|t| detect(t.source()));
        ToolSettings {
            format: parser.or(detected).unwrap_or(ToolCallFormat::Hermes),
            style: match renders {
                true => HermesStyle::Blocks,
                false => HermesStyle::List,
            },
            template_renders_tools: renders,
            auto,
        }
    }
}

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// No call: the tools are only shown to the model.
    None,
    /// The model decides; its output is read for calls.
    Auto,
    /// At least one call (exactly one without parallel calls).
    Required,
    /// A call of this function.
    Named(String),
}

/// A request's tools and what it asks of them.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// The functions, read.
    pub tools: Vec<Tool>,
    /// The `tools` entries as sent, for templates that render them.
    pub declared: Vec<Value>,
    /// `tool_choice`.
    pub choice: Choice,
    /// `parallel_tool_calls` (default true).
    pub parallel: bool,
}

impl ToolRequest {
    /// Whether the output is read for calls.
    pub fn reads_calls(&self) -> bool {
        self.choice != Choice::None
    }

    /// The grammar of the calls `required` or a named function forces, written in the
    /// model's own format; `None` for `none` and `auto`.
    pub fn forced(
        &self,
        settings: &ToolSettings,
        tokenizer: &Tokenizer,
    ) -> Result<Option<Requested>, ApiError> {
        let choice = match &self.choice {
            Choice::None | Choice::Auto => return Ok(None),
            Choice::Required => CallChoice::Required {
                parallel: self.parallel,
            },
            Choice::Named(name) => CallChoice::Named(name.clone()),
        };
        let constraint = forced_call_grammar(
            settings.format,
            settings.style,
            &self.tools,
            &choice,
            tokenizer,
        )
        .map_err(|err| ApiError::invalid("tool_choice", err.to_string()))?;
        Ok(Some(Requested {
            param: "tool_choice".into(),
            constraint,
        }))
    }
}

/// The longest function name OpenAI takes.
const MAX_NAME_CHARS: usize = 64;

/// The tools `body` sends and what it asks of them; `None` when it sends none.
pub fn read(body: &Value, settings: &ToolSettings) -> Result<Option<ToolRequest>, ApiError> {
    let Some(fields) = body.as_object() else {
        return Ok(None);
    };
    let declared = match fields.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tools)) => tools.clone(),
        Some(_) => return Err(ApiError::invalid("tools", "`tools` must be a list")),
    };
    let parallel = match fields.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(parallel)) => *parallel,
        Some(_) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                "`parallel_tool_calls` must be a boolean",
            ))
        }
    };
    let tools = functions(&declared)?;
    let choice = choice(fields.get("tool_choice"), &tools)?;
    offered(tools, declared, choice, parallel, settings)
}

/// The functions of `declared` (`tools` entries in OpenAI's shape), read; two tools of
/// one name are refused.
pub fn functions(declared: &[Value]) -> Result<Vec<Tool>, ApiError> {
    let tools = declared
        .iter()
        .enumerate()
        .map(|(at, entry)| tool(at, entry))
        .collect::<Result<Vec<_>, _>>()?;
    for (at, tool) in tools.iter().enumerate() {
        if tools[..at].iter().any(|earlier| earlier.name == tool.name) {
            return Err(ApiError::invalid(
                format!("tools[{at}].function.name"),
                format!("two tools are named {:?}", tool.name),
            ));
        }
    }
    Ok(tools)
}

/// `tools` (read from `declared`) with what `choice` asks of them (`None`: not sent);
/// `None` when there are no tools and no call is asked for.
pub fn offered(
    tools: Vec<Tool>,
    declared: Vec<Value>,
    choice: Option<Choice>,
    parallel: bool,
    settings: &ToolSettings,
) -> Result<Option<ToolRequest>, ApiError> {
    if tools.is_empty() {
        return match choice {
            None | Some(Choice::None) => Ok(None),
            Some(_) => Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` asks for a call, but the request sends no `tools`",
            )),
        };
    }
    let choice = choice.unwrap_or(Choice::Auto);
    if choice == Choice::Auto && !settings.auto {
        return Err(ApiError::invalid(
            "tool_choice",
            "\"auto\" tool choice (the default when `tools` are sent) requires \
             --enable-auto-tool-choice; send \"none\", \"required\" or a named function, or \
             start the server with that flag",
        ));
    }
    Ok(Some(ToolRequest {
        tools,
        declared,
        choice,
        parallel,
    }))
}

/// `tools[at]`: `{"type": "function", "function": {"name", "description"?, "parameters"?,
/// "strict"?}}`.
fn tool(at: usize, entry: &Value) -> Result<Tool, ApiError> {
    let param = format!("tools[{at}]");
    let fields = entry
        .as_object()
        .ok_or_else(|| ApiError::invalid(&param, "each tool must be an object"))?;
    match fields.get("type").and_then(Value::as_str) {
        Some("function") => {}
        other => {
            return Err(ApiError::invalid(
                format!("{param}.type"),
                format!("a tool's `type` must be \"function\", got {other:?}"),
            ))
        }
    }
    let function = fields
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            ApiError::invalid(
                format!("{param}.function"),
                "a tool needs a `function` object",
            )
        })?;
    let name = function.get("name").and_then(Value::as_str).unwrap_or("");
    let valid = !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if !valid {
        return Err(ApiError::invalid(
            format!("{param}.function.name"),
            format!(
                "a function's `name` must be 1 to {MAX_NAME_CHARS} letters, digits, `_`, `-` \
                 or `.`, got {:?}",
                function.get("name").unwrap_or(&Value::Null)
            ),
        ));
    }
    match function.get("parameters") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{param}.function.parameters"),
                "a function's `parameters` must be a JSON schema object",
            ))
        }
    }
    let mut function: Map<String, Value> = function.clone();
    if function.get("parameters").is_some_and(Value::is_null) {
        function.remove("parameters");
    }
    serde_json::from_value(Value::Object(function)).map_err(|err| {
        ApiError::invalid(
            format!("{param}.function"),
            format!("invalid function: {err}"),
        )
    })
}

/// `tool_choice`, read; `None` when it is not sent.
fn choice(value: Option<&Value>, tools: &[Tool]) -> Result<Option<Choice>, ApiError> {
    let invalid = || {
        ApiError::invalid(
            "tool_choice",
            "`tool_choice` must be \"none\", \"auto\", \"required\" or \
             {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )
    };
    Ok(Some(match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(choice)) => match choice.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            _ => return Err(invalid()),
        },
        Some(Value::Object(named)) => {
            if named.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid());
            }
            let name = named
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(invalid)?;
            if !tools.iter().any(|tool| tool.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` names the function {name:?}, which is not in `tools`"),
                ));
            }
            Choice::Named(name.to_owned())
        }
        Some(_) => return Err(invalid()),
    }))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    /// Hermes calls in one list, the tools written into the system turn, `auto` served.
    pub const SETTINGS: ToolSettings = ToolSettings {
        format: ToolCallFormat::Hermes,
        style: HermesStyle::List,
        template_renders_tools: false,
        auto: true,
    };

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}}})
    }

    #[test]
    fn tools_and_choices_are_read() {
        let read_body = |body: Value| read(&body, &SETTINGS).unwrap();
        assert_eq!(read_body(json!({})), None);
        assert_eq!(read_body(json!({"tools": [], "tool_choice": "none"})), None);
        let request = read_body(json!({"tools": [weather()]})).unwrap();
        assert_eq!(
            (request.choice.clone(), request.parallel),
            (Choice::Auto, true)
        );
        assert_eq!(request.tools[0].name, "get_weather");
        assert_eq!(request.declared, vec![weather()]);
        let named = read_body(json!({"tools": [weather()], "parallel_tool_calls": false,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
        .unwrap();
        assert_eq!(named.choice, Choice::Named("get_weather".into()));
        assert!(!named.parallel);
        let none = read_body(json!({"tools": [weather()], "tool_choice": "none"})).unwrap();
        assert!(!none.reads_calls());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [{"type": "code"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "function", "function": {}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function",
                    "function": {"name": "f", "parameters": []}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [weather(), weather()]}),
                "tools[1].function.name",
            ),
            (
                json!({"tools": [weather()], "tool_choice": "always"}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather()],
                    "tool_choice": {"type": "function", "function": {"name": "other"}}}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [weather()], "parallel_tool_calls": "yes"}),
                "parallel_tool_calls",
            ),
        ];
        for (body, param) in cases {
            let err = read(&body, &SETTINGS).unwrap_err();
            assert_eq!(
                (err.status().as_u16(), err.param()),
                (400, Some(param)),
                "{body}: {}",
                err.message()
            );
        }
    }

    #[test]
    fn auto_needs_the_flag_as_in_vllm() {
        let settings = ToolSettings {
            auto: false,
            ..SETTINGS
        };
        let err = read(&json!({"tools": [weather()]}), &settings).unwrap_err();
        assert_eq!(err.param(), Some("tool_choice"));
        assert!(err.message().contains("--enable-auto-tool-choice"));
        let required = json!({"tools": [weather()], "tool_choice": "required"});
        assert!(read(&required, &settings).unwrap().is_some());
    }
}

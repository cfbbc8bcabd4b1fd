//! Forced calls (`tool_choice` `required` or a named function): a llguidance Lark grammar
//! that admits only calls in the model's own format, each tool's arguments held to its
//! `parameters` schema through `%json`. Every output it admits reads back with
//! [`crate::tools::parse`] as complete calls of the given tools. A marker that is a token of
//! the served tokenizer is written as that token, so the model emits it as it was trained.

use peregrine_models::tokenizer::Tokenizer;
use serde_json::{json, Value};

use super::format::{
    HermesStyle, ToolCallFormat, DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALLS_END, DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END, DEEPSEEK_SEP, HERMES_CLOSE, HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALLS,
};
use super::region::is_name_char;
use super::types::Tool;
use crate::constraint::{lark_literal, Constraint};

/// The calls `tool_choice` forces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallChoice {
    /// `required`: calls of any of the tools, one or more with `parallel` (the request's
    /// `parallel_tool_calls`), else exactly one.
    Required {
        /// Whether several calls may follow one another.
        parallel: bool,
    },
    /// `{"type": "function", "function": {"name": ...}}`: exactly one call of this tool.
    Named(String),
}

/// Why no grammar was written: the request's tools or choice cannot be forced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolGrammarError(pub String);

/// How one call and a run of calls are written in a format: `prefix item (separator
/// item)* suffix`, each part a Lark expression (empty where there is none).
struct Layout {
    prefix: String,
    separator: String,
    suffix: String,
}

/// The grammar of the calls `choice` forces among `tools`, written as `format` (and
/// `style`, for Hermes) with the markers of `tokenizer`.
pub fn forced_call_grammar(
    format: ToolCallFormat,
    style: HermesStyle,
    tools: &[Tool],
    choice: &CallChoice,
    tokenizer: &Tokenizer,
) -> Result<Constraint, ToolGrammarError> {
    let chosen: Vec<&Tool> = match choice {
        CallChoice::Required { .. } => tools.iter().collect(),
        CallChoice::Named(name) => tools
            .iter()
            .filter(|tool| tool.name == *name)
            .take(1)
            .collect(),
    };
    if chosen.is_empty() {
        return Err(ToolGrammarError(match choice {
            CallChoice::Named(name) => {
                format!("tool_choice names {name:?}, which is not among the tools")
            }
            CallChoice::Required { .. } => {
                "tool_choice \"required\" needs at least one tool".into()
            }
        }));
    }
    let mistral_args = tokenizer.token_to_id(MISTRAL_ARGS).is_some();
    let marker = |text: &str| match tokenizer.token_to_id(text) {
        Some(id) => format!("<[{id}]>"),
        None => lark_literal(text),
    };
    let mut rules = Vec::new();
    let mut items = Vec::new();
    for (i, tool) in chosen.iter().enumerate() {
        items.push(format!("item_{i}"));
        let item = item(format, style, mistral_args, tool, i, &marker)?;
        rules.push(format!("item_{i}: {item}"));
        rules.push(format!("args_{i}: %json {}", arguments_schema(tool)?));
    }
    let layout = layout(format, style, mistral_args, &marker);
    let repeat = match choice {
        CallChoice::Required { parallel: true } if layout.separator.is_empty() => "item*".into(),
        CallChoice::Required { parallel: true } => format!("({} item)*", layout.separator),
        _ => String::new(),
    };
    let start = [layout.prefix.as_str(), "item", &repeat, &layout.suffix]
        .into_iter()
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let mut grammar = format!("start: {start}\nitem: {}\n", items.join(" | "));
    for rule in rules {
        grammar.push_str(&rule);
        grammar.push('\n');
    }
    Ok(Constraint::ToolCall(grammar))
}

/// What surrounds and separates calls in `format`.
fn layout(
    format: ToolCallFormat,
    style: HermesStyle,
    mistral_args: bool,
    marker: &dyn Fn(&str) -> String,
) -> Layout {
    let text = |text: &str| lark_literal(text);
    let (prefix, separator, suffix) = match (format, style) {
        (ToolCallFormat::Hermes, HermesStyle::Blocks) => (String::new(), text("\n"), String::new()),
        (ToolCallFormat::Hermes, HermesStyle::List) => (
            format!("{} {}", marker(HERMES_OPEN), text("[")),
            text(", "),
            format!("{} {}", text("]"), marker(HERMES_CLOSE)),
        ),
        (ToolCallFormat::Llama3Json, _) => (String::new(), text("; "), String::new()),
        (ToolCallFormat::Mistral, _) if mistral_args => {
            (String::new(), String::new(), String::new())
        }
        (ToolCallFormat::Mistral, _) => (
            format!("{} {}", marker(MISTRAL_CALLS), text("[")),
            text(", "),
            text("]"),
        ),
        (ToolCallFormat::DeepSeekV3, _) => (
            marker(DEEPSEEK_CALLS_BEGIN),
            text("\n"),
            marker(DEEPSEEK_CALLS_END),
        ),
    };
    Layout {
        prefix,
        separator,
        suffix,
    }
}

/// One call of `tool` (the `index`th chosen) in `format`, its arguments the rule `args_INDEX`.
fn item(
    format: ToolCallFormat,
    style: HermesStyle,
    mistral_args: bool,
    tool: &Tool,
    index: usize,
    marker: &dyn Fn(&str) -> String,
) -> Result<String, ToolGrammarError> {
    let args = format!("args_{index}");
    let object = |key: &str| {
        let head = format!(
            "{{\"name\": {}, \"{key}\": ",
            Value::from(tool.name.as_str())
        );
        format!("{} {args} {}", lark_literal(&head), lark_literal("}"))
    };
    if tool.name.is_empty() {
        return Err(ToolGrammarError("a tool has an empty name".into()));
    }
    let bare_name = || {
        if tool.name.chars().all(is_name_char) {
            Ok(lark_literal(&tool.name))
        } else {
            Err(ToolGrammarError(format!(
                "the tool name {:?} cannot be written in the {} format (letters, digits, `_`, `-`, `.` and `:` only)",
                tool.name,
                format.parser_name()
            )))
        }
    };
    Ok(match (format, style) {
        (ToolCallFormat::Hermes, HermesStyle::Blocks) => format!(
            "{} {} {} {} {}",
            marker(HERMES_OPEN),
            lark_literal("\n"),
            object("arguments"),
            lark_literal("\n"),
            marker(HERMES_CLOSE)
        ),
        (ToolCallFormat::Hermes, HermesStyle::List) => object("arguments"),
        (ToolCallFormat::Llama3Json, _) => object("parameters"),
        (ToolCallFormat::Mistral, _) if mistral_args => format!(
            "{} {} {} {args}",
            marker(MISTRAL_CALLS),
            bare_name()?,
            marker(MISTRAL_ARGS)
        ),
        (ToolCallFormat::Mistral, _) => object("arguments"),
        (ToolCallFormat::DeepSeekV3, _) => format!(
            "{} {} {} {} {} {args} {} {}",
            marker(DEEPSEEK_CALL_BEGIN),
            lark_literal("function"),
            marker(DEEPSEEK_SEP),
            bare_name()?,
            lark_literal("\n```json\n"),
            lark_literal("\n```"),
            marker(DEEPSEEK_CALL_END)
        ),
    })
}

/// `tool`'s arguments schema as `%json` takes it: an object schema, written as
/// `json.dumps` writes JSON, approximated where the tool is not strict.
fn arguments_schema(tool: &Tool) -> Result<String, ToolGrammarError> {
    let refuse = |why: &str| {
        Err(ToolGrammarError(format!(
            "the parameters of tool {:?} {why}",
            tool.name
        )))
    };
    let mut schema = match &tool.parameters {
        Value::Null | Value::Bool(true) => json!({"type": "object"}),
        Value::Object(fields) => Value::Object(fields.clone()),
        Value::Bool(false) => return refuse("are `false`, which no arguments match"),
        _ => return refuse("are not a JSON schema (an object)"),
    };
    let Some(fields) = schema.as_object_mut() else {
        return refuse("are not a JSON schema (an object)");
    };
    let object_type = match fields.get("type") {
        None => true,
        Some(Value::String(kind)) => kind == "object",
        Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "object"),
        Some(_) => false,
    };
    if !object_type {
        return refuse("do not describe an object");
    }
    fields.insert("type".into(), json!("object"));
    fields.entry("x-guidance").or_insert_with(|| {
        json!({
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
            "lenient": !tool.strict,
            "coerce_one_of": !tool.strict,
        })
    });
    Ok(schema.to_string())
}

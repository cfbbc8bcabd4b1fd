//! What a request constrains its output to, as the gateway read it from the request, and
//! the llguidance grammar of each kind.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use crate::gbnf::gbnf_to_lark;
use crate::schema_check::unenforceable;
use crate::schema_formats::without_unknown_formats;
use crate::schema_objects::closed_objects;

/// One request's output constraint.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// Text matching a JSON schema (OpenAI's `json_schema`, vLLM's `json`).
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// Text matching a regular expression (Rust `regex` syntax, anchored at both ends).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// A grammar in llama.cpp's GBNF, converted to Lark.
    Gbnf(String),
    /// A tool call in the model's own call format: a Lark grammar the tools module wrote.
    ToolCall(String),
}

/// How JSON is written when a schema does not say (`x-guidance`): the separators Python's
/// `json.dumps` writes, which models have seen most, and no other whitespace between
/// tokens, so that a small model cannot stall in an endless run of blanks.
fn json_options() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

impl Constraint {
    /// The kind, as metrics label it.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonSchema(_) => "json_schema",
            Constraint::JsonObject => "json_object",
            Constraint::Regex(_) => "regex",
            Constraint::Choice(_) => "choice",
            Constraint::Lark(_) => "grammar",
            Constraint::Gbnf(_) => "gbnf",
            Constraint::ToolCall(_) => "tool_call",
        }
    }

    /// The text the compiled grammar is cached under: the kind and the constraint's
    /// canonical text (a schema re-serialized, so key order and spacing as sent count).
    pub fn cache_key(&self) -> String {
        let text = match self {
            Constraint::JsonSchema(schema) => schema.to_string(),
            Constraint::JsonObject => String::new(),
            Constraint::Regex(text)
            | Constraint::Lark(text)
            | Constraint::Gbnf(text)
            | Constraint::ToolCall(text) => text.clone(),
            Constraint::Choice(choices) => Value::from(choices.clone()).to_string(),
        };
        format!("{}\n{text}", self.kind())
    }

    /// The size of the constraint's text, in bytes, which the compiler bounds.
    pub fn text_len(&self) -> usize {
        match self {
            Constraint::JsonSchema(schema) => schema.to_string().len(),
            Constraint::JsonObject => 0,
            Constraint::Regex(text)
            | Constraint::Lark(text)
            | Constraint::Gbnf(text)
            | Constraint::ToolCall(text) => text.len(),
            Constraint::Choice(choices) => choices.iter().map(String::len).sum(),
        }
    }

    /// The llguidance grammar, or why there is none (a GBNF grammar that does not parse,
    /// an empty choice list).
    pub fn grammar(&self) -> Result<TopLevelGrammar, String> {
        Ok(match self {
            Constraint::JsonSchema(schema) => {
                let schema = closed_objects(without_unknown_formats(schema.clone()));
                if let Some(why) = unenforceable(&schema) {
                    return Err(why);
                }
                TopLevelGrammar::from_json_schema(with_options(&schema)?)
            }
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(with_options(&json!({"type": "object"}))?)
            }
            Constraint::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Constraint::Choice(choices) => TopLevelGrammar::from_lark(choice_lark(choices)?),
            Constraint::Lark(lark) | Constraint::ToolCall(lark) => {
                TopLevelGrammar::from_lark(lark.clone())
            }
            Constraint::Gbnf(gbnf) => {
                TopLevelGrammar::from_lark(gbnf_to_lark(gbnf).map_err(|err| err.to_string())?)
            }
        })
    }
}

/// `schema` with Peregrine's JSON writing options where it sets none of its own. A boolean
/// schema becomes its object form (`true`: any JSON value).
fn with_options(schema: &Value) -> Result<Value, String> {
    let mut schema = match schema {
        Value::Bool(true) => json!({}),
        Value::Bool(false) => return Err("the schema `false` matches nothing".into()),
        Value::Object(_) => schema.clone(),
        other => {
            return Err(format!(
                "a JSON schema must be an object or a boolean, got {}",
                kind_of(other)
            ))
        }
    };
    if let Some(fields) = schema.as_object_mut() {
        fields.entry("x-guidance").or_insert_with(json_options);
    }
    Ok(schema)
}

/// A JSON value's kind, in words.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The Lark grammar of a choice: one quoted literal per choice.
fn choice_lark(choices: &[String]) -> Result<String, String> {
    if choices.is_empty() {
        return Err("the list of choices is empty".into());
    }
    let literals: Vec<String> = choices.iter().map(|choice| lark_literal(choice)).collect();
    Ok(format!("start: {}", literals.join(" | ")))
}

/// `text` as a Lark string literal: JSON's quoting, which Lark's lexer reads, with DEL
/// escaped too (JSON leaves it raw; Lark's lexer refuses it).
pub fn lark_literal(text: &str) -> String {
    Value::from(text).to_string().replace('\u{7f}', "\\u007f")
}

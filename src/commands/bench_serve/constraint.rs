//! The kind of constrained output a request asks for, read from the fields the server
//! reads it from, so that the report can count constrained requests by kind.

use serde_json::{Map, Value};

/// One kind of constrained output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Constraint {
    /// Output matching a JSON schema.
    JsonSchema,
    /// Any JSON object.
    JsonObject,
    /// Output matching a regular expression.
    Regex,
    /// One of a list of strings.
    Choice,
    /// Output matching a grammar.
    Grammar,
    /// Tool calls, with tools offered and `tool_choice` not `"none"`.
    Tools,
}

impl Constraint {
    /// Every kind, in the report's order.
    pub const ALL: [Self; 6] = [
        Self::JsonSchema,
        Self::JsonObject,
        Self::Regex,
        Self::Choice,
        Self::Grammar,
        Self::Tools,
    ];

    /// The kind's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::JsonSchema => "json_schema",
            Self::JsonObject => "json_object",
            Self::Regex => "regex",
            Self::Choice => "choice",
            Self::Grammar => "grammar",
            Self::Tools => "tools",
        }
    }

    /// The kind a request's body fields ask for: tool calling when tools are offered
    /// (it shapes the output whatever else is set), else the kind of the output
    /// constraint field that is set (the server takes at most one), else `None`.
    pub fn of(fields: &Map<String, Value>) -> Option<Self> {
        let tools = fields
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|tools| !tools.is_empty());
        if tools && fields.get("tool_choice").and_then(Value::as_str) != Some("none") {
            return Some(Self::Tools);
        }
        fields
            .iter()
            .find_map(|(name, value)| field_kind(name, value))
    }
}

/// The kind one top-level field asks for, as the server reads it; `None` for a field
/// that constrains nothing (`response_format` of type `text`, an empty grammar).
fn field_kind(name: &str, value: &Value) -> Option<Constraint> {
    if value.is_null() {
        return None;
    }
    match name {
        "response_format" => match value["type"].as_str()? {
            "json_schema" => Some(Constraint::JsonSchema),
            // llama.cpp's `{"type": "json_object", "schema": ...}` is a schema.
            "json_object" if value["schema"].is_null() => Some(Constraint::JsonObject),
            "json_object" => Some(Constraint::JsonSchema),
            _ => None,
        },
        "structured_outputs" => value
            .as_object()?
            .iter()
            .find_map(|(key, value)| structured_outputs_kind(key, value)),
        "guided_json" | "json_schema" => Some(Constraint::JsonSchema),
        "guided_regex" => Some(Constraint::Regex),
        "guided_choice" => Some(Constraint::Choice),
        "guided_grammar" => Some(Constraint::Grammar),
        "grammar" => (value.as_str() != Some("")).then_some(Constraint::Grammar),
        _ => None,
    }
}

/// The kind one key of vLLM's `structured_outputs` asks for.
fn structured_outputs_kind(key: &str, value: &Value) -> Option<Constraint> {
    match key {
        _ if value.is_null() => None,
        "json" => Some(Constraint::JsonSchema),
        "json_object" => (value.as_bool() == Some(true)).then_some(Constraint::JsonObject),
        "regex" => Some(Constraint::Regex),
        "choice" => Some(Constraint::Choice),
        "grammar" => Some(Constraint::Grammar),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kind(fields: Value) -> Option<Constraint> {
        Constraint::of(fields.as_object().unwrap())
    }

    #[test]
    fn every_spelling_has_its_kind() {
        let schema = json!({"type": "object"});
        for (fields, want) in [
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}),
                Constraint::JsonSchema,
            ),
            (
                json!({"response_format": {"type": "json_object"}}),
                Constraint::JsonObject,
            ),
            (
                json!({"response_format": {"type": "json_object", "schema": schema}}),
                Constraint::JsonSchema,
            ),
            (
                json!({"structured_outputs": {"json": schema, "backend": "x"}}),
                Constraint::JsonSchema,
            ),
            (
                json!({"structured_outputs": {"json_object": true}}),
                Constraint::JsonObject,
            ),
            (
                json!({"structured_outputs": {"regex": "[0-9]+"}}),
                Constraint::Regex,
            ),
            (
                json!({"structured_outputs": {"choice": ["a", "b"]}}),
                Constraint::Choice,
            ),
            (
                json!({"structured_outputs": {"grammar": "root ::= \"a\""}}),
                Constraint::Grammar,
            ),
            (json!({"guided_json": schema}), Constraint::JsonSchema),
            (json!({"guided_regex": "a+"}), Constraint::Regex),
            (json!({"guided_choice": ["yes", "no"]}), Constraint::Choice),
            (json!({"guided_grammar": "root ::= x"}), Constraint::Grammar),
            (json!({"json_schema": schema}), Constraint::JsonSchema),
            (json!({"grammar": "root ::= \"a\""}), Constraint::Grammar),
            (
                json!({"tools": [{"type": "function"}], "tool_choice": "auto", "temperature": 1}),
                Constraint::Tools,
            ),
            (
                json!({"tools": [{"type": "function"}], "response_format": {"type": "json_object"}}),
                Constraint::Tools,
            ),
        ] {
            assert_eq!(kind(fields.clone()), Some(want), "{fields}");
        }
    }

    #[test]
    fn fields_that_constrain_nothing() {
        for fields in [
            json!({}),
            json!({"temperature": 0.7}),
            json!({"response_format": {"type": "text"}}),
            json!({"structured_outputs": {"json_object": false, "backend": "x"}}),
            json!({"grammar": ""}),
            json!({"guided_regex": null}),
            json!({"tools": []}),
            json!({"tools": [{"type": "function"}], "tool_choice": "none"}),
        ] {
            assert_eq!(kind(fields.clone()), None, "{fields}");
        }
        let names: Vec<&str> = Constraint::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "json_schema",
                "json_object",
                "regex",
                "choice",
                "grammar",
                "tools"
            ]
        );
    }
}

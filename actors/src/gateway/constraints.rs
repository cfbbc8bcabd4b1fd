//! The output constraint a generation request asks for, in any of the spellings clients
//! send: OpenAI's `response_format`, vLLM's `structured_outputs` and its older `guided_*`
//! fields, llama.cpp's `json_schema` and `grammar` (GBNF), SGLang's `regex` and `ebnf`.
//! One request has at most one; each error is a 400 naming the field at fault.

use peregrine_structured::Constraint;
use serde_json::{Map, Value};

use super::errors::ApiError;

/// A request's constraint and the field that asked for it (for errors found later, when
/// it is compiled).
#[derive(Clone, Debug, PartialEq)]
pub struct Requested {
    /// The field's path, like `response_format.json_schema.schema`.
    pub param: String,
    /// What the output must match.
    pub constraint: Constraint,
}

/// The constraint `body` asks for, if any.
pub fn requested(body: &Value) -> Result<Option<Requested>, ApiError> {
    let Some(fields) = body.as_object() else {
        return Ok(None);
    };
    let readers: [(&str, Reader); 10] = [
        ("response_format", response_format),
        ("structured_outputs", structured_outputs),
        ("guided_json", |v, p| json_schema(v, p).map(Some)),
        ("guided_regex", |v, p| {
            text(v, p).map(|t| Some(Constraint::Regex(t)))
        }),
        ("guided_choice", |v, p| choice(v, p).map(Some)),
        ("guided_grammar", |v, p| grammar(v, p).map(Some)),
        ("json_schema", |v, p| json_schema(v, p).map(Some)),
        ("grammar", gbnf_field),
        ("regex", |v, p| {
            text(v, p).map(|t| Some(Constraint::Regex(t)))
        }),
        ("ebnf", |v, p| text(v, p).map(|t| Some(Constraint::Gbnf(t)))),
    ];
    let mut found: Option<Requested> = None;
    for (field, read) in readers {
        let Some(value) = fields.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let Some(constraint) = read(value, field)? else {
            continue;
        };
        if let Some(first) = &found {
            return Err(ApiError::invalid(
                field,
                format!(
                    "a request takes one output constraint, but `{}` and `{field}` were both \
                     given",
                    first.param.split('.').next().unwrap_or(&first.param)
                ),
            ));
        }
        found = Some(Requested {
            param: param_of(field, &constraint),
            constraint,
        });
    }
    refuse_options(fields)?;
    Ok(found)
}

/// Reads one field's value (its name given for errors): `None` when the value asks for
/// nothing (`{"type": "text"}`, an empty GBNF grammar).
type Reader = fn(&Value, &str) -> Result<Option<Constraint>, ApiError>;

/// The path of the value that holds `constraint`'s text inside `field`, for errors.
fn param_of(field: &str, constraint: &Constraint) -> String {
    match (field, constraint) {
        ("response_format", Constraint::JsonSchema(_)) => {
            "response_format.json_schema.schema".into()
        }
        ("structured_outputs", constraint) => {
            let key = match constraint {
                Constraint::JsonSchema(_) => "json",
                Constraint::JsonObject => "json_object",
                Constraint::Regex(_) => "regex",
                Constraint::Choice(_) => "choice",
                _ => "grammar",
            };
            format!("structured_outputs.{key}")
        }
        (field, _) => field.into(),
    }
}

/// Options of the `guided_*` family that would change the output and are not honoured.
fn refuse_options(fields: &Map<String, Value>) -> Result<(), ApiError> {
    if let Some(pattern) = fields
        .get("guided_whitespace_pattern")
        .filter(|v| !v.is_null())
    {
        return Err(ApiError::invalid(
            "guided_whitespace_pattern",
            format!(
                "`guided_whitespace_pattern` = {pattern} is not supported: JSON is written \
                 with \", \" and \": \" and no other whitespace; leave it out"
            ),
        ));
    }
    Ok(())
}

/// OpenAI's `response_format` (and llama.cpp's `{"type": "json_object", "schema": ...}`).
fn response_format(value: &Value, field: &str) -> Result<Option<Constraint>, ApiError> {
    let format = object(value, field)?;
    let kind = format.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            format!("{field}.type"),
            "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\"",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => match format.get("schema").filter(|s| !s.is_null()) {
            Some(schema) => json_schema(schema, &format!("{field}.schema")).map(Some),
            None => Ok(Some(Constraint::JsonObject)),
        },
        "json_schema" => {
            let param = format!("{field}.json_schema");
            let inner = format
                .get("json_schema")
                .ok_or_else(|| {
                    ApiError::invalid(
                        &param,
                        "`response_format` of type \"json_schema\" needs `json_schema`",
                    )
                })
                .and_then(|inner| object(inner, &param))?;
            if let Some(name) = inner.get("name") {
                let valid = name.as_str().is_some_and(|name| {
                    !name.is_empty()
                        && name.len() <= 64
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                });
                if !valid {
                    return Err(ApiError::invalid(
                        format!("{param}.name"),
                        "`json_schema.name` must be 1 to 64 letters, digits, `_` or `-`",
                    ));
                }
            }
            let schema = inner.get("schema").filter(|s| !s.is_null());
            match schema {
                Some(schema) => json_schema(schema, &format!("{param}.schema")).map(Some),
                None => Ok(Some(Constraint::JsonSchema(Value::Object(Map::new())))),
            }
        }
        other => Err(ApiError::invalid(
            format!("{field}.type"),
            format!(
                "`response_format.type` = {other:?} is not supported: send \"text\", \
                 \"json_object\" or \"json_schema\""
            ),
        )),
    }
}

/// vLLM's `structured_outputs`: exactly one of `json`, `regex`, `choice`, `grammar` and
/// `json_object`, and the options that change nothing here.
fn structured_outputs(value: &Value, field: &str) -> Result<Option<Constraint>, ApiError> {
    let params = object(value, field)?;
    let mut found: Option<(&str, Constraint)> = None;
    for (key, value) in params {
        let param = format!("{field}.{key}");
        if value.is_null() {
            continue;
        }
        let constraint = match key.as_str() {
            "json" => json_schema(value, &param)?,
            "regex" => Constraint::Regex(text(value, &param)?),
            "choice" => choice(value, &param)?,
            "grammar" => grammar(value, &param)?,
            "json_object" => match value.as_bool() {
                Some(true) => Constraint::JsonObject,
                Some(false) => continue,
                None => return Err(ApiError::invalid(param, "`json_object` must be a boolean")),
            },
            // The backend choice and its fallback: one backend serves every constraint.
            "backend" | "disable_fallback" => continue,
            // JSON is never written with free whitespace.
            "disable_any_whitespace" if value == &Value::Bool(true) => continue,
            other => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "`structured_outputs.{other}` = {value} is not supported: send one of \
                         `json`, `regex`, `choice`, `grammar` or `json_object`"
                    ),
                ))
            }
        };
        if let Some((first, _)) = &found {
            return Err(ApiError::invalid(
                param,
                format!("`structured_outputs` takes one constraint, got `{first}` and `{key}`"),
            ));
        }
        found = Some((key.as_str(), constraint));
    }
    Ok(found.map(|(_, constraint)| constraint))
}

/// llama.cpp's `grammar`: a GBNF grammar, or nothing when empty.
fn gbnf_field(value: &Value, field: &str) -> Result<Option<Constraint>, ApiError> {
    let grammar = text(value, field)?;
    Ok((!grammar.trim().is_empty()).then_some(Constraint::Gbnf(grammar)))
}

/// A grammar of vLLM's fields: GBNF/EBNF where it has `::=` rules, else Lark.
fn grammar(value: &Value, param: &str) -> Result<Constraint, ApiError> {
    let grammar = text(value, param)?;
    if grammar.trim().is_empty() {
        return Err(ApiError::invalid(param, "the grammar is empty"));
    }
    Ok(match grammar.contains("::=") {
        true => Constraint::Gbnf(grammar),
        false => Constraint::Lark(grammar),
    })
}

/// A JSON schema: an object or a boolean, or a string holding one (SGLang sends strings).
fn json_schema(value: &Value, param: &str) -> Result<Constraint, ApiError> {
    let schema = match value {
        Value::String(text) => serde_json::from_str(text).map_err(|err| {
            ApiError::invalid(param, format!("the JSON schema is not valid JSON: {err}"))
        })?,
        other => other.clone(),
    };
    match schema {
        Value::Object(_) | Value::Bool(_) => Ok(Constraint::JsonSchema(schema)),
        _ => Err(ApiError::invalid(
            param,
            "a JSON schema must be an object (or a boolean)",
        )),
    }
}

/// A list of strings to choose from.
fn choice(value: &Value, param: &str) -> Result<Constraint, ApiError> {
    let choices = value
        .as_array()
        .ok_or_else(|| ApiError::invalid(param, "the choices must be a list of strings"))?;
    let choices = choices
        .iter()
        .enumerate()
        .map(|(at, choice)| {
            choice.as_str().map(str::to_owned).ok_or_else(|| {
                ApiError::invalid(format!("{param}[{at}]"), "each choice must be a string")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if choices.is_empty() {
        return Err(ApiError::invalid(param, "the list of choices is empty"));
    }
    Ok(Constraint::Choice(choices))
}

/// A string field.
fn text(value: &Value, param: &str) -> Result<String, ApiError> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| ApiError::invalid(param, format!("`{param}` must be a string")))
}

/// An object field.
fn object<'a>(value: &'a Value, param: &str) -> Result<&'a Map<String, Value>, ApiError> {
    value
        .as_object()
        .ok_or_else(|| ApiError::invalid(param, format!("`{param}` must be an object")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<Option<Requested>, ApiError> {
        requested(&body)
    }

    fn constraint(body: Value) -> Constraint {
        read(body).unwrap().unwrap().constraint
    }

    #[test]
    fn every_spelling_is_read() {
        let schema = json!({"type": "object"});
        let cases = [
            (
                json!({"response_format": {"type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
                Constraint::JsonSchema(schema.clone()),
            ),
            (
                json!({"response_format": {"type": "json_object"}}),
                Constraint::JsonObject,
            ),
            (
                json!({"response_format": {"type": "json_object", "schema": schema}}),
                Constraint::JsonSchema(schema.clone()),
            ),
            (
                json!({"structured_outputs": {"json": schema.to_string()}}),
                Constraint::JsonSchema(schema.clone()),
            ),
            (
                json!({"structured_outputs": {"regex": "a+", "disable_fallback": true}}),
                Constraint::Regex("a+".into()),
            ),
            (
                json!({"structured_outputs": {"choice": ["a", "b"]}}),
                Constraint::Choice(vec!["a".into(), "b".into()]),
            ),
            (
                json!({"structured_outputs": {"grammar": "start: \"a\""}}),
                Constraint::Lark("start: \"a\"".into()),
            ),
            (
                json!({"structured_outputs": {"json_object": true}}),
                Constraint::JsonObject,
            ),
            (
                json!({"guided_json": schema}),
                Constraint::JsonSchema(schema.clone()),
            ),
            (json!({"guided_regex": "x"}), Constraint::Regex("x".into())),
            (
                json!({"guided_choice": ["y"]}),
                Constraint::Choice(vec!["y".into()]),
            ),
            (
                json!({"guided_grammar": "root ::= \"a\""}),
                Constraint::Gbnf("root ::= \"a\"".into()),
            ),
            (
                json!({"json_schema": schema}),
                Constraint::JsonSchema(schema.clone()),
            ),
            (
                json!({"grammar": "root ::= \"a\""}),
                Constraint::Gbnf("root ::= \"a\"".into()),
            ),
            (json!({"regex": "z"}), Constraint::Regex("z".into())),
            (
                json!({"ebnf": "root ::= \"b\""}),
                Constraint::Gbnf("root ::= \"b\"".into()),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(constraint(body.clone()), want, "{body}");
        }
    }

    #[test]
    fn neutral_values_ask_for_nothing() {
        for body in [
            json!({}),
            json!({"response_format": {"type": "text"}}),
            json!({"grammar": ""}),
            json!({"guided_json": null, "structured_outputs": null}),
            json!({"structured_outputs": {"json_object": false}}),
        ] {
            assert_eq!(read(body.clone()).unwrap(), None, "{body}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                json!({"response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (json!({"response_format": {}}), "response_format.type"),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"response_format": {"type": "json_schema",
                    "json_schema": {"name": "a", "schema": [1]}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
                "structured_outputs.choice",
            ),
            (
                json!({"structured_outputs": {"structural_tag": "{}"}}),
                "structured_outputs.structural_tag",
            ),
            (json!({"guided_choice": []}), "guided_choice"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice[1]"),
            (json!({"guided_json": "{"}), "guided_json"),
            (json!({"guided_regex": 3}), "guided_regex"),
            (json!({"guided_grammar": " "}), "guided_grammar"),
            (
                json!({"guided_regex": "a", "response_format": {"type": "json_object"}}),
                "guided_regex",
            ),
            (
                json!({"guided_json": {}, "guided_whitespace_pattern": " "}),
                "guided_whitespace_pattern",
            ),
        ];
        for (body, param) in cases {
            let err = read(body.clone()).unwrap_err();
            assert_eq!(
                (err.status().as_u16(), err.param()),
                (400, Some(param)),
                "{body}: {}",
                err.message()
            );
        }
    }

    #[test]
    fn the_param_points_at_the_constraint_text() {
        let found = read(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "a", "schema": {"type": "object"}}}}))
        .unwrap()
        .unwrap();
        assert_eq!(found.param, "response_format.json_schema.schema");
        let found = read(json!({"structured_outputs": {"choice": ["a"]}}))
            .unwrap()
            .unwrap();
        assert_eq!(found.param, "structured_outputs.choice");
    }
}

//! The lines of a JSONL dataset: a prompt or a chat, the output length, and the fields
//! that constrain or shape the output, kept as given to be sent on unchanged.

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::{Map, Number, Value};
use std::path::Path;

/// What a line asks the model to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A completion prompt (`prompt`).
    Text(String),
    /// Chat messages (`messages`), as given.
    Chat(Vec<Value>),
}

/// One dataset line, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The line's 1-based number in the file.
    pub number: usize,
    /// The prompt or the chat.
    pub input: Input,
    /// The `max_tokens` to send.
    pub max_tokens: usize,
    /// Whether to ask the server to keep generating past end-of-sequence.
    pub ignore_eos: bool,
    /// The fields that constrain or shape the output (`temperature`, `response_format`,
    /// `tools`, ...) that the line sets, by name, as given.
    pub fields: Map<String, Value>,
}

/// A line as written. Unknown fields are refused, so that a misspelt one is not
/// silently dropped; `null` counts as absent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    prompt: Option<String>,
    messages: Option<Vec<Value>>,
    max_tokens: Option<usize>,
    ignore_eos: Option<bool>,
    temperature: Option<Number>,
    response_format: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<Value>,
    structured_outputs: Option<Value>,
    guided_json: Option<Value>,
    guided_regex: Option<Value>,
    guided_choice: Option<Value>,
    guided_grammar: Option<Value>,
    json_schema: Option<Value>,
    grammar: Option<Value>,
}

/// Reads a JSONL dataset. Lines without `max_tokens` get `default_max_tokens`; the model
/// may stop early at end-of-sequence unless the line sets `ignore_eos`. Blank lines are
/// skipped; an error names the file and the line.
pub fn load(path: &Path, default_max_tokens: usize) -> anyhow::Result<Vec<Line>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the dataset {}", path.display()))?;
    parse(&text, default_max_tokens).with_context(|| format!("in the dataset {}", path.display()))
}

/// Parses JSONL text; an error names the line.
pub fn parse(text: &str, default_max_tokens: usize) -> anyhow::Result<Vec<Line>> {
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if !line.trim().is_empty() {
            lines.push(parse_line(line, index + 1, default_max_tokens)?);
        }
    }
    if lines.is_empty() {
        bail!("no prompts (the file is empty)");
    }
    Ok(lines)
}

/// Parses line `number`.
fn parse_line(line: &str, number: usize, default_max_tokens: usize) -> anyhow::Result<Line> {
    let written: Written = match serde_json::from_str(line) {
        Ok(written) => written,
        Err(e) => {
            // serde's own "at line 1 column N" would clash with the file's line number.
            let reason = e.to_string();
            let reason = reason
                .rsplit_once(" at line ")
                .map_or(reason.as_str(), |(r, _)| r);
            bail!(
                "line {number}, column {}: not a dataset line: {reason}",
                e.column()
            )
        }
    };
    let Written {
        prompt,
        messages,
        max_tokens,
        ignore_eos,
        temperature,
        response_format,
        tools,
        tool_choice,
        parallel_tool_calls,
        structured_outputs,
        guided_json,
        guided_regex,
        guided_choice,
        guided_grammar,
        json_schema,
        grammar,
    } = written;
    let input = match (prompt, messages) {
        (Some(prompt), None) => Input::Text(prompt),
        (None, Some(messages)) => Input::Chat(messages),
        (Some(_), Some(_)) => bail!("line {number}: has both \"prompt\" and \"messages\""),
        (None, None) => bail!("line {number}: needs \"prompt\" or \"messages\""),
    };
    let max_tokens = max_tokens.unwrap_or(default_max_tokens);
    if max_tokens == 0 {
        bail!("line {number}: max_tokens must be at least 1");
    }
    let shaping = [
        ("temperature", temperature.map(Value::Number)),
        ("response_format", response_format),
        ("tools", tools),
        ("tool_choice", tool_choice),
        ("parallel_tool_calls", parallel_tool_calls),
        ("structured_outputs", structured_outputs),
        ("guided_json", guided_json),
        ("guided_regex", guided_regex),
        ("guided_choice", guided_choice),
        ("guided_grammar", guided_grammar),
        ("json_schema", json_schema),
        ("grammar", grammar),
    ];
    let fields = shaping
        .into_iter()
        .filter_map(|(name, value)| Some((name.to_owned(), value?)))
        .collect();
    Ok(Line {
        number,
        input,
        max_tokens,
        ignore_eos: ignore_eos.unwrap_or(false),
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn error(text: &str) -> String {
        format!("{:#}", parse(text, 9).unwrap_err())
    }

    #[test]
    fn prompts_chats_and_shaping_fields() {
        let text = "{\"prompt\": \"hello there\", \"max_tokens\": 5, \"ignore_eos\": true}\n\n\
                    {\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": 0.5, \
                     \"response_format\": {\"type\": \"json_object\"}, \"guided_regex\": null}\n\
                    {\"prompt\": \"x\", \"tools\": [], \"tool_choice\": \"auto\", \
                     \"parallel_tool_calls\": false, \"guided_choice\": [\"a\"]}\n";
        let lines = parse(text, 9).unwrap();
        assert_eq!(lines.len(), 3);
        let first = &lines[0];
        assert_eq!(first.input, Input::Text("hello there".into()));
        assert_eq!(
            (first.number, first.max_tokens, first.ignore_eos),
            (1, 5, true)
        );
        assert!(first.fields.is_empty());
        let chat = &lines[1];
        assert_eq!(
            chat.input,
            Input::Chat(vec![json!({"role": "user", "content": "hi"})])
        );
        assert_eq!(
            (chat.number, chat.max_tokens, chat.ignore_eos),
            (3, 9, false)
        );
        assert_eq!(
            Value::Object(chat.fields.clone()),
            json!({"temperature": 0.5, "response_format": {"type": "json_object"}})
        );
        assert_eq!(
            Value::Object(lines[2].fields.clone()),
            json!({"tools": [], "tool_choice": "auto", "parallel_tool_calls": false, "guided_choice": ["a"]})
        );
    }

    #[test]
    fn every_shaping_field_is_kept() {
        let fields = json!({
            "temperature": 1, "response_format": {"type": "text"}, "tools": [{"type": "function"}],
            "tool_choice": "required", "parallel_tool_calls": true,
            "structured_outputs": {"regex": "a"}, "guided_json": {}, "guided_regex": "b",
            "guided_choice": ["c"], "guided_grammar": "root ::= x", "json_schema": {},
            "grammar": "root ::= y"
        });
        let mut line = fields.clone();
        line["prompt"] = json!("p");
        let parsed = parse(&line.to_string(), 9).unwrap();
        assert_eq!(Value::Object(parsed[0].fields.clone()), fields);
    }

    #[test]
    fn bad_lines_are_named() {
        let e = error("{\"prompt\": \"ok\"}\n{\"prompt\": 3}\n");
        assert!(
            e.starts_with("line 2, column 12: not a dataset line"),
            "{e}"
        );
        assert!(e.ends_with("expected a string"), "{e}");
        let e = error("{\"prompt\": \"ok\"}\n\n{\"prompt\": \"a\", \"respose_format\": {}}\n");
        assert!(
            e.starts_with("line 3, column 32: not a dataset line: unknown field")
                && e.contains("`respose_format`, expected one of `prompt`, `messages`"),
            "{e}"
        );
        let e = error("{\"prompt\": \"a\", \"temperature\": \"hot\"}");
        assert!(e.starts_with("line 1, column 36:"), "{e}");
        let e = error("{\"messages\": {\"role\": \"user\"}}");
        assert!(e.contains("expected a sequence"), "{e}");
        assert_eq!(
            error("{\"prompt\": \"a\", \"max_tokens\": 0}"),
            "line 1: max_tokens must be at least 1"
        );
        assert_eq!(
            error("{\"prompt\": \"a\", \"messages\": []}"),
            "line 1: has both \"prompt\" and \"messages\""
        );
        assert_eq!(
            error("{\"max_tokens\": 3}"),
            "line 1: needs \"prompt\" or \"messages\""
        );
        assert_eq!(error("\n\n"), "no prompts (the file is empty)");
        assert!(error("{\"prompt\": \"a\"").starts_with("line 1, column 14:"));
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        std::fs::write(&path, "{\"prompt\": \"a\"}\n{\"prompt\": 1}\n").unwrap();
        let e = format!("{:#}", load(&path, 4).unwrap_err());
        assert!(
            e.starts_with(&format!("in the dataset {}: line 2", path.display())),
            "{e}"
        );
        let missing = format!("{:#}", load(&dir.path().join("none"), 4).unwrap_err());
        assert!(missing.contains("cannot read the dataset"), "{missing}");
    }
}

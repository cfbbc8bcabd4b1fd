//! One benchmark request as it will be sent: the endpoint, the body, the prompt length
//! estimate and the kind of constrained output the report counts it under.

use super::constraint::Constraint;
use super::dataset::{Input, Line};
use super::prompts::Prompt;
use serde_json::{json, Map, Value};

/// The generation endpoint a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

impl Endpoint {
    /// The endpoint's path.
    pub fn path(self) -> &'static str {
        match self {
            Self::Completions => "/v1/completions",
            Self::Chat => "/v1/chat/completions",
        }
    }
}

/// One request of the benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Where it goes.
    pub endpoint: Endpoint,
    /// The body, less `model` and the streaming fields that every request shares.
    pub body: Map<String, Value>,
    /// The prompt length in tokens as estimated here (one per word); used only when
    /// the server reports no usage.
    pub approx_tokens: usize,
    /// The kind of constrained output it asks for, if any.
    pub constraint: Option<Constraint>,
}

impl Job {
    /// A greedy completion of a random prompt.
    pub fn from_prompt(prompt: &Prompt) -> Self {
        let text = json!(prompt.text);
        Self {
            endpoint: Endpoint::Completions,
            body: greedy_body("prompt", text, prompt.max_tokens, prompt.ignore_eos),
            approx_tokens: prompt.approx_tokens,
            constraint: None,
        }
    }

    /// The request a dataset line describes: a chat when it has `messages` or `tools`
    /// (a `prompt` then becomes one user message), a completion otherwise; greedy
    /// unless the line sets `temperature`, and with its shaping fields as given.
    pub fn from_line(line: Line) -> Self {
        let chat = matches!(line.input, Input::Chat(_)) || line.fields.contains_key("tools");
        let (endpoint, input, value, approx_tokens) = match line.input {
            Input::Text(text) if chat => (
                Endpoint::Chat,
                "messages",
                json!([{"role": "user", "content": text}]),
                words(&text),
            ),
            Input::Text(text) => (Endpoint::Completions, "prompt", json!(text), words(&text)),
            Input::Chat(messages) => {
                let approx = messages.iter().map(|m| content_words(&m["content"])).sum();
                (Endpoint::Chat, "messages", json!(messages), approx)
            }
        };
        let mut body = greedy_body(input, value, line.max_tokens, line.ignore_eos);
        let constraint = Constraint::of(&line.fields);
        body.extend(line.fields);
        Self {
            endpoint,
            body,
            approx_tokens,
            constraint,
        }
    }
}

/// A body of the input field (`prompt` or `messages`), the output length, and greedy
/// sampling.
fn greedy_body(
    input: &str,
    value: Value,
    max_tokens: usize,
    ignore_eos: bool,
) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert(input.into(), value);
    body.insert("max_tokens".into(), json!(max_tokens));
    body.insert("ignore_eos".into(), json!(ignore_eos));
    body.insert("temperature".into(), json!(0));
    body
}

/// The words of `text`, the estimate of its tokens.
fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// The words of a chat message's content: a string, or the text of its parts.
fn content_words(content: &Value) -> usize {
    match content {
        Value::String(text) => words(text),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part["text"].as_str())
            .map(words)
            .sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::bench_serve::dataset::parse;

    fn job(line: Value) -> Job {
        let mut lines = parse(&line.to_string(), 7).unwrap();
        Job::from_line(lines.remove(0))
    }

    #[test]
    fn random_prompts_are_greedy_completions() {
        let prompt = Prompt {
            text: "a b c".into(),
            max_tokens: 4,
            ignore_eos: true,
            approx_tokens: 3,
        };
        let job = Job::from_prompt(&prompt);
        assert_eq!(job.endpoint, Endpoint::Completions);
        assert_eq!(
            Value::Object(job.body),
            json!({"prompt": "a b c", "max_tokens": 4, "ignore_eos": true, "temperature": 0})
        );
        assert_eq!((job.approx_tokens, job.constraint), (3, None));
    }

    #[test]
    fn completion_lines_keep_their_constraint() {
        let job =
            job(json!({"prompt": "one two", "guided_choice": ["yes", "no"], "max_tokens": 2}));
        assert_eq!(job.endpoint.path(), "/v1/completions");
        assert_eq!(
            Value::Object(job.body),
            json!({"prompt": "one two", "max_tokens": 2, "ignore_eos": false, "temperature": 0,
                   "guided_choice": ["yes", "no"]})
        );
        assert_eq!(
            (job.approx_tokens, job.constraint),
            (2, Some(Constraint::Choice))
        );
    }

    #[test]
    fn chat_lines_go_to_chat_completions() {
        let messages = json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "three word question"}]}
        ]);
        let format = json!({"type": "json_schema", "json_schema": {"name": "a", "schema": {}}});
        let job = job(json!({"messages": messages, "response_format": format, "temperature": 0.7}));
        assert_eq!(job.endpoint.path(), "/v1/chat/completions");
        assert_eq!(
            Value::Object(job.body),
            json!({"messages": messages, "max_tokens": 7, "ignore_eos": false,
                   "temperature": 0.7, "response_format": format})
        );
        assert_eq!(
            (job.approx_tokens, job.constraint),
            (5, Some(Constraint::JsonSchema))
        );
    }

    #[test]
    fn a_prompt_with_tools_becomes_a_user_message() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let job = job(
            json!({"prompt": "call f", "tools": tools, "tool_choice": "auto",
                             "parallel_tool_calls": false}),
        );
        assert_eq!(job.endpoint, Endpoint::Chat);
        assert_eq!(
            Value::Object(job.body),
            json!({"messages": [{"role": "user", "content": "call f"}], "max_tokens": 7,
                   "ignore_eos": false, "temperature": 0, "tools": tools,
                   "tool_choice": "auto", "parallel_tool_calls": false})
        );
        assert_eq!(
            (job.approx_tokens, job.constraint),
            (2, Some(Constraint::Tools))
        );
    }
}

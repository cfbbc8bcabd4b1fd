//! The answer of `/v1/messages` in Anthropic's shape: a whole message, whose text and
//! tool calls are content blocks, with Anthropic's stop reason and usage.

use peregrine_structured::tools::ToolCallFormat;
use serde::Serialize;
use serde_json::{json, Value};

use crate::gateway::generation::Output;
use crate::gateway::tool_output::{self, CallIds};

/// A message: the whole answer, or (empty, without a stop reason) the one a stream's
/// `message_start` announces.
#[derive(Debug, Serialize)]
pub struct MessageOut {
    /// `msg_…`.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    /// The served model's name.
    pub model: String,
    /// The text and the tool calls, in order.
    pub content: Vec<BlockOut>,
    /// Why the output ended; null in `message_start`.
    pub stop_reason: Option<&'static str>,
    /// The stop sequence that ended it, if one did.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: UsageOut,
}

/// One content block of the answer.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockOut {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call.
    ToolUse {
        /// `toolu_…`, which a `tool_result` answers.
        id: String,
        /// The tool called.
        name: String,
        /// Its arguments, an object.
        input: Value,
    },
}

/// Anthropic's `usage`: the prompt's tokens split into those computed (`input_tokens`)
/// and those read from the prefix cache, as Anthropic counts cache reads apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct UsageOut {
    /// Prompt tokens computed (not read from the cache).
    pub input_tokens: usize,
    /// Prompt tokens written to a cache on request: none (Peregrine caches every prompt's
    /// blocks without being asked).
    pub cache_creation_input_tokens: usize,
    /// Prompt tokens found in the prefix cache.
    pub cache_read_input_tokens: usize,
    /// Tokens generated.
    pub output_tokens: usize,
}

impl UsageOut {
    /// The usage a chat's `usage` reports in Anthropic's terms.
    pub fn of(usage: &super::super::protocol::response::UsageOut) -> UsageOut {
        let cached = usage
            .prompt_tokens_details
            .as_ref()
            .map_or(0, |d| d.cached_tokens)
            .min(usage.prompt_tokens);
        UsageOut {
            input_tokens: usage.prompt_tokens - cached,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
            output_tokens: usage.completion_tokens,
        }
    }
}

impl MessageOut {
    /// The message `id` before any output, its prompt `input_tokens` long.
    pub fn start(id: String, model: String, input_tokens: usize) -> MessageOut {
        MessageOut {
            id,
            kind: "message",
            role: "assistant",
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: UsageOut {
                input_tokens,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
                output_tokens: 0,
            },
        }
    }

    /// The whole answer of `output`, read for calls in `calls` (where the request asks
    /// for it) with ids from `ids`.
    pub fn whole(self, output: Output, calls: Option<ToolCallFormat>, ids: &CallIds) -> MessageOut {
        let (text, calls) = match calls {
            Some(format) => tool_output::whole(format, &output.text, ids),
            None => (Some(output.text), None),
        };
        let text = text.filter(|text| !text.is_empty());
        let calls = calls.unwrap_or_default();
        let stop_reason = stop_reason(
            output.reason,
            output.stop_string.as_deref(),
            !calls.is_empty(),
        );
        let mut content: Vec<BlockOut> = text
            .map(|text| BlockOut::Text { text })
            .into_iter()
            .collect();
        content.extend(calls.into_iter().map(|call| BlockOut::ToolUse {
            id: call.id,
            name: call.function.name,
            input: input(&call.function.arguments),
        }));
        MessageOut {
            content,
            stop_reason: Some(stop_reason),
            stop_sequence: output.stop_string,
            usage: UsageOut::of(&output.usage),
            ..self
        }
    }
}

/// A call's arguments as its `input` object: `{}` where they are not a whole object (the
/// output ended inside them, and `stop_reason` is `max_tokens`).
fn input(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// Anthropic's stop reason for a generation that ended for `reason` (`stop` or
/// `length`), at `stop_sequence` if one ended it, having made calls or not.
pub fn stop_reason(reason: &str, stop_sequence: Option<&str>, made_calls: bool) -> &'static str {
    match (reason, stop_sequence, made_calls) {
        ("length", _, _) => "max_tokens",
        (_, Some(_), _) => "stop_sequence",
        (_, None, true) => "tool_use",
        (_, None, false) => "end_turn",
    }
}

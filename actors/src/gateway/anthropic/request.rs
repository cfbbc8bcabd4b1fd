//! The body of `POST /v1/messages` as Anthropic's Messages API takes it. Fields it does not
//! know are ignored, as they change nothing (`metadata`, `cache_control`, `service_tier`);
//! the ones that would change the output and that Peregrine does not implement are refused
//! by name first ([`REFUSED`]).

use serde::Deserialize;
use serde_json::Value;

use crate::gateway::unsupported::{refused, Neutral, Refused};

/// The request body.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    /// The model asked for.
    pub model: String,
    /// The most tokens to generate (required, as Anthropic requires it).
    pub max_tokens: i64,
    /// The conversation so far, `user` and `assistant` turns.
    pub messages: Vec<InputMessage>,
    /// The system prompt: a string or text blocks.
    pub system: Option<Blocks>,
    /// Strings that end the output (not included in it).
    pub stop_sequences: Option<Vec<String>>,
    /// Divides the logits; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens.
    pub top_k: Option<i32>,
    /// Stream the output as Anthropic's server-sent events.
    pub stream: Option<bool>,
    /// The tools the model may call.
    pub tools: Option<Vec<ToolIn>>,
    /// What is asked of the tools.
    pub tool_choice: Option<ToolChoiceIn>,
}

/// One turn of the conversation.
#[derive(Debug, Deserialize)]
pub struct InputMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string or content blocks.
    pub content: Blocks,
}

/// Content: a string, or a list of blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Blocks {
    /// Plain text.
    Text(String),
    /// Typed blocks.
    List(Vec<Block>),
}

/// One content block, any of its types: `text`, `tool_use`, `tool_result` are served; the
/// fields a type does not have stay `None`.
#[derive(Debug, Deserialize)]
pub struct Block {
    /// The block's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// A `text` block's text.
    pub text: Option<String>,
    /// A `tool_use` block's id.
    pub id: Option<String>,
    /// A `tool_use` block's tool.
    pub name: Option<String>,
    /// A `tool_use` block's arguments, an object.
    pub input: Option<Value>,
    /// The `tool_use` a `tool_result` block answers.
    pub tool_use_id: Option<String>,
    /// A `tool_result` block's result: a string or text blocks.
    pub content: Option<Blocks>,
    /// Whether a `tool_result` reports that the tool failed.
    pub is_error: Option<bool>,
}

/// One tool: a custom tool, described by its input's JSON schema.
#[derive(Debug, Deserialize)]
pub struct ToolIn {
    /// `custom` or absent; Anthropic's own tools (`bash_…`, `web_search_…`) are refused.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// The JSON schema of its input (required for a custom tool).
    pub input_schema: Option<Value>,
}

/// `tool_choice`.
#[derive(Debug, Deserialize)]
pub struct ToolChoiceIn {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool a `tool` choice forces.
    pub name: Option<String>,
    /// At most one call.
    pub disable_parallel_tool_use: Option<bool>,
}

/// The Messages API's fields that would change the output and that Peregrine does not
/// implement.
pub const REFUSED: &[Refused] = &[
    refused("thinking", Neutral::Kind("disabled"), "extended thinking"),
    refused(
        "output_format",
        Neutral::Null,
        "structured outputs on /v1/messages (/v1/chat/completions serves them)",
    ),
    refused(
        "output_config",
        Neutral::Empty,
        "output effort or format settings",
    ),
    refused("mcp_servers", Neutral::Empty, "MCP server tools"),
    refused("container", Neutral::Null, "code-execution containers"),
    refused(
        "context_management",
        Neutral::Null,
        "edits of the context by the server",
    ),
];

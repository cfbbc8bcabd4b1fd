//! The Responses API's bodies as OpenAI defines them: the response object, its output items
//! and usage, and the typed events of a stream.

use serde::Serialize;
use serde_json::Value;

use crate::gateway::protocol::response::UsageOut;

/// A response: `status` `in_progress` while streaming, then `completed`, `incomplete`
/// (the output limit was reached) or `failed`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResponseObject {
    /// `resp_…`.
    pub id: String,
    /// Always `response`.
    pub object: &'static str,
    /// Unix time the request arrived.
    pub created_at: u64,
    /// Where the response stands.
    pub status: &'static str,
    /// Why a failed response failed.
    pub error: Option<ResponseError>,
    /// Why an incomplete response stopped.
    pub incomplete_details: Option<IncompleteDetails>,
    /// The served model's name.
    pub model: String,
    /// The messages and calls, in order.
    pub output: Vec<OutputItem>,
    /// Token counts, once finished.
    pub usage: Option<ResponseUsage>,
    /// The request's parameters, repeated.
    #[serde(flatten)]
    pub echo: Echo,
    /// The state it keeps: none.
    #[serde(flatten)]
    pub stateless: Stateless,
}

impl ResponseObject {
    /// The response of a request that has only begun.
    pub fn started(id: String, created_at: u64, model: String, echo: Echo) -> Self {
        Self {
            id,
            object: "response",
            created_at,
            status: "in_progress",
            error: None,
            incomplete_details: None,
            model,
            output: Vec::new(),
            usage: None,
            echo,
            stateless: STATELESS,
        }
    }

    /// This response finished with `output`, ended for `reason` (`stop` or `length`).
    pub fn finished(&self, output: Vec<OutputItem>, reason: &str, usage: UsageOut) -> Self {
        let complete = reason != "length";
        Self {
            status: item_status(complete),
            incomplete_details: (!complete).then_some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
            output,
            usage: Some(ResponseUsage::from(usage)),
            ..self.clone()
        }
    }

    /// This response failed with `message`, after `output`.
    pub fn failed(&self, output: Vec<OutputItem>, message: &str) -> Self {
        Self {
            status: "failed",
            error: Some(ResponseError {
                code: "server_error",
                message: message.to_owned(),
            }),
            output,
            ..self.clone()
        }
    }
}

/// The status of a finished item or response: `completed`, else `incomplete`.
pub fn item_status(complete: bool) -> &'static str {
    match complete {
        true => "completed",
        false => "incomplete",
    }
}

/// The parameters a response repeats from its request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Echo {
    /// The system message, as sent.
    pub instructions: Value,
    /// The client's key-value pairs (`{}` when none).
    pub metadata: Value,
    /// Whether several calls may be made at once.
    pub parallel_tool_calls: bool,
    /// As sent, or null.
    pub temperature: Value,
    /// As sent, or null.
    pub top_p: Value,
    /// As sent, `auto` by default.
    pub tool_choice: Value,
    /// The function tools, as sent.
    pub tools: Vec<Value>,
    /// As sent, or null.
    pub max_output_tokens: Value,
    /// The text format, `{"format": {"type": "text"}}` by default.
    pub text: Value,
    /// As sent, or null.
    pub user: Value,
}

/// What every response says of the state it keeps: none.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stateless {
    /// Always `disabled`.
    truncation: &'static str,
    /// Always false.
    store: bool,
    /// Always false.
    background: bool,
    /// Always null.
    previous_response_id: Option<String>,
    /// Always null.
    reasoning: Option<Value>,
}

/// The one [`Stateless`].
const STATELESS: Stateless = Stateless {
    truncation: "disabled",
    store: false,
    background: false,
    previous_response_id: None,
    reasoning: None,
};

/// Why a response is incomplete.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IncompleteDetails {
    /// Always `max_output_tokens`.
    pub reason: &'static str,
}

/// Why a response failed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResponseError {
    /// Always `server_error`.
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
}

/// An item of a response's output.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The assistant's text.
    Message {
        /// `msg_…`.
        id: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
        /// Always `assistant`.
        role: &'static str,
        /// One text part (none while it is being added).
        content: Vec<OutputText>,
    },
    /// A call of one of the request's functions.
    FunctionCall {
        /// `fc_…`.
        id: String,
        /// `call_…`, which a `function_call_output` item answers.
        call_id: String,
        /// The function's name.
        name: String,
        /// Its arguments, a JSON object as text.
        arguments: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
    },
}

/// A message's text part.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutputText {
    /// Always `output_text`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The text.
    pub text: String,
    /// Always empty.
    pub annotations: Vec<Value>,
    /// Always empty (logprobs are not served on this endpoint).
    pub logprobs: Vec<Value>,
}

impl OutputText {
    /// A part holding `text`.
    pub fn new(text: String) -> Self {
        Self {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// OpenAI's Responses `usage`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResponseUsage {
    /// Tokens in the prompt.
    pub input_tokens: usize,
    /// Of which served from the prefix cache.
    pub input_tokens_details: InputTokensDetails,
    /// Tokens generated.
    pub output_tokens: usize,
    /// Of which reasoning: none.
    pub output_tokens_details: OutputTokensDetails,
    /// Their sum.
    pub total_tokens: usize,
}

/// `usage.input_tokens_details`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InputTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Always 0: no cache writes are reported.
    pub cache_write_tokens: usize,
}

/// `usage.output_tokens_details`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OutputTokensDetails {
    /// Always 0.
    pub reasoning_tokens: usize,
}

impl From<UsageOut> for ResponseUsage {
    fn from(usage: UsageOut) -> Self {
        Self {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage
                    .prompt_tokens_details
                    .map_or(0, |details| details.cached_tokens),
                cache_write_tokens: 0,
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
            total_tokens: usage.total_tokens,
        }
    }
}

/// One event of a stream (written with its `sequence_number` by `stream.rs`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum Event {
    /// The response has begun.
    #[serde(rename = "response.created")]
    Created { response: Box<ResponseObject> },
    /// It is being generated.
    #[serde(rename = "response.in_progress")]
    InProgress { response: Box<ResponseObject> },
    /// An item begins.
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    /// A message's text part begins.
    #[serde(rename = "response.content_part.added")]
    PartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    /// More of a message's text.
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<Value>,
    },
    /// A message's whole text.
    #[serde(rename = "response.output_text.done")]
    TextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<Value>,
    },
    /// A message's text part, whole.
    #[serde(rename = "response.content_part.done")]
    PartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    /// An item, whole.
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        output_index: usize,
        item: OutputItem,
    },
    /// More of a call's arguments.
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    /// A call's whole arguments.
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    /// The response finished.
    #[serde(rename = "response.completed")]
    Completed { response: Box<ResponseObject> },
    /// The response stopped at the output limit.
    #[serde(rename = "response.incomplete")]
    Incomplete { response: Box<ResponseObject> },
    /// The response failed part-way.
    #[serde(rename = "response.failed")]
    Failed { response: Box<ResponseObject> },
    /// An error part-way, before `response.failed`.
    #[serde(rename = "error")]
    Error {
        code: String,
        message: String,
        param: Option<String>,
    },
}

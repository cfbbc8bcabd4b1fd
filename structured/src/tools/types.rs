//! The plain data the tools module takes and gives: a request's tools, the calls parsed
//! out of a model's output, and the deltas a stream of output is turned into.

use serde::Deserialize;
use serde_json::Value;

/// A function the model may call, as a request's `tools[].function` describes it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Tool {
    /// The function's name, which a call names it by.
    pub name: String,
    /// What the function does, for the model.
    #[serde(default)]
    pub description: Option<String>,
    /// The JSON schema of the call's arguments (an object). A missing schema takes no
    /// arguments in particular: any object.
    #[serde(default = "any_object")]
    pub parameters: Value,
    /// OpenAI's `strict`: an enforced call's arguments must follow the schema exactly, and a
    /// schema that cannot be enforced exactly (an unsupported keyword, `oneOf`) is refused.
    /// Without it, such keywords are approximated (`oneOf` as `anyOf`) or left out.
    #[serde(default)]
    pub strict: bool,
}

/// The schema of a tool that gives none: any object.
fn any_object() -> Value {
    serde_json::json!({"type": "object"})
}

/// One call found in a model's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The function the model called (not checked against the request's tools).
    pub name: String,
    /// The arguments, a JSON object as the model wrote it, without the whitespace between
    /// its tokens (`{"city":"Paris","days":[1, 2]}` becomes `{"city":"Paris","days":[1,2]}`),
    /// as OpenAI returns `function.arguments`. Where `complete` is false it is only the
    /// start of an object.
    pub arguments: String,
    /// Whether the arguments are a whole object: false where the output ended inside them
    /// (`finish_reason: length`) or they stopped being JSON, after they began to stream.
    pub complete: bool,
}

/// A whole output split into the message's text and its calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// The text outside calls (the message's `content`); `None` when there is none.
    pub content: Option<String>,
    /// The calls, in the order the model wrote them.
    pub calls: Vec<ToolCall>,
}

/// What a piece of streamed output adds to the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolDelta {
    /// Text of the message's `content`.
    Content(String),
    /// Call `index` (0, 1, … in order) begins; it calls `name`. The gateway gives it its id.
    CallStart {
        /// The call's position among the output's calls.
        index: usize,
        /// The function it calls.
        name: String,
    },
    /// More of call `index`'s arguments (always after its [`ToolDelta::CallStart`]); the
    /// fragments of a call concatenate to its [`ToolCall::arguments`].
    Arguments {
        /// The call's position among the output's calls.
        index: usize,
        /// The next piece of its arguments' text.
        fragment: String,
    },
}

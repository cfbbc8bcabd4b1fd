//! Request bodies of `/v1/completions` and `/v1/chat/completions`. A body is read twice:
//! once as [`GenerationFields`] (the fields both endpoints share) and once as the endpoint's
//! own fields, so each struct derives `Deserialize` plainly and every error keeps its field
//! path; the fields that take one of several shapes ([`Prompt`], [`Stop`], [`Content`]) are
//! read by hand (`shapes.rs`) so that theirs name the element too. Fields a request does not
//! know are ignored, as OpenAI's clients send extras; the ones that would change what the
//! output must be are refused first (`gateway/unsupported.rs`).

use serde::Deserialize;

/// The fields both generation endpoints share.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GenerationFields {
    /// The model asked for; `None`: the served one.
    pub model: Option<String>,
    /// The most tokens to generate.
    pub max_tokens: Option<i64>,
    /// Divides the logits; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens; 0 or -1: off.
    pub top_k: Option<i32>,
    /// Drop tokens less likely than this fraction of the most likely.
    pub min_p: Option<f32>,
    /// Seeds the request's RNG: any signed 64-bit integer, as OpenAI's schema and vLLM
    /// take it.
    pub seed: Option<i64>,
    /// Strings that end the output (not included in it).
    pub stop: Option<Stop>,
    /// Token ids that end the output.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Keep generating past EOS.
    pub ignore_eos: Option<bool>,
    /// OpenAI's presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// vLLM's repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Scheduling priority: lower runs first.
    pub priority: Option<i32>,
    /// Stream the output as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Add `spec_decode_details` (drafts, draft tokens, accepted tokens) to `usage`.
    pub return_spec_decode_stats: Option<bool>,
    /// vLLM's: add the prompt's and the generated token ids to the response.
    pub return_token_ids: Option<bool>,
    /// OpenAI's: token id (as a string) to a bias in [-100, 100] added to its logit.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// vLLM's: no end-of-sequence or stop token before this many tokens.
    pub min_tokens: Option<i64>,
    /// vLLM's: score the prompt, each of its tokens' logprob given the tokens before it,
    /// with this many alternatives (0 to 20); not with `stream`.
    pub prompt_logprobs: Option<i64>,
    /// Choices to generate for the prompt (OpenAI's `n`, 1 to [`MAX_CHOICES`]).
    ///
    /// [`MAX_CHOICES`]: crate::gateway::params::MAX_CHOICES
    pub n: Option<i64>,
}

/// `stop`: one string or several (deserialized in `shapes.rs`).
#[derive(Clone, Debug)]
pub enum Stop {
    /// A single stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(text) => vec![text],
            Stop::Many(texts) => texts,
        }
    }
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// End the stream with a chunk holding the usage and no choices.
    pub include_usage: Option<bool>,
    /// vLLM's: with `include_usage`, every chunk also carries the usage so far.
    pub continuous_usage_stats: Option<bool>,
}

/// The fields only `/v1/completions` has.
#[derive(Debug, Deserialize)]
pub struct CompletionFields {
    /// The prompt.
    pub prompt: Prompt,
    /// Return the chosen token's logprob and this many alternatives.
    pub logprobs: Option<i64>,
    /// Add the tokenizer's special tokens (BOS) to a text prompt; default true.
    pub add_special_tokens: Option<bool>,
    /// Put the prompt's text before each choice's output.
    pub echo: Option<bool>,
}

/// A completion prompt as OpenAI accepts it (deserialized in `shapes.rs`).
#[derive(Debug)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// A list of texts, one choice (or `n`) each.
    Texts(Vec<String>),
    /// Token ids.
    Tokens(Vec<u32>),
    /// Lists of token ids, one choice (or `n`) each.
    TokenLists(Vec<Vec<u32>>),
}

/// The fields only `/v1/chat/completions` has.
#[derive(Debug, Deserialize)]
pub struct ChatFields {
    /// The conversation so far.
    pub messages: Vec<MessageIn>,
    /// The most tokens to generate (OpenAI's newer name for `max_tokens`).
    pub max_completion_tokens: Option<i64>,
    /// Return each token's logprob.
    pub logprobs: Option<bool>,
    /// With `logprobs`, this many alternatives per token.
    pub top_logprobs: Option<i64>,
    /// End the prompt with the assistant's header; default true.
    pub add_generation_prompt: Option<bool>,
}

/// One chat message of a request.
#[derive(Debug, Deserialize)]
pub struct MessageIn {
    /// `system`, `user`, `assistant`, …
    pub role: String,
    /// The text, as a string or a list of parts; may be null (an assistant's tool call).
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant message's tool calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` message's answer to this call id.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// A `tool` message's function name, or a participant's name.
    #[serde(default)]
    pub name: Option<String>,
}

/// One tool call of an assistant message, as the client sends it back.
#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    /// The call's id, which a `tool` message answers.
    #[serde(default)]
    pub id: Option<String>,
    /// The called function.
    pub function: FunctionCallIn,
}

/// The function of a tool call.
#[derive(Debug, Deserialize)]
pub struct FunctionCallIn {
    /// The function's name.
    pub name: String,
    /// Its arguments: a JSON object as text (OpenAI's shape), or the object itself.
    #[serde(default)]
    pub arguments: Option<serde_json::Value>,
}

/// A message's content (deserialized in `shapes.rs`).
#[derive(Debug)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Typed parts; only `text` parts are supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    /// The part's type: `text`, `image_url`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

//! Response bodies: completions and chat completions (whole and as stream chunks), usage,
//! logprobs in both endpoints' shapes, and the model list.

use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::messages::Usage;

/// The envelope every generation response and stream chunk shares; `C` is the choice type.
#[derive(Debug, serde::Serialize)]
pub struct Envelope<C> {
    /// `cmpl-…` or `chatcmpl-…`.
    pub id: String,
    /// `text_completion`, `chat.completion` or `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix time the request arrived.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The backend configuration's name (see `gateway/fingerprint.rs`).
    pub system_fingerprint: String,
    /// One choice (or none, in the final usage chunk of a stream).
    pub choices: Vec<C>,
    /// Token counts: in every whole response, in the last chunk of a stream that asked
    /// for it, and so far in every chunk with `continuous_usage_stats`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOut>,
    /// vLLM's: the prompt's token ids, with `return_token_ids`, in a whole chat response
    /// and the first chunk of a chat stream (completions put them on the choice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// vLLM's: the prompt's tokens' logprobs, with `prompt_logprobs`, in a whole chat
    /// response (completions put them on the choice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobsOut>,
}

/// OpenAI's `usage`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UsageOut {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Prompt tokens served from the prefix cache, where the engine reported them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Speculative decoding counts, when the request set `return_spec_decode_stats`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec_decode_details: Option<SpecDecodeDetails>,
}

/// `usage.spec_decode_details`, named as vLLM's speculative-decoding counters: the
/// request's verification steps with drafts, draft tokens and accepted draft tokens.
/// `completion_tokens - num_accepted_tokens` forwards produced its output.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SpecDecodeDetails {
    pub num_drafts: usize,
    pub num_draft_tokens: usize,
    pub num_accepted_tokens: usize,
}

impl std::iter::Sum for SpecDecodeDetails {
    /// The counts of several requests added.
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(
            SpecDecodeDetails {
                num_drafts: 0,
                num_draft_tokens: 0,
                num_accepted_tokens: 0,
            },
            |a, b| SpecDecodeDetails {
                num_drafts: a.num_drafts + b.num_drafts,
                num_draft_tokens: a.num_draft_tokens + b.num_draft_tokens,
                num_accepted_tokens: a.num_accepted_tokens + b.num_accepted_tokens,
            },
        )
    }
}

/// OpenAI's `usage.prompt_tokens_details`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

impl UsageOut {
    /// Usage counted by the gateway (the engine's report never came: the engine stopped
    /// before it could send one), without cache details.
    pub fn counted(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
            spec_decode_details: None,
        }
    }
}

impl UsageOut {
    /// The engine's report, with the speculation counts when `spec_details`.
    pub fn reported(usage: Usage, spec_details: bool) -> Self {
        Self {
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: usage.cached_tokens,
            }),
            spec_decode_details: spec_details.then_some(SpecDecodeDetails {
                num_drafts: usage.num_drafts,
                num_draft_tokens: usage.num_draft_tokens,
                num_accepted_tokens: usage.num_accepted_tokens,
            }),
            ..Self::counted(usage.prompt_tokens, usage.completion_tokens)
        }
    }
}

/// A choice of `/v1/completions`, whole or streamed.
#[derive(Debug, serde::Serialize)]
pub struct CompletionChoice {
    /// Always 0 (n = 1).
    pub index: usize,
    /// The text (of this chunk, when streaming).
    pub text: String,
    /// The tokens' logprobs, if asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length` once finished; null before.
    pub finish_reason: Option<&'static str>,
    /// vLLM's: the prompt's token ids, with `return_token_ids`, in a whole response and
    /// the first chunk of a stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// vLLM's: the generated token ids (of this chunk, when streaming), with
    /// `return_token_ids`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// vLLM's: the prompt's tokens' logprobs, with `prompt_logprobs` (whole responses
    /// only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobsOut>,
}

/// Logprobs in the completions shape. With `echo` they cover the prompt's tokens first,
/// the first of which has neither a logprob nor alternatives (null, as OpenAI's).
#[derive(Debug, Default, PartialEq, serde::Serialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's logprob.
    pub token_logprobs: Vec<Option<f32>>,
    /// Each token's most likely alternatives, text to logprob.
    pub top_logprobs: Vec<Option<TopLogprobs>>,
    /// Where each token's text starts in the output, in characters.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// These, then `more`.
    pub fn append(&mut self, more: CompletionLogprobs) {
        self.tokens.extend(more.tokens);
        self.token_logprobs.extend(more.token_logprobs);
        self.top_logprobs.extend(more.top_logprobs);
        self.text_offset.extend(more.text_offset);
    }
}

/// vLLM's `prompt_logprobs`: one entry per prompt token, null for the first (it follows
/// nothing), then the token's and the most likely tokens' logprobs there, by token id.
#[derive(Debug, Default, PartialEq, serde::Serialize)]
pub struct PromptLogprobsOut(pub Vec<Option<PromptPosition>>);

/// The logprobs at one prompt position, serialized as a JSON object from token id (as a
/// string) to its [`PromptLogprob`]: the prompt's token first, then the most likely ones.
#[derive(Debug, Default, PartialEq)]
pub struct PromptPosition(pub Vec<(u32, PromptLogprob)>);

impl Serialize for PromptPosition {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (id, logprob) in &self.0 {
            map.serialize_entry(&id.to_string(), logprob)?;
        }
        map.end()
    }
}

/// One token's logprob at a prompt position (vLLM's `Logprob`).
#[derive(Debug, PartialEq, serde::Serialize)]
pub struct PromptLogprob {
    /// Its logprob.
    pub logprob: f32,
    /// Its 1-based rank among the vocabulary there.
    pub rank: usize,
    /// Its text.
    pub decoded_token: String,
}

/// A token's alternatives, serialized as a JSON object of text to logprob in rank order.
#[derive(Debug, Default, PartialEq)]
pub struct TopLogprobs(pub Vec<(String, f32)>);

impl Serialize for TopLogprobs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

/// A whole choice of `/v1/chat/completions`.
#[derive(Debug, serde::Serialize)]
pub struct ChatChoice {
    /// Always 0 (n = 1).
    pub index: usize,
    /// The assistant's reply.
    pub message: AssistantMessage,
    /// The tokens' logprobs, if asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: Option<&'static str>,
    /// vLLM's: the generated token ids, with `return_token_ids`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// The assistant's reply.
#[derive(Debug, serde::Serialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The text; null when the reply is only tool calls.
    pub content: Option<String>,
    /// The tool calls the reply makes, where the request offered tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// One tool call of a reply.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ToolCallOut {
    /// The call's id, which a `tool` message answers.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionOut,
}

/// The function a call calls.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FunctionOut {
    /// Its name.
    pub name: String,
    /// Its arguments, a JSON object as text.
    pub arguments: String,
}

/// What a chunk adds to one tool call: its id, type and name first, then pieces of its
/// arguments.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ToolCallDelta {
    /// The call's position among the reply's calls.
    pub index: usize,
    /// The call's id, in its first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, in its first delta.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name (first delta) or the next piece of the arguments.
    pub function: FunctionDelta,
}

/// What a chunk adds to a call's function.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FunctionDelta {
    /// The name, in the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the arguments (empty in the first delta).
    pub arguments: String,
}

/// A streamed choice of `/v1/chat/completions`.
#[derive(Debug, serde::Serialize)]
pub struct ChatChunkChoice {
    /// Always 0 (n = 1).
    pub index: usize,
    /// What this chunk adds.
    pub delta: ChatDelta,
    /// This chunk's tokens' logprobs, if asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length` in the last chunk; null before.
    pub finish_reason: Option<&'static str>,
    /// vLLM's: this chunk's generated token ids, with `return_token_ids` (not in the
    /// opening role chunk, which has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// What a chat chunk adds to the reply.
#[derive(Debug, Default, serde::Serialize)]
pub struct ChatDelta {
    /// `assistant`, in the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// What the chunk adds to the reply's tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// Logprobs in the chat shape.
#[derive(Debug, Default, PartialEq, serde::Serialize)]
pub struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<ChatTokenLogprob>,
}

/// One token's logprob in the chat shape.
#[derive(Debug, PartialEq, serde::Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// The UTF-8 bytes of its text.
    pub bytes: Vec<u8>,
    /// The most likely alternatives, in rank order.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// One alternative token in the chat shape.
#[derive(Debug, PartialEq, serde::Serialize)]
pub struct ChatTopLogprob {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// The UTF-8 bytes of its text.
    pub bytes: Vec<u8>,
}

/// `GET /v1/models`.
#[derive(Debug, serde::Serialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The served model.
    pub data: Vec<ModelCard>,
}

/// One served model.
#[derive(Debug, serde::Serialize)]
pub struct ModelCard {
    /// The name requests use.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Unix time the server started.
    pub created: u64,
    /// Always `peregrine`.
    pub owned_by: &'static str,
    /// Where the model was loaded from: the `--model` path as given, or the default
    /// model's name (vLLM's `root`, its `--model` argument).
    pub root: String,
    /// The model this one derives from; always `null` (vLLM gives a LoRA adapter's base).
    pub parent: Option<String>,
    /// The most tokens (prompt plus output) a request may hold.
    pub max_model_len: usize,
}

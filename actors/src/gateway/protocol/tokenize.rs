//! Bodies of vLLM's `/tokenize` and `/detokenize`.

use serde::{Deserialize, Serialize};

use super::request::MessageIn;

/// `POST /tokenize`: a `prompt`, or chat `messages` to render with the template first.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    /// The model asked for; `None`: the served one.
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// A chat to render and tokenize.
    pub messages: Option<Vec<MessageIn>>,
    /// End a rendered chat with the assistant's header; default true.
    pub add_generation_prompt: Option<bool>,
    /// Add the tokenizer's special tokens; default true for a prompt, false for a chat
    /// (its template writes them), as vLLM.
    pub add_special_tokens: Option<bool>,
    /// Also answer each token's text in the vocabulary (vLLM's `return_token_strs`).
    pub return_token_strs: Option<bool>,
}

/// The answer of `/tokenize`.
#[derive(Debug, Serialize)]
pub struct TokenizeResponse {
    /// How many tokens.
    pub count: usize,
    /// The model's context length, for comparison.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Each token's text in the vocabulary, as Hugging Face's `convert_ids_to_tokens`
    /// gives it; only when `return_token_strs` asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    /// The model asked for; `None`: the served one.
    pub model: Option<String>,
    /// Token ids to decode.
    pub tokens: Vec<u32>,
}

/// The answer of `/detokenize`.
#[derive(Debug, Serialize)]
pub struct DetokenizeResponse {
    /// The decoded text.
    pub prompt: String,
}

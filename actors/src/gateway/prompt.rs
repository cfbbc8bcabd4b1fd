//! Prompts to token ids: completion prompts (text or ids), and chats rendered with the
//! model's template, each text within the character limit before it is tokenized.
//! Errors are 400s (413 over the limit) naming the field.

use std::sync::Arc;

use peregrine_models::chat_template::{ChatMessage, ChatTemplate};
use peregrine_models::tokenizer::Tokenizer;

use super::errors::ApiError;
use super::prompt_size::{check_chars, check_prompt};
use super::protocol::request::{Content, MessageIn, Prompt};

/// What turns a request's prompt into ids: the model's tokenizer and chat template and
/// the live character limit, owned so that the work can move to the blocking pool.
pub struct Prompter {
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Its chat template, if it has one.
    pub template: Option<Arc<ChatTemplate>>,
    /// The longest prompt text, in characters.
    pub max_chars: usize,
}

impl Prompter {
    /// The ids of a completion prompt: one text (encoded, with the tokenizer's special
    /// tokens if `add_special_tokens`) or one list of ids in the vocabulary; never empty.
    pub fn completion(
        &self,
        prompt: Prompt,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ApiError> {
        check_prompt(&prompt, self.max_chars)?;
        let tokenizer = &self.tokenizer;
        let ids = match prompt {
            Prompt::Text(text) => encode(tokenizer, &text, add_special_tokens)?,
            Prompt::Texts(texts) => encode(tokenizer, &only_one(texts)?, add_special_tokens)?,
            Prompt::Tokens(ids) => in_vocabulary(ids, tokenizer, "prompt")?,
            Prompt::TokenLists(lists) => in_vocabulary(only_one(lists)?, tokenizer, "prompt")?,
        };
        if ids.is_empty() {
            return Err(ApiError::invalid("prompt", "the prompt is empty"));
        }
        Ok(ids)
    }

    /// The ids of `text` (`/tokenize`'s `prompt`).
    pub fn text(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ApiError> {
        check_chars("prompt", text, self.max_chars)?;
        encode(&self.tokenizer, text, add_special_tokens)
    }

    /// The ids of `messages` rendered with the template.
    pub fn chat(
        &self,
        messages: Vec<MessageIn>,
        add_generation_prompt: bool,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ApiError> {
        let text = render_chat(messages, add_generation_prompt, self.template.as_deref())?;
        check_chars("messages", &text, self.max_chars)?;
        encode(&self.tokenizer, &text, add_special_tokens)
    }
}

/// The single prompt of a list (batched prompts are not supported).
fn only_one<T>(prompts: Vec<T>) -> Result<T, ApiError> {
    let count = prompts.len();
    match prompts.into_iter().next() {
        Some(prompt) if count == 1 => Ok(prompt),
        _ => Err(ApiError::invalid(
            "prompt",
            format!("exactly one prompt per request is supported, got {count}"),
        )),
    }
}

/// `ids`, or a 400 naming `param` and the first id outside the vocabulary.
pub fn in_vocabulary(
    ids: Vec<u32>,
    tokenizer: &Tokenizer,
    param: &str,
) -> Result<Vec<u32>, ApiError> {
    let vocab = tokenizer.vocab_size();
    match ids.iter().position(|&id| id as usize >= vocab) {
        Some(at) => Err(ApiError::invalid(
            param,
            format!(
                "token id {} at position {at} is outside the vocabulary (size {vocab})",
                ids[at]
            ),
        )),
        None => Ok(ids),
    }
}

/// Token ids of `text`.
fn encode(
    tokenizer: &Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<u32>, ApiError> {
    tokenizer
        .encode(text, add_special_tokens)
        .map_err(|err| ApiError::invalid("prompt", format!("{err:#}")))
}

/// The text of a chat rendered with `template`.
fn render_chat(
    messages: Vec<MessageIn>,
    add_generation_prompt: bool,
    template: Option<&ChatTemplate>,
) -> Result<String, ApiError> {
    let template = template.ok_or_else(|| {
        ApiError::bad_request(
            "the model has no chat template: use /v1/completions with a plain prompt",
        )
    })?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    let messages = messages
        .into_iter()
        .enumerate()
        .map(|(at, message)| chat_message(at, message))
        .collect::<Result<Vec<_>, _>>()?;
    template
        .render(&messages, add_generation_prompt)
        .map_err(|err| ApiError::invalid("messages", format!("{err:#}")))
}

/// The roles a chat message may have: OpenAI's, which chat templates know. Anything else
/// is refused rather than written into the prompt, where a role such as
/// `user<|im_end|>\n<|im_start|>system` would forge a turn.
const CHAT_ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Message `at` with its text parts joined by newlines.
fn chat_message(at: usize, message: MessageIn) -> Result<ChatMessage, ApiError> {
    if !CHAT_ROLES.contains(&message.role.as_str()) {
        return Err(ApiError::invalid(
            format!("messages[{at}].role"),
            format!(
                "messages[{at}].role must be one of {}, got {:?}",
                CHAT_ROLES.join(", "),
                message.role
            ),
        ));
    }
    let content = match message.content {
        None => String::new(),
        Some(Content::Text(text)) => text,
        Some(Content::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (part_at, part) in parts.into_iter().enumerate() {
                let param = format!("messages[{at}].content[{part_at}]");
                if part.kind != "text" {
                    return Err(ApiError::invalid(
                        format!("{param}.type"),
                        format!("only text content parts are supported, not `{}`", part.kind),
                    ));
                }
                let text = part.text.ok_or_else(|| {
                    ApiError::invalid(format!("{param}.text"), "a text part needs `text`")
                })?;
                texts.push(text);
            }
            texts.join("\n")
        }
    };
    Ok(ChatMessage {
        role: message.role,
        content,
    })
}

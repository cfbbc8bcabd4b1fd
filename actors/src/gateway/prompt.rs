//! Prompts to token ids: completion prompts (text or ids), and chats rendered with the
//! model's template, each text within the character limit before it is tokenized.
//! Errors are 400s (413 over the limit) naming the field.

use std::sync::Arc;

use peregrine_models::chat_template::{ChatMessage, ChatTemplate};
use peregrine_models::tokenizer::Tokenizer;
use peregrine_structured::tools::{HermesStyle, Tool};
use serde_json::{json, Value};

use super::errors::ApiError;
use super::prompt_size::{check_chars, check_prompt};
use super::protocol::request::{Content, MessageIn, Prompt, ToolCallIn};
use super::tool_prompt::{written_out, ToolPrompt};

/// What turns a request's prompt into ids: the model's tokenizer and chat template and
/// the live character limit, owned so that the work can move to the blocking pool.
pub struct Prompter {
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Its chat template, if it has one.
    pub template: Option<Arc<ChatTemplate>>,
    /// The longest prompt text, in characters.
    pub max_chars: usize,
    /// How tool calls are laid out where the template has no tool syntax.
    pub tool_style: HermesStyle,
}

/// The tools a chat request offers: as sent (for templates that render them) and read.
#[derive(Default)]
pub struct ChatTools {
    /// The `tools` entries as sent.
    pub declared: Vec<Value>,
    /// The functions.
    pub tools: Vec<Tool>,
}

impl Prompter {
    /// The ids of each completion prompt, in order: one text (encoded, with the
    /// tokenizer's special tokens if `add_special_tokens`) or one list of ids in the
    /// vocabulary, or a list of either (OpenAI's batch of prompts); none empty, and at
    /// most [`MAX_PROMPTS`].
    pub fn completions(
        &self,
        prompt: Prompt,
        add_special_tokens: bool,
    ) -> Result<Vec<Vec<u32>>, ApiError> {
        check_prompt(&prompt, self.max_chars)?;
        let tokenizer = &self.tokenizer;
        let prompts = match prompt {
            Prompt::Text(text) => vec![encode(tokenizer, &text, add_special_tokens)?],
            Prompt::Texts(texts) => counted(texts)?
                .iter()
                .map(|text| encode(tokenizer, text, add_special_tokens))
                .collect::<Result<_, _>>()?,
            Prompt::Tokens(ids) => vec![in_vocabulary(ids, tokenizer, "prompt")?],
            Prompt::TokenLists(lists) => counted(lists)?
                .into_iter()
                .map(|ids| in_vocabulary(ids, tokenizer, "prompt"))
                .collect::<Result<_, _>>()?,
        };
        if let Some(at) = prompts.iter().position(Vec::is_empty) {
            let which = match prompts.len() {
                1 => "the prompt is empty".to_owned(),
                _ => format!("prompt {at} of the list is empty"),
            };
            return Err(ApiError::invalid("prompt", which));
        }
        Ok(prompts)
    }

    /// The ids of `text` (`/tokenize`'s `prompt`).
    pub fn text(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ApiError> {
        check_chars("prompt", text, self.max_chars)?;
        encode(&self.tokenizer, text, add_special_tokens)
    }

    /// The ids of `messages` rendered with the template, offering `tools`.
    pub fn chat(
        &self,
        messages: Vec<MessageIn>,
        tools: ChatTools,
        add_generation_prompt: bool,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ApiError> {
        let template = self.template.as_deref().ok_or_else(|| {
            ApiError::bad_request(
                "the model has no chat template: use /v1/completions with a plain prompt",
            )
        })?;
        let messages = chat_messages(messages)?;
        let text = match template.renders_tools() {
            true => {
                let declared = (!tools.declared.is_empty()).then_some(tools.declared.as_slice());
                template.render_with_tools(&messages, declared, add_generation_prompt)
            }
            false => {
                let prompt = ToolPrompt {
                    tools: &tools.tools,
                    style: self.tool_style,
                };
                template.render(&written_out(messages, &prompt), add_generation_prompt)
            }
        }
        .map_err(|err| ApiError::invalid("messages", format!("{err:#}")))?;
        check_chars("messages", &text, self.max_chars)?;
        encode(&self.tokenizer, &text, add_special_tokens)
    }
}

/// The single prompt of a list (batched prompts are not supported).
/// The most prompts one completions request may list.
pub const MAX_PROMPTS: usize = 128;

/// `prompts`, unless there are none or more than [`MAX_PROMPTS`].
fn counted<T>(prompts: Vec<T>) -> Result<Vec<T>, ApiError> {
    match prompts.len() {
        0 => Err(ApiError::invalid("prompt", "the list of prompts is empty")),
        count if count > MAX_PROMPTS => Err(ApiError::invalid(
            "prompt",
            format!("{count} prompts in one request, over the limit of {MAX_PROMPTS}"),
        )),
        _ => Ok(prompts),
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

/// A request's messages as the template reads them.
fn chat_messages(messages: Vec<MessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(at, message)| chat_message(at, message))
        .collect()
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
    let tool_calls = match message.tool_calls {
        Some(calls) => Some(
            calls
                .into_iter()
                .enumerate()
                .map(|(index, call)| template_call(at, index, call))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    Ok(ChatMessage {
        role: message.role,
        content,
        tool_calls,
        tool_call_id: message.tool_call_id,
        name: message.name,
    })
}

/// Call `index` of message `at` as templates read it: `{"id", "type": "function",
/// "function": {"name", "arguments": {...}}}`, its arguments an object (sent as JSON text,
/// as OpenAI's clients send them, or as the object).
fn template_call(at: usize, index: usize, call: ToolCallIn) -> Result<Value, ApiError> {
    let param = format!("messages[{at}].tool_calls[{index}].function.arguments");
    let arguments = match call.function.arguments {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(text)) if text.trim().is_empty() => json!({}),
        Some(Value::String(text)) => serde_json::from_str(&text).map_err(|err| {
            ApiError::invalid(&param, format!("the arguments are not JSON: {err}"))
        })?,
        Some(other) => other,
    };
    if !arguments.is_object() {
        return Err(ApiError::invalid(
            param,
            "the arguments must be a JSON object",
        ));
    }
    Ok(json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    }))
}

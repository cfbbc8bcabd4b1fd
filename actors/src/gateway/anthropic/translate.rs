//! A Messages request translated into the chat the gateway renders: the system prompt
//! becomes a `system` message; a user turn's text blocks a `user` message and each of its
//! `tool_result` blocks a `tool` message answering its `tool_use_id` (a failed tool's
//! result prefixed with `Error: `); an assistant turn's text and `tool_use` blocks one
//! `assistant` message with its calls. Tools become OpenAI function tools, and
//! `tool_choice` `auto`, `any`, `tool` and `none` become `auto`, `required`, a named
//! function and `none`. Every error is a 400 naming the field as Anthropic spells it.

use serde_json::{json, Value};

use super::request::{Block, Blocks, InputMessage, MessagesRequest, ToolChoiceIn, ToolIn};
use crate::gateway::conversation::Conversation;
use crate::gateway::errors::ApiError;
use crate::gateway::protocol::request::{
    Content, FunctionCallIn, GenerationFields, MessageIn, Stop, ToolCallIn,
};
use crate::gateway::tools::{self, Choice, ToolRequest, ToolSettings};

/// `request` as a conversation with the tools of a model served with `settings`.
pub fn conversation(
    request: MessagesRequest,
    settings: &ToolSettings,
) -> Result<Conversation, ApiError> {
    let mut messages = Vec::new();
    if let Some(system) = request.system {
        messages.push(message("system", text_of(system, "system")?));
    }
    let count = request.messages.len();
    for (at, turn) in request.messages.into_iter().enumerate() {
        if turn.role == "assistant" && at + 1 == count {
            return Err(ApiError::invalid(
                format!("messages[{at}].role"),
                "a last `assistant` message (a prefilled reply to continue) is not supported: \
                 end with a `user` message",
            ));
        }
        messages.extend(chat_messages(at, turn)?);
    }
    let stop = request.stop_sequences.unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop_sequences",
            "stop sequences must not be empty",
        ));
    }
    let tools = tool_request(request.tools, request.tool_choice, settings)?;
    let fields = GenerationFields {
        model: Some(request.model),
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        stop: Some(Stop::Many(stop)),
        stream: request.stream,
        ..GenerationFields::default()
    };
    Ok(Conversation {
        fields,
        messages,
        tools,
        constraint: None,
        max_tokens: Some(("max_tokens", request.max_tokens)),
        logprobs: None,
        add_generation_prompt: true,
    })
}

/// A message of `role` saying `text`.
fn message(role: &str, text: String) -> MessageIn {
    MessageIn {
        role: role.to_owned(),
        content: Some(Content::Text(text)),
        tool_calls: None,
        tool_call_id: None,
        name: None,
    }
}

/// The text of `content`, its text blocks joined by newlines; any other block is refused,
/// naming its `type` under `param`.
fn text_of(content: Blocks, param: &str) -> Result<String, ApiError> {
    let blocks = match content {
        Blocks::Text(text) => return Ok(text),
        Blocks::List(blocks) => blocks,
    };
    let mut texts = Vec::with_capacity(blocks.len());
    for (at, block) in blocks.into_iter().enumerate() {
        let param = format!("{param}[{at}]");
        if block.kind != "text" {
            return Err(unsupported_block(&param, &block.kind));
        }
        texts.push(block_text(block, &param)?);
    }
    Ok(texts.join("\n"))
}

/// A `text` block's text.
fn block_text(block: Block, param: &str) -> Result<String, ApiError> {
    block
        .text
        .ok_or_else(|| ApiError::invalid(format!("{param}.text"), "a text block needs `text`"))
}

/// 400 for a block of a type that is not served where it is.
fn unsupported_block(param: &str, kind: &str) -> ApiError {
    ApiError::invalid(
        format!("{param}.type"),
        format!("`{kind}` content blocks are not supported here"),
    )
}

/// The chat messages of turn `at`.
fn chat_messages(at: usize, turn: InputMessage) -> Result<Vec<MessageIn>, ApiError> {
    let param = format!("messages[{at}].content");
    let blocks = match (turn.role.as_str(), turn.content) {
        ("user" | "assistant", Blocks::Text(text)) => return Ok(vec![message(&turn.role, text)]),
        ("user" | "assistant", Blocks::List(blocks)) => blocks,
        (role, _) => {
            return Err(ApiError::invalid(
                format!("messages[{at}].role"),
                format!("a message's role must be \"user\" or \"assistant\", got {role:?}"),
            ))
        }
    };
    match turn.role.as_str() {
        "user" => user_messages(blocks, &param),
        _ => assistant_message(blocks, &param).map(|message| vec![message]),
    }
}

/// A user turn: its runs of text blocks as `user` messages, its tool results as `tool`
/// messages, in order.
fn user_messages(blocks: Vec<Block>, param: &str) -> Result<Vec<MessageIn>, ApiError> {
    let mut messages = Vec::new();
    let mut texts: Vec<String> = Vec::new();
    for (at, block) in blocks.into_iter().enumerate() {
        let param = format!("{param}[{at}]");
        match block.kind.as_str() {
            "text" => texts.push(block_text(block, &param)?),
            "tool_result" => {
                if !texts.is_empty() {
                    messages.push(message("user", texts.join("\n")));
                    texts.clear();
                }
                messages.push(tool_result(block, &param)?);
            }
            kind => return Err(unsupported_block(&param, kind)),
        }
    }
    if !texts.is_empty() || messages.is_empty() {
        messages.push(message("user", texts.join("\n")));
    }
    Ok(messages)
}

/// A `tool_result` block as a `tool` message.
fn tool_result(block: Block, param: &str) -> Result<MessageIn, ApiError> {
    let id = block.tool_use_id.ok_or_else(|| {
        ApiError::invalid(
            format!("{param}.tool_use_id"),
            "a tool_result block needs `tool_use_id`",
        )
    })?;
    let text = match block.content {
        None => String::new(),
        Some(content) => text_of(content, &format!("{param}.content"))?,
    };
    let text = match block.is_error {
        Some(true) => format!("Error: {text}"),
        _ => text,
    };
    Ok(MessageIn {
        tool_call_id: Some(id),
        ..message("tool", text)
    })
}

/// An assistant turn: its text blocks joined, and its `tool_use` blocks as calls.
fn assistant_message(blocks: Vec<Block>, param: &str) -> Result<MessageIn, ApiError> {
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for (at, block) in blocks.into_iter().enumerate() {
        let param = format!("{param}[{at}]");
        match block.kind.as_str() {
            "text" => texts.push(block_text(block, &param)?),
            "tool_use" => calls.push(tool_use(block, &param)?),
            kind => return Err(unsupported_block(&param, kind)),
        }
    }
    Ok(MessageIn {
        tool_calls: (!calls.is_empty()).then_some(calls),
        ..message("assistant", texts.join("\n"))
    })
}

/// A `tool_use` block as a call, its arguments the `input` object.
fn tool_use(block: Block, param: &str) -> Result<ToolCallIn, ApiError> {
    let missing = |field: &str| {
        ApiError::invalid(
            format!("{param}.{field}"),
            format!("a tool_use block needs `{field}`"),
        )
    };
    let id = block.id.ok_or_else(|| missing("id"))?;
    let name = block.name.ok_or_else(|| missing("name"))?;
    let input = block.input.unwrap_or_else(|| json!({}));
    if !input.is_object() {
        return Err(ApiError::invalid(
            format!("{param}.input"),
            "a tool_use block's `input` must be an object",
        ));
    }
    Ok(ToolCallIn {
        id: Some(id),
        function: FunctionCallIn {
            name,
            arguments: Some(input),
        },
    })
}

/// The tools and what `choice` asks of them.
fn tool_request(
    tools: Option<Vec<ToolIn>>,
    choice: Option<ToolChoiceIn>,
    settings: &ToolSettings,
) -> Result<Option<ToolRequest>, ApiError> {
    let declared = tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(at, tool)| function_tool(at, tool))
        .collect::<Result<Vec<_>, _>>()?;
    let functions = tools::functions(&declared).map_err(|err| err.map_param(anthropic_param))?;
    let (choice, parallel) = match choice {
        None => (None, true),
        Some(choice) => {
            let parallel = !choice.disable_parallel_tool_use.unwrap_or(false);
            (Some(read_choice(choice, &declared, parallel)?), parallel)
        }
    };
    tools::offered(functions, declared, choice, parallel, settings)
}

/// The param of a chat tool's field, as Anthropic names it: `tools[0].function.parameters`
/// is `tools[0].input_schema`.
fn anthropic_param(param: &str) -> String {
    param
        .replace(".function.parameters", ".input_schema")
        .replace(".function.name", ".name")
        .replace(".function", "")
}

/// Tool `at` as an OpenAI function tool.
fn function_tool(at: usize, tool: ToolIn) -> Result<Value, ApiError> {
    if let Some(kind) = tool.kind.filter(|kind| kind != "custom") {
        return Err(ApiError::invalid(
            format!("tools[{at}].type"),
            format!("only custom tools are served, not Anthropic's `{kind}` tool"),
        ));
    }
    let schema = tool.input_schema.ok_or_else(|| {
        ApiError::invalid(
            format!("tools[{at}].input_schema"),
            "a tool needs an `input_schema`",
        )
    })?;
    let mut function = json!({"name": tool.name, "parameters": schema});
    if let Some(description) = tool.description {
        function["description"] = Value::String(description);
    }
    Ok(json!({"type": "function", "function": function}))
}

/// `tool_choice` as the chat's choice. `disable_parallel_tool_use` is honoured where a
/// call is forced (by the grammar); with `auto` it would need a grammar too, so it is
/// refused there.
fn read_choice(
    choice: ToolChoiceIn,
    declared: &[Value],
    parallel: bool,
) -> Result<Choice, ApiError> {
    let choice =
        match choice.kind.as_str() {
            "auto" if !parallel => return Err(ApiError::invalid(
                "tool_choice.disable_parallel_tool_use",
                "`disable_parallel_tool_use` is served with `tool_choice` \"any\" or \"tool\", \
                 not \"auto\"",
            )),
            "auto" => Choice::Auto,
            "any" => Choice::Required,
            "none" => Choice::None,
            "tool" => {
                let name = choice.name.ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice.name",
                        "a \"tool\" choice needs the tool's `name`",
                    )
                })?;
                let known = declared
                    .iter()
                    .any(|tool| tool["function"]["name"] == name.as_str());
                if !known {
                    return Err(ApiError::invalid(
                        "tool_choice.name",
                        format!("`tool_choice` names the tool {name:?}, which is not in `tools`"),
                    ));
                }
                Choice::Named(name)
            }
            other => {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    format!(
                        "`tool_choice.type` must be \"auto\", \"any\", \"tool\" or \"none\", got \
                     {other:?}"
                    ),
                ))
            }
        };
    Ok(choice)
}

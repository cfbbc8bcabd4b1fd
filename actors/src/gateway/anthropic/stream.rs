//! A message streamed as Anthropic's server-sent events, each an `event:` line naming its
//! type and a `data:` line: `message_start` and a `ping`; per content block
//! `content_block_start`, `content_block_delta` (`text_delta`, or `input_json_delta` pieces
//! of a call's input) and `content_block_stop`; then `message_delta` (the stop reason and
//! the final usage: output tokens, and the prompt's split into computed and cache-read
//! tokens, which `message_start` could not know yet) and `message_stop`. A failure part-way is an `error` event. A text block opens with the
//! first text, a `tool_use` block when its call's name is known.

use bytes::Bytes;
use serde::Serialize;
use serde_json::json;

use super::errors;
use super::response::{stop_reason, MessageOut, UsageOut as MessageUsage};
use crate::gateway::errors::ApiError;
use crate::gateway::generation::{Delta, Finish};
use crate::gateway::protocol::response::{ToolCallDelta, UsageOut};
use crate::gateway::sse::ChunkFormat;
use crate::gateway::tool_output::CallDeltas;

/// One event: `event: {name}` and the data as JSON.
fn event(name: &str, data: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(data).unwrap_or_default();
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}

/// The block being streamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Text,
    ToolUse,
}

/// The events of one streamed message.
pub struct MessageEvents {
    /// The message `message_start` announces, until it is sent.
    start: Option<MessageOut>,
    /// The output read for calls, where the request asks for it.
    calls: Option<CallDeltas>,
    /// The block being streamed, if one is open.
    open: Option<Open>,
    /// The index of the open block, or of the next one.
    index: usize,
    /// The stop sequence that ended the output, if one did.
    stop_sequence: Option<String>,
    /// The stop reason, once the output ended.
    stop_reason: Option<&'static str>,
}

impl MessageEvents {
    /// The events of `start`'s message, its output read for `calls` if set.
    pub fn new(start: MessageOut, calls: Option<CallDeltas>) -> MessageEvents {
        MessageEvents {
            start: Some(start),
            calls,
            open: None,
            index: 0,
            stop_sequence: None,
            stop_reason: None,
        }
    }

    /// `text` added to a text block, opened if none is.
    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        if self.open != Some(Open::Text) {
            self.begin(Open::Text, json!({"type": "text", "text": ""}), out);
        }
        let delta = json!({"type": "text_delta", "text": text});
        self.delta(delta, out);
    }

    /// What `call` adds: a `tool_use` block begins with its id and name, then its input
    /// follows in pieces.
    fn call(&mut self, call: ToolCallDelta, out: &mut Vec<u8>) {
        if let (Some(id), Some(name)) = (call.id, call.function.name) {
            let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
            self.begin(Open::ToolUse, block, out);
        }
        if !call.function.arguments.is_empty() {
            let partial = call.function.arguments;
            let delta = json!({"type": "input_json_delta", "partial_json": partial});
            self.delta(delta, out);
        }
    }

    /// Ends the open block and opens `block`.
    fn begin(&mut self, open: Open, block: serde_json::Value, out: &mut Vec<u8>) {
        self.close(out);
        let start = json!({"type": "content_block_start", "index": self.index,
            "content_block": block});
        out.extend_from_slice(&event("content_block_start", &start));
        self.open = Some(open);
    }

    /// A `content_block_delta` of the open block.
    fn delta(&mut self, delta: serde_json::Value, out: &mut Vec<u8>) {
        let data = json!({"type": "content_block_delta", "index": self.index, "delta": delta});
        out.extend_from_slice(&event("content_block_delta", &data));
    }

    /// Ends the open block, if one is.
    fn close(&mut self, out: &mut Vec<u8>) {
        if self.open.take().is_some() {
            let stop = json!({"type": "content_block_stop", "index": self.index});
            out.extend_from_slice(&event("content_block_stop", &stop));
            self.index += 1;
        }
    }
}

impl ChunkFormat for MessageEvents {
    fn opening(&mut self) -> Option<Bytes> {
        let message = self.start.take()?;
        let data = json!({"type": "message_start", "message": message});
        let mut out = event("message_start", &data).to_vec();
        out.extend_from_slice(&event("ping", &json!({"type": "ping"})));
        Some(Bytes::from(out))
    }

    fn chunk(&mut self, delta: &Delta, finish_reason: Option<&'static str>) -> Bytes {
        let mut out = Vec::new();
        let deltas = match self.calls.as_mut() {
            None => {
                self.text(&delta.text, &mut out);
                Vec::new()
            }
            Some(calls) => {
                let mut deltas = calls.push(&delta.text);
                if finish_reason.is_some() {
                    deltas.extend(calls.finish());
                }
                deltas
            }
        };
        for chat_delta in deltas {
            self.text(chat_delta.content.as_deref().unwrap_or(""), &mut out);
            for call in chat_delta.tool_calls.unwrap_or_default() {
                self.call(call, &mut out);
            }
        }
        if let Some(reason) = finish_reason {
            self.close(&mut out);
            let made_calls = self.calls.as_ref().is_some_and(CallDeltas::made_calls);
            let sequence = self.stop_sequence.as_deref();
            self.stop_reason = Some(stop_reason(reason, sequence, made_calls));
        }
        Bytes::from(out)
    }

    fn usage(&mut self, usage: UsageOut) -> Bytes {
        let delta = json!({"type": "message_delta",
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
            "usage": MessageUsage::of(&usage)});
        let mut out = event("message_delta", &delta).to_vec();
        out.extend_from_slice(&event("message_stop", &json!({"type": "message_stop"})));
        Bytes::from(out)
    }

    /// The last chunk, then `message_delta` and `message_stop`, always (there is no
    /// `stream_options` to ask for the usage).
    fn last(&mut self, finish: Finish, _include_usage: bool) -> Vec<Bytes> {
        self.stop_sequence = finish.stop_string;
        let last = self.chunk(&finish.delta, Some(finish.reason));
        vec![last, self.usage(finish.usage)]
    }

    fn error(&mut self, err: &ApiError) -> Bytes {
        event("error", &errors::body(err))
    }

    fn done(&mut self) -> Option<Bytes> {
        None
    }
}

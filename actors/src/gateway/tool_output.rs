//! A reply read for tool calls: the model's output (detokenized with special tokens kept)
//! split into the message's text and its calls, whole or as a stream of OpenAI's deltas
//! (a call's id, type and name first, then pieces of its arguments), each call given an
//! id made from the request's.

use peregrine_structured::tools::{parse, ToolCallFormat, ToolCallStream, ToolDelta};

use super::protocol::response::{
    ChatDelta, FunctionDelta, FunctionOut, ToolCallDelta, ToolCallOut,
};

/// The ids of a request's calls: `<prefix>_<request>_<index>`.
#[derive(Clone, Debug)]
pub struct CallIds(String);

impl CallIds {
    /// The ids of the calls of the request `public_id` (`chatcmpl-…`, `msg_…`), each
    /// beginning with `prefix` (OpenAI's `call`, Anthropic's `toolu`).
    pub fn of(prefix: &str, public_id: &str) -> CallIds {
        let request = public_id.rsplit(['-', '_']).next().unwrap_or(public_id);
        CallIds(format!("{prefix}_{request}"))
    }

    /// The ids of choice `choice`'s calls (`n` > 1): the first choice's are the
    /// request's, the others' carry the choice's index too.
    pub fn for_choice(&self, choice: usize) -> CallIds {
        match choice {
            0 => self.clone(),
            _ => CallIds(format!("{}_{choice}", self.0)),
        }
    }

    fn id(&self, index: usize) -> String {
        format!("{}_{index}", self.0)
    }
}

/// A whole reply: its text (`None` when there is none) and its calls (`None` when it made
/// none).
pub fn whole(
    format: ToolCallFormat,
    output: &str,
    ids: &CallIds,
) -> (Option<String>, Option<Vec<ToolCallOut>>) {
    let parsed = parse(format, output);
    let calls: Vec<ToolCallOut> = parsed
        .calls
        .into_iter()
        .enumerate()
        .map(|(index, call)| ToolCallOut {
            id: ids.id(index),
            kind: "function",
            function: FunctionOut {
                name: call.name,
                arguments: call.arguments,
            },
        })
        .collect();
    match calls.is_empty() {
        true => (Some(parsed.content.unwrap_or_default()), None),
        false => (parsed.content, Some(calls)),
    }
}

/// The finish reason of a reply that made calls: `tool_calls` where the model ended it
/// (OpenAI's and vLLM's), else the reason it ended.
pub fn finish_reason(reason: &'static str, made_calls: bool) -> &'static str {
    match (reason, made_calls) {
        ("stop", true) => "tool_calls",
        (reason, _) => reason,
    }
}

/// A streamed reply read for calls.
pub struct CallDeltas {
    stream: ToolCallStream,
    ids: CallIds,
    made_calls: bool,
}

impl CallDeltas {
    /// A reply in `format`.
    pub fn new(format: ToolCallFormat, ids: CallIds) -> CallDeltas {
        CallDeltas {
            stream: ToolCallStream::new(format),
            ids,
            made_calls: false,
        }
    }

    /// Whether a call has begun.
    pub fn made_calls(&self) -> bool {
        self.made_calls
    }

    /// The chat deltas `text` adds (none while it may still be the start of a call).
    pub fn push(&mut self, text: &str) -> Vec<ChatDelta> {
        let deltas = self.stream.push(text);
        self.chat_deltas(deltas)
    }

    /// The deltas of whatever the stream still holds, at the reply's end.
    pub fn finish(&mut self) -> Vec<ChatDelta> {
        let deltas = self.stream.finish();
        self.chat_deltas(deltas)
    }

    /// `deltas` as chat deltas: text runs and one delta per call event.
    fn chat_deltas(&mut self, deltas: Vec<ToolDelta>) -> Vec<ChatDelta> {
        let mut out: Vec<ChatDelta> = Vec::new();
        for delta in deltas {
            match delta {
                ToolDelta::Content(text) => match out.last_mut() {
                    Some(ChatDelta {
                        content: Some(content),
                        ..
                    }) => content.push_str(&text),
                    _ => out.push(ChatDelta {
                        content: Some(text),
                        ..ChatDelta::default()
                    }),
                },
                ToolDelta::CallStart { index, name } => {
                    self.made_calls = true;
                    out.push(call_delta(ToolCallDelta {
                        index,
                        id: Some(self.ids.id(index)),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(name),
                            arguments: String::new(),
                        },
                    }));
                }
                ToolDelta::Arguments { index, fragment } => {
                    out.push(call_delta(ToolCallDelta {
                        index,
                        id: None,
                        kind: None,
                        function: FunctionDelta {
                            name: None,
                            arguments: fragment,
                        },
                    }));
                }
            }
        }
        out
    }
}

fn call_delta(call: ToolCallDelta) -> ChatDelta {
    ChatDelta {
        tool_calls: Some(vec![call]),
        ..ChatDelta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "Let me check.\n<tool_call>[{\"name\": \"get_weather\", \"arguments\": \
        {\"city\": \"Oslo\"}}, {\"name\": \"get_time\", \"arguments\": {}}]</tool_call>";

    #[test]
    fn a_whole_reply_splits_into_text_and_calls_with_ids() {
        let ids = CallIds::of("call", "chatcmpl-abc123");
        let (content, calls) = whole(ToolCallFormat::Hermes, OUTPUT, &ids);
        assert_eq!(content.as_deref(), Some("Let me check.\n"));
        let calls = calls.unwrap();
        assert_eq!(calls[0].id, "call_abc123_0");
        assert_eq!(calls[1].id, "call_abc123_1");
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, "{\"city\":\"Oslo\"}");
        assert_eq!(finish_reason("stop", true), "tool_calls");
        assert_eq!(finish_reason("length", true), "length");
        let (plain, none) = whole(ToolCallFormat::Hermes, "just text", &ids);
        assert_eq!((plain.as_deref(), none), (Some("just text"), None));
    }

    #[test]
    fn streamed_deltas_rebuild_the_whole_reply() {
        let ids = CallIds::of("call", "chatcmpl-abc123");
        let (content, calls) = whole(ToolCallFormat::Hermes, OUTPUT, &ids);
        let calls = calls.unwrap();
        for split in 1..OUTPUT.len() {
            if !OUTPUT.is_char_boundary(split) {
                continue;
            }
            let mut stream = CallDeltas::new(ToolCallFormat::Hermes, ids.clone());
            let mut deltas = stream.push(&OUTPUT[..split]);
            deltas.extend(stream.push(&OUTPUT[split..]));
            deltas.extend(stream.finish());
            let mut text = String::new();
            let mut rebuilt: Vec<(Option<String>, Option<String>, String)> = Vec::new();
            for delta in deltas {
                text.push_str(delta.content.as_deref().unwrap_or(""));
                for call in delta.tool_calls.unwrap_or_default() {
                    if call.index == rebuilt.len() {
                        assert!(call.id.is_some(), "a call's first delta has its id");
                        rebuilt.push((call.id, call.function.name, String::new()));
                    } else {
                        assert_eq!(call.id, None);
                    }
                    rebuilt[call.index].2.push_str(&call.function.arguments);
                }
            }
            assert_eq!(Some(text), content, "split at {split}");
            assert!(stream.made_calls());
            for (call, (id, name, arguments)) in calls.iter().zip(&rebuilt) {
                assert_eq!(id.as_deref(), Some(call.id.as_str()));
                assert_eq!(name.as_deref(), Some(call.function.name.as_str()));
                assert_eq!(arguments, &call.function.arguments, "split at {split}");
            }
        }
    }
}

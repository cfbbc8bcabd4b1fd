//! A reply turned into a response's output items as it arrives: its text into message
//! items, the calls it makes (read in the model's format by `tool_output.rs`) into
//! `function_call` items, each piece giving the stream events it makes. A whole response
//! is built the same way, its events dropped, so that whole and streamed agree.

use peregrine_structured::tools::ToolCallFormat;

use super::shapes::{item_status, Event, OutputItem, OutputText};
use crate::gateway::protocol::response::ChatDelta;
use crate::gateway::tool_output::{CallDeltas, CallIds};

/// The output of one response, built piece by piece.
pub struct OutputBuilder {
    /// The request's part of every item id.
    tag: String,
    /// The reply's calls, where it is read for them.
    calls: Option<CallDeltas>,
    items: Vec<OutputItem>,
    /// The item that takes the next piece of its kind, if still open.
    open: Option<usize>,
    /// The item of each call, by the call's index.
    call_items: Vec<usize>,
}

impl OutputBuilder {
    /// The output of the request `public_id` (`resp_…`), read for calls in `calls`' format.
    pub fn new(public_id: &str, calls: Option<ToolCallFormat>) -> Self {
        let ids = CallIds::of("call", public_id);
        Self {
            tag: public_id.rsplit('_').next().unwrap_or(public_id).to_owned(),
            calls: calls.map(|format| CallDeltas::new(format, ids)),
            items: Vec::new(),
            open: None,
            call_items: Vec::new(),
        }
    }

    /// The items so far.
    pub fn items(&self) -> &[OutputItem] {
        &self.items
    }

    /// The events `text`, the reply's next piece, makes.
    pub fn push(&mut self, text: &str) -> Vec<Event> {
        let deltas = match self.calls.as_mut() {
            Some(calls) => calls.push(text),
            None => vec![ChatDelta {
                content: Some(text.to_owned()),
                ..ChatDelta::default()
            }],
        };
        self.apply(deltas)
    }

    /// The events of the reply's end: what the call reader still held, the open item
    /// closed (`incomplete` unless `complete`), and an empty message if there is no item.
    pub fn finish(&mut self, complete: bool) -> Vec<Event> {
        let rest = self.calls.as_mut().map(CallDeltas::finish);
        let mut events = self.apply(rest.unwrap_or_default());
        if self.items.is_empty() {
            events.extend(self.open_message());
        }
        events.extend(self.close(complete));
        events
    }

    fn apply(&mut self, deltas: Vec<ChatDelta>) -> Vec<Event> {
        let mut events = Vec::new();
        for delta in deltas {
            if let Some(text) = delta.content.filter(|text| !text.is_empty()) {
                events.extend(self.text(text));
            }
            for call in delta.tool_calls.unwrap_or_default() {
                match (call.id, call.function.name) {
                    (Some(call_id), Some(name)) => {
                        events.extend(self.close(true));
                        let index = self.items.len();
                        self.call_items.push(index);
                        self.items.push(OutputItem::FunctionCall {
                            id: format!("fc_{}_{}", self.tag, call.index),
                            call_id,
                            name,
                            arguments: String::new(),
                            status: "in_progress",
                        });
                        self.open = Some(index);
                        events.push(self.added(index));
                    }
                    _ => events.extend(self.arguments(call.index, call.function.arguments)),
                }
            }
        }
        events
    }

    /// The events of `text` added to the open message, or to a new one.
    fn text(&mut self, text: String) -> Vec<Event> {
        let mut events = Vec::new();
        let open_message = self
            .open
            .filter(|&at| matches!(self.items[at], OutputItem::Message { .. }));
        let index = match open_message {
            Some(index) => index,
            None => {
                events.extend(self.close(true));
                events.extend(self.open_message());
                self.items.len() - 1
            }
        };
        let OutputItem::Message { id, content, .. } = &mut self.items[index] else {
            unreachable!("the open item is a message");
        };
        content[0].text.push_str(&text);
        events.push(Event::TextDelta {
            item_id: id.clone(),
            output_index: index,
            content_index: 0,
            delta: text,
            logprobs: Vec::new(),
        });
        events
    }

    /// The events of a new, empty message.
    fn open_message(&mut self) -> Vec<Event> {
        let index = self.items.len();
        let id = format!("msg_{}_{index}", self.tag);
        self.items.push(OutputItem::Message {
            id: id.clone(),
            status: "in_progress",
            role: "assistant",
            content: Vec::new(),
        });
        self.open = Some(index);
        let added = self.added(index);
        if let OutputItem::Message { content, .. } = &mut self.items[index] {
            content.push(OutputText::new(String::new()));
        }
        vec![
            added,
            Event::PartAdded {
                item_id: id,
                output_index: index,
                content_index: 0,
                part: OutputText::new(String::new()),
            },
        ]
    }

    /// The event of `fragment` added to the arguments of call `call`.
    fn arguments(&mut self, call: usize, fragment: String) -> Option<Event> {
        let index = *self.call_items.get(call)?;
        let OutputItem::FunctionCall { id, arguments, .. } = &mut self.items[index] else {
            return None;
        };
        if fragment.is_empty() {
            return None;
        }
        arguments.push_str(&fragment);
        Some(Event::ArgumentsDelta {
            item_id: id.clone(),
            output_index: index,
            delta: fragment,
        })
    }

    /// The item `index` as added.
    fn added(&self, index: usize) -> Event {
        Event::ItemAdded {
            output_index: index,
            item: self.items[index].clone(),
        }
    }

    /// The events that close the open item, if any.
    fn close(&mut self, complete: bool) -> Vec<Event> {
        let Some(index) = self.open.take() else {
            return Vec::new();
        };
        let output_index = index;
        let item = &mut self.items[index];
        let mut events = match item {
            OutputItem::Message {
                id,
                status,
                content,
                ..
            } => {
                *status = item_status(complete);
                let part = content[0].clone();
                vec![
                    Event::TextDone {
                        item_id: id.clone(),
                        output_index,
                        content_index: 0,
                        text: part.text.clone(),
                        logprobs: Vec::new(),
                    },
                    Event::PartDone {
                        item_id: id.clone(),
                        output_index,
                        content_index: 0,
                        part,
                    },
                ]
            }
            OutputItem::FunctionCall {
                id,
                name,
                arguments,
                status,
                ..
            } => {
                *status = item_status(complete);
                vec![Event::ArgumentsDone {
                    item_id: id.clone(),
                    output_index,
                    name: name.clone(),
                    arguments: arguments.clone(),
                }]
            }
        };
        events.push(Event::ItemDone {
            output_index,
            item: item.clone(),
        });
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const REPLY: &str = "Checking.<tool_call>[{\"name\": \"get_weather\", \"arguments\": \
        {\"city\": \"Oslo\"}}, {\"name\": \"get_time\", \"arguments\": {}}]</tool_call>";

    fn names(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|event| {
                let value = serde_json::to_value(event).unwrap();
                value["type"].as_str().unwrap().to_owned()
            })
            .collect()
    }

    #[test]
    fn text_and_calls_become_a_message_and_function_calls() {
        let mut builder = OutputBuilder::new("resp_00ab", Some(ToolCallFormat::Hermes));
        builder.push(REPLY);
        builder.finish(true);
        let items: Vec<Value> = builder
            .items()
            .iter()
            .map(|item| serde_json::to_value(item).unwrap())
            .collect();
        assert_eq!(
            items,
            [
                serde_json::json!({"type": "message", "id": "msg_00ab_0", "status": "completed",
                    "role": "assistant", "content": [{"type": "output_text",
                    "text": "Checking.", "annotations": [], "logprobs": []}]}),
                serde_json::json!({"type": "function_call", "id": "fc_00ab_0",
                    "call_id": "call_00ab_0", "name": "get_weather",
                    "arguments": "{\"city\":\"Oslo\"}", "status": "completed"}),
                serde_json::json!({"type": "function_call", "id": "fc_00ab_1",
                    "call_id": "call_00ab_1", "name": "get_time", "arguments": "{}",
                    "status": "completed"}),
            ]
        );
    }

    #[test]
    fn the_events_of_any_split_rebuild_the_items_in_order() {
        let mut whole = OutputBuilder::new("resp_1", Some(ToolCallFormat::Hermes));
        whole.push(REPLY);
        whole.finish(true);
        for split in (1..REPLY.len()).filter(|&at| REPLY.is_char_boundary(at)) {
            let mut builder = OutputBuilder::new("resp_1", Some(ToolCallFormat::Hermes));
            let mut events = builder.push(&REPLY[..split]);
            events.extend(builder.push(&REPLY[split..]));
            events.extend(builder.finish(true));
            assert_eq!(builder.items(), whole.items(), "split at {split}");
            // Each item is added, filled and done before the next is added.
            let mut rebuilt: Vec<OutputItem> = Vec::new();
            let mut text = String::new();
            let mut arguments = String::new();
            for event in events {
                match event {
                    Event::ItemAdded { output_index, item } => {
                        assert_eq!(output_index, rebuilt.len());
                        text.clear();
                        arguments.clear();
                        rebuilt.push(item);
                    }
                    Event::TextDelta { delta, .. } => text.push_str(&delta),
                    Event::TextDone { text: done, .. } => assert_eq!(done, text),
                    Event::ArgumentsDelta { delta, .. } => arguments.push_str(&delta),
                    Event::ArgumentsDone {
                        arguments: done, ..
                    } => assert_eq!(done, arguments),
                    Event::ItemDone { output_index, item } => {
                        assert_eq!(output_index, rebuilt.len() - 1, "split at {split}");
                        rebuilt[output_index] = item;
                    }
                    _ => {}
                }
            }
            assert_eq!(rebuilt, whole.items(), "split at {split}");
        }
    }

    #[test]
    fn a_plain_reply_is_one_message_and_an_empty_one_still_has_one() {
        let mut builder = OutputBuilder::new("resp_2", None);
        let mut events = builder.push("Hello");
        events.extend(builder.push(" world"));
        events.extend(builder.finish(false));
        assert_eq!(
            names(&events),
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
            ]
        );
        let OutputItem::Message {
            status, content, ..
        } = &builder.items()[0]
        else {
            panic!("not a message");
        };
        assert_eq!(
            (*status, content[0].text.as_str()),
            ("incomplete", "Hello world")
        );
        let mut empty = OutputBuilder::new("resp_3", None);
        let events = empty.finish(true);
        assert_eq!(names(&events).len(), 5);
        assert_eq!(empty.items().len(), 1);
    }

    #[test]
    fn a_call_cut_off_is_incomplete() {
        let mut builder = OutputBuilder::new("resp_4", Some(ToolCallFormat::Hermes));
        builder.push("<tool_call>[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"C");
        let events = builder.finish(false);
        let done = events.last().unwrap();
        let Event::ItemDone {
            item: OutputItem::FunctionCall { status, name, .. },
            ..
        } = done
        else {
            panic!("{done:?}");
        };
        assert_eq!((*status, name.as_str()), ("incomplete", "get_time"));
    }
}

//! A response streamed as the Responses API's typed server-sent events: each an `event:`
//! line naming its type and a `data:` line holding it with its `sequence_number`, from
//! `response.created` to `response.completed` (or `response.incomplete`), or to `error` and
//! `response.failed` when the generation fails part-way. No `data: [DONE]` ends it.

use bytes::Bytes;

use super::output::OutputBuilder;
use super::shapes::{Event, ResponseObject};
use crate::gateway::errors::ApiError;
use crate::gateway::generation::Delta;
use crate::gateway::protocol::response::UsageOut;
use crate::gateway::sse::ChunkFormat;

/// The events of one streamed response.
pub struct ResponseStream {
    /// The response as it began.
    response: ResponseObject,
    output: OutputBuilder,
    /// Why the generation ended, once it has.
    reason: Option<&'static str>,
    /// The next event's number.
    sequence: usize,
}

impl ResponseStream {
    /// The stream of `response` (just begun), whose items `output` builds.
    pub fn new(response: ResponseObject, output: OutputBuilder) -> Self {
        Self {
            response,
            output,
            reason: None,
            sequence: 0,
        }
    }

    /// `events`, numbered and written.
    fn write(&mut self, events: Vec<Event>) -> Bytes {
        let mut bytes = Vec::new();
        for event in events {
            let mut value = serde_json::to_value(&event).unwrap_or_default();
            value["sequence_number"] = self.sequence.into();
            self.sequence += 1;
            let name = value["type"].as_str().unwrap_or_default().to_owned();
            bytes.extend_from_slice(format!("event: {name}\ndata: {value}\n\n").as_bytes());
        }
        Bytes::from(bytes)
    }
}

impl ChunkFormat for ResponseStream {
    fn opening(&mut self) -> Option<Bytes> {
        let response = Box::new(self.response.clone());
        Some(self.write(vec![
            Event::Created {
                response: response.clone(),
            },
            Event::InProgress { response },
        ]))
    }

    fn chunk(&mut self, delta: &Delta, finish_reason: Option<&'static str>) -> Bytes {
        let mut events = self.output.push(&delta.text);
        if let Some(reason) = finish_reason {
            self.reason = Some(reason);
            events.extend(self.output.finish(reason != "length"));
        }
        self.write(events)
    }

    fn usage(&mut self, usage: UsageOut) -> Bytes {
        let reason = self.reason.unwrap_or("stop");
        let output = self.output.items().to_vec();
        let response = Box::new(self.response.finished(output, reason, usage));
        let last = match response.status {
            "completed" => Event::Completed { response },
            _ => Event::Incomplete { response },
        };
        self.write(vec![last])
    }

    fn error(&mut self, err: &ApiError) -> Bytes {
        let body = err.body();
        let output = self.output.items().to_vec();
        let failed = self.response.failed(output, err.message());
        self.write(vec![
            Event::Error {
                code: body.error.kind.to_owned(),
                message: err.message().to_owned(),
                param: err.param().map(str::to_owned),
            },
            Event::Failed {
                response: Box::new(failed),
            },
        ])
    }

    fn done(&mut self) -> Option<Bytes> {
        None
    }
}

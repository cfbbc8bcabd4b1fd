//! Server-sent events: a generation streamed as `data: {json}\n\n` chunks ending with
//! `data: [DONE]\n\n` (OpenAI's wording; an endpoint may word its events otherwise). The response body owns the generation, so when actix drops the body
//! (the client went away) the events receiver goes with it and the request is cancelled.
//! Until its first tokens a stream also watches its connection, so a client that leaves
//! while its request is queued or in prefill is noticed at once, not when the first token
//! is written; from then on each token's write notices it.

use std::collections::VecDeque;
use std::convert::Infallible;

use actix_web::http::header::CACHE_CONTROL;
use actix_web::HttpResponse;
use bytes::Bytes;
use serde::Serialize;
use tracing::Instrument;

use super::errors::ApiError;
use super::generation::{Delta, Finish, Generation, Step};
use super::peer::PeerProbe;
use super::protocol::response::UsageOut;

/// The event that ends every stream.
const DONE: &[u8] = b"data: [DONE]\n\n";

/// How an endpoint words its stream.
pub trait ChunkFormat: 'static {
    /// The event sent before any output, if the endpoint has one (chat's role chunk).
    fn opening(&mut self) -> Option<Bytes>;

    /// The event for `delta`; `finish_reason` is set on the last one.
    fn chunk(&mut self, delta: &Delta, finish_reason: Option<&'static str>) -> Bytes;

    /// The event with the usage and no choices, sent last when the client asked for it.
    fn usage(&mut self, usage: UsageOut) -> Bytes;

    /// The usage so far, for the events that follow to carry (vLLM's
    /// `continuous_usage_stats`); formats without per-chunk usage ignore it.
    fn running_usage(&mut self, _usage: UsageOut) {}

    /// The events that end a generation: its last chunk, then the usage if
    /// `include_usage`.
    fn last(&mut self, finish: Finish, include_usage: bool) -> Vec<Bytes> {
        let mut events = vec![self.chunk(&finish.delta, Some(finish.reason))];
        if include_usage {
            events.push(self.usage(finish.usage));
        }
        events
    }

    /// The event of an error that ends the stream part-way.
    fn error(&mut self, err: &ApiError) -> Bytes {
        event(&err.body())
    }

    /// The event after all others, if the endpoint has one (`data: [DONE]`).
    fn done(&mut self) -> Option<Bytes> {
        Some(Bytes::from_static(DONE))
    }
}

/// One `data:` event holding `value` as JSON.
pub fn event(value: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_default();
    Bytes::from(format!("data: {json}\n\n"))
}

/// Which usage a stream reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamUsage {
    /// A last event with the usage and no choices (`stream_options.include_usage`).
    pub at_end: bool,
    /// Every event carries the usage so far (vLLM's `continuous_usage_stats`).
    pub every_chunk: bool,
}

impl From<bool> for StreamUsage {
    /// Usage at the end or not at all.
    fn from(at_end: bool) -> Self {
        StreamUsage {
            at_end,
            every_chunk: false,
        }
    }
}

/// The streaming response for `generation`, logging inside `span`, cancelled as soon as
/// `peer` (the client's connection, where known) closes.
pub fn respond<F: ChunkFormat>(
    generation: Generation,
    mut format: F,
    usage: impl Into<StreamUsage>,
    span: tracing::Span,
    peer: Option<PeerProbe>,
) -> HttpResponse {
    let usage = usage.into();
    if usage.every_chunk {
        format.running_usage(generation.usage_so_far());
    }
    let stream = SseStream {
        queue: format.opening().into_iter().collect(),
        generation: Some(generation),
        peer,
        format,
        usage,
        ended: false,
    };
    let body = futures_util::stream::unfold(stream, move |mut stream| {
        async move {
            loop {
                if let Some(bytes) = stream.queue.pop_front() {
                    return Some((Ok::<_, Infallible>(bytes), stream));
                }
                if stream.ended {
                    return None;
                }
                stream.advance().await;
            }
        }
        .instrument(span.clone())
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, "no-cache"))
        .streaming(body)
}

/// The state of one stream: events ready to send and the generation behind them.
struct SseStream<F> {
    queue: VecDeque<Bytes>,
    /// `None` once the client left (dropping it cancels the request).
    generation: Option<Generation>,
    /// The client's connection, watched until the first tokens arrive.
    peer: Option<PeerProbe>,
    format: F,
    usage: StreamUsage,
    ended: bool,
}

impl<F: ChunkFormat> SseStream<F> {
    /// Reads the generation's next step into events; ends the stream, cancelling the
    /// request, if the client leaves first.
    async fn advance(&mut self) {
        let Some(generation) = self.generation.as_mut() else {
            self.ended = true;
            return;
        };
        let step = match &self.peer {
            Some(peer) => tokio::select! {
                step = generation.next() => step,
                () = peer.closed_wait() => {
                    tracing::info!("client closed the connection; request cancelled");
                    self.generation = None;
                    self.ended = true;
                    return;
                }
            },
            None => generation.next().await,
        };
        self.queue_step(step);
        // What is queued now is written next, and the write notices a client that left.
        if !self.queue.is_empty() {
            self.peer = None;
        }
    }

    /// Queues the events of one step of the generation.
    fn queue_step(&mut self, step: Option<Result<Step, ApiError>>) {
        match step {
            Some(Ok(Step::Delta(delta))) => {
                if !delta.is_empty() {
                    if let Some(generation) = self.generation.as_ref() {
                        if self.usage.every_chunk {
                            self.format.running_usage(generation.usage_so_far());
                        }
                    }
                    self.queue.push_back(self.format.chunk(&delta, None));
                }
            }
            Some(Ok(Step::Finished(finish))) => {
                if self.usage.every_chunk {
                    self.format.running_usage(finish.usage.clone());
                }
                let last = self.format.last(finish, self.usage.at_end);
                self.queue.extend(last);
                self.end();
            }
            Some(Err(err)) => {
                tracing::warn!(%err, "the stream failed");
                self.queue.push_back(self.format.error(&err));
                self.end();
            }
            None => self.end(),
        }
    }

    fn end(&mut self) {
        self.queue.extend(self.format.done());
        self.ended = true;
    }
}

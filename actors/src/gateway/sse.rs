//! Server-sent events: a generation streamed as `data: {json}\n\n` chunks ending with
//! `data: [DONE]\n\n`, or in the events an endpoint's [`ChunkFormat`] writes instead. The
//! response body owns the generation, so when actix drops the body
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
use super::generation::{Delta, Generation, Step};
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

    /// The events of an error part-way: OpenAI's error body by default.
    fn error(&mut self, err: &ApiError) -> Bytes {
        event(&err.body())
    }

    /// The event that ends the stream, if the endpoint has one: `data: [DONE]` by default.
    fn done(&mut self) -> Option<Bytes> {
        Some(Bytes::from_static(DONE))
    }
}

/// One `data:` event holding `value` as JSON.
pub fn event(value: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_default();
    Bytes::from(format!("data: {json}\n\n"))
}

/// The streaming response for `generation`, logging inside `span`, cancelled as soon as
/// `peer` (the client's connection, where known) closes.
pub fn respond<F: ChunkFormat>(
    generation: Generation,
    mut format: F,
    include_usage: bool,
    span: tracing::Span,
    peer: Option<PeerProbe>,
) -> HttpResponse {
    let stream = SseStream {
        queue: format.opening().into_iter().collect(),
        generation: Some(generation),
        peer,
        format,
        include_usage,
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
    include_usage: bool,
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
                    self.queue.push_back(self.format.chunk(&delta, None));
                }
            }
            Some(Ok(Step::Finished(finish))) => {
                let last = self.format.chunk(&finish.delta, Some(finish.reason));
                self.queue.push_back(last);
                if self.include_usage {
                    self.queue.push_back(self.format.usage(finish.usage));
                }
                self.end();
            }
            Some(Err(err)) => {
                tracing::warn!(%err, "the stream failed");
                let events = self.format.error(&err);
                self.queue.push_back(events);
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

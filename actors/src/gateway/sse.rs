//! Server-sent events: a generation streamed as `data: {json}\n\n` chunks ending with
//! `data: [DONE]\n\n` (OpenAI's wording; an endpoint may word its events otherwise). The response body owns the generation, so when actix drops the body
//! (the client went away) the events receiver goes with it and the request is cancelled.
//! Until its first tokens a stream also watches its connection, so a client that leaves
//! while its request is queued or in prefill is noticed at once, not when the first token
//! is written; from then on each token's write notices it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;

use actix_web::http::header::CACHE_CONTROL;
use actix_web::HttpResponse;
use bytes::Bytes;
use futures_util::stream::{SelectAll, Stream, StreamExt};
use serde::Serialize;
use tracing::Instrument;

use super::choices::{summed, Choices};
use super::errors::ApiError;
use super::generation::{Delta, Finish, Generation, Step};
use super::peer::PeerProbe;
use super::protocol::response::UsageOut;

/// The event that ends every stream.
const DONE: &[u8] = b"data: [DONE]\n\n";

/// How an endpoint words its stream.
pub trait ChunkFormat: 'static {
    /// The event sent before any output, if the endpoint has one (chat's role chunk); with
    /// several choices, one per choice.
    fn opening(&mut self) -> Option<Bytes>;

    /// Which choice (of several, `n` > 1) the events that follow are about; a format that
    /// serves one choice ignores it.
    fn choice(&mut self, _index: usize) {}

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
    format: F,
    usage: impl Into<StreamUsage>,
    span: tracing::Span,
    peer: Option<PeerProbe>,
) -> HttpResponse {
    let choices = Choices {
        generations: vec![generation],
        per_prompt: 1,
    };
    respond_choices(choices, format, usage, span, peer)
}

/// The streaming response for `choices`: each one's events as its tokens come, told apart
/// by their index ([`ChunkFormat::choice`]); a stream of one choice ends with
/// [`ChunkFormat::last`], one of several with each choice's last chunk and then the summed
/// usage, where asked for. An error in any choice ends the stream, cancelling them all.
pub fn respond_choices<F: ChunkFormat>(
    choices: Choices,
    mut format: F,
    usage: impl Into<StreamUsage>,
    span: tracing::Span,
    peer: Option<PeerProbe>,
) -> HttpResponse {
    let usage = usage.into();
    let latest: Vec<UsageOut> = choices
        .generations
        .iter()
        .map(Generation::usage_so_far)
        .collect();
    let count = latest.len();
    if usage.every_chunk {
        format.running_usage(summed(&latest, choices.per_prompt));
    }
    let mut queue = VecDeque::new();
    for index in 0..count {
        format.choice(index);
        queue.extend(format.opening());
    }
    let steps = choices
        .generations
        .into_iter()
        .enumerate()
        .map(|(index, generation)| choice_steps(index, generation));
    let stream = SseStream {
        queue,
        steps: Some(futures_util::stream::select_all(steps)),
        latest,
        finals: vec![None; count],
        per_prompt: choices.per_prompt,
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

/// One step of one choice, with that choice's usage after it.
struct ChoiceStep {
    index: usize,
    step: Option<Result<Step, ApiError>>,
    usage: UsageOut,
}

/// The steps of choice `index`, ending after its last (dropping the generation).
fn choice_steps(index: usize, generation: Generation) -> Pin<Box<dyn Stream<Item = ChoiceStep>>> {
    Box::pin(futures_util::stream::unfold(
        Some(generation),
        move |generation| async move {
            let mut generation = generation?;
            let step = generation.next().await;
            let usage = generation.usage_so_far();
            let goes_on = matches!(step, Some(Ok(Step::Delta(_))));
            let step = ChoiceStep { index, step, usage };
            Some((step, goes_on.then_some(generation)))
        },
    ))
}

/// The state of one stream: events ready to send and the choices behind them.
struct SseStream<F> {
    queue: VecDeque<Bytes>,
    /// Every choice's steps as they come; `None` once the client left (dropping them
    /// cancels the requests).
    steps: Option<SelectAll<Pin<Box<dyn Stream<Item = ChoiceStep>>>>>,
    /// Each choice's usage so far.
    latest: Vec<UsageOut>,
    /// Each finished choice's final usage.
    finals: Vec<Option<UsageOut>>,
    /// Choices per prompt, for the summed usage.
    per_prompt: usize,
    /// The client's connection, watched until the first tokens arrive.
    peer: Option<PeerProbe>,
    format: F,
    usage: StreamUsage,
    ended: bool,
}

impl<F: ChunkFormat> SseStream<F> {
    /// Reads the next step of any choice into events; ends the stream, cancelling the
    /// requests, if the client leaves first.
    async fn advance(&mut self) {
        let Some(steps) = self.steps.as_mut() else {
            self.ended = true;
            return;
        };
        let next = match &self.peer {
            Some(peer) => tokio::select! {
                next = steps.next() => next,
                () = peer.closed_wait() => {
                    tracing::info!("client closed the connection; request cancelled");
                    self.steps = None;
                    self.ended = true;
                    return;
                }
            },
            None => steps.next().await,
        };
        match next {
            Some(step) => self.queue_step(step),
            None => self.end(),
        }
        // What is queued now is written next, and the write notices a client that left.
        if !self.queue.is_empty() {
            self.peer = None;
        }
    }

    /// Queues the events of one step of a choice.
    fn queue_step(&mut self, choice: ChoiceStep) {
        let ChoiceStep { index, step, usage } = choice;
        self.latest[index] = usage;
        self.format.choice(index);
        match step {
            Some(Ok(Step::Delta(delta))) => {
                if !delta.is_empty() {
                    if self.usage.every_chunk {
                        let running = summed(&self.latest, self.per_prompt);
                        self.format.running_usage(running);
                    }
                    self.queue.push_back(self.format.chunk(&delta, None));
                }
            }
            Some(Ok(Step::Finished(finish))) => self.finish(index, finish),
            Some(Err(err)) => {
                tracing::warn!(%err, "the stream failed");
                self.queue.push_back(self.format.error(&err));
                self.steps = None;
                self.end();
            }
            None => {
                self.queue.push_back(
                    self.format
                        .error(&ApiError::internal("a choice ended without finishing")),
                );
                self.steps = None;
                self.end();
            }
        }
    }

    /// Queues the last events of choice `index`, and after the last choice's the usage.
    fn finish(&mut self, index: usize, finish: Finish) {
        self.latest[index] = finish.usage.clone();
        self.finals[index] = Some(finish.usage.clone());
        if self.usage.every_chunk {
            self.format
                .running_usage(summed(&self.latest, self.per_prompt));
        }
        if self.finals.len() == 1 {
            let last = self.format.last(finish, self.usage.at_end);
            self.queue.extend(last);
            self.end();
            return;
        }
        let last = self.format.chunk(&finish.delta, Some(finish.reason));
        self.queue.push_back(last);
        if self.finals.iter().all(Option::is_some) {
            if self.usage.at_end {
                let usage = summed(&self.latest, self.per_prompt);
                self.queue.push_back(self.format.usage(usage));
            }
            self.end();
        }
    }

    fn end(&mut self) {
        self.queue.extend(self.format.done());
        self.ended = true;
    }
}

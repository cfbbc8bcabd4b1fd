//! One running request as the gateway sees it: the scheduler's token events turned into
//! text (detokenized incrementally, special tokens skipped), cut at the first stop string,
//! with each token's logprobs and ids where asked for, and the prompt's tokens' logprobs
//! where the request scores its prompt (they come before the first tokens, with the first
//! delta). Both the whole-response handlers and the SSE streams read it; dropping it drops
//! the events receiver, which cancels the request.
//!
//! The token ids (`return_token_ids`) are exactly the ids the engine generated for the
//! request, in order, that the output counts: the token that ended it included, be it an
//! end-of-sequence or `stop_token_ids` id the engine sampled (the text skips a special
//! token, the ids keep it, as vLLM's do) or the token that completed a stop string. Tokens
//! the engine generated past a stop string are left out, as `usage` leaves them out, so
//! there are always `usage.completion_tokens` ids, streamed or whole.

use std::sync::Arc;

use peregrine_models::tokenizer::{DecodeStream, Tokenizer};
use peregrine_ops::sampling::TokenLogprobs;
use tokio::sync::mpsc;

use super::context::RequestContext;
use super::engine_client::EngineClient;
use super::errors::ApiError;
use super::params::Plan;
use super::peer::PeerProbe;
use super::protocol::response::UsageOut;
use super::state::GatewayState;
use super::stop::{Matched, StopMatcher};
use crate::messages::{
    FinishReason, GeneratedToken, PromptLogprobs, RequestEvent, RequestId, Usage,
};

/// A generated token with the texts its logprobs are reported under.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOut {
    /// The token's own text.
    pub text: String,
    /// Its logprob.
    pub logprob: f32,
    /// The most likely alternatives' texts and logprobs, most likely first.
    pub top: Vec<(String, f32)>,
}

/// A prompt token with its score, where the request scores its prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptTokenOut {
    /// The token.
    pub id: u32,
    /// Its text.
    pub text: String,
    /// Its logprob given the tokens before it; `None` for the first, which follows nothing.
    pub scored: Option<Scored>,
}

/// A prompt token's logprob given the tokens before it.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    /// Its logprob.
    pub logprob: f32,
    /// Its 1-based rank: how many tokens are at least as likely there.
    pub rank: usize,
    /// The most likely tokens there: id, text and logprob, most likely first.
    pub top: Vec<(u32, String, f32)>,
}

/// What one batch of events added.
#[derive(Debug, Default, PartialEq)]
pub struct Delta {
    /// The prompt's tokens, scored, in the first delta of a request that scores its
    /// prompt.
    pub prompt: Vec<PromptTokenOut>,
    /// Text that is now final.
    pub text: String,
    /// The new tokens, when logprobs were asked for.
    pub tokens: Vec<TokenOut>,
    /// The new tokens' ids, when token ids were asked for.
    pub token_ids: Vec<u32>,
}

impl Delta {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.prompt.is_empty()
            && self.text.is_empty()
            && self.tokens.is_empty()
            && self.token_ids.is_empty()
    }
}

/// The end of a request.
#[derive(Debug, PartialEq)]
pub struct Finish {
    /// The last text and tokens.
    pub delta: Delta,
    /// `stop` or `length`.
    pub reason: &'static str,
    /// The stop string that ended the output, if one did.
    pub stop_string: Option<String>,
    /// Token counts.
    pub usage: UsageOut,
}

/// One step of a generation.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// More output; more follows.
    Delta(Delta),
    /// The last output.
    Finished(Finish),
}

/// A whole generation's output.
#[derive(Debug, PartialEq)]
pub struct Output {
    /// The prompt's tokens, scored, where the request scores its prompt.
    pub prompt: Vec<PromptTokenOut>,
    /// All the text.
    pub text: String,
    /// All the tokens, when logprobs were asked for.
    pub tokens: Vec<TokenOut>,
    /// All the token ids, when token ids were asked for.
    pub token_ids: Vec<u32>,
    /// `stop` or `length`.
    pub reason: &'static str,
    /// The stop string that ended the output, if one did.
    pub stop_string: Option<String>,
    /// Token counts.
    pub usage: UsageOut,
}

/// A submitted request whose events are being read.
pub struct Generation {
    id: RequestId,
    public_id: String,
    engine: EngineClient,
    events: mpsc::UnboundedReceiver<RequestEvent>,
    /// The first event, when [`Generation::started`] read it ahead.
    first: Option<RequestEvent>,
    tokenizer: Arc<Tokenizer>,
    decoder: Option<DecodeStream>,
    /// Token ids whose text is left out of the output: none when special tokens are
    /// skipped (the decoder drops them), else the tokens that end it.
    unwritten: Vec<u32>,
    stops: StopMatcher,
    /// The prompt, where the request scores it (`prompt_logprobs`): its scores name no
    /// token, the positions do.
    scored_prompt: Option<Arc<[u32]>>,
    /// Prompt tokens scored and not yet in a delta.
    prompt_out: Vec<PromptTokenOut>,
    /// Prompt tokens already in a delta.
    prompt_sent: usize,
    /// Stop strings end the output only from the token after this many (vLLM's
    /// `min_tokens`).
    min_tokens: usize,
    logprobs: bool,
    /// Report each token's id.
    token_ids: bool,
    /// Report speculation counts in `usage`.
    spec_details: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
    done: bool,
}

impl Generation {
    /// Submits `plan` as the request of `context`.
    pub async fn start(
        state: &GatewayState,
        context: &RequestContext,
        plan: Plan,
    ) -> Result<Self, ApiError> {
        Self::start_as(state, context.id, &context.public_id, plan).await
    }

    /// Submits `plan` as engine request `id`, logged as `public_id`.
    pub async fn start_as(
        state: &GatewayState,
        id: RequestId,
        public_id: &str,
        plan: Plan,
    ) -> Result<Self, ApiError> {
        let submission = plan.submission;
        let prompt_tokens = submission.prompt.len();
        let logprobs = submission.logprobs.is_some();
        tracing::info!(
            prompt_tokens,
            max_tokens = submission.max_tokens,
            stream = plan.stream,
            "submitting"
        );
        let keep_special = plan.keep_special_tokens;
        let unwritten = match keep_special {
            true => {
                let eos = state.model.tokenizer.eos_token_ids();
                [eos, submission.stop_token_ids.as_slice()].concat()
            }
            false => Vec::new(),
        };
        let min_tokens = submission.params.min_tokens;
        let scored_prompt = submission
            .prompt_logprobs
            .map(|_| Arc::clone(&submission.prompt));
        let events = state.engine.submit(id, submission).await?;
        let tokenizer = &state.model.tokenizer;
        let mut generation = Self {
            id,
            public_id: public_id.to_owned(),
            engine: state.engine.clone(),
            events,
            first: None,
            tokenizer: Arc::clone(tokenizer),
            decoder: Some(tokenizer.decode_stream(!keep_special)),
            unwritten,
            stops: StopMatcher::new(plan.stop),
            scored_prompt,
            prompt_out: Vec::new(),
            prompt_sent: 0,
            min_tokens,
            logprobs,
            token_ids: plan.return_token_ids,
            spec_details: plan.spec_decode_details,
            prompt_tokens,
            completion_tokens: 0,
            done: false,
        };
        // The first prompt token follows nothing: it has no score, but its place.
        if let Some(&id) = generation.scored_prompt.as_ref().and_then(|p| p.first()) {
            let text = generation.token_text(id);
            generation.prompt_out.push(PromptTokenOut {
                id,
                text,
                scored: None,
            });
        }
        Ok(generation)
    }

    /// The token counts so far: the prompt's, and the output's tokens read until now.
    pub fn usage_so_far(&self) -> UsageOut {
        UsageOut::counted(self.prompt_tokens, self.completion_tokens)
    }

    /// Waits until the engine has sent the request's first event (its first tokens: its
    /// prompt is computed), which the next [`Generation::next`] then reads.
    pub async fn started(&mut self) {
        if self.first.is_none() && !self.done {
            self.first = self.events.recv().await;
        }
    }

    /// The next step; `None` after the last.
    pub async fn next(&mut self) -> Option<Result<Step, ApiError>> {
        if self.done {
            return None;
        }
        let step = loop {
            let event = match self.first.take() {
                Some(event) => Some(event),
                None => self.events.recv().await,
            };
            let step = match event {
                Some(RequestEvent::PromptLogprobs(scores)) => match self.on_scores(scores) {
                    Ok(()) => continue,
                    Err(err) => Err(err),
                },
                Some(RequestEvent::Tokens(tokens)) => self.on_tokens(tokens).await,
                Some(RequestEvent::Finished { reason, usage }) => self.on_finished(reason, usage),
                None => Err(ApiError::internal(
                    "the engine dropped the request before it finished",
                )),
            };
            break step.map(|step| self.with_prompt(step));
        };
        self.done = !matches!(step, Ok(Step::Delta(_)));
        if let Ok(Step::Finished(finish)) = &step {
            tracing::info!(
                reason = finish.reason,
                completion_tokens = finish.usage.completion_tokens,
                "finished"
            );
        }
        Some(step)
    }

    /// Reads to the end, or gives up (dropping the request, which the scheduler then
    /// cancels) as soon as `peer` says the client has gone.
    pub async fn collect_while_connected(
        self,
        peer: Option<PeerProbe>,
    ) -> Result<Output, ApiError> {
        let Some(peer) = peer else {
            return self.collect().await;
        };
        tokio::select! {
            output = self.collect() => output,
            () = peer.closed_wait() => {
                tracing::info!("client closed the connection; request cancelled");
                Err(ApiError::bad_request("the client closed the connection"))
            }
        }
    }

    /// Reads to the end.
    pub async fn collect(mut self) -> Result<Output, ApiError> {
        let mut text = String::new();
        let (mut prompt, mut tokens, mut token_ids) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(step) = self.next().await {
            let (delta, finish) = match step? {
                Step::Delta(delta) => (delta, None),
                Step::Finished(Finish {
                    delta,
                    reason,
                    stop_string,
                    usage,
                }) => (delta, Some((reason, stop_string, usage))),
            };
            prompt.extend(delta.prompt);
            text.push_str(&delta.text);
            tokens.extend(delta.tokens);
            token_ids.extend(delta.token_ids);
            if let Some((reason, stop_string, usage)) = finish {
                return Ok(Output {
                    prompt,
                    text,
                    tokens,
                    token_ids,
                    reason,
                    stop_string,
                    usage,
                });
            }
        }
        Err(ApiError::internal("the request ended without finishing"))
    }

    /// Takes in the scores of the prompt's tokens from `scores.first` on; an error if
    /// they do not follow those already taken in.
    fn on_scores(&mut self, scores: PromptLogprobs) -> Result<(), ApiError> {
        let Some(prompt) = self.scored_prompt.clone() else {
            return Ok(());
        };
        let taken = self.prompt_out.len() + self.prompt_sent;
        if scores.first != taken || taken + scores.scores.len() > prompt.len() {
            return Err(ApiError::internal(format!(
                "the engine scored prompt tokens {}..{} after {taken} of {}",
                scores.first,
                scores.first + scores.scores.len(),
                prompt.len()
            )));
        }
        for (score, &id) in scores.scores.into_iter().zip(&prompt[scores.first..]) {
            let top = score
                .top
                .iter()
                .map(|&(id, logprob)| (id, self.token_text(id), logprob))
                .collect();
            self.prompt_out.push(PromptTokenOut {
                id,
                text: self.token_text(id),
                scored: Some(Scored {
                    logprob: score.logprob,
                    rank: score.rank,
                    top,
                }),
            });
        }
        Ok(())
    }

    /// `step` with the prompt tokens scored since the last one, in its delta.
    fn with_prompt(&mut self, mut step: Step) -> Step {
        let delta = match &mut step {
            Step::Delta(delta) => delta,
            Step::Finished(finish) => &mut finish.delta,
        };
        self.prompt_sent += self.prompt_out.len();
        delta.prompt = std::mem::take(&mut self.prompt_out);
        step
    }

    async fn on_tokens(&mut self, tokens: Vec<GeneratedToken>) -> Result<Step, ApiError> {
        let mut delta = Delta::default();
        for token in tokens {
            self.completion_tokens += 1;
            if self.token_ids {
                delta.token_ids.push(token.id);
            }
            if let Some(logprobs) = token.logprobs.filter(|_| self.logprobs) {
                delta.tokens.push(self.token_out(token.id, logprobs));
            }
            let text = match self.decoder.as_mut() {
                Some(_) if self.unwritten.contains(&token.id) => None,
                Some(decoder) => decoder.step(token.id).map_err(decode_error)?,
                None => None,
            };
            let checked = self.completion_tokens > self.min_tokens;
            let matched = text.map(|text| match checked {
                true => self.stops.push(&text),
                false => Matched::Released(self.stops.push_unchecked(&text)),
            });
            match matched {
                None => {}
                Some(Matched::Released(text)) => delta.text.push_str(&text),
                Some(Matched::Stopped(text)) => {
                    delta.text.push_str(&text);
                    let usage = self.usage_at_stop().await;
                    return Ok(Step::Finished(Finish {
                        delta,
                        reason: "stop",
                        stop_string: self.stops.matched().map(str::to_owned),
                        usage,
                    }));
                }
            }
        }
        Ok(Step::Delta(delta))
    }

    /// The usage of a request that a stop string ended: the engine is told to stop it and
    /// its final report (prefix-cache hits, speculation counts) is awaited, with the
    /// completion tokens counted up to the token that completed the stop string (the engine
    /// may have generated more by then). Without an engine to report, the gateway's own
    /// counts.
    async fn usage_at_stop(&mut self) -> UsageOut {
        self.engine.stop(self.id).await;
        let completion_tokens = self.completion_tokens;
        loop {
            match self.events.recv().await {
                Some(RequestEvent::PromptLogprobs(_) | RequestEvent::Tokens(_)) => {}
                Some(RequestEvent::Finished { usage, .. }) => {
                    let usage = Usage {
                        completion_tokens,
                        ..usage
                    };
                    return UsageOut::reported(usage, self.spec_details);
                }
                None => return UsageOut::counted(self.prompt_tokens, completion_tokens),
            }
        }
    }

    fn on_finished(&mut self, reason: FinishReason, usage: Usage) -> Result<Step, ApiError> {
        match reason {
            FinishReason::Abort => {
                return Err(ApiError::unavailable(
                    "the request was cancelled before it finished (the server is shutting down)",
                ))
            }
            FinishReason::Error => {
                return Err(ApiError::internal(
                    "the engine failed while running the request (the server log says why)",
                ))
            }
            FinishReason::Stop | FinishReason::Length => {}
        }
        let tail = match self.decoder.take() {
            Some(decoder) => decoder.finish().map_err(decode_error)?,
            None => String::new(),
        };
        let (text, reason) = match self.stops.push(&tail) {
            Matched::Released(text) => (text + &self.stops.flush(), reason.as_str()),
            Matched::Stopped(text) => (text, "stop"),
        };
        Ok(Step::Finished(Finish {
            delta: Delta {
                text,
                ..Delta::default()
            },
            reason,
            stop_string: self.stops.matched().map(str::to_owned),
            usage: UsageOut::reported(usage, self.spec_details),
        }))
    }

    fn token_out(&self, id: u32, logprobs: TokenLogprobs) -> TokenOut {
        TokenOut {
            text: self.token_text(id),
            logprob: logprobs.logprob,
            top: logprobs
                .top
                .iter()
                .map(|&(id, logprob)| (self.token_text(id), logprob))
                .collect(),
        }
    }

    /// One token's text, special tokens included (empty if the id cannot be decoded).
    fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.done {
            tracing::info!(id = %self.public_id, "client went away; the request is cancelled");
        }
    }
}

fn decode_error(err: anyhow::Error) -> ApiError {
    ApiError::internal(format!("cannot detokenize the output: {err:#}"))
}

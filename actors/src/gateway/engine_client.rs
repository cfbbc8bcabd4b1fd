//! The gateway's handle on the scheduler: submits requests and aborts them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use peregrine_ops::sampling::SamplingParams;
use tokio::sync::{mpsc, oneshot};

use super::errors::ApiError;
use crate::messages::{GenerateRequest, RequestEvent, RequestId, SchedulerMsg, SubmitError};

/// A request as the gateway hands it over: everything in a [`GenerateRequest`] except the
/// id, arrival time and events channel, which [`EngineClient::submit`] adds.
#[derive(Clone, Debug, PartialEq)]
pub struct Submission {
    /// The prompt's token ids.
    pub prompt: Arc<[u32]>,
    /// Validated sampling parameters.
    pub params: SamplingParams,
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end the request besides EOS.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// Top alternatives to report with each token's logprob (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// Lower runs first.
    pub priority: i32,
}

/// Why a submission did not reach the queue.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The scheduler refused it.
    #[error(transparent)]
    Refused(#[from] SubmitError),
    /// The scheduler is not running (its channel is closed).
    #[error("the engine is not running")]
    Unavailable,
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        match err {
            EngineError::Refused(err) => err.into(),
            EngineError::Unavailable => ApiError::unavailable(err.to_string()),
        }
    }
}

/// A cheap-to-clone handle that sends [`SchedulerMsg`]s and numbers requests.
#[derive(Clone, Debug)]
pub struct EngineClient {
    scheduler: mpsc::Sender<SchedulerMsg>,
    next_id: Arc<AtomicU64>,
}

impl EngineClient {
    /// A client of the scheduler listening on `scheduler`.
    pub fn new(scheduler: mpsc::Sender<SchedulerMsg>) -> Self {
        Self {
            scheduler,
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// A fresh request id, unique among this client and its clones.
    pub fn next_id(&self) -> RequestId {
        RequestId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Queues `submission` as request `id`; returns the receiver of its events. Dropping
    /// the receiver cancels the request.
    pub async fn submit(
        &self,
        id: RequestId,
        submission: Submission,
    ) -> Result<mpsc::UnboundedReceiver<RequestEvent>, EngineError> {
        let (events, receiver) = mpsc::unbounded_channel();
        let request = GenerateRequest {
            id,
            prompt: submission.prompt,
            params: submission.params,
            max_tokens: submission.max_tokens,
            stop_token_ids: submission.stop_token_ids,
            ignore_eos: submission.ignore_eos,
            logprobs: submission.logprobs,
            priority: submission.priority,
            arrival: Instant::now(),
            events,
        };
        let (reply, answer) = oneshot::channel();
        self.scheduler
            .send(SchedulerMsg::Submit(request, reply))
            .await
            .map_err(|_| EngineError::Unavailable)?;
        answer.await.map_err(|_| EngineError::Unavailable)??;
        Ok(receiver)
    }

    /// Asks the scheduler to cancel request `id`; a scheduler that is gone needs no asking.
    pub async fn abort(&self, id: RequestId) {
        if self.scheduler.send(SchedulerMsg::Abort(id)).await.is_err() {
            tracing::debug!(%id, "abort not sent: the scheduler is gone");
        }
    }
}

//! The gateway's handle on the scheduler: submits requests and aborts them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::errors::ApiError;
use crate::health::EngineHealth;
use crate::messages::{
    GenerateRequest, RequestEvent, RequestId, RequestSpec, SchedulerMsg, SubmitError,
};

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

/// A cheap-to-clone handle that sends [`SchedulerMsg`]s, numbers requests and reads the
/// engine's liveness.
#[derive(Clone, Debug)]
pub struct EngineClient {
    scheduler: mpsc::Sender<SchedulerMsg>,
    health: EngineHealth,
    next_id: Arc<AtomicU64>,
}

impl EngineClient {
    /// A client of the scheduler listening on `scheduler`, whose engine records its
    /// liveness in `health`.
    pub fn new(scheduler: mpsc::Sender<SchedulerMsg>, health: EngineHealth) -> Self {
        Self {
            scheduler,
            health,
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// `Ok` while the engine is live: its scheduler runs, its threads run and its last
    /// step succeeded; else why it is not.
    pub fn health(&self) -> Result<(), String> {
        if self.scheduler.is_closed() {
            return Err("the engine's scheduler has stopped".into());
        }
        self.health.check()
    }

    /// A fresh request id, unique among this client and its clones.
    pub fn next_id(&self) -> RequestId {
        RequestId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Queues `spec` as request `id`; returns the receiver of its events. Dropping the
    /// receiver cancels the request.
    pub async fn submit(
        &self,
        id: RequestId,
        spec: RequestSpec,
    ) -> Result<mpsc::UnboundedReceiver<RequestEvent>, EngineError> {
        let (events, receiver) = mpsc::unbounded_channel();
        let request = GenerateRequest {
            id,
            spec,
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

    /// Asks the scheduler to end request `id` as `stop` (a stop string ended its text); a
    /// scheduler that is gone needs no asking.
    pub async fn stop(&self, id: RequestId) {
        if self.scheduler.send(SchedulerMsg::Stop(id)).await.is_err() {
            tracing::debug!(%id, "stop not sent: the scheduler is gone");
        }
    }
}

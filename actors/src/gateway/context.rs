//! A generation request's identity: its engine id, the id clients see (`cmpl-…`,
//! `chatcmpl-…`, `msg_…`) and the `tracing` span that puts that id on every log line about it.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use tracing::Instrument;

use super::engine_client::EngineClient;
use super::errors::ApiError;
use super::state::unix_now;
use crate::messages::RequestId;

/// One request's ids, arrival time and span.
#[derive(Clone, Debug)]
pub struct RequestContext {
    /// The engine's id.
    pub id: RequestId,
    /// The id in responses and logs.
    pub public_id: String,
    /// Unix time the request arrived.
    pub created: u64,
    /// The span of everything logged about the request.
    pub span: tracing::Span,
}

impl RequestContext {
    /// A fresh context; `prefix` is `cmpl-`, `chatcmpl-` or `msg_`.
    pub fn new(engine: &EngineClient, prefix: &str) -> Self {
        let id = engine.next_id();
        let public_id = format!("{prefix}{:016x}{:016x}", process_tag(), id.0);
        let span = tracing::info_span!("request", id = %public_id, request_id = %id);
        Self {
            id,
            public_id,
            created: unix_now(),
            span,
        }
    }

    /// Runs `work` inside the span, logging a refusal.
    pub async fn run<T>(
        &self,
        work: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        async {
            let result = work.await;
            if let Err(err) = &result {
                tracing::info!(
                    status = err.status().as_u16(),
                    message = err.message(),
                    "refused"
                );
            }
            result
        }
        .instrument(self.span.clone())
        .await
    }
}

/// A random number fixed for the life of the process, so ids differ across restarts.
fn process_tag() -> u64 {
    static TAG: OnceLock<u64> = OnceLock::new();
    *TAG.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(unix_now());
        hasher.finish()
    })
}

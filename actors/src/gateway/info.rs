//! The open endpoints: `GET /health`, `GET /ready`, `GET /metrics`, and `GET /v1/models` and
//! `GET /v1/models/{model}` (which need the API key like every `/v1` path).

use actix_web::{web, HttpResponse};

use super::auth::ApiKeyAuth;
use super::errors::ApiError;
use super::params::check_model;
use super::protocol::response::{ModelCard, ModelList};
use super::state::GatewayState;

/// 200 while the engine is live; 503 naming why once its scheduler or a runner thread has
/// stopped or its last step failed.
pub async fn health(state: web::Data<GatewayState>) -> Result<HttpResponse, ApiError> {
    state.engine.health().map_err(ApiError::unavailable)?;
    Ok(HttpResponse::Ok().finish())
}

/// 200 while the engine is live and takes new requests; 503 naming why otherwise (the
/// engine's failure, or a drain begun by SIGTERM): what a Kubernetes readiness probe or a
/// router's health check reads, so that no new request is sent to a replica going away,
/// while `/health` (liveness) stays 200 through the drain. The server listens only once
/// the model is loaded, so a loading replica is not ready either.
pub async fn ready(state: web::Data<GatewayState>) -> Result<HttpResponse, ApiError> {
    state.engine.health().map_err(ApiError::unavailable)?;
    state.ensure_accepting()?;
    Ok(HttpResponse::Ok().finish())
}

/// The Prometheus exposition text.
pub async fn metrics(state: web::Data<GatewayState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body((state.metrics)())
}

/// The one served model.
pub async fn models(_auth: ApiKeyAuth, state: web::Data<GatewayState>) -> HttpResponse {
    HttpResponse::Ok().json(ModelList {
        object: "list",
        data: vec![card(&state)],
    })
}

/// OpenAI's "retrieve model": the served model's card, or 404 for any other id. The id may
/// hold slashes (`org/name`), as the OpenAI client sends it unescaped.
pub async fn model(
    _auth: ApiKeyAuth,
    state: web::Data<GatewayState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    check_model(Some(id.as_str()), &state.config.get())?;
    Ok(HttpResponse::Ok().json(card(&state)))
}

/// The card of the served model.
fn card(state: &GatewayState) -> ModelCard {
    ModelCard {
        id: state.config.get().served_model_name.clone(),
        object: "model",
        created: state.created,
        owned_by: "peregrine",
        root: state.model.root.clone(),
        parent: None,
        max_model_len: state.model.max_model_len,
    }
}

//! The open endpoints: `GET /health`, `GET /metrics`, and `GET /v1/models` (which needs
//! the API key like every `/v1` path).

use actix_web::{web, HttpResponse};

use super::auth::ApiKeyAuth;
use super::protocol::response::{ModelCard, ModelList};
use super::state::GatewayState;

/// 200 while the server runs.
pub async fn health() -> HttpResponse {
    HttpResponse::Ok().finish()
}

/// The Prometheus exposition text.
pub async fn metrics(state: web::Data<GatewayState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body((state.metrics)())
}

/// The one served model.
pub async fn models(_auth: ApiKeyAuth, state: web::Data<GatewayState>) -> HttpResponse {
    let card = ModelCard {
        id: state.config.get().served_model_name.clone(),
        object: "model",
        created: state.created,
        owned_by: "peregrine",
        max_model_len: state.model.max_model_len,
    };
    HttpResponse::Ok().json(ModelList {
        object: "list",
        data: vec![card],
    })
}

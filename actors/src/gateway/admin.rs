//! `POST /admin/reload` and `GET /admin/config`, behind the admin token.

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::auth::AdminAuth;
use super::errors::ApiError;
use super::state::GatewayState;

/// Reloads the configuration: 200 with what changed, or 400 with why it was refused.
pub async fn reload(
    _auth: AdminAuth,
    state: web::Data<GatewayState>,
) -> Result<HttpResponse, ApiError> {
    match state.admin.reload().await {
        Ok(message) => {
            tracing::info!(%message, "configuration reloaded");
            Ok(HttpResponse::Ok().json(json!({"status": "reloaded", "message": message})))
        }
        Err(reason) => {
            tracing::warn!(%reason, "configuration reload refused");
            Err(ApiError::bad_request(format!(
                "the new configuration was refused and the running one stays: {reason}"
            )))
        }
    }
}

/// The live configuration, secrets masked.
pub async fn config(_auth: AdminAuth, state: web::Data<GatewayState>) -> HttpResponse {
    HttpResponse::Ok().json(state.admin.live_config())
}

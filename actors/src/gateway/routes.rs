//! Every route of the gateway (the OpenAI ones also without `/v1`), and OpenAI-shaped
//! answers for unknown paths and wrong methods.

use actix_web::{web, HttpRequest, HttpResponse, Resource, Route};

use super::errors::ApiError;
use super::{admin, anthropic, chat, completions, info, responses, tokenize};

/// Registers the gateway's routes. The app must also hold the state as
/// `web::Data<GatewayState>`:
///
/// ```ignore
/// let state = web::Data::new(GatewayState::new(engine, model, config, admin, metrics));
/// HttpServer::new(move || App::new().app_data(state.clone()).configure(gateway::routes))
/// ```
pub fn routes(cfg: &mut web::ServiceConfig) {
    // The OpenAI routes, each also without its `/v1` prefix, as llama.cpp serves them.
    for prefix in ["/v1", ""] {
        cfg.service(resource(
            &format!("{prefix}/completions"),
            web::post().to(completions::create),
        ))
        .service(resource(
            &format!("{prefix}/chat/completions"),
            web::post().to(chat::create),
        ))
        .service(resource(
            &format!("{prefix}/messages"),
            web::post().to(anthropic::create),
        ))
        .service(resource(
            &format!("{prefix}/messages/count_tokens"),
            web::post().to(anthropic::count_tokens),
        ))
        .service(resource(
            &format!("{prefix}/responses"),
            web::post().to(responses::create),
        ))
        .service(resource(
            &format!("{prefix}/models"),
            web::get().to(info::models),
        ))
        .service(resource(
            &format!("{prefix}/models/{{model:.+}}"),
            web::get().to(info::model),
        ));
    }
    cfg.service(resource("/tokenize", web::post().to(tokenize::tokenize)))
        .service(resource(
            "/detokenize",
            web::post().to(tokenize::detokenize),
        ))
        .service(resource("/health", web::get().to(info::health)))
        .service(resource("/ready", web::get().to(info::ready)))
        .service(resource("/metrics", web::get().to(info::metrics)))
        .service(resource("/admin/reload", web::post().to(admin::reload)))
        .service(resource("/admin/config", web::get().to(admin::config)))
        .default_service(web::to(unknown_path));
}

/// `path` served by `route`; other methods get 405.
fn resource(path: &str, route: Route) -> Resource {
    web::resource(path)
        .route(route)
        .default_service(web::to(wrong_method))
}

async fn unknown_path(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::not_found(format!(
        "no such endpoint: {} {}",
        req.method(),
        req.path()
    )))
}

async fn wrong_method(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::method_not_allowed(format!(
        "{} does not accept {}",
        req.path(),
        req.method()
    )))
}

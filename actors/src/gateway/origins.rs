//! Which web pages may call the API. A browser marks every cross-origin request (and every
//! POST) with an `Origin` header, and a page can send a "simple" POST without asking first,
//! so an API without keys would otherwise generate for any page its user visits (or any
//! page that rebinds a DNS name to it). A request whose `Origin` is not allowed is refused
//! with 403 before routing, preflights included; clients that are not browsers send no
//! `Origin` and are not affected. Allowed origins get CORS answers (`actix-cors`): their
//! preflights are answered and their responses carry `Access-Control-Allow-Origin`.

use actix_cors::Cors;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::ORIGIN;
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, ResponseError};

use super::errors::ApiError;

/// The origins allowed to call the API (vLLM's `--allowed-origins`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedOrigins {
    any: bool,
    origins: Vec<String>,
}

impl AllowedOrigins {
    /// The origins `list` names; `*` allows any.
    pub fn new(list: &[String]) -> AllowedOrigins {
        AllowedOrigins {
            any: list.iter().any(|o| o == "*"),
            origins: list.iter().filter(|o| *o != "*").cloned().collect(),
        }
    }

    /// Whether a request from `origin` is served.
    pub fn allows(&self, origin: &str) -> bool {
        self.any || self.origins.iter().any(|o| o.eq_ignore_ascii_case(origin))
    }

    /// The CORS middleware for these origins: it answers their preflights and marks their
    /// responses; without any, it lets every request by untouched (the guard has refused
    /// those with an `Origin`).
    pub fn cors(&self) -> Cors {
        let mut cors = Cors::default()
            .allowed_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_any_header()
            .max_age(3600);
        if self.any {
            cors = cors.allow_any_origin().send_wildcard();
        }
        for origin in &self.origins {
            cors = cors.allowed_origin(origin);
        }
        cors
    }
}

/// Middleware: 403 for a request whose `Origin` is not allowed (the app's
/// `web::Data<AllowedOrigins>`; none allowed when it has none).
pub async fn refuse_foreign_origins(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody + 'static>>, actix_web::Error> {
    let refused = match req.headers().get(ORIGIN) {
        None => None,
        Some(origin) => {
            let origin = origin.to_str().unwrap_or("");
            let allowed = req
                .app_data::<web::Data<AllowedOrigins>>()
                .is_some_and(|allowed| allowed.allows(origin));
            (!allowed).then(|| origin.to_owned())
        }
    };
    let refusal = refused.map(|origin| {
        ApiError::forbidden(format!(
            "requests from the web origin {origin:?} are not allowed: start the server \
             with --allowed-origins {origin} to serve pages from it"
        ))
    });
    refuse_or_next(req, next, refusal).await
}

/// A guard's answer: `refusal` where there is one, else what `next` answers.
pub(super) async fn refuse_or_next<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
    refusal: Option<ApiError>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    match refusal {
        Some(err) => Ok(req
            .into_response(err.error_response())
            .map_into_right_body()),
        None => Ok(next.call(req).await?.map_into_left_body()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_match_exactly_or_any() {
        let some = AllowedOrigins::new(&["https://app.example.com".into()]);
        assert!(some.allows("https://APP.example.com"));
        assert!(!some.allows("https://app.example.com.evil.net"));
        assert!(!some.allows("http://app.example.com"));
        assert!(!AllowedOrigins::default().allows("http://localhost:3000"));
        assert!(AllowedOrigins::new(&["*".into()]).allows("null"));
    }
}

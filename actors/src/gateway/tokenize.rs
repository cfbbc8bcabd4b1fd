//! vLLM's `POST /tokenize` and `POST /detokenize`.

use actix_web::{web, HttpResponse};
use serde_json::Value;

use super::auth::ApiKeyAuth;
use super::body::{parse, JsonContent};
use super::errors::ApiError;
use super::params::check_model;
use super::prompt::{encode, in_vocabulary, render_chat};
use super::protocol::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
};
use super::state::GatewayState;

/// Token ids of a prompt, or of a chat rendered with the template.
pub async fn tokenize(
    _auth: ApiKeyAuth,
    _json: JsonContent,
    state: web::Data<GatewayState>,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    let request: TokenizeRequest = parse(&body)?;
    check_model(request.model.as_deref(), &state.config.get())?;
    let tokenizer = &state.model.tokenizer;
    let tokens = match (request.prompt, request.messages) {
        (Some(prompt), None) => encode(
            tokenizer,
            &prompt,
            request.add_special_tokens.unwrap_or(true),
        )?,
        (None, Some(messages)) => {
            let text = render_chat(
                messages,
                request.add_generation_prompt.unwrap_or(true),
                state.model.chat_template.as_deref(),
            )?;
            encode(
                tokenizer,
                &text,
                request.add_special_tokens.unwrap_or(false),
            )?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `prompt` and `messages`",
            ))
        }
    };
    Ok(HttpResponse::Ok().json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.model.max_model_len,
        tokens,
    }))
}

/// The text of token ids (special tokens included).
pub async fn detokenize(
    _auth: ApiKeyAuth,
    _json: JsonContent,
    state: web::Data<GatewayState>,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    let request: DetokenizeRequest = parse(&body)?;
    check_model(request.model.as_deref(), &state.config.get())?;
    let tokenizer = &state.model.tokenizer;
    let ids = in_vocabulary(request.tokens, tokenizer, "tokens")?;
    let prompt = tokenizer
        .decode(&ids, false)
        .map_err(|err| ApiError::invalid("tokens", format!("{err:#}")))?;
    Ok(HttpResponse::Ok().json(DetokenizeResponse { prompt }))
}

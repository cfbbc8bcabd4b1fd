//! vLLM's `POST /tokenize` and `POST /detokenize`.

use std::sync::Arc;

use actix_web::{web, HttpResponse};

use super::auth::ApiKeyAuth;
use super::body::{parse, JsonBody};
use super::errors::ApiError;
use super::params::check_model;
use super::prompt::{encode, in_vocabulary, render_chat};
use super::prompt_size::check_chars;
use super::protocol::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
};
use super::state::GatewayState;

/// Token ids of a prompt, or of a chat rendered with the template (on the blocking pool,
/// within the prompt's character limit).
pub async fn tokenize(
    _auth: ApiKeyAuth,
    state: web::Data<GatewayState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let request: TokenizeRequest = parse(&body.0)?;
    let config = state.config.get();
    check_model(request.model.as_deref(), &config)?;
    let limit = state.prompt_char_limit(&config);
    let tokenizer = Arc::clone(&state.model.tokenizer);
    let template = state.model.chat_template.clone();
    let tokens = state
        .blocking
        .run(move || match (request.prompt, request.messages) {
            (Some(prompt), None) => {
                check_chars("prompt", &prompt, limit)?;
                let add_special_tokens = request.add_special_tokens.unwrap_or(true);
                encode(&tokenizer, &prompt, add_special_tokens)
            }
            (None, Some(messages)) => {
                let add_generation_prompt = request.add_generation_prompt.unwrap_or(true);
                let text = render_chat(messages, add_generation_prompt, template.as_deref())?;
                check_chars("messages", &text, limit)?;
                let add_special_tokens = request.add_special_tokens.unwrap_or(false);
                encode(&tokenizer, &text, add_special_tokens)
            }
            _ => Err(ApiError::bad_request(
                "give exactly one of `prompt` and `messages`",
            )),
        })
        .await?;
    Ok(HttpResponse::Ok().json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.model.max_model_len,
        tokens,
    }))
}

/// The text of token ids (special tokens included).
pub async fn detokenize(
    _auth: ApiKeyAuth,
    state: web::Data<GatewayState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let request: DetokenizeRequest = parse(&body.0)?;
    check_model(request.model.as_deref(), &state.config.get())?;
    let tokenizer = &state.model.tokenizer;
    let ids = in_vocabulary(request.tokens, tokenizer, "tokens")?;
    let prompt = tokenizer
        .decode(&ids, false)
        .map_err(|err| ApiError::invalid("tokens", format!("{err:#}")))?;
    Ok(HttpResponse::Ok().json(DetokenizeResponse { prompt }))
}

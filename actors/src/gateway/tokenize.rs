//! vLLM's `POST /tokenize` and `POST /detokenize`.

use actix_web::{web, HttpResponse};

use super::auth::ApiKeyAuth;
use super::body::{parse, JsonBody};
use super::errors::ApiError;
use super::params::check_model;
use super::prompt::{in_vocabulary, ChatTools};
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
    let prompter = state.prompter(&config);
    let return_token_strs = request.return_token_strs.unwrap_or(false);
    let tokens = state
        .blocking
        .run(move || match (request.prompt, request.messages) {
            (Some(prompt), None) => {
                prompter.text(&prompt, request.add_special_tokens.unwrap_or(true))
            }
            (None, Some(messages)) => prompter.chat(
                messages,
                ChatTools::default(),
                request.add_generation_prompt.unwrap_or(true),
                request.add_special_tokens.unwrap_or(false),
            ),
            _ => Err(ApiError::bad_request(
                "give exactly one of `prompt` and `messages`",
            )),
        })
        .await?;
    let tokenizer = &state.model.tokenizer;
    let token_strs = return_token_strs.then(|| {
        let text = |&id: &u32| tokenizer.id_to_token(id).unwrap_or_default();
        tokens.iter().map(text).collect()
    });
    Ok(HttpResponse::Ok().json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.model.max_model_len,
        tokens,
        token_strs,
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

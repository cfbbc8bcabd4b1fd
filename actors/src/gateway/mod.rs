//! The HTTP gateway (actix-web): parses and validates OpenAI-style requests, applies the
//! chat template, tokenizes, submits to the scheduler through [`EngineClient`], and turns
//! the token events back into text, whole or streamed as server-sent events; OpenAI's
//! Responses API (`/v1/responses`) is served through the chat path. It also serves
//! `/v1/models`, `/tokenize`, `/detokenize`, `/health`, `/ready`, `/metrics` and the admin endpoints.
//! `POST /v1/messages` answers Anthropic's Messages API over the same chat. It never touches
//! a device.
//!
//! The server builds a [`GatewayState`], wraps it in `web::Data`, and registers [`routes`].

mod admin;
mod anthropic;
mod auth;
mod biases;
mod blocking;
mod body;
mod chat;
mod choices;
mod completions;
mod constraints;
mod context;
mod conversation;
mod engine_client;
mod errors;
mod fingerprint;
mod generation;
mod grammar;
mod hosts;
mod info;
mod logprobs;
mod origins;
mod params;
mod parser_errors;
mod peer;
mod prompt;
mod prompt_size;
mod protocol;
mod responses;
mod routes;
mod server;
mod sse;
mod state;
mod stop;
mod tokenize;
mod tool_output;
mod tool_prompt;
mod tools;
mod unsupported;

#[cfg(test)]
mod tests;

pub use engine_client::{EngineClient, EngineError};
pub use errors::ApiError;
pub use hosts::AllowedHosts;
pub use origins::AllowedOrigins;
pub use peer::{on_connect, PeerProbe};
pub use routes::routes;
pub use server::{app, bind, Bound, HttpSettings};
pub use state::{
    AdminHooks, BoxFuture, GatewayConfig, GatewayState, MetricsRenderer, ModelInfo, SharedConfig,
};
pub use tools::ToolSettings;

//! OpenAI's (and vLLM's) request and response bodies.

pub mod request;
pub mod response;
mod shapes;
pub mod tokenize;

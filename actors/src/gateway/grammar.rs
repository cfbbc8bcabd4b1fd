//! A request's constraint compiled with the served model's grammar compiler, on the
//! blocking pool (off the HTTP threads and the engine's step loop), from its cache where
//! an earlier request compiled the same text.

use std::sync::Arc;

use peregrine_structured::{CompiledGrammar, GrammarError};

use super::constraints::Requested;
use super::errors::ApiError;
use super::state::GatewayState;
use crate::metrics;

/// `requested` compiled, or a 400 naming its field and saying what is wrong.
pub async fn compile(
    state: &GatewayState,
    requested: Requested,
) -> Result<Arc<CompiledGrammar>, ApiError> {
    let compiler = match &state.model.grammars {
        Ok(compiler) => Arc::clone(compiler),
        Err(why) => {
            return Err(ApiError::invalid(
                requested.param,
                format!("structured output is not available for this model: {why}"),
            ))
        }
    };
    let Requested { param, constraint } = requested;
    let kind = constraint.kind();
    let compiled = state
        .blocking
        .run(move || Ok(compiler.compile(&constraint)))
        .await?;
    match compiled {
        Ok((grammar, report)) => {
            metrics::record_grammar(kind, report.cached, report.elapsed);
            Ok(grammar)
        }
        Err(GrammarError::Invalid(why)) => Err(ApiError::invalid(
            param,
            format!("invalid {}: {why}", described(kind)),
        )),
        Err(err) => Err(ApiError::invalid(param, err.to_string())),
    }
}

/// A constraint kind in words.
fn described(kind: &str) -> &'static str {
    match kind {
        "json_schema" | "json_object" => "JSON schema",
        "regex" => "regular expression",
        "choice" => "list of choices",
        "gbnf" => "GBNF grammar",
        "tool_call" => "tool call grammar",
        _ => "grammar",
    }
}

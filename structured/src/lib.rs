//! Structured output for Peregrine: a request's output constrained to a JSON schema, a
//! regular expression, a list of choices or a grammar, through llguidance, and tool calls
//! in each model family's own format, parsed and enforced.
//!
//! The gateway reads a request's [`Constraint`] and compiles it with the model's
//! [`GrammarCompiler`] (cached by text, bounded in size and time); the target runner owns
//! each constrained request's [`GrammarMatcher`], whose [`peregrine_ops::sampling::TokenMask`]
//! is applied to a row's logits before it is sampled.

pub mod compiler;
pub mod constraint;
pub mod gbnf;
pub mod matcher;
mod schema_check;
mod schema_formats;
mod schema_objects;
mod schema_walk;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
pub mod tokens;
pub mod tools;

pub use compiler::{CompileReport, CompiledGrammar, GrammarCompiler, GrammarError, GrammarLimits};
pub use constraint::Constraint;
pub use matcher::{DraftMasks, GrammarMatcher};

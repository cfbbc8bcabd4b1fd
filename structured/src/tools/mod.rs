//! Tool calls in each model family's own format: choosing the format from a chat template,
//! reading calls out of a whole output or a stream of it, forcing calls with a grammar in
//! the format (`tool_choice` `required` or a named function), and writing tools, calls and
//! results into prompts for models whose templates have no tool syntax.
//!
//! The formats are vLLM's `--tool-call-parser` ones: [`ToolCallFormat::Hermes`],
//! [`ToolCallFormat::Llama3Json`], [`ToolCallFormat::Mistral`] and
//! [`ToolCallFormat::DeepSeekV3`]. Outputs are read as text detokenized with special tokens
//! kept (vLLM sets `skip_special_tokens=False` for the same reason: some formats' markers
//! are special tokens), the end-of-sequence token left out.

mod call_list;
mod call_object;
mod deepseek;
mod dumps;
mod format;
mod grammar;
mod hermes;
mod json;
mod literal;
mod llama;
mod mistral;
mod parse;
mod prompt;
mod readers;
mod region;
mod stream;
mod types;

pub use format::{detect, HermesStyle, ToolCallFormat};
pub use grammar::{forced_call_grammar, CallChoice, ToolGrammarError};
pub use parse::parse;
pub use prompt::{render_tool_calls, render_tool_result, tools_system_prompt};
pub use stream::ToolCallStream;
pub use types::{ParsedOutput, Tool, ToolCall, ToolDelta};

#[cfg(test)]
mod tests;

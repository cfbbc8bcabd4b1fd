//! Reading a whole output at once.

use super::format::ToolCallFormat;
use super::stream::ToolCallStream;
use super::types::ParsedOutput;

/// `output` (detokenized with special tokens kept) split into its content and its calls in
/// `format`: what [`ToolCallStream`] gives for the same text, however it is streamed.
pub fn parse(format: ToolCallFormat, output: &str) -> ParsedOutput {
    let mut stream = ToolCallStream::new(format);
    stream.push(output);
    stream.finish();
    stream.parsed()
}

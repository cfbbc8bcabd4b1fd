//! The tiny models' tokenizer: `peregrine_models::tiny_tokenizer`, unwrapped for tests.

use std::path::Path;

/// Writes the tokenizer files for a vocabulary of `vocab_size` into `dir`
/// ([`peregrine_models::tiny_tokenizer::write_tokenizer`]).
pub fn write_tokenizer(dir: &Path, vocab_size: usize) {
    peregrine_models::tiny_tokenizer::write_tokenizer(dir, vocab_size)
        .expect("writing the tiny tokenizer");
}

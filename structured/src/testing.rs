//! What the crate's tests share: a tiny byte-level tokenizer (the tiny models' ChatML one)
//! and a compiler over it.

use std::sync::OnceLock;

use peregrine_models::tokenizer::Tokenizer;

use crate::{CompiledGrammar, GrammarCompiler, GrammarLimits, GrammarMatcher};

/// The tiny tokenizer's end-of-sequence token, `<|im_end|>`.
pub const EOS: u32 = 2;

/// The tiny byte-level BPE tokenizer of `vocab` tokens: 0 `<|endoftext|>`, 1
/// `<|im_start|>`, 2 `<|im_end|>` (end of sequence), the 256 bytes from 3, then merges.
pub fn tiny_tokenizer(vocab: usize) -> Tokenizer {
    let dir = tempfile::tempdir().expect("a temporary folder");
    peregrine_models::tiny_tokenizer::write_tokenizer(dir.path(), vocab)
        .expect("writing the tiny tokenizer");
    Tokenizer::from_dir(dir.path()).expect("loading the tiny tokenizer")
}

/// A compiler over [`tiny_tokenizer`] of 300 tokens with the default limits.
pub fn tiny_compiler() -> GrammarCompiler {
    GrammarCompiler::new(&tiny_tokenizer(300), 300, GrammarLimits::default())
        .expect("a grammar compiler over the tiny tokenizer")
}

/// [`tiny_tokenizer`] of `vocab` tokens with `specials` added after them as special tokens
/// (ids `vocab`, `vocab + 1`, …), as a served model's tool-call markers are.
pub fn tiny_tokenizer_with_specials(vocab: usize, specials: &[&str]) -> Tokenizer {
    let dir = tempfile::tempdir().expect("a temporary folder");
    peregrine_models::tiny_tokenizer::write_tokenizer(dir.path(), vocab)
        .expect("writing the tiny tokenizer");
    let path = dir.path().join("tokenizer.json");
    let text = std::fs::read_to_string(&path).expect("reading tokenizer.json");
    let mut json: serde_json::Value = serde_json::from_str(&text).expect("tokenizer.json");
    let added = json["added_tokens"]
        .as_array_mut()
        .expect("tokenizer.json lists added tokens");
    for (i, special) in specials.iter().enumerate() {
        added.push(
            serde_json::json!({"id": vocab + i, "content": special, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
        );
    }
    std::fs::write(&path, json.to_string()).expect("writing tokenizer.json");
    Tokenizer::from_dir(dir.path()).expect("loading the tiny tokenizer")
}

/// Greedily walks `matcher` through `text`'s bytes as tokens (one byte token each: the
/// tiny tokenizer's byte tokens sit at `3 + byte`), checking every one is allowed first.
pub fn walk_bytes(matcher: &mut GrammarMatcher, text: &str) -> Result<(), String> {
    for byte in text.bytes() {
        let token = 3 + u32::from(byte);
        let mask = matcher.mask()?;
        if !mask.allows(token) {
            return Err(format!("{:?} is not allowed", byte as char));
        }
        matcher.consume(&[token])?;
    }
    Ok(())
}

/// The tiny tokenizer's tokens of several bytes (those after the 256 byte tokens), with
/// their text.
fn merged_tokens() -> &'static [(u32, String)] {
    static MERGED: OnceLock<Vec<(u32, String)>> = OnceLock::new();
    MERGED.get_or_init(|| {
        let tokenizer = tiny_tokenizer(300);
        (259..300)
            .map(|id| (id, tokenizer.decode(&[id], false).expect("a merged token")))
            .collect()
    })
}

/// Walks `matcher` through `text` as the tiny tokenizer's tokens: each byte as its own
/// token where the grammar allows it, else the longest allowed merged token `text` goes on
/// with (where the grammar forces bytes, llguidance allows only the token the tokenizer
/// would make of them).
pub fn walk_text(matcher: &mut GrammarMatcher, text: &str) -> Result<(), String> {
    let mut rest = text.as_bytes();
    while let Some(&byte) = rest.first() {
        let mask = matcher.mask()?;
        let (token, len) = if mask.allows(3 + u32::from(byte)) {
            (3 + u32::from(byte), 1)
        } else {
            merged_tokens()
                .iter()
                .filter(|(id, merged)| mask.allows(*id) && rest.starts_with(merged.as_bytes()))
                .map(|(id, merged)| (*id, merged.len()))
                .max_by_key(|&(_, len)| len)
                .ok_or_else(|| format!("{:?} is not allowed", byte as char))?
        };
        matcher.consume(&[token])?;
        rest = &rest[len..];
    }
    Ok(())
}

/// Whether `grammar` matches all of `text`: a new matcher walks it ([`walk_text`]) and
/// may then end. The error says where it failed.
pub fn matches_whole(grammar: &CompiledGrammar, text: &str) -> Result<(), String> {
    let mut matcher = grammar.matcher();
    walk_text(&mut matcher, text)?;
    if matcher.mask()?.allows(EOS) {
        Ok(())
    } else {
        Err("the grammar cannot end there".into())
    }
}

//! A byte-level BPE tokenizer for tiny test models, written as Hugging Face files
//! (tokenizer.json, tokenizer_config.json with a ChatML template), laid out like
//! SmolLM2's: 0 `<|endoftext|>`, 1 `<|im_start|>` (bos), 2 `<|im_end|>` (eos), the 256
//! byte symbols from id 3, then merged tokens up to the vocabulary size.

use anyhow::{bail, Context};
use serde_json::{json, Map, Value};
use std::path::Path;

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The ChatML template SmolLM2-Instruct ships.
pub const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's reversible map from bytes to printable characters.
fn byte_symbols() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut by_byte = vec![' '; 256];
    for (b, c) in printable.iter().zip(chars) {
        by_byte[*b as usize] = char::from_u32(c).unwrap_or(' ');
    }
    by_byte
}

/// Writes tokenizer.json and tokenizer_config.json for a vocabulary of `vocab_size`
/// (at least 259) into `dir`, and sets the bos/eos ids of its config.json (where there is
/// one) to match.
pub fn write_tokenizer(dir: &Path, vocab_size: usize) -> anyhow::Result<()> {
    if vocab_size < 259 {
        bail!("a byte-level vocabulary needs at least 259 tokens, not {vocab_size}");
    }
    let symbols = byte_symbols();
    let mut vocab = Map::new();
    for (i, s) in SPECIALS.iter().enumerate() {
        vocab.insert(s.to_string(), json!(i));
    }
    for (b, c) in symbols.iter().enumerate() {
        vocab.insert(c.to_string(), json!(3 + b));
    }
    // Merge frequent English pairs until the vocabulary is full.
    let text = "the quick brown fox jumps over the lazy dog and then the cat sat on the mat with another hat";
    let space = symbols[b' ' as usize];
    let words: Vec<String> = text.split(' ').map(|w| format!("{space}{w}")).collect();
    let mut pieces: Vec<Vec<String>> = words
        .iter()
        .map(|w| w.chars().map(String::from).collect())
        .collect();
    let mut merges = Vec::new();
    while vocab.len() < vocab_size {
        let mut counts: Vec<((String, String), usize)> = Vec::new();
        for p in &pieces {
            for pair in p.windows(2) {
                let key = (pair[0].clone(), pair[1].clone());
                match counts.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((key, 1)),
                }
            }
        }
        let Some(((a, b), _)) = counts.into_iter().max_by_key(|(_, n)| *n) else {
            break;
        };
        let merged = format!("{a}{b}");
        vocab.insert(merged.clone(), json!(vocab.len()));
        merges.push(format!("{a} {b}"));
        for p in pieces.iter_mut() {
            let mut i = 0;
            while i + 1 < p.len() {
                if p[i] == a && p[i + 1] == b {
                    p[i] = merged.clone();
                    p.remove(i + 1);
                }
                i += 1;
            }
        }
    }
    if vocab.len() != vocab_size {
        bail!("not enough merges to fill a vocabulary of {vocab_size}");
    }
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": i, "content": s, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string())?;
    let config = json!({
        "bos_token": SPECIALS[1], "eos_token": SPECIALS[2], "unk_token": SPECIALS[0],
        "add_bos_token": false, "chat_template": CHATML, "model_max_length": 4096,
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string())?;
    let path = dir.join("config.json");
    if path.exists() {
        let text = std::fs::read_to_string(&path)?;
        let mut model: Value = serde_json::from_str(&text).context("config.json")?;
        model["bos_token_id"] = json!(1);
        model["eos_token_id"] = json!(2);
        std::fs::write(path, model.to_string())?;
    }
    Ok(())
}

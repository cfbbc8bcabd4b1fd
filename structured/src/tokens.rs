//! The token environment llguidance compiles grammars against: the served tokenizer's
//! vocabulary as bytes, rebuilt by `toktrie_hf_tokenizers` from the tokenizer's own JSON
//! (so a GGUF's tokenizer and a `tokenizer.json` give the same trie), with the model's
//! end-of-sequence ids, padded to the width of the model's logits.

use anyhow::{bail, Context};
use peregrine_models::tokenizer::Tokenizer;
use toktrie::TokEnv;
use toktrie_hf_tokenizers::ByteTokenizer;

/// The token environment of `tokenizer` for logit rows of `logits_width` tokens (the
/// model's vocabulary, which may pad the tokenizer's). Its end-of-sequence tokens are the
/// tokenizer's; a grammar that is complete allows only those.
pub fn token_env(tokenizer: &Tokenizer, logits_width: usize) -> anyhow::Result<TokEnv> {
    let json = tokenizer.to_json()?;
    let mut bytes = ByteTokenizer::from_json_bytes(json.as_bytes())
        .context("llguidance cannot read the tokenizer")?;
    let known = bytes.tokrx_info().vocab_size as usize;
    if known > logits_width {
        bail!("the tokenizer has {known} tokens but the model's logits only {logits_width}");
    }
    let eos: Vec<u32> = tokenizer
        .eos_token_ids()
        .iter()
        .copied()
        .filter(|&id| (id as usize) < known)
        .collect();
    if eos.is_empty() {
        bail!("the tokenizer names no end-of-sequence token, which a finished grammar allows");
    }
    bytes.set_eos_tokens(&eos);
    bytes
        .into_tok_env(Some(logits_width))
        .context("llguidance cannot build its token trie")
}

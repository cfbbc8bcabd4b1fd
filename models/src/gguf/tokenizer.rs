//! A Hugging Face `tokenizer.json` (and, through [`SpecialTokens`], `tokenizer_config.json`)
//! from GGUF tokenizer metadata
//! (byte-level BPE, `tokenizer.ggml.model = gpt2`).

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::sequence::Sequence as ProcessorSequence;
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{
    AddedToken, PostProcessorWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use super::reader::GgufFile;
use super::special_tokens::{Special, SpecialTokens};

/// llama.cpp token types that become added tokens: control (special) and user-defined.
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Llama 3's split regex (`tokenizer.ggml.pre = llama-bpe`), as in its tokenizer.json.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a `tokenizer.ggml.pre` value splits text before BPE.
enum PreSplit {
    /// GPT-2's regex (inside ByteLevel).
    Gpt2,
    /// Every digit alone, then GPT-2's regex (StarCoder, SmolLM).
    DigitsThenGpt2,
    /// Llama 3's regex; merges are skipped for whole-word vocabulary hits.
    Llama3,
}

impl PreSplit {
    fn from_gguf(pre: &str) -> Result<Self> {
        Ok(match pre {
            "default" | "gpt2" | "mpt" | "olmo" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" => Self::DigitsThenGpt2,
            "llama-bpe" | "llama3" => Self::Llama3,
            other => bail!(
                "tokenizer.ggml.pre '{other}' is not supported (supported: default, gpt2, mpt, \
                 olmo, smollm, starcoder, refact, llama-bpe)"
            ),
        })
    }

    fn pre_tokenizer(&self) -> Result<PreTokenizerWrapper> {
        Ok(match self {
            Self::Gpt2 => ByteLevel::new(false, true, true).into(),
            Self::DigitsThenGpt2 => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            Self::Llama3 => {
                let split = Split::new(
                    SplitPattern::Regex(LLAMA3_SPLIT.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| anyhow!("compiling the Llama 3 split regex: {e}"))?;
                Sequence::new(vec![
                    split.into(),
                    ByteLevel::new(false, true, false).into(),
                ])
                .into()
            }
        })
    }
}

/// The tokenizer files of a converted model.
pub(crate) struct TokenizerFiles {
    /// `tokenizer.json`.
    pub tokenizer: Tokenizer,
    /// `tokenizer_config.json`.
    pub config: Json,
}

/// Builds the tokenizer of `file`, whose model has `vocab_size` embedding rows and a context
/// of `max_len` tokens.
pub(crate) fn build(file: &GgufFile, vocab_size: usize, max_len: u64) -> Result<TokenizerFiles> {
    let model = file
        .get_str("tokenizer.ggml.model")?
        .context("GGUF has no tokenizer (key 'tokenizer.ggml.model' is missing)")?;
    if model != "gpt2" {
        bail!("tokenizer model '{model}' is not supported (only 'gpt2', byte-level BPE)");
    }
    let tokens = file
        .get_str_array("tokenizer.ggml.tokens")?
        .context("GGUF key 'tokenizer.ggml.tokens' is missing")?;
    if tokens.len() > vocab_size {
        bail!(
            "tokenizer.ggml.tokens has {} tokens but the embedding has only {vocab_size} rows",
            tokens.len()
        );
    }
    let pre = PreSplit::from_gguf(file.get_str("tokenizer.ggml.pre")?.unwrap_or("default"))?;
    let llama3 = matches!(pre, PreSplit::Llama3);
    // llama.cpp adds BOS by default only for the Llama 3 pre-tokenizer.
    let specials = SpecialTokens::read(file, &tokens, llama3)?;

    let mut tokenizer = Tokenizer::new(bpe(file, &tokens, llama3)?);
    tokenizer.with_pre_tokenizer(Some(pre.pre_tokenizer()?));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    let (control, user) = added_tokens(file, &tokens)?;
    tokenizer.add_special_tokens(&control);
    tokenizer.add_tokens(&user);
    let (bos, eos) = specials.added()?;
    tokenizer.with_post_processor(Some(post_processor(bos, eos)?));
    Ok(TokenizerFiles {
        tokenizer,
        config: specials.tokenizer_config(file, max_len)?,
    })
}

/// The BPE model: every GGUF token at its id, and the merges in rank order.
fn bpe(file: &GgufFile, tokens: &[&str], ignore_merges: bool) -> Result<BPE> {
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        if let Some(first) = vocab.insert(token.to_string(), id as u32) {
            bail!("tokenizer.ggml.tokens has '{token}' twice (ids {first} and {id})");
        }
    }
    let merges = file
        .get_str_array("tokenizer.ggml.merges")?
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                Ok((a.to_string(), b.to_string()))
            }
            _ => bail!("tokenizer.ggml.merges[{i}] = '{m}' is not two tokens separated by a space"),
        })
        .collect::<Result<Vec<_>>>()?;
    BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| anyhow!("building the BPE model from tokenizer.ggml.tokens and merges: {e}"))
}

/// Control tokens (special) and user-defined tokens (not special), matched in raw text.
fn added_tokens(file: &GgufFile, tokens: &[&str]) -> Result<(Vec<AddedToken>, Vec<AddedToken>)> {
    let Some(types) = file.get_int_array("tokenizer.ggml.token_type")? else {
        return Ok((Vec::new(), Vec::new()));
    };
    if types.len() != tokens.len() {
        bail!(
            "tokenizer.ggml.token_type has {} entries for {} tokens",
            types.len(),
            tokens.len()
        );
    }
    let of_type = |wanted: i64, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(&types)
            .filter(|(_, &ty)| ty == wanted)
            .map(|(t, _)| AddedToken::from(*t, special).normalized(false))
            .collect()
    };
    Ok((
        of_type(TOKEN_TYPE_CONTROL, true),
        of_type(TOKEN_TYPE_USER_DEFINED, false),
    ))
}

/// ByteLevel offsets handling, then BOS / EOS where the GGUF asks for them.
fn post_processor(bos: Option<&Special>, eos: Option<&Special>) -> Result<PostProcessorWrapper> {
    let byte_level = ByteLevel::new(true, false, true);
    if bos.is_none() && eos.is_none() {
        return Ok(byte_level.into());
    }
    // Template pieces are `name[:type_id]` separated by spaces; name each token by a key
    // that cannot clash with that syntax.
    let specials: Vec<(&str, &Special)> = [("BOS", bos), ("EOS", eos)]
        .into_iter()
        .filter_map(|(k, t)| Some((k, t?)))
        .collect();
    let wrap = |seq: &str, type_id: u32| -> Vec<String> {
        let mut pieces: Vec<String> = Vec::new();
        if bos.is_some() {
            pieces.push(format!("BOS:{type_id}"));
        }
        pieces.push(format!("{seq}:{type_id}"));
        if eos.is_some() {
            pieces.push(format!("EOS:{type_id}"));
        }
        pieces
    };
    let pair = [wrap("$A", 0), wrap("$B", 1)].concat();
    let template = TemplateProcessing::builder()
        .try_single(wrap("$A", 0))
        .map_err(|e| anyhow!("post-processor template: {e}"))?
        .try_pair(pair)
        .map_err(|e| anyhow!("post-processor template: {e}"))?
        .special_tokens(
            specials
                .iter()
                .map(|(key, t)| {
                    SpecialToken::new(key.to_string(), vec![t.id], vec![t.text.clone()])
                })
                .collect::<tokenizers::Result<Vec<_>>>()
                .map_err(|e| anyhow!("post-processor special tokens: {e}"))?,
        )
        .build()
        .map_err(|e| anyhow!("post-processor template: {e}"))?;
    Ok(ProcessorSequence::new(vec![byte_level.into(), template.into()]).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer(bos: Option<&Special>, eos: Option<&Special>) -> Tokenizer {
        let vocab: Vocab = [("<s>", 0), ("</s>", 1), ("a", 2)]
            .into_iter()
            .map(|(t, i)| (t.to_string(), i))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, vec![])
            .build()
            .unwrap();
        let mut tok = Tokenizer::new(bpe);
        tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        tok.with_post_processor(Some(post_processor(bos, eos).unwrap()));
        tok
    }

    #[test]
    fn post_processor_adds_bos_and_eos_as_asked() {
        let special = |id, text: &str| Special {
            id,
            text: text.into(),
        };
        let (bos, eos) = (special(0, "<s>"), special(1, "</s>"));
        let ids = |tok: &Tokenizer, pair: bool| {
            let enc = if pair {
                tok.encode(("a", "a"), true)
            } else {
                tok.encode("a", true)
            };
            enc.unwrap().get_ids().to_vec()
        };
        let both = tokenizer(Some(&bos), Some(&eos));
        assert_eq!(ids(&both, false), [0, 2, 1]);
        assert_eq!(ids(&both, true), [0, 2, 1, 0, 2, 1]);
        assert_eq!(ids(&tokenizer(Some(&bos), None), false), [0, 2]);
        assert_eq!(ids(&tokenizer(None, Some(&eos)), false), [2, 1]);
        assert_eq!(ids(&tokenizer(None, None), false), [2]);
        let json = both.to_string(false).unwrap();
        assert!(json.parse::<Tokenizer>().is_ok());
    }

    #[test]
    fn pre_split_names() {
        assert!(PreSplit::from_gguf("smollm").is_ok());
        let err = PreSplit::from_gguf("deepseek-llm")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("'deepseek-llm'"), "{err}");
        for pre in ["gpt2", "smollm", "llama-bpe"] {
            assert!(PreSplit::from_gguf(pre).unwrap().pre_tokenizer().is_ok());
        }
    }
}

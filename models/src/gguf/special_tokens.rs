//! The special tokens GGUF metadata names (BOS, EOS, unknown, padding), whether BOS / EOS
//! are added, and the `tokenizer_config.json` built from them.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value as Json};

use super::reader::GgufFile;

/// A token named by a `tokenizer.ggml.*_token_id` key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Special {
    /// The token id.
    pub id: u32,
    /// The token's text in the vocabulary.
    pub text: String,
}

/// The special tokens of a GGUF tokenizer.
pub(crate) struct SpecialTokens {
    bos: Option<Special>,
    eos: Option<Special>,
    unk: Option<Special>,
    pad: Option<Special>,
    add_bos: bool,
    add_eos: bool,
}

impl SpecialTokens {
    /// Reads the special token ids (resolved against `tokens`) and the add-BOS / add-EOS
    /// flags; `default_add_bos` applies when the file does not say.
    pub(crate) fn read(file: &GgufFile, tokens: &[&str], default_add_bos: bool) -> Result<Self> {
        let token = |key: &str| -> Result<Option<Special>> {
            let Some(id) = file.get_u64(key)? else {
                return Ok(None);
            };
            let text = tokens.get(id as usize).with_context(|| {
                format!(
                    "{key} = {id} is past the vocabulary ({} tokens)",
                    tokens.len()
                )
            })?;
            Ok(Some(Special {
                id: id as u32,
                text: text.to_string(),
            }))
        };
        Ok(Self {
            bos: token("tokenizer.ggml.bos_token_id")?,
            eos: token("tokenizer.ggml.eos_token_id")?,
            unk: token("tokenizer.ggml.unknown_token_id")?,
            pad: token("tokenizer.ggml.padding_token_id")?,
            add_bos: file
                .get_bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(default_add_bos),
            add_eos: file
                .get_bool("tokenizer.ggml.add_eos_token")?
                .unwrap_or(false),
        })
    }

    /// The BOS and EOS tokens to add around every encoded sequence; an error if the file
    /// asks for one it does not name.
    pub(crate) fn added(&self) -> Result<(Option<&Special>, Option<&Special>)> {
        Ok((
            wanted(self.add_bos, &self.bos, "bos")?,
            wanted(self.add_eos, &self.eos, "eos")?,
        ))
    }

    /// `tokenizer_config.json`, for a context of `max_len` tokens.
    pub(crate) fn tokenizer_config(&self, file: &GgufFile, max_len: u64) -> Result<Json> {
        let text = |t: &Option<Special>| t.as_ref().map(|s| s.text.clone());
        let mut config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "bos_token": text(&self.bos),
            "eos_token": text(&self.eos),
            "clean_up_tokenization_spaces": false,
            "model_max_length": max_len,
        });
        if let Some(unk) = text(&self.unk) {
            config["unk_token"] = json!(unk);
        }
        if let Some(pad) = text(&self.pad) {
            config["pad_token"] = json!(pad);
        }
        if let Some(template) = file.get_str("tokenizer.chat_template")? {
            config["chat_template"] = json!(template);
        }
        Ok(config)
    }
}

/// `token` if `wanted`; an error if wanted but absent.
fn wanted<'a>(
    wanted: bool,
    token: &'a Option<Special>,
    which: &str,
) -> Result<Option<&'a Special>> {
    match (wanted, token) {
        (false, _) => Ok(None),
        (true, Some(t)) => Ok(Some(t)),
        (true, None) => bail!(
            "tokenizer.ggml.add_{which}_token is set but tokenizer.ggml.{which}_token_id is missing"
        ),
    }
}

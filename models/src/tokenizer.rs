//! A model directory's tokenizer: `tokenizer.json` through the `tokenizers` crate, the
//! special tokens of `tokenizer_config.json`, `config.json` and `generation_config.json`,
//! and incremental detokenization for streaming.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use serde::Deserialize;
use serde_json::Value;

/// A loaded tokenizer with its BOS and EOS tokens resolved to ids. Cloning is cheap.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    bos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
    add_bos_token: bool,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`, and the special tokens from `tokenizer_config.json`
    /// (`bos_token`, `eos_token`, `add_bos_token`), `config.json` (`eos_token_id`,
    /// `bos_token_id`) and `generation_config.json` (`eos_token_id`) where present.
    pub fn from_dir(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|err| anyhow!("cannot load {}: {err}", path.display()))?;
        let config = TokenizerConfig::from_dir(dir)?;
        let model_config = read_json(&dir.join("config.json"))?;
        let generation_config = read_json(&dir.join("generation_config.json"))?;
        let token_id = |token: &Option<String>| {
            let token = token.as_deref()?;
            let id = inner.token_to_id(token);
            if id.is_none() {
                tracing::warn!(
                    "tokenizer_config.json names {token:?}, which is not in the vocabulary"
                );
            }
            id
        };

        let bos_token_id = match token_id(&config.bos_token) {
            Some(id) => Some(id),
            None => token_ids(&model_config, "bos_token_id", "config.json")?
                .first()
                .copied(),
        };
        let mut eos_token_ids: Vec<u32> = token_id(&config.eos_token).into_iter().collect();
        let configured = [
            token_ids(&model_config, "eos_token_id", "config.json")?,
            token_ids(&generation_config, "eos_token_id", "generation_config.json")?,
        ];
        for id in configured.into_iter().flatten() {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        Ok(Self {
            inner: Arc::new(inner),
            bos_token_id,
            eos_token_ids,
            add_bos_token: config.add_bos_token == Some(true),
        })
    }

    /// Token ids of `text`. With `add_special_tokens`, the post-processor of
    /// `tokenizer.json` adds its special tokens, and BOS is prepended if
    /// `tokenizer_config.json` sets `add_bos_token` and the post-processor did not add it.
    /// Text rendered by a chat template usually holds its BOS already: encode it without.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> anyhow::Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|err| anyhow!("cannot tokenize the text: {err}"))?;
        let mut ids = encoding.get_ids().to_vec();
        if let Some(bos) = self.bos_token_id {
            if add_special_tokens && self.add_bos_token && ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The text of `ids`, without special tokens if `skip_special_tokens`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> anyhow::Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|err| anyhow!("cannot decode token ids: {err}"))
    }

    /// The number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids that end generation: `tokenizer_config.json`'s `eos_token`, then
    /// `config.json`'s and `generation_config.json`'s `eos_token_id`, without repeats.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// The id of `tokenizer_config.json`'s `bos_token`, else of `config.json`'s
    /// `bos_token_id`.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// Whether [`encode`](Self::encode) with special tokens starts a text with BOS (added by
    /// the post-processor or by `add_bos_token`): what llama.cpp's `llama_vocab_get_add_bos`
    /// says of a GGUF's metadata.
    pub fn adds_bos(&self) -> anyhow::Result<bool> {
        Ok(self.bos_token_id.is_some()
            && self.encode("", true)?.first() == self.bos_token_id.as_ref())
    }

    /// The tokenizer in `tokenizer.json`'s format: what another library (llguidance's
    /// token trie) rebuilds the same vocabulary from.
    pub fn to_json(&self) -> anyhow::Result<String> {
        self.inner
            .to_string(false)
            .map_err(|err| anyhow!("cannot serialize the tokenizer: {err}"))
    }

    /// The id of `token`'s text in the vocabulary (added tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary's text of token `id` as stored, byte-level marks such as `Ġ` included
    /// (Hugging Face's `convert_ids_to_tokens`); `None` outside the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// A streaming decoder that starts with no tokens.
    pub fn decode_stream(&self, skip_special_tokens: bool) -> DecodeStream {
        DecodeStream {
            tokenizer: Arc::clone(&self.inner),
            skip_special_tokens,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }
}

/// Incremental detokenization of one sequence: feed ids one at a time and get back the
/// newly completed text. Text is held back while it ends in an incomplete UTF-8 character
/// (an emoji split across byte tokens comes out whole), and decoding a window of recent
/// tokens keeps the spacing a full decode gives (the `tokenizers` crate's `DecodeStream`
/// algorithm, here owning its tokenizer so it can live in a request's state).
pub struct DecodeStream {
    tokenizer: Arc<tokenizers::Tokenizer>,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl DecodeStream {
    /// Adds `id`; returns the text it completes, or `None` while text is held back.
    pub fn step(&mut self, id: u32) -> anyhow::Result<Option<String>> {
        tokenizers::step_decode_stream(
            &self.tokenizer,
            vec![id],
            self.skip_special_tokens,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        )
        .map_err(|err| anyhow!("cannot decode token {id}: {err}"))
    }

    /// Ends the stream: the held-back text, as a full decode renders it (an incomplete
    /// character at the very end becomes U+FFFD), so that the concatenated output of
    /// [`DecodeStream::step`] and `finish` equals the full decode.
    pub fn finish(self) -> anyhow::Result<String> {
        let text = self
            .tokenizer
            .decode(&self.ids, self.skip_special_tokens)
            .map_err(|err| anyhow!("cannot decode the stream's tail: {err}"))?;
        match text.strip_prefix(&self.prefix) {
            Some(rest) => Ok(rest.to_owned()),
            None => bail!(
                "the stream's tail {text:?} does not extend {:?}",
                self.prefix
            ),
        }
    }
}

/// The fields of `tokenizer_config.json` that Peregrine reads.
#[derive(Debug, Default, Deserialize)]
pub struct TokenizerConfig {
    /// The BOS token's text.
    #[serde(default, deserialize_with = "special_token")]
    pub bos_token: Option<String>,
    /// The EOS token's text.
    #[serde(default, deserialize_with = "special_token")]
    pub eos_token: Option<String>,
    /// Whether encoding with special tokens starts with BOS.
    #[serde(default)]
    pub add_bos_token: Option<bool>,
    /// The chat template(s).
    #[serde(default)]
    pub chat_template: Option<TemplateField>,
}

/// `tokenizer_config.json`'s `chat_template`: one template, or a list of named ones.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TemplateField {
    /// A single template.
    Single(String),
    /// Named templates; the one named `default` is the chat template.
    Named(Vec<NamedTemplate>),
}

/// One entry of a list of named templates.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NamedTemplate {
    /// The template's name, such as `default` or `tool_use`.
    pub name: String,
    /// The template's source.
    pub template: String,
}

impl TokenizerConfig {
    /// Reads `dir/tokenizer_config.json`; all fields empty if the file does not exist.
    pub fn from_dir(dir: &Path) -> anyhow::Result<Self> {
        match read_json(&dir.join("tokenizer_config.json"))? {
            Value::Null => Ok(Self::default()),
            value => serde_json::from_value(value).context("invalid tokenizer_config.json"),
        }
    }
}

/// A special token written as a string or as an `AddedToken` object with `content`.
fn special_token<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Field {
        Text(String),
        Added { content: String },
    }
    Ok(match Option::<Field>::deserialize(de)? {
        Some(Field::Text(text) | Field::Added { content: text }) => Some(text),
        None => None,
    })
}

/// The JSON in `path`, or `Value::Null` if the file does not exist.
fn read_json(path: &Path) -> anyhow::Result<Value> {
    if !path.exists() {
        return Ok(Value::Null);
    }
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("invalid JSON in {}", path.display()))
}

/// The ids under `key` in a config (an integer or a list of them; absent or null: none).
fn token_ids(config: &Value, key: &str, file: &str) -> anyhow::Result<Vec<u32>> {
    let as_id = |value: &Value| {
        value
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| {
                anyhow!("{file}: `{key}` must be a token id or a list of them, not {value}")
            })
    };
    match config.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(values)) => values.iter().map(as_id).collect(),
        Some(value) => Ok(vec![as_id(value)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::AddedToken;

    const TEXTS: [&str; 4] = [
        "Hello, wörld! Ünïcödé façade — “quotes” 你好世界",
        "emoji 🦀🎉 family 👩‍👩‍👧 flag 🇫🇷 and ẞ",
        "  leading, \t tabs\n\n\nand   runs of   spaces   ",
        "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
    ];

    /// Writes a byte-level BPE tokenizer (the 256 byte symbols, a few merges, three special
    /// tokens; BOS added by a post-processor if `bos_template`) and `configs` to a temp dir.
    fn model_dir(bos_template: bool, configs: &[(&str, &str)]) -> tempfile::TempDir {
        let mut symbols: Vec<String> = ByteLevel::alphabet()
            .into_iter()
            .map(String::from)
            .collect();
        symbols.sort();
        let merges: Vec<(String, String)> =
            [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "Ġ"), ("i", "n")]
                .iter()
                .map(|&(a, b)| (a.to_owned(), b.to_owned()))
                .collect();
        symbols.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
        let vocab: Vocab = symbols.into_iter().zip(0u32..).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .unwrap();

        let mut tokenizer = tokenizers::Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        tokenizer.add_special_tokens(&[
            AddedToken::from("<|bos|>", true),
            AddedToken::from("<|eos|>", true),
            AddedToken::from("<|im_end|>", true),
        ]);
        let bos = tokenizer.token_to_id("<|bos|>").unwrap();
        let template = TemplateProcessing::builder()
            .try_single("<|bos|> $A")
            .unwrap()
            .try_pair("<|bos|> $A $B")
            .unwrap()
            .special_tokens(vec![("<|bos|>", bos)])
            .build()
            .unwrap();
        if bos_template {
            tokenizer.with_post_processor(Some(template));
        }

        let dir = tempfile::tempdir().unwrap();
        tokenizer
            .save(dir.path().join("tokenizer.json"), false)
            .unwrap();
        for (name, text) in configs {
            fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    const TOKENIZER_CONFIG: (&str, &str) = (
        "tokenizer_config.json",
        r#"{"bos_token": "<|bos|>", "eos_token": {"content": "<|eos|>", "special": true}}"#,
    );

    #[test]
    fn encode_decode_round_trips_mixed_text() {
        let dir = model_dir(true, &[TOKENIZER_CONFIG]);
        let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tokenizer.vocab_size(), 256 + 5 + 3);
        let bos = tokenizer.bos_token_id().unwrap();
        for text in TEXTS {
            let ids = tokenizer.encode(text, false).unwrap();
            assert!(ids.len() > 5 && !ids.contains(&bos), "{text:?}");
            assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
            let with_bos = tokenizer.encode(text, true).unwrap();
            assert_eq!((with_bos[0], &with_bos[1..]), (bos, &ids[..]));
            assert_eq!(tokenizer.decode(&with_bos, true).unwrap(), text);
        }
        let the = tokenizer.encode(" the", false).unwrap();
        assert_eq!(the.len(), 1, "merges apply");
        let special = tokenizer.encode("a<|im_end|>b", false).unwrap();
        assert_eq!(special.len(), 3, "special tokens are single ids");
        assert_eq!(tokenizer.decode(&special, true).unwrap(), "ab");
    }

    /// Streams `ids`, checking no chunk holds U+FFFD, and returns the concatenated text.
    fn stream(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> String {
        let mut decoder = tokenizer.decode_stream(skip_special_tokens);
        let mut text = String::new();
        for &id in ids {
            if let Some(chunk) = decoder.step(id).unwrap() {
                assert!(!chunk.contains('\u{FFFD}'), "chunk {chunk:?} of {ids:?}");
                text.push_str(&chunk);
            }
        }
        text.push_str(&decoder.finish().unwrap());
        text
    }

    #[test]
    fn streaming_matches_the_full_decode() {
        let dir = model_dir(true, &[TOKENIZER_CONFIG]);
        let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
        for text in TEXTS {
            let ids = tokenizer.encode(text, false).unwrap();
            assert_eq!(stream(&tokenizer, &ids, false), text);
        }
        let ids = tokenizer
            .encode("<|bos|>x 🦀<|eos|> then<|im_end|>", false)
            .unwrap();
        for skip in [false, true] {
            let full = tokenizer.decode(&ids, skip).unwrap();
            assert_eq!(stream(&tokenizer, &ids, skip), full, "skip {skip}");
        }
    }

    #[test]
    fn split_emoji_comes_out_whole() {
        let dir = model_dir(true, &[TOKENIZER_CONFIG]);
        let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
        let ids = tokenizer.encode("🦀", false).unwrap();
        assert_eq!(ids.len(), 4, "one token per byte");
        let mut decoder = tokenizer.decode_stream(false);
        for &id in &ids[..3] {
            assert_eq!(decoder.step(id).unwrap(), None);
        }
        assert_eq!(decoder.step(ids[3]).unwrap().as_deref(), Some("🦀"));

        let mut truncated = tokenizer.decode_stream(false);
        for &id in &ids[..2] {
            assert_eq!(truncated.step(id).unwrap(), None);
        }
        let tail = truncated.finish().unwrap();
        assert_eq!(tail, tokenizer.decode(&ids[..2], false).unwrap());
        assert!(tail.contains('\u{FFFD}'));
    }

    #[test]
    fn adds_bos_follows_the_post_processor_and_add_bos_token() {
        let added = |bos_template, config: &str| {
            let dir = model_dir(bos_template, &[("tokenizer_config.json", config)]);
            Tokenizer::from_dir(dir.path()).unwrap().adds_bos().unwrap()
        };
        let (plain, asking) = (
            r#"{"bos_token": "<|bos|>"}"#,
            r#"{"bos_token": "<|bos|>", "add_bos_token": true}"#,
        );
        assert!(added(true, plain), "the post-processor adds it");
        assert!(added(false, asking), "add_bos_token adds it");
        assert!(!added(false, plain));
        assert!(
            !added(false, r#"{"add_bos_token": true}"#),
            "no BOS token to add"
        );
    }

    #[test]
    fn special_tokens_resolve_from_the_configs() {
        let dir = model_dir(
            true,
            &[
                TOKENIZER_CONFIG,
                (
                    "config.json",
                    r#"{"bos_token_id": 3, "eos_token_id": [262, 263]}"#,
                ),
                ("generation_config.json", r#"{"eos_token_id": 263}"#),
            ],
        );
        let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
        let eos = tokenizer.encode("<|eos|>", false).unwrap()[0];
        let im_end = tokenizer.encode("<|im_end|>", false).unwrap()[0];
        assert_eq!((eos, im_end), (262, 263));
        assert_eq!(tokenizer.eos_token_ids(), &[262, 263]);
        assert_eq!(tokenizer.bos_token_id(), Some(261));
    }

    #[test]
    fn config_ids_are_used_without_a_tokenizer_config() {
        let dir = model_dir(
            true,
            &[
                (
                    "config.json",
                    r#"{"bos_token_id": 261, "eos_token_id": 263}"#,
                ),
                ("generation_config.json", r#"{"eos_token_id": [262, 263]}"#),
            ],
        );
        let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tokenizer.eos_token_ids(), &[263, 262]);
        assert_eq!(tokenizer.bos_token_id(), Some(261));
    }

    #[test]
    fn add_bos_token_prepends_bos_once() {
        let config = r#"{"bos_token": "<|bos|>", "add_bos_token": true}"#;
        for bos_template in [false, true] {
            let dir = model_dir(bos_template, &[("tokenizer_config.json", config)]);
            let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
            let plain = tokenizer.encode("hi there", false).unwrap();
            assert_ne!(plain[0], 261);
            let ids = tokenizer.encode("hi there", true).unwrap();
            assert_eq!(
                (ids[0], &ids[1..]),
                (261, &plain[..]),
                "template {bos_template}"
            );
        }
        let dir = model_dir(false, &[TOKENIZER_CONFIG]);
        let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
        let ids = tokenizer.encode("hi there", true).unwrap();
        assert_eq!(
            ids,
            tokenizer.encode("hi there", false).unwrap(),
            "add_bos_token unset"
        );
    }

    #[test]
    fn malformed_configs_are_errors_naming_the_problem() {
        let dir = model_dir(true, &[("config.json", r#"{"eos_token_id": "</s>"}"#)]);
        let err = Tokenizer::from_dir(dir.path()).err().unwrap();
        assert!(err.to_string().contains("eos_token_id"), "{err}");
        let dir = model_dir(true, &[("generation_config.json", "{not json")]);
        let err = Tokenizer::from_dir(dir.path()).err().unwrap();
        assert!(err.to_string().contains("generation_config.json"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        let err = Tokenizer::from_dir(empty.path()).err().unwrap();
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
    }
}

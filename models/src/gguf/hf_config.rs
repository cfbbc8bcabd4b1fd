//! The Hugging Face `config.json` of a Llama model, from GGUF metadata.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value as Json};

use super::names::OUTPUT;
use super::reader::GgufFile;

/// The only architecture Peregrine imports from GGUF.
pub(crate) const ARCH: &str = "llama";

/// Llama hyper-parameters read from a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LlamaConfig {
    /// Rows of the token embedding.
    pub vocab_size: usize,
    /// `embedding_length`.
    pub hidden_size: usize,
    /// `feed_forward_length`.
    pub intermediate_size: usize,
    /// `block_count`.
    pub num_layers: usize,
    /// `attention.head_count`.
    pub num_heads: usize,
    /// `attention.head_count_kv` (default: `num_heads`).
    pub num_kv_heads: usize,
    /// `attention.key_length` (default: hidden size / heads).
    pub head_dim: usize,
    /// `attention.layer_norm_rms_epsilon`.
    pub rms_norm_eps: f64,
    /// `rope.freq_base` (default 10000).
    pub rope_theta: f64,
    /// `context_length`.
    pub max_position_embeddings: u64,
    /// The factor of linear RoPE scaling, if the model uses it.
    pub linear_rope_factor: Option<f64>,
    /// True when the file has no `output.weight`.
    pub tie_word_embeddings: bool,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u64>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u64>,
}

impl LlamaConfig {
    /// Reads the config; an error names any missing or ill-typed key, or a non-Llama
    /// architecture.
    pub(crate) fn from_gguf(file: &GgufFile) -> Result<Self> {
        let arch = file.require_str("general.architecture")?;
        if arch != ARCH {
            bail!("unsupported GGUF architecture '{arch}' (Peregrine imports only '{ARCH}')");
        }
        let key = |k: &str| format!("{ARCH}.{k}");
        let size = |k: &str| -> Result<usize> {
            let v = file.require_u64(&key(k))?;
            usize::try_from(v).with_context(|| format!("GGUF key '{}' = {v} is too large", key(k)))
        };
        let hidden_size = size("embedding_length")?;
        let num_heads = size("attention.head_count")?;
        if num_heads == 0 || !hidden_size.is_multiple_of(num_heads) {
            bail!(
                "{} heads do not divide the hidden size {hidden_size}",
                num_heads
            );
        }
        let num_kv_heads = match file.get_u64(&key("attention.head_count_kv"))? {
            Some(n) => n as usize,
            None => num_heads,
        };
        if num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            bail!("{num_kv_heads} key/value heads do not divide {num_heads} attention heads");
        }
        let head_dim = match file.get_u64(&key("attention.key_length"))? {
            Some(n) => n as usize,
            None => hidden_size / num_heads,
        };
        if let Some(v) = file.get_u64(&key("attention.value_length"))? {
            if v as usize != head_dim {
                bail!(
                    "value head size {v} differs from key head size {head_dim}: not a Llama model"
                );
            }
        }
        if let Some(rot) = file.get_u64(&key("rope.dimension_count"))? {
            if rot as usize != head_dim {
                bail!(
                    "RoPE covers {rot} of {head_dim} head dimensions: partial rotary is not Llama"
                );
            }
        }
        let embed = file
            .tensor("token_embd.weight")
            .context("GGUF has no tensor 'token_embd.weight'")?;
        let vocab_size = match embed.hf_shape()[..] {
            [rows, cols] if cols == hidden_size => rows,
            ref shape => bail!(
                "tensor 'token_embd.weight' has shape {shape:?}, expected [vocab, {hidden_size}]"
            ),
        };
        Ok(Self {
            vocab_size,
            hidden_size,
            intermediate_size: size("feed_forward_length")?,
            num_layers: size("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: file
                .get_f64(&key("attention.layer_norm_rms_epsilon"))?
                .with_context(|| {
                    format!(
                        "GGUF key '{}' is missing",
                        key("attention.layer_norm_rms_epsilon")
                    )
                })?,
            rope_theta: file.get_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            max_position_embeddings: file.require_u64(&key("context_length"))?,
            linear_rope_factor: linear_rope_factor(file)?,
            tie_word_embeddings: file.tensor(OUTPUT).is_none(),
            bos_token_id: file.get_u64("tokenizer.ggml.bos_token_id")?,
            eos_token_id: file.get_u64("tokenizer.ggml.eos_token_id")?,
        })
    }

    /// The Hugging Face shape a tensor with GGUF name `gguf` must have, if it is a Llama tensor.
    pub(crate) fn expected_shape(&self, gguf: &str) -> Option<Vec<usize>> {
        // Saturating: absurd metadata then matches no real shape instead of overflowing.
        let (h, q, kv, ff) = (
            self.hidden_size,
            self.num_heads.saturating_mul(self.head_dim),
            self.num_kv_heads.saturating_mul(self.head_dim),
            self.intermediate_size,
        );
        let suffix = gguf
            .strip_prefix("blk.")
            .map_or(gguf, |rest| rest.split_once('.').map_or(rest, |(_, s)| s));
        Some(match suffix {
            "token_embd.weight" | "output.weight" => vec![self.vocab_size, h],
            "output_norm.weight" | "attn_norm.weight" | "ffn_norm.weight" => vec![h],
            "attn_q.weight" => vec![q, h],
            "attn_k.weight" | "attn_v.weight" => vec![kv, h],
            "attn_output.weight" => vec![h, q],
            "ffn_gate.weight" | "ffn_up.weight" => vec![ff, h],
            "ffn_down.weight" => vec![h, ff],
            _ => return None,
        })
    }

    /// `config.json` as Hugging Face writes it for `LlamaForCausalLM`.
    pub(crate) fn to_json(&self) -> Json {
        let mut cfg = json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": false,
            "mlp_bias": false,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": "float32",
        });
        if let Some(factor) = self.linear_rope_factor {
            cfg["rope_scaling"] =
                json!({"type": "linear", "rope_type": "linear", "factor": factor});
        }
        cfg
    }
}

/// The linear RoPE scaling factor: `rope.scaling.type = linear` with `rope.scaling.factor`,
/// or the older `rope.scale_linear`. Any other scaling type is an error.
fn linear_rope_factor(file: &GgufFile) -> Result<Option<f64>> {
    let factor_key = format!("{ARCH}.rope.scaling.factor");
    match file.get_str(&format!("{ARCH}.rope.scaling.type"))? {
        Some("linear") => {
            Ok(Some(file.get_f64(&factor_key)?.with_context(|| {
                format!("linear RoPE scaling without '{factor_key}'")
            })?))
        }
        Some("none") | None => Ok(file
            .get_f64(&format!("{ARCH}.rope.scale_linear"))?
            .filter(|&f| f != 1.0)),
        Some(other) => bail!("RoPE scaling type '{other}' is not supported (only linear)"),
    }
}

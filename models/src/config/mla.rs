//! Multi-head latent attention's fields of a DeepSeek-V2/V3 config.json.

use super::{field_error, required, ConfigError};
use serde_json::Value;

/// The geometry of multi-head latent attention (DeepSeek-V2 and V3).
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// Rank of the query's compression (`q_lora_rank`); `None` projects q directly.
    pub q_lora_rank: Option<usize>,
    /// Width of the compressed key/value latent (`kv_lora_rank`), 512 in DeepSeek's.
    pub kv_lora_rank: usize,
    /// Per-head query/key width without a position (`qk_nope_head_dim`).
    pub qk_nope_head_dim: usize,
    /// Width of the rotary part, one key of it shared by all heads (`qk_rope_head_dim`).
    pub qk_rope_head_dim: usize,
    /// Per-head value width (`v_head_dim`).
    pub v_head_dim: usize,
    /// Whether the rotary pairs are interleaved (GPT-J style, DeepSeek's own) rather than
    /// split into halves (V3's `rope_interleave: false`).
    pub rope_interleaved: bool,
    /// The softmax scale: `qk_head_dim^-0.5`, times YaRN's `mscale²` of `mscale_all_dim`.
    pub softmax_scale: f64,
}

/// The raw MLA fields of a config.json.
pub(super) struct RawMla {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: Option<usize>,
    pub qk_nope_head_dim: Option<usize>,
    pub qk_rope_head_dim: Option<usize>,
    pub v_head_dim: Option<usize>,
    pub rope_interleave: Option<bool>,
}

impl MlaConfig {
    /// Checks the MLA fields, with `rope` the rotary settings (`rope_scaling` or
    /// `rope_parameters`), whose YaRN `mscale_all_dim` scales the softmax as DeepSeek's
    /// own code does.
    pub(super) fn parse(raw: RawMla, rope: Option<&Value>) -> Result<MlaConfig, ConfigError> {
        let q_lora_rank = match raw.q_lora_rank {
            None => None,
            Some(r) => Some(required(Some(r), "q_lora_rank")?),
        };
        let kv_lora_rank = required(raw.kv_lora_rank, "kv_lora_rank")?;
        let qk_nope_head_dim = required(raw.qk_nope_head_dim, "qk_nope_head_dim")?;
        let qk_rope_head_dim = required(raw.qk_rope_head_dim, "qk_rope_head_dim")?;
        if !qk_rope_head_dim.is_multiple_of(2) {
            return Err(field_error(
                "qk_rope_head_dim",
                format!("({qk_rope_head_dim}) must be even for rotary embeddings"),
            ));
        }
        let v_head_dim = required(raw.v_head_dim, "v_head_dim")?;
        let qk_head_dim = (qk_nope_head_dim + qk_rope_head_dim) as f64;
        Ok(MlaConfig {
            q_lora_rank,
            kv_lora_rank,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            rope_interleaved: raw.rope_interleave.unwrap_or(true),
            softmax_scale: qk_head_dim.powf(-0.5) * softmax_mscale(rope).powi(2),
        })
    }

    /// Values one token keeps per layer in the cache: the latent, then the rotary key
    /// (576 in DeepSeek's models).
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// One head's query (and key) width: the part without a position, then the rotary one.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

/// YaRN's `0.1 * mscale_all_dim * ln(factor) + 1` (1 for a factor of at most 1, for no
/// `mscale_all_dim`, or for plain rotary embeddings).
fn softmax_mscale(rope: Option<&Value>) -> f64 {
    let Some(rope) = rope.filter(|v| v.is_object()) else {
        return 1.0;
    };
    let kind = rope["rope_type"].as_str().or(rope["type"].as_str());
    let (factor, all_dim) = (rope["factor"].as_f64(), rope["mscale_all_dim"].as_f64());
    match (kind, factor, all_dim) {
        (Some(k), Some(factor), Some(m)) if k != "default" && m != 0.0 && factor > 1.0 => {
            0.1 * m * factor.ln() + 1.0
        }
        _ => 1.0,
    }
}

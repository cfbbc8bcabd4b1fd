//! Hugging Face `config.json` for the Llama family (Llama, Mistral, Qwen2, Qwen3) and the
//! DeepSeek family (DeepSeek-V2 and V3 with latent attention and experts, Qwen3-MoE).

mod mla;
mod moe;

pub use mla::MlaConfig;
pub use moe::{GroupScore, MoeConfig, Scoring};

use mla::RawMla;
use moe::RawMoe;
use peregrine_kernels::cpu::KvLayout;
use peregrine_ops::{KvRows, RopeScaling};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// A config that cannot be used, naming the field or architecture at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config.json is not valid JSON: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("config.json: field `{field}`: {problem}")]
    FieldType { field: String, problem: String },
    #[error("unsupported architecture {0:?} (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)")]
    Architecture(String),
    #[error("config.json: field `{field}` {problem}")]
    Field {
        field: &'static str,
        problem: String,
    },
}

/// The architectures Peregrine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen3 attention with a mixture of experts.
    Qwen3Moe,
    /// Multi-head latent attention and DeepSeek's mixture of experts.
    DeepseekV2,
    /// DeepSeek-V2's shape with sigmoid routing and multi-token prediction layers.
    DeepseekV3,
}

/// A validated model configuration.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// The longest sequence the model serves: `max_position_embeddings`, or Mistral's
    /// sliding window when that is shorter (windowed attention is not implemented).
    pub max_model_len: usize,
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2, or Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k before the rotary embedding (Qwen3).
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Multi-head latent attention in place of grouped-query attention (DeepSeek).
    pub mla: Option<MlaConfig>,
    /// The mixture of experts, for the layers it names.
    pub moe: Option<MoeConfig>,
    /// Multi-token prediction layers stored after the last decoder layer
    /// (`num_nextn_predict_layers`, DeepSeek-V3); the forward does not run them.
    pub mtp_layers: usize,
}

#[derive(Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    max_position_embeddings: Option<usize>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    hidden_act: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<Value>,
    /// transformers 5's name for `rope_scaling`, with `rope_theta` inside.
    rope_parameters: Option<Value>,
    q_lora_rank: Option<usize>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    rope_interleave: Option<bool>,
    n_routed_experts: Option<usize>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    n_shared_experts: Option<usize>,
    first_k_dense_replace: Option<usize>,
    moe_layer_freq: Option<usize>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    topk_method: Option<String>,
    scoring_func: Option<String>,
    norm_topk_prob: Option<bool>,
    routed_scaling_factor: Option<f64>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    shared_expert_intermediate_size: Option<usize>,
    num_nextn_predict_layers: Option<usize>,
}

/// The attention geometry every Llama-family config.json gives, checked.
pub(crate) struct AttentionShape {
    pub hidden_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// Checks the activation and the attention fields of a config.json (`num_key_value_heads`
/// defaults to the heads, `head_dim` to hidden over heads) and returns the geometry.
pub(crate) fn attention_shape(
    hidden_act: Option<&str>,
    hidden_size: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
) -> Result<AttentionShape, ConfigError> {
    if let Some(act) = hidden_act.filter(|a| *a != "silu") {
        return Err(field_error(
            "hidden_act",
            format!("is {act:?}; only \"silu\" is supported"),
        ));
    }
    let hidden_size = required(hidden_size, "hidden_size")?;
    let num_heads = required(num_attention_heads, "num_attention_heads")?;
    let num_kv_heads = required(
        num_key_value_heads.or(Some(num_heads)),
        "num_key_value_heads",
    )?;
    if !num_heads.is_multiple_of(num_kv_heads) {
        return Err(field_error(
            "num_key_value_heads",
            format!("({num_kv_heads}) must divide num_attention_heads ({num_heads})"),
        ));
    }
    let head_dim = match head_dim {
        Some(d) => required(Some(d), "head_dim")?,
        None if hidden_size.is_multiple_of(num_heads) => hidden_size / num_heads,
        None => {
            return Err(field_error(
                "head_dim",
                "is missing and hidden_size is not a multiple of num_attention_heads",
            ))
        }
    };
    if !head_dim.is_multiple_of(2) {
        return Err(field_error(
            "head_dim",
            format!("({head_dim}) must be even for rotary embeddings"),
        ));
    }
    Ok(AttentionShape {
        hidden_size,
        num_heads,
        num_kv_heads,
        head_dim,
    })
}

/// `value`, or `default` when absent, refused unless positive (NaN included).
pub(crate) fn positive_or(
    value: Option<f64>,
    default: f64,
    field: &'static str,
) -> Result<f64, ConfigError> {
    let value = value.unwrap_or(default);
    if value.is_nan() || value <= 0.0 {
        return Err(field_error(field, "must be positive"));
    }
    Ok(value)
}

/// The text of `dir/config.json`.
pub(crate) fn read_config_json(dir: &Path) -> Result<String, ConfigError> {
    let path = dir.join("config.json");
    std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

pub(crate) fn required(value: Option<usize>, field: &'static str) -> Result<usize, ConfigError> {
    match value {
        Some(v) if v > 0 => Ok(v),
        Some(_) => Err(field_error(field, "must be positive")),
        None => Err(field_error(field, "is missing")),
    }
}

pub(crate) fn field_error(field: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field,
        problem: problem.into(),
    }
}

/// The raw fields of a config.json text; a value of the wrong type names its field.
fn parse_raw(text: &str) -> Result<RawConfig, ConfigError> {
    let mut json = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut json).map_err(|err| {
        let field = err.path().to_string();
        let inner = err.into_inner();
        if field == "." || inner.is_syntax() || inner.is_eof() {
            ConfigError::Parse(inner)
        } else {
            ConfigError::FieldType {
                field,
                problem: inner.to_string(),
            }
        }
    })
}

impl ModelConfig {
    /// Bytes one token takes in the KV cache across all layers, at `elem_bytes` per value:
    /// its keys and values, or under latent attention its one latent row.
    pub fn kv_bytes_per_token(&self, elem_bytes: u64) -> u64 {
        let layout = self.kv_layout(1, 1);
        let rows = if self.mla.is_some() { 1 } else { 2 };
        rows * self.num_layers as u64 * layout.slot_elems() * elem_bytes
    }

    /// Reads and validates `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<ModelConfig, ConfigError> {
        ModelConfig::from_json(&read_config_json(dir)?)
    }

    /// Parses and validates the text of a config.json.
    pub fn from_json(text: &str) -> Result<ModelConfig, ConfigError> {
        let raw: RawConfig = parse_raw(text)?;
        let name = raw
            .architectures
            .as_ref()
            .and_then(|a| a.first())
            .ok_or_else(|| field_error("architectures", "is missing"))?;
        let architecture = match name.as_str() {
            "LlamaForCausalLM" => Architecture::Llama,
            "MistralForCausalLM" => Architecture::Mistral,
            "Qwen2ForCausalLM" => Architecture::Qwen2,
            "Qwen3ForCausalLM" => Architecture::Qwen3,
            "Qwen3MoeForCausalLM" => Architecture::Qwen3Moe,
            "DeepseekV2ForCausalLM" => Architecture::DeepseekV2,
            "DeepseekV3ForCausalLM" => Architecture::DeepseekV3,
            other => return Err(ConfigError::Architecture(other.to_string())),
        };
        let deepseek = matches!(
            architecture,
            Architecture::DeepseekV2 | Architecture::DeepseekV3
        );
        let rope = raw.rope_scaling.as_ref().or(raw.rope_parameters.as_ref());
        let mla = if deepseek {
            let mla = RawMla {
                q_lora_rank: raw.q_lora_rank,
                kv_lora_rank: raw.kv_lora_rank,
                qk_nope_head_dim: raw.qk_nope_head_dim,
                qk_rope_head_dim: raw.qk_rope_head_dim,
                v_head_dim: raw.v_head_dim,
                rope_interleave: raw.rope_interleave,
            };
            Some(MlaConfig::parse(mla, rope)?)
        } else {
            None
        };
        if raw.shared_expert_intermediate_size.is_some_and(|s| s > 0) {
            return Err(field_error(
                "shared_expert_intermediate_size",
                "names a gated shared expert, which is not supported",
            ));
        }
        let AttentionShape {
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
        } = attention_shape(
            raw.hidden_act.as_deref(),
            raw.hidden_size,
            raw.num_attention_heads,
            // Latent attention has one latent for all heads; its heads are as wide as
            // their query.
            raw.num_key_value_heads.filter(|_| mla.is_none()),
            mla.as_ref().map(MlaConfig::qk_head_dim).or(raw.head_dim),
        )?;
        let mut max_model_len = required(raw.max_position_embeddings, "max_position_embeddings")?;
        let windowed =
            architecture == Architecture::Mistral || raw.use_sliding_window == Some(true);
        if let Some(window) = raw.sliding_window.filter(|_| windowed) {
            max_model_len = max_model_len.min(window);
        }
        let eos_token_ids = match raw.eos_token_id {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Number(n)) => vec![token_id(&n)?],
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|v| match v {
                    Value::Number(n) => token_id(n),
                    _ => Err(field_error("eos_token_id", "must hold token ids")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(field_error(
                    "eos_token_id",
                    "must be an id or a list of ids",
                ))
            }
        };
        let rms_norm_eps = positive_or(raw.rms_norm_eps, 1e-6, "rms_norm_eps")?;
        let theta_inside = raw
            .rope_parameters
            .as_ref()
            .and_then(|p| p["rope_theta"].as_f64());
        let rope_theta = positive_or(raw.rope_theta.or(theta_inside), 10000.0, "rope_theta")?;
        let num_layers = required(raw.num_hidden_layers, "num_hidden_layers")?;
        let mtp_layers = raw.num_nextn_predict_layers.unwrap_or(0);
        let moe = RawMoe {
            num_experts: raw
                .n_routed_experts
                .or(raw.num_experts)
                .or(raw.num_local_experts)
                .filter(|_| deepseek || architecture == Architecture::Qwen3Moe),
            experts_per_token: raw.num_experts_per_tok,
            moe_intermediate_size: raw.moe_intermediate_size,
            n_shared_experts: raw.n_shared_experts,
            first_k_dense_replace: raw.first_k_dense_replace,
            moe_layer_freq: raw.moe_layer_freq,
            n_group: raw.n_group,
            topk_group: raw.topk_group,
            topk_method: raw.topk_method,
            scoring_func: raw.scoring_func,
            norm_topk_prob: raw.norm_topk_prob,
            routed_scaling_factor: raw.routed_scaling_factor,
            decoder_sparse_step: raw.decoder_sparse_step,
            mlp_only_layers: raw.mlp_only_layers,
        };
        Ok(ModelConfig {
            architecture,
            vocab_size: required(raw.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: required(raw.intermediate_size, "intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            rope_scaling: rope_scaling(rope)?,
            max_model_len,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias: architecture == Architecture::Qwen2 || raw.attention_bias == Some(true),
            qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Qwen3Moe),
            bos_token_id: raw.bos_token_id,
            eos_token_ids,
            moe: MoeConfig::parse(architecture, moe, num_layers + mtp_layers)?,
            mla,
            mtp_layers,
        })
    }
}

fn token_id(n: &serde_json::Number) -> Result<u32, ConfigError> {
    n.as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| field_error("eos_token_id", format!("{n} is not a token id")))
}

pub(crate) fn rope_scaling(value: Option<&Value>) -> Result<RopeScaling, ConfigError> {
    let Some(v) = value.filter(|v| !v.is_null()) else {
        return Ok(RopeScaling::None);
    };
    let kind = v["rope_type"]
        .as_str()
        .or(v["type"].as_str())
        .unwrap_or("default");
    let number = |key: &str| {
        v[key].as_f64().filter(|x| *x > 0.0).ok_or_else(|| {
            field_error(
                "rope_scaling",
                format!("needs a positive `{key}` for type {kind:?}"),
            )
        })
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: number("factor")?,
        }),
        "yarn" => {
            let factor = number("factor")?;
            let optional = |key: &str, default: f64| match v.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(_) => number(key),
            };
            // transformers' default: the ratio of `mscale` to `mscale_all_dim` when both
            // are given, else YaRN's `0.1 ln(factor) + 1`.
            let mscale = |m: f64| {
                if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * m * factor.ln() + 1.0
                }
            };
            let (m, all) = (v["mscale"].as_f64(), v["mscale_all_dim"].as_f64());
            let default_factor = match (m, all) {
                (Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
                _ => mscale(1.0),
            };
            Ok(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: number("original_max_position_embeddings")?,
                beta_fast: optional("beta_fast", 32.0)?,
                beta_slow: optional("beta_slow", 1.0)?,
                truncate: v["truncate"].as_bool().unwrap_or(true),
                attention_factor: optional("attention_factor", default_factor)?,
            })
        }
        "llama3" => {
            let (low, high) = (number("low_freq_factor")?, number("high_freq_factor")?);
            if high <= low {
                return Err(field_error(
                    "rope_scaling",
                    "high_freq_factor must exceed low_freq_factor",
                ));
            }
            Ok(RopeScaling::Llama3 {
                factor: number("factor")?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: number("original_max_position_embeddings")?,
            })
        }
        other => Err(field_error(
            "rope_scaling",
            format!("type {other:?} is not supported (supported: linear, llama3, yarn)"),
        )),
    }
}

impl ModelConfig {
    /// What a token leaves in each layer's cache: keys and values, or under latent attention
    /// one latent row.
    pub fn kv_rows(&self) -> KvRows {
        if self.mla.is_some() {
            KvRows::Latent
        } else {
            KvRows::KeysAndValues
        }
    }

    /// One layer's KV cache layout for a pool of `num_blocks` blocks of `block_size` tokens;
    /// under latent attention one "head" per token, as wide as the latent and rotary key.
    pub fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        let (num_kv_heads, head_dim) = match &self.mla {
            Some(mla) => (1, mla.cache_width()),
            None => (self.num_kv_heads, self.head_dim),
        };
        KvLayout {
            num_blocks,
            block_size,
            num_kv_heads: num_kv_heads as u64,
            head_dim: head_dim as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"{"architectures":["LlamaForCausalLM"],"vocab_size":100,"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
        "max_position_embeddings":2048,"eos_token_id":[2,7],
        "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#;

    #[test]
    fn a_value_of_the_wrong_type_names_its_field() {
        let text = LLAMA.replace(r#""hidden_size":64"#, r#""hidden_size":"wide""#);
        let err = ModelConfig::from_json(&text).unwrap_err().to_string();
        assert!(
            err.starts_with("config.json: field `hidden_size`: invalid type: string \"wide\""),
            "{err}"
        );
        let err = ModelConfig::from_json("{\"vocab_size\": 3,").unwrap_err();
        assert!(matches!(err, ConfigError::Parse(_)), "{err}");
    }

    #[test]
    fn parses_llama_with_defaults() {
        let c = ModelConfig::from_json(LLAMA).unwrap();
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.eos_token_ids, vec![2, 7]);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        assert!(!c.qkv_bias && !c.qk_norm);
    }

    #[test]
    fn errors_name_the_field_or_architecture() {
        let e = ModelConfig::from_json(&LLAMA.replace("LlamaForCausalLM", "GPT2LMHeadModel"))
            .unwrap_err();
        assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}");
        let e = ModelConfig::from_json(
            &LLAMA.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("num_key_value_heads"), "{e}");
        let e = ModelConfig::from_json(&LLAMA.replace("\"hidden_size\":64,", "")).unwrap_err();
        assert!(e.to_string().contains("`hidden_size` is missing"), "{e}");
        let e = ModelConfig::from_json(&LLAMA.replace("llama3", "dynamic")).unwrap_err();
        assert!(e.to_string().contains("dynamic"), "{e}");
    }
}

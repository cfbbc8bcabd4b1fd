//! An EAGLE-3 head's `config.json`, as SafeAILab and SpecForge publish it.

use crate::config::{
    attention_shape, field_error, positive_or, read_config_json, required, rope_scaling,
    AttentionShape, ConfigError,
};
use peregrine_kernels::cpu::KvLayout;
use peregrine_ops::RopeScaling;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// A validated EAGLE-3 head configuration.
#[derive(Clone, Debug)]
pub struct Eagle3Config {
    /// The head's width H.
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_model_len: usize,
    /// The target's vocabulary V (embedding rows; draft ids map into it).
    pub vocab_size: usize,
    /// The draft vocabulary V_d (`lm_head` rows, `d2t` entries).
    pub draft_vocab_size: usize,
    /// The target's width H_t: `target_hidden_size`, else `hidden_size`.
    pub target_hidden_size: usize,
    /// `eagle_config.eagle_aux_hidden_state_layer_ids`, when the checkpoint names them.
    pub aux_layer_ids: Option<Vec<usize>>,
    /// The residual is `hidden_norm(g)` rather than `g`.
    pub norm_before_residual: bool,
}

#[derive(Deserialize)]
struct RawConfig {
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
    vocab_size: Option<usize>,
    draft_vocab_size: Option<usize>,
    target_hidden_size: Option<usize>,
    hidden_act: Option<String>,
    eagle_config: Option<RawEagleConfig>,
    norm_before_residual: Option<bool>,
}

#[derive(Deserialize)]
struct RawEagleConfig {
    eagle_aux_hidden_state_layer_ids: Option<Vec<usize>>,
    use_aux_hidden_state: Option<bool>,
}

/// `(2, L/2, L-3)`: the layers whose inputs feed a head whose config names none, for a
/// target of `num_layers` layers (vLLM's default); `None` below 3 layers.
pub fn default_aux_layers(num_layers: usize) -> Option<Vec<usize>> {
    (num_layers >= 3).then(|| vec![2, num_layers / 2, num_layers - 3])
}

impl Eagle3Config {
    /// Reads and validates `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Eagle3Config, ConfigError> {
        Eagle3Config::from_json(&read_config_json(dir)?)
    }

    /// Parses and validates the text of an EAGLE-3 config.json. The architecture name is
    /// not checked (old heads say `LlamaForCausalLM`); the method chooses the model.
    pub fn from_json(text: &str) -> Result<Eagle3Config, ConfigError> {
        let raw: RawConfig = serde_json::from_str(text)?;
        let layers = required(raw.num_hidden_layers, "num_hidden_layers")?;
        if layers != 1 {
            return Err(field_error(
                "num_hidden_layers",
                format!("is {layers}; an EAGLE-3 head has exactly 1 decoder layer"),
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
            raw.num_key_value_heads,
            raw.head_dim,
        )?;
        let vocab_size = required(raw.vocab_size, "vocab_size")?;
        let draft_vocab_size = required(
            raw.draft_vocab_size.or(Some(vocab_size)),
            "draft_vocab_size",
        )?;
        if draft_vocab_size > vocab_size {
            return Err(field_error(
                "draft_vocab_size",
                format!("({draft_vocab_size}) exceeds vocab_size ({vocab_size})"),
            ));
        }
        let target_hidden_size = required(
            raw.target_hidden_size.or(Some(hidden_size)),
            "target_hidden_size",
        )?;
        let eagle = raw.eagle_config.as_ref();
        if eagle.and_then(|e| e.use_aux_hidden_state) == Some(false) {
            return Err(field_error(
                "eagle_config.use_aux_hidden_state",
                "is false (a head fed only the last hidden state, without `fc`); \
                 only heads that read the target's auxiliary hidden states are supported",
            ));
        }
        let aux_layer_ids = eagle.and_then(|e| e.eagle_aux_hidden_state_layer_ids.clone());
        if aux_layer_ids.as_ref().is_some_and(Vec::is_empty) {
            return Err(field_error(
                "eagle_config.eagle_aux_hidden_state_layer_ids",
                "is empty",
            ));
        }
        let rms_norm_eps = positive_or(raw.rms_norm_eps, 1e-6, "rms_norm_eps")?;
        let rope_theta = positive_or(raw.rope_theta, 10000.0, "rope_theta")?;
        Ok(Eagle3Config {
            hidden_size,
            intermediate_size: required(raw.intermediate_size, "intermediate_size")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            rope_scaling: rope_scaling(raw.rope_scaling.as_ref())?,
            max_model_len: required(raw.max_position_embeddings, "max_position_embeddings")?,
            vocab_size,
            draft_vocab_size,
            target_hidden_size,
            aux_layer_ids,
            norm_before_residual: raw.norm_before_residual.unwrap_or(false),
        })
    }

    /// The target layers whose inputs the head reads, in concatenation order, for a target
    /// of `target_layers` layers: the config's ids, else [`default_aux_layers`]. Each must
    /// be a layer of the target.
    pub fn aux_layers(&self, target_layers: usize) -> Result<Vec<usize>, ConfigError> {
        const FIELD: &str = "eagle_config.eagle_aux_hidden_state_layer_ids";
        let ids = match &self.aux_layer_ids {
            Some(ids) => ids.clone(),
            None => default_aux_layers(target_layers).ok_or_else(|| {
                field_error(
                    FIELD,
                    format!(
                        "is missing and the default (2, L/2, L-3) needs a target of at least \
                         3 layers; the target has {target_layers}"
                    ),
                )
            })?,
        };
        if let Some(&id) = ids.iter().find(|&&id| id >= target_layers) {
            return Err(field_error(
                FIELD,
                format!("names layer {id}, but the target has {target_layers} layers"),
            ));
        }
        Ok(ids)
    }

    /// The head's one-layer KV cache layout over a pool of `num_blocks` blocks of
    /// `block_size` tokens (the target's block ids index it).
    pub fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        KvLayout {
            num_blocks,
            block_size,
            num_kv_heads: self.num_kv_heads as u64,
            head_dim: self.head_dim as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published head for Llama-3.1-8B, abridged.
    const LLAMA31: &str = r#"{"architectures":["LlamaForCausalLMEagle3"],"hidden_size":4096,
        "intermediate_size":14336,"num_attention_heads":32,"num_key_value_heads":8,
        "num_hidden_layers":1,"rms_norm_eps":1e-5,"vocab_size":128256,"draft_vocab_size":32000,
        "max_position_embeddings":131072,"rope_theta":500000.0,"tie_word_embeddings":false,
        "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
        "high_freq_factor":4.0,"original_max_position_embeddings":8192},"hidden_act":"silu"}"#;

    #[test]
    fn parses_a_published_head_with_defaults() {
        let c = Eagle3Config::from_json(LLAMA31).unwrap();
        assert_eq!((c.head_dim, c.draft_vocab_size), (128, 32000));
        assert_eq!(c.target_hidden_size, 4096);
        assert!(!c.norm_before_residual && c.aux_layer_ids.is_none());
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { .. }));
        assert_eq!(c.aux_layers(32).unwrap(), vec![2, 16, 29]);
        let e = c.aux_layers(2).unwrap_err().to_string();
        assert!(
            e.contains("eagle_aux_hidden_state_layer_ids") && e.contains("has 2"),
            "{e}"
        );
    }

    #[test]
    fn reads_the_optional_fields() {
        let text = LLAMA31.replace(
            "\"hidden_act\":\"silu\"",
            "\"head_dim\":64,\"target_hidden_size\":7168,\"norm_before_residual\":true,\
             \"eagle_config\":{\"eagle_aux_hidden_state_layer_ids\":[1,29,57],\
             \"use_aux_hidden_state\":true}",
        );
        let c = Eagle3Config::from_json(&text.replace(",\"draft_vocab_size\":32000", "")).unwrap();
        assert_eq!((c.head_dim, c.target_hidden_size), (64, 7168));
        assert_eq!(c.draft_vocab_size, c.vocab_size);
        assert!(c.norm_before_residual);
        assert_eq!(c.aux_layers(61).unwrap(), vec![1, 29, 57]);
        let e = c.aux_layers(57).unwrap_err().to_string();
        assert!(e.contains("names layer 57"), "{e}");
    }

    #[test]
    fn refuses_what_it_cannot_run_naming_the_field() {
        let cases = [
            (
                "\"num_hidden_layers\":1",
                "\"num_hidden_layers\":2",
                "num_hidden_layers",
            ),
            (
                "\"draft_vocab_size\":32000",
                "\"draft_vocab_size\":200000",
                "draft_vocab_size",
            ),
            (
                "\"hidden_act\":\"silu\"",
                "\"eagle_config\":{\"use_aux_hidden_state\":false}",
                "use_aux_hidden_state",
            ),
            ("\"hidden_size\":4096,", "", "hidden_size"),
        ];
        for (from, to, field) in cases {
            let e = Eagle3Config::from_json(&LLAMA31.replace(from, to)).unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
    }
}

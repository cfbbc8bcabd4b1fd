//! Tiny random models in Hugging Face format (config.json + model.safetensors), written by
//! the tests themselves so that no checkpoint has to be downloaded.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::{tensor::TensorView, Dtype};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Which Hugging Face architecture a tiny model imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TinyArch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

/// Shapes and hyper-parameters of a tiny model.
#[derive(Clone, Debug)]
pub struct TinySpec {
    pub arch: TinyArch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub tie_embeddings: bool,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    pub rope_scaling: Option<Value>,
}

impl TinySpec {
    /// A small Llama with grouped-query attention and untied embeddings.
    pub fn llama_tiny() -> TinySpec {
        TinySpec {
            arch: TinyArch::Llama,
            vocab_size: 300,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            tie_embeddings: false,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 4096,
            rope_scaling: None,
        }
    }

    /// A small Qwen3: per-head q/k RMSNorm, tied embeddings, head_dim not hidden/heads.
    pub fn qwen3_tiny() -> TinySpec {
        TinySpec {
            arch: TinyArch::Qwen3,
            vocab_size: 280,
            hidden_size: 48,
            intermediate_size: 96,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 1,
            head_dim: 24,
            tie_embeddings: true,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 4096,
            rope_scaling: None,
        }
    }

    /// A small Qwen2: biases on q, k and v.
    pub fn qwen2_tiny() -> TinySpec {
        TinySpec {
            arch: TinyArch::Qwen2,
            num_kv_heads: 4,
            ..TinySpec::llama_tiny()
        }
    }

    fn architecture(&self) -> (&'static str, &'static str) {
        match self.arch {
            TinyArch::Llama => ("LlamaForCausalLM", "llama"),
            TinyArch::Mistral => ("MistralForCausalLM", "mistral"),
            TinyArch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
            TinyArch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        }
    }

    /// The config.json Hugging Face would write for this model.
    pub fn config_json(&self) -> Value {
        let (architecture, model_type) = self.architecture();
        let mut config = json!({
            "architectures": [architecture],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
            "bos_token_id": 1,
            "eos_token_id": 2,
        });
        if let Some(scaling) = &self.rope_scaling {
            config["rope_scaling"] = scaling.clone();
        }
        config
    }
}

/// A tiny model: its spec and every tensor (shape, row-major values) under its HF name.
pub struct TinyModel {
    pub spec: TinySpec,
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

impl TinyModel {
    /// Draws every weight fresh from a seeded RNG: matrices uniform in +-1/sqrt(fan_in)
    /// (embeddings +-1), norm weights around 1, biases small.
    pub fn random(spec: TinySpec, seed: u64) -> TinyModel {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = BTreeMap::new();
        let (h, i, d) = (spec.hidden_size, spec.intermediate_size, spec.head_dim);
        let (qd, kvd) = (spec.num_heads * d, spec.num_kv_heads * d);
        let mut add = |name: String, shape: Vec<usize>, kind: Init| {
            let n: usize = shape.iter().product();
            let values = (0..n)
                .map(|_| match kind {
                    Init::Matrix(fan_in) => {
                        let a = 1.0 / (fan_in as f32).sqrt();
                        rng.random_range(-a..a)
                    }
                    Init::Embedding => rng.random_range(-1.0..1.0),
                    Init::Norm => rng.random_range(0.8..1.2),
                    Init::Bias => rng.random_range(-0.1..0.1),
                })
                .collect();
            tensors.insert(name, (shape, values));
        };
        add(
            "model.embed_tokens.weight".into(),
            vec![spec.vocab_size, h],
            Init::Embedding,
        );
        for l in 0..spec.num_layers {
            let p = format!("model.layers.{l}");
            add(format!("{p}.input_layernorm.weight"), vec![h], Init::Norm);
            add(
                format!("{p}.post_attention_layernorm.weight"),
                vec![h],
                Init::Norm,
            );
            add(
                format!("{p}.self_attn.q_proj.weight"),
                vec![qd, h],
                Init::Matrix(h),
            );
            add(
                format!("{p}.self_attn.k_proj.weight"),
                vec![kvd, h],
                Init::Matrix(h),
            );
            add(
                format!("{p}.self_attn.v_proj.weight"),
                vec![kvd, h],
                Init::Matrix(h),
            );
            add(
                format!("{p}.self_attn.o_proj.weight"),
                vec![h, qd],
                Init::Matrix(qd),
            );
            add(
                format!("{p}.mlp.gate_proj.weight"),
                vec![i, h],
                Init::Matrix(h),
            );
            add(
                format!("{p}.mlp.up_proj.weight"),
                vec![i, h],
                Init::Matrix(h),
            );
            add(
                format!("{p}.mlp.down_proj.weight"),
                vec![h, i],
                Init::Matrix(i),
            );
            if spec.arch == TinyArch::Qwen2 {
                add(format!("{p}.self_attn.q_proj.bias"), vec![qd], Init::Bias);
                add(format!("{p}.self_attn.k_proj.bias"), vec![kvd], Init::Bias);
                add(format!("{p}.self_attn.v_proj.bias"), vec![kvd], Init::Bias);
            }
            if spec.arch == TinyArch::Qwen3 {
                add(format!("{p}.self_attn.q_norm.weight"), vec![d], Init::Norm);
                add(format!("{p}.self_attn.k_norm.weight"), vec![d], Init::Norm);
            }
        }
        add("model.norm.weight".into(), vec![h], Init::Norm);
        if !spec.tie_embeddings {
            add(
                "lm_head.weight".into(),
                vec![spec.vocab_size, h],
                Init::Matrix(h),
            );
        }
        TinyModel { spec, tensors }
    }

    /// Writes config.json and model.safetensors (float32) into `dir`.
    pub fn write_hf(&self, dir: &Path) {
        self.write_hf_as(dir, Dtype::F32);
    }

    /// Writes config.json and model.safetensors with every tensor stored as `dtype`
    /// (F32, F16 or BF16).
    pub fn write_hf_as(&self, dir: &Path, dtype: Dtype) {
        std::fs::create_dir_all(dir).unwrap();
        let config = serde_json::to_string_pretty(&self.spec.config_json()).unwrap();
        std::fs::write(dir.join("config.json"), config).unwrap();
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(name, (shape, values))| (name.clone(), shape.clone(), encode(values, dtype)))
            .collect();
        let views = bytes.iter().map(|(name, shape, data)| {
            (
                name.clone(),
                TensorView::new(dtype, shape.clone(), data).unwrap(),
            )
        });
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    }
}

#[derive(Clone, Copy)]
enum Init {
    Matrix(usize),
    Embedding,
    Norm,
    Bias,
}

fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        other => panic!("tiny models are not written as {other:?}"),
    }
}

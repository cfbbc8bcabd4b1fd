//! Random EAGLE-3 heads in the published format (config.json with a reduced draft
//! vocabulary, safetensors with `midlayer.` or `layers.0.` names, an int64 `d2t` and a
//! bool `t2d`), written by the tests themselves.

use crate::tiny_model::TinySpec;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::{tensor::TensorView, Dtype};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The shape of a random head and how its checkpoint is written.
pub struct HeadSpec {
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// Written to config.json when set; else hidden / heads.
    pub head_dim: Option<usize>,
    pub draft_vocab: usize,
    /// `target_hidden_size` when set.
    pub target_hidden: Option<usize>,
    /// `eagle_config.eagle_aux_hidden_state_layer_ids` when set.
    pub aux_ids: Option<Vec<usize>>,
    /// `midlayer` or `layers.0`.
    pub prefix: &'static str,
    pub norm_before_residual: bool,
    pub own_embed: bool,
    pub rope_theta: f64,
    /// A "linear" `rope_scaling` factor when set.
    pub rope_linear: Option<f64>,
}

impl HeadSpec {
    /// `midlayer.` names, its own embedding, H (48) narrower than the target's (64), q
    /// wider than H, aux ids in eagle_config (layer 0 among them).
    pub fn midlayer() -> HeadSpec {
        HeadSpec {
            hidden: 48,
            intermediate: 80,
            heads: 4,
            kv_heads: 2,
            head_dim: Some(16),
            draft_vocab: 120,
            target_hidden: Some(64),
            aux_ids: Some(vec![0, 2, 3]),
            prefix: "midlayer",
            norm_before_residual: false,
            own_embed: true,
            rope_theta: 50_000.0,
            rope_linear: None,
        }
    }

    /// `layers.0.` names, norm_before_residual, no embed_tokens (the target's is shared),
    /// the default aux layers (2, L/2, L-3), linear RoPE scaling.
    pub fn layers0() -> HeadSpec {
        HeadSpec {
            hidden: 64,
            intermediate: 96,
            heads: 4,
            kv_heads: 4,
            head_dim: None,
            draft_vocab: 200,
            target_hidden: None,
            aux_ids: None,
            prefix: "layers.0",
            norm_before_residual: true,
            own_embed: false,
            rope_theta: 10_000.0,
            rope_linear: Some(2.0),
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden / self.heads)
    }

    /// The aux layers for a target of `target_layers` layers.
    pub fn aux_layers(&self, target_layers: usize) -> Vec<usize> {
        self.aux_ids
            .clone()
            .unwrap_or_else(|| vec![2, target_layers / 2, target_layers - 3])
    }
}

/// A random head: its config.json, float tensors, `d2t` and `t2d`.
pub struct RandomHead {
    pub config: Value,
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    pub d2t: Vec<i64>,
    pub vocab: usize,
}

impl RandomHead {
    pub fn new(s: &HeadSpec, target: &TinySpec, seed: u64) -> RandomHead {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (h, ht, v) = (s.hidden, target.hidden_size, target.vocab_size);
        let d = s.head_dim();
        let (qd, kvd) = (s.heads * d, s.kv_heads * d);
        let mut tensors = BTreeMap::new();
        let mut add = |name: String, shape: Vec<usize>, scale: Option<usize>| {
            let n: usize = shape.iter().product();
            let values = (0..n)
                .map(|_| match scale {
                    Some(fan_in) => {
                        let a = 1.0 / (fan_in as f32).sqrt();
                        rng.random_range(-a..a)
                    }
                    None => rng.random_range(0.8..1.2),
                })
                .collect();
            tensors.insert(name, (shape, values));
        };
        let aux = s.aux_layers(target.num_layers).len();
        add("fc.weight".into(), vec![h, aux * ht], Some(aux * ht));
        let p = s.prefix;
        add(format!("{p}.input_layernorm.weight"), vec![h], None);
        add(format!("{p}.hidden_norm.weight"), vec![h], None);
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            None,
        );
        add(
            format!("{p}.self_attn.q_proj.weight"),
            vec![qd, 2 * h],
            Some(2 * h),
        );
        add(
            format!("{p}.self_attn.k_proj.weight"),
            vec![kvd, 2 * h],
            Some(2 * h),
        );
        add(
            format!("{p}.self_attn.v_proj.weight"),
            vec![kvd, 2 * h],
            Some(2 * h),
        );
        add(
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, qd],
            Some(qd),
        );
        let i = s.intermediate;
        add(format!("{p}.mlp.gate_proj.weight"), vec![i, h], Some(h));
        add(format!("{p}.mlp.up_proj.weight"), vec![i, h], Some(h));
        add(format!("{p}.mlp.down_proj.weight"), vec![h, i], Some(i));
        add("norm.weight".into(), vec![h], None);
        add("lm_head.weight".into(), vec![s.draft_vocab, h], Some(h));
        if s.own_embed {
            // Embeddings are +-1, like the target's.
            add("embed_tokens.weight".into(), vec![v, h], Some(1));
        }
        // The draft vocabulary: draft_vocab distinct target ids, ascending.
        let mut used = rand::seq::index::sample(&mut rng, v, s.draft_vocab).into_vec();
        used.sort_unstable();
        let d2t = used
            .iter()
            .enumerate()
            .map(|(i, &t)| t as i64 - i as i64)
            .collect();
        let mut config = json!({
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": h,
            "intermediate_size": s.intermediate,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
            "num_hidden_layers": 1,
            "rms_norm_eps": 1e-5,
            "vocab_size": v,
            "draft_vocab_size": s.draft_vocab,
            "max_position_embeddings": 2048,
            "rope_theta": s.rope_theta,
            "tie_word_embeddings": false,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        });
        if let Some(d) = s.head_dim {
            config["head_dim"] = json!(d);
        }
        if let Some(t) = s.target_hidden {
            config["target_hidden_size"] = json!(t);
        }
        if let Some(ids) = &s.aux_ids {
            config["eagle_config"] = json!({
                "eagle_aux_hidden_state_layer_ids": ids,
                "use_aux_hidden_state": true,
            });
        }
        if s.norm_before_residual {
            config["norm_before_residual"] = json!(true);
        }
        if let Some(factor) = s.rope_linear {
            config["rope_scaling"] = json!({"rope_type": "linear", "factor": factor});
        }
        RandomHead {
            config,
            tensors,
            d2t,
            vocab: v,
        }
    }

    /// The same head with its q and k scaled up (a `midlayer.` head), so that its attention
    /// is sharp and a wrong position or row changes its drafts.
    pub fn sharpened(mut self) -> RandomHead {
        for name in ["q_proj", "k_proj"] {
            let w = self
                .tensors
                .get_mut(&format!("midlayer.self_attn.{name}.weight"))
                .expect("a midlayer head");
            w.1.iter_mut().for_each(|x| *x *= 3.0);
        }
        self
    }

    /// Writes config.json and model.safetensors (float32 tensors, int64 `d2t`, bool `t2d`).
    pub fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let config = serde_json::to_string_pretty(&self.config).unwrap();
        std::fs::write(dir.join("config.json"), config).unwrap();
        let mut bytes: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(name, (shape, values))| {
                let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (name.clone(), Dtype::F32, shape.clone(), data)
            })
            .collect();
        if !self.d2t.is_empty() {
            let data = self.d2t.iter().flat_map(|v| v.to_le_bytes()).collect();
            bytes.push(("d2t".into(), Dtype::I64, vec![self.d2t.len()], data));
            let mut t2d = vec![0u8; self.vocab];
            for (i, off) in self.d2t.iter().enumerate() {
                // A d2t that maps outside the vocabulary (a bad-checkpoint case) has no t2d bit.
                if let Some(bit) = usize::try_from(i as i64 + off)
                    .ok()
                    .and_then(|t| t2d.get_mut(t))
                {
                    *bit = 1;
                }
            }
            bytes.push(("t2d".into(), Dtype::BOOL, vec![self.vocab], t2d));
        }
        let views = bytes.iter().map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        });
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    }
}

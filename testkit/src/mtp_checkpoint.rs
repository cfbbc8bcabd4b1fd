//! The DeepSeek-V3 fixture of `tests/fixtures/deepseek/deepseek_v3` with a random
//! multi-token prediction layer added as a second shard (transformers does not keep MTP
//! layers, so the fixture has none): its config declares one (`num_nextn_predict_layers`).
//! The caller names the fixture's folder: the root tests and the GPU tests (run from the
//! workspace root) by its relative path, a member crate's tests by
//! [`crate::fixtures::deepseek`].

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::{tensor::TensorView, Dtype, SafeTensors};
use serde_json::{json, Map, Value};
use std::path::Path;

/// Writes the fixture of folder `fixture` (`deepseek_v3`) with an MTP layer
/// (`model.layers.{num_hidden_layers}`, random: norms near 1, the rest N(0, 0.1)-like) into
/// `dir`, sharded with an index.
pub fn write_from(fixture: &Path, dir: &Path, seed: u64) {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap())
            .unwrap();
    std::fs::copy(fixture.join("config.json"), dir.join("config.json")).unwrap();
    let first = "model-00001-of-00002.safetensors";
    let second = "model-00002-of-00002.safetensors";
    std::fs::copy(fixture.join("model.safetensors"), dir.join(first)).unwrap();
    let n = |k: &str| config[k].as_u64().unwrap() as usize;
    let (h, heads, vocab) = (n("hidden_size"), n("num_attention_heads"), n("vocab_size"));
    let (ql, l, r) = (n("q_lora_rank"), n("kv_lora_rank"), n("qk_rope_head_dim"));
    let (p, v) = (n("qk_nope_head_dim"), n("v_head_dim"));
    let (experts, inter) = (n("n_routed_experts"), n("moe_intermediate_size"));
    let shared = inter * n("n_shared_experts");
    let layer = format!("model.layers.{}", n("num_hidden_layers"));
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("enorm.weight".into(), vec![h]),
        ("hnorm.weight".into(), vec![h]),
        ("eh_proj.weight".into(), vec![h, 2 * h]),
        ("shared_head.norm.weight".into(), vec![h]),
        ("shared_head.head.weight".into(), vec![vocab, h]),
        ("input_layernorm.weight".into(), vec![h]),
        ("post_attention_layernorm.weight".into(), vec![h]),
        ("self_attn.q_a_proj.weight".into(), vec![ql, h]),
        ("self_attn.q_a_layernorm.weight".into(), vec![ql]),
        (
            "self_attn.q_b_proj.weight".into(),
            vec![heads * (p + r), ql],
        ),
        ("self_attn.kv_a_proj_with_mqa.weight".into(), vec![l + r, h]),
        ("self_attn.kv_a_layernorm.weight".into(), vec![l]),
        (
            "self_attn.kv_b_proj.weight".into(),
            vec![heads * (p + v), l],
        ),
        ("self_attn.o_proj.weight".into(), vec![h, heads * v]),
        ("mlp.gate.weight".into(), vec![experts, h]),
        ("mlp.gate.e_score_correction_bias".into(), vec![experts]),
    ];
    let mlps = (0..experts)
        .map(|e| (format!("mlp.experts.{e}"), inter))
        .chain([("mlp.shared_experts".to_string(), shared)]);
    for (prefix, width) in mlps {
        shapes.push((format!("{prefix}.gate_proj.weight"), vec![width, h]));
        shapes.push((format!("{prefix}.up_proj.weight"), vec![width, h]));
        shapes.push((format!("{prefix}.down_proj.weight"), vec![h, width]));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .map(|(name, shape)| {
            let count: usize = shape.iter().product();
            let norm = name.ends_with("norm.weight");
            let bias = name.ends_with("correction_bias");
            let bytes = (0..count)
                .flat_map(|_| {
                    let noise: f32 = rng.random_range(-0.17..0.17);
                    let x = if norm {
                        1.0 + noise
                    } else if bias {
                        0.3 * noise
                    } else {
                        noise
                    };
                    x.to_le_bytes()
                })
                .collect();
            (format!("{layer}.{name}"), shape, bytes)
        })
        .collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            (
                name.clone(),
                TensorView::new(Dtype::F32, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join(second)).unwrap();
    let mut map = Map::new();
    let bytes = std::fs::read(dir.join(first)).unwrap();
    for name in SafeTensors::deserialize(&bytes).unwrap().names() {
        map.insert(name.to_string(), json!(first));
    }
    for (name, ..) in &tensors {
        map.insert(name.clone(), json!(second));
    }
    let index = json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

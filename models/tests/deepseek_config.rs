//! The published configs of DeepSeek-V2, DeepSeek-V2-Lite, DeepSeek-V3 and Qwen3-30B-A3B
//! (as their Hugging Face repositories give them, in `tests/fixtures/deepseek/published/`)
//! parse into the latent attention, routing and cache sizes those models have, and
//! transformers 5's spelling of the same fields (`rope_parameters`, `num_local_experts`)
//! parses alike.

use peregrine_models::config::{GroupScore, Scoring};
use peregrine_models::{Architecture, ModelConfig};
use peregrine_ops::RopeScaling;
use peregrine_testkit::fixtures;

fn published(name: &str) -> ModelConfig {
    let path = fixtures::deepseek("published").join(format!("{name}.json"));
    ModelConfig::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// YaRN's `0.1 * m * ln(factor) + 1`.
fn mscale(m: f64, factor: f64) -> f64 {
    0.1 * m * factor.ln() + 1.0
}

#[test]
fn deepseek_v2_lite() {
    let c = published("deepseek-v2-lite");
    assert_eq!(c.architecture, Architecture::DeepseekV2);
    let mla = c.mla.as_ref().unwrap();
    assert_eq!(mla.q_lora_rank, None);
    assert_eq!(
        (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.cache_width()),
        (512, 64, 576)
    );
    assert_eq!((mla.qk_nope_head_dim, mla.v_head_dim), (128, 128));
    // The reference's softmax scale: 192^-0.5 * m^2, 0.114721 for V2-Lite.
    assert!(
        (mla.softmax_scale - 0.114721).abs() < 1e-6,
        "{}",
        mla.softmax_scale
    );
    assert!(mla.rope_interleaved);
    // mscale equals mscale_all_dim, so cos and sin are not scaled.
    match c.rope_scaling {
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            attention_factor,
            ..
        } => {
            assert_eq!((factor, original_max_position_embeddings), (40.0, 4096.0));
            assert_eq!(attention_factor, 1.0);
        }
        ref other => panic!("{other:?}"),
    }
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (64, 6));
    assert_eq!(
        (moe.expert_intermediate_size, moe.shared_intermediate_size),
        (1408, 2816)
    );
    assert_eq!(
        (moe.scoring, moe.groups, moe.top_groups),
        (Scoring::Softmax, 1, 1)
    );
    assert!(!moe.normalize && !moe.score_bias);
    assert_eq!(moe.routed_scaling, 1.0);
    assert!(!moe.layers[0] && moe.layers[1..].iter().all(|&m| m));
    assert_eq!(c.intermediate_size, 10944);
    // The cache: 27 layers of 576 values a token (31,104 bytes in bf16).
    assert_eq!(c.kv_bytes_per_token(2), 31_104);
    let layout = c.kv_layout(10, 16);
    assert_eq!((layout.num_kv_heads, layout.head_dim), (1, 576));
    assert_eq!(c.mtp_layers, 0);
}

#[test]
fn deepseek_v2() {
    let c = published("deepseek-v2");
    let mla = c.mla.as_ref().unwrap();
    assert_eq!(mla.q_lora_rank, Some(1536));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.groups, moe.top_groups), (160, 8, 3));
    assert_eq!(moe.group_score, GroupScore::Max);
    assert_eq!(moe.routed_scaling, 16.0);
    assert_eq!(c.num_heads, 128);
}

#[test]
fn deepseek_v3() {
    let c = published("deepseek-v3");
    assert_eq!(c.architecture, Architecture::DeepseekV3);
    let mla = c.mla.as_ref().unwrap();
    assert_eq!(mla.q_lora_rank, Some(1536));
    let m = mscale(1.0, 40.0);
    assert!((mla.softmax_scale - 192f64.powf(-0.5) * m * m).abs() < 1e-12);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (256, 8));
    assert_eq!(
        (moe.scoring, moe.group_score),
        (Scoring::Sigmoid, GroupScore::TopTwoSum)
    );
    assert_eq!((moe.groups, moe.top_groups), (8, 4));
    assert!(moe.score_bias && moe.normalize);
    assert_eq!(moe.routed_scaling, 2.5);
    assert_eq!(moe.shared_intermediate_size, 2048);
    assert_eq!(moe.layers.iter().filter(|&&m| !m).count(), 3);
    assert!(moe.layers[3]);
    // The multi-token prediction layer after the 61 decoder layers has the mixture too.
    assert_eq!(moe.layers.len(), 62);
    assert!(moe.layers[61]);
    assert_eq!(c.mtp_layers, 1);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(0), vec![1])
    );
}

#[test]
fn qwen3_30b_a3b() {
    let c = published("qwen3-30b-a3b");
    assert_eq!(c.architecture, Architecture::Qwen3Moe);
    assert!(c.mla.is_none() && c.qk_norm);
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (32, 4, 128));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (128, 8));
    assert_eq!(moe.expert_intermediate_size, 768);
    assert_eq!(moe.shared_intermediate_size, 0);
    assert!(moe.normalize && moe.layers.iter().all(|&m| m));
    assert_eq!(c.kv_bytes_per_token(2), 2 * 48 * 4 * 128 * 2);
}

#[test]
fn transformers_5_spellings_parse_alike() {
    let fixture = |name: &str| {
        let path = fixtures::deepseek(name).join("config.json");
        ModelConfig::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let v2 = fixture("deepseek_v2");
    assert!(matches!(v2.rope_scaling, RopeScaling::Yarn { factor, .. } if factor == 4.0));
    assert_eq!(v2.rope_theta, 10000.0);
    let m = mscale(0.707, 4.0);
    let scale = v2.mla.as_ref().unwrap().softmax_scale;
    assert!((scale - 24f64.powf(-0.5) * m * m).abs() < 1e-12);
    let qwen = fixture("qwen3_moe");
    assert_eq!(qwen.moe.as_ref().unwrap().num_experts, 8);
    assert_eq!(qwen.rope_theta, 1_000_000.0);
    assert!(!qwen.moe.as_ref().unwrap().layers[0]);
}

#[test]
fn bad_routing_fields_are_refused_by_name() {
    let text =
        std::fs::read_to_string(fixtures::deepseek("published").join("deepseek-v3.json")).unwrap();
    let refused = |from: &str, to: &str| {
        let err = ModelConfig::from_json(&text.replace(from, to)).unwrap_err();
        err.to_string()
    };
    let e = refused("\"noaux_tc\"", "\"random\"");
    assert!(e.contains("topk_method") && e.contains("random"), "{e}");
    let e = refused("\"n_group\": 8", "\"n_group\": 7");
    assert!(e.contains("n_group"), "{e}");
    let e = refused("\"sigmoid\"", "\"sqrtsoftplus\"");
    assert!(e.contains("scoring_func"), "{e}");
    let e = refused("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 300");
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = refused("\"kv_lora_rank\": 512,", "");
    assert!(e.contains("kv_lora_rank"), "{e}");
}

//! Each start-up check refuses its case with the numbers, and passes the sizes that split.

use super::{llama_1b, smollm2};
use crate::tensor_parallel::{validate, RankShard, TpError, TpShape};

#[test]
fn each_bad_size_is_refused_with_its_numbers() {
    let s = smollm2();
    let cases: [(TpShape, usize, Option<usize>, TpError, &str); 8] = [
        (s, 0, None, TpError::Zero, "at least 1, not 0"),
        (
            s,
            2,
            None,
            TpError::Heads { heads: 9, size: 2 },
            "--tensor-parallel-size 2 does not divide the model's 9 attention heads",
        ),
        (
            TpShape {
                num_kv_heads: 4,
                ..s
            },
            3,
            None,
            TpError::Grouping {
                heads: 9,
                kv_heads: 4,
            },
            "9 attention heads are not a multiple of its 4 KV heads",
        ),
        (
            TpShape {
                num_heads: 24,
                num_kv_heads: 12,
                ..s
            },
            8,
            None,
            TpError::KvHeads {
                kv_heads: 12,
                size: 8,
            },
            "--tensor-parallel-size 8 does not divide the model's 12 KV heads",
        ),
        (
            TpShape {
                num_heads: 12,
                num_kv_heads: 4,
                ..s
            },
            6,
            None,
            TpError::KvReplicas {
                kv_heads: 4,
                size: 6,
            },
            "--tensor-parallel-size 6 is not a multiple of the model's 4 KV heads",
        ),
        (
            TpShape {
                intermediate_size: 1000,
                ..s
            },
            3,
            None,
            TpError::Intermediate {
                intermediate: 1000,
                size: 3,
            },
            "--tensor-parallel-size 3 does not divide the model's intermediate size 1000",
        ),
        (
            llama_1b(),
            4,
            Some(2),
            TpError::Gpus { size: 4, gpus: 2 },
            "--tensor-parallel-size 4 needs 4 GPUs; 2 found",
        ),
        (
            llama_1b(),
            8,
            Some(0),
            TpError::Gpus { size: 8, gpus: 0 },
            "needs 8 GPUs; 0 found",
        ),
    ];
    for (shape, size, gpus, want, text) in cases {
        let got = validate(&shape, size, gpus).unwrap_err();
        assert_eq!(got, want, "{shape:?} over {size}");
        assert!(got.to_string().contains(text), "{got}");
    }
}

#[test]
fn sizes_that_split_pass_and_ranks_past_the_group_are_refused() {
    let ok = [
        (smollm2(), 1, Some(1)),
        (smollm2(), 3, Some(3)),
        (llama_1b(), 2, Some(8)),
        (llama_1b(), 8, Some(8)),
        (llama_1b(), 16, None),
        (llama_1b(), 32, None),
    ];
    for (shape, size, gpus) in ok {
        assert_eq!(
            validate(&shape, size, gpus),
            Ok(()),
            "{shape:?} over {size}"
        );
    }
    // 64 ranks: more than the 32 query heads.
    assert_eq!(
        validate(&llama_1b(), 64, None),
        Err(TpError::Heads {
            heads: 32,
            size: 64
        })
    );
    assert_eq!(
        RankShard::new(smollm2(), 3, 3),
        Err(TpError::Rank { rank: 3, size: 3 })
    );
}

#[test]
fn latent_attention_and_experts_are_not_sharded() {
    let dense = crate::ModelConfig::from_json(
        r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 128}"#,
    )
    .unwrap();
    let shape = TpShape::of(&dense).unwrap();
    assert_eq!(
        (
            shape.num_heads,
            shape.num_kv_heads,
            shape.head_dim,
            shape.vocab_size
        ),
        (4, 2, 16, 100)
    );
    let moe = crate::ModelConfig::from_json(
        r#"{"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 100, "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 128, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32}"#,
    )
    .unwrap();
    assert_eq!(
        TpShape::of(&moe),
        Err(TpError::Unsupported("a mixture of experts"))
    );
}

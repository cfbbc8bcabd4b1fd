//! Every rank's shard of every weight, put back together (concatenated along the split
//! axis, replicated KV heads taken once), is the full weight; a replicated KV head is the
//! one its rank's query heads read; the vocabulary padding is zeros.

use super::{llama_1b, random, smollm2};
use crate::tensor_parallel::{cut, LlamaWeight, RankShard, TpShape};

/// The vocabulary tables are checked this wide: their cut is by rows, the same at any
/// width, and at the real width Llama's table would take a gigabyte.
const VOCAB_WIDTH: usize = 8;

/// Rows `from..from + len` of each row-major shard (`cols` wide), concatenated.
fn rows_of(shards: &[&[f64]], cols: usize, from: usize, len: usize) -> Vec<f64> {
    shards
        .iter()
        .flat_map(|s| s[from * cols..(from + len) * cols].iter().copied())
        .collect()
}

/// The row-major shards (each `rows` rows of `width`) side by side.
fn side_by_side(shards: &[Vec<f64>], rows: usize, width: usize) -> Vec<f64> {
    (0..rows)
        .flat_map(|r| {
            shards
                .iter()
                .flat_map(move |s| s[r * width..(r + 1) * width].iter().copied())
        })
        .collect()
}

/// Checks `weight` over `size` ranks of `shape`; `seed` draws the full weight.
fn check(shape: TpShape, size: usize, weight: LlamaWeight, seed: u64) {
    let [rows, cols] = match weight.shape(&shape) {
        [v, _] if matches!(weight, LlamaWeight::EmbedTokens | LlamaWeight::LmHead) => {
            [v, VOCAB_WIDTH]
        }
        s => s,
    };
    let full = random(seed, rows * cols);
    let ranks = RankShard::all(shape, size).unwrap();
    let shards: Vec<Vec<f64>> = ranks
        .iter()
        .map(|r| cut(&full, rows, cols, &r.cut_of(weight)))
        .collect();
    let d = shape.head_dim;
    let (hp, i) = (shape.num_heads / size, shape.intermediate_size / size);
    // KV heads per rank, and how many ranks hold each.
    let (kvp, replicas) = match shape.num_kv_heads >= size {
        true => (shape.num_kv_heads / size, 1),
        false => (1, size / shape.num_kv_heads),
    };
    // A replicated KV head is taken from the first rank of those holding it, after
    // checking the others hold the same.
    let distinct = |from: usize, len: usize| -> Vec<f64> {
        let parts: Vec<Vec<f64>> = shards
            .iter()
            .map(|s| s[from * cols..(from + len) * cols].to_vec())
            .collect();
        for (r, p) in parts.iter().enumerate() {
            assert_eq!(
                p,
                &parts[r - r % replicas],
                "rank {r}'s replica of its KV head"
            );
        }
        parts.iter().step_by(replicas).flatten().copied().collect()
    };
    let all: Vec<&[f64]> = shards.iter().map(|s| &s[..]).collect();
    let whole = match weight {
        LlamaWeight::QProj => rows_of(&all, cols, 0, hp * d),
        LlamaWeight::KProj | LlamaWeight::VProj => distinct(0, kvp * d),
        LlamaWeight::Qkv => [
            rows_of(&all, cols, 0, hp * d),
            distinct(hp * d, kvp * d),
            distinct((hp + kvp) * d, kvp * d),
        ]
        .concat(),
        LlamaWeight::GateProj | LlamaWeight::UpProj => rows_of(&all, cols, 0, i),
        LlamaWeight::GateUp => [rows_of(&all, cols, 0, i), rows_of(&all, cols, i, i)].concat(),
        LlamaWeight::OProj => side_by_side(&shards, rows, hp * d),
        LlamaWeight::DownProj => side_by_side(&shards, rows, i),
        LlamaWeight::EmbedTokens | LlamaWeight::LmHead => {
            let per = rows.div_ceil(size);
            let mut joined: Vec<f64> = shards.concat();
            assert_eq!(joined.len(), per * size * cols, "equal padded shards");
            let padding = joined.split_off(rows * cols);
            assert!(padding.iter().all(|&x| x == 0.0), "the padding is zeros");
            joined
        }
        LlamaWeight::Norm => {
            assert!(shards.iter().all(|s| s == &full), "replicated");
            full.clone()
        }
    };
    assert!(whole == full, "{weight:?} of {shape:?} over {size} ranks");
}

/// Each rank's KV heads are those its query heads read in the full model.
fn check_grouping(shape: TpShape, size: usize) {
    let group = shape.num_heads / shape.num_kv_heads;
    for r in RankShard::all(shape, size).unwrap() {
        let kv = r.kv_heads();
        let local_group = r.q_heads().len() / kv.len();
        for (local, q) in r.q_heads().enumerate() {
            assert_eq!(
                kv.start + local / local_group,
                q / group,
                "{r:?}, query head {q}"
            );
        }
        assert_eq!(r.kv_replicas() * shape.num_kv_heads.min(size), size);
    }
}

const WEIGHTS: [LlamaWeight; 12] = [
    LlamaWeight::QProj,
    LlamaWeight::KProj,
    LlamaWeight::VProj,
    LlamaWeight::Qkv,
    LlamaWeight::OProj,
    LlamaWeight::GateProj,
    LlamaWeight::UpProj,
    LlamaWeight::GateUp,
    LlamaWeight::DownProj,
    LlamaWeight::EmbedTokens,
    LlamaWeight::LmHead,
    LlamaWeight::Norm,
];

fn check_all(shape: TpShape, size: usize, seed: u64) {
    check_grouping(shape, size);
    for (n, w) in WEIGHTS.into_iter().enumerate() {
        check(shape, size, w, seed * 100 + n as u64);
    }
}

#[test]
fn smollm2_shards_over_three_ranks_reassemble() {
    check_all(smollm2(), 3, 1);
    assert!(
        RankShard::all(smollm2(), 2).is_err(),
        "9 heads over 2 ranks"
    );
}

#[test]
fn llama_1b_shards_over_2_4_8_and_16_ranks_reassemble() {
    for (seed, size) in [2, 4, 8, 16].into_iter().enumerate() {
        check_all(llama_1b(), size, seed as u64 + 10);
    }
}

#[test]
fn small_random_shapes_reassemble() {
    // 6 heads, 3 or 6 KV heads over 1, 3 and 6 ranks; a vocabulary 3 and 6 do not divide.
    let shape = |kv| TpShape {
        num_heads: 6,
        num_kv_heads: kv,
        head_dim: 4,
        hidden_size: 10,
        intermediate_size: 18,
        vocab_size: 29,
    };
    for (seed, (kv, size)) in [(3, 1), (3, 3), (3, 6), (6, 3), (6, 6), (1, 2), (2, 6)]
        .into_iter()
        .enumerate()
    {
        check_all(shape(kv), size, seed as u64 + 20);
    }
}

#[test]
fn checkpoint_names_map_to_their_weights() {
    let cases = [
        (
            "model.layers.0.self_attn.q_proj.weight",
            Some(LlamaWeight::QProj),
        ),
        (
            "model.layers.11.self_attn.k_proj.bias",
            Some(LlamaWeight::KProj),
        ),
        (
            "model.layers.2.mlp.down_proj.weight",
            Some(LlamaWeight::DownProj),
        ),
        ("model.embed_tokens.weight", Some(LlamaWeight::EmbedTokens)),
        ("lm_head.weight", Some(LlamaWeight::LmHead)),
        ("model.norm.weight", Some(LlamaWeight::Norm)),
        (
            "model.layers.0.self_attn.q_norm.weight",
            Some(LlamaWeight::Norm),
        ),
        ("model.layers.0.mlp.experts.0.w1", None),
        ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", None),
    ];
    for (name, want) in cases {
        assert_eq!(LlamaWeight::from_name(name), want, "{name}");
    }
}

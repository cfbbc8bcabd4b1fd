//! The converted weights match the source's within each type's quantization error, and
//! give the source model's logits (converted, and run as stored); tied embeddings and
//! linear RoPE scaling carry over.

use crate::gguf_writer::{self as gw, Meta};
use crate::tiny_gguf::{convert, gguf_of, gguf_with, import, mixed_type, q8_matrices, read_json};
use peregrine_models::gguf::convert_gguf;
use peregrine_models::LlamaModel;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use peregrine_testkit::reference::logits_f64;
use peregrine_testkit::tiny_model::{TinyModel, TinySpec};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::Path;

/// The engine's logits (CPU) at every position of `tokens`, run as one prefill.
fn engine_logits(dir: &Path, tokens: &[u32]) -> Vec<Vec<f64>> {
    const BLOCK: usize = 16;
    let model = LlamaModel::load(dir).unwrap();
    let blocks: Vec<u32> = (0..tokens.len().div_ceil(BLOCK) as u32).collect();
    let mut cache = KvCache::new(
        model.config().num_layers,
        model.kv_layout(blocks.len() as u64, BLOCK as u64),
    );
    let spec = SeqSpec {
        num_cached: 0,
        num_new: tokens.len(),
        block_table: &blocks,
    };
    let plan = AttentionPlan::new(&[spec], BLOCK, blocks.len() as u64).unwrap();
    let rows: Vec<usize> = (0..tokens.len()).collect();
    let logits = model.forward(tokens, &plan, &mut cache, &rows).unwrap();
    logits
        .chunks(model.config().vocab_size)
        .map(|row| row.iter().map(|&v| f64::from(v)).collect())
        .collect()
}

/// Every tensor of a converted model.safetensors: dtype and values widened to f32.
fn read_converted(dir: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = view.data();
            let values = match view.dtype() {
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                Dtype::F16 => data
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                Dtype::BF16 => data
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                other => panic!("{name} is stored as {other:?}"),
            };
            (name, (view.dtype(), view.shape().to_vec(), values))
        })
        .collect()
}

/// The largest error ggml type `ty` may put on each element of a 32-element block `x` (the
/// encoders' rounding, plus f16 rounding of the block's scale and minimum).
fn block_tolerance(ty: u32, x: &[f32]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let f16_rel = 1.0 / 1024.0; // f16 keeps 11 significant bits: relative error <= 2^-11, doubled
    match ty {
        // half a step of amax / 127, and up to 127 steps of a scale off by f16 rounding
        gw::Q8_0 => amax / 127.0 * 0.5 + amax * f16_rel,
        // codes span -8..7 steps of amax / 8: the far end of the other sign clips by one step
        gw::Q4_0 => amax / 8.0 * (1.0 + 8.0 * f16_rel),
        // half a step of (max - min) / 15, and the f16 rounding of the scale and the minimum
        gw::Q4_1 => (hi - lo) / 15.0 * (0.5 + 15.0 * f16_rel) + lo.abs() * f16_rel,
        other => panic!("no block tolerance for type {other}"),
    }
}

#[test]
fn tensors_match_the_source_within_quantization_error() {
    let model = TinyModel::random(TinySpec::llama_tiny(), 7);
    let dir = tempfile::tempdir().unwrap();
    let out = convert(dir.path(), &gguf_of(&model, mixed_type));
    let converted = read_converted(&out);
    assert_eq!(converted.len(), model.tensors.len());

    for (name, (shape, src)) in &model.tensors {
        let ty = mixed_type(name);
        let (dtype, got_shape, got) = &converted[name];
        assert_eq!(got_shape, shape, "{name}");
        let want_dtype = match ty {
            gw::F16 => Dtype::F16,
            gw::BF16 => Dtype::BF16,
            _ => Dtype::F32,
        };
        assert_eq!(*dtype, want_dtype, "{name}");
        let mut worst_allowed = 0f32;
        for (b, (x, y)) in src.chunks(32).zip(got.chunks(32)).enumerate() {
            for (i, (a, g)) in x.iter().zip(y).enumerate() {
                match ty {
                    gw::F32 => assert_eq!(a.to_bits(), g.to_bits(), "{name}[{}]", b * 32 + i),
                    gw::F16 => assert_eq!(*g, half::f16::from_f32(*a).to_f32(), "{name}"),
                    gw::BF16 => assert_eq!(*g, half::bf16::from_f32(*a).to_f32(), "{name}"),
                    q => {
                        let tol = block_tolerance(q, x);
                        worst_allowed = worst_allowed.max(tol);
                        assert!(
                            (a - g).abs() <= tol,
                            "{name}[{}]: {g} vs {a} (tol {tol})",
                            b * 32 + i
                        );
                    }
                }
            }
        }
        // The check has teeth: the still-permuted tensor is far from the source.
        if name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight") {
            let heads = if name.contains("q_proj") {
                model.spec.num_heads
            } else {
                model.spec.num_kv_heads
            };
            let permuted = gw::llama_cpp_permute(src, shape[0], heads);
            let far = permuted
                .iter()
                .zip(src)
                .map(|(p, s)| (p - s).abs())
                .fold(0f32, f32::max);
            assert!(
                far > 10.0 * worst_allowed.max(1e-3),
                "{name}: permutation is invisible"
            );
        }
    }

    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    let spec = &model.spec;
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");
    assert_eq!(config["model_type"], "llama");
    for (key, want) in [
        ("vocab_size", spec.vocab_size),
        ("hidden_size", spec.hidden_size),
        ("intermediate_size", spec.intermediate_size),
        ("num_hidden_layers", spec.num_layers),
        ("num_attention_heads", spec.num_heads),
        ("num_key_value_heads", spec.num_kv_heads),
        ("head_dim", spec.head_dim),
        ("max_position_embeddings", spec.max_position_embeddings),
        ("bos_token_id", 1),
        ("eos_token_id", 2),
    ] {
        assert_eq!(config[key].as_u64(), Some(want as u64), "{key}");
    }
    assert_eq!(config["rms_norm_eps"].as_f64(), Some(spec.rms_norm_eps));
    assert_eq!(config["rope_theta"].as_f64(), Some(spec.rope_theta));
    assert_eq!(config["tie_word_embeddings"], false);
    assert_eq!(config["torch_dtype"], "float32");
    assert!(config.get("rope_scaling").is_none());
}

/// How far logits `b` are from `a`: largest |a - b|, RMS of a - b, RMS of `a`, and at how
/// many positions the argmax agrees.
struct LogitGap {
    max_diff: f64,
    rms_diff: f64,
    rms: f64,
    argmax_agree: usize,
}

fn logit_gap(a: &[Vec<f64>], b: &[Vec<f64>]) -> LogitGap {
    let argmax = |row: &[f64]| (0..row.len()).max_by(|&i, &j| row[i].total_cmp(&row[j]));
    let (mut max_diff, mut sq_diff, mut sq, mut n, mut argmax_agree) = (0f64, 0f64, 0f64, 0f64, 0);
    for (ra, rb) in a.iter().zip(b) {
        for (x, y) in ra.iter().zip(rb) {
            max_diff = max_diff.max((x - y).abs());
            sq_diff += (x - y) * (x - y);
            sq += x * x;
            n += 1.0;
        }
        argmax_agree += usize::from(argmax(ra) == argmax(rb));
    }
    LogitGap {
        max_diff,
        rms_diff: (sq_diff / n).sqrt(),
        rms: (sq / n).sqrt(),
        argmax_agree,
    }
}

/// Tolerances. A Q8_0 weight is off by at most half a step of amax / 127, uniformly, so its
/// RMS error is about amax / 440 against an RMS of amax / sqrt(3) for these uniform weights:
/// 0.4% relative. Each token's logits pass through ~8 quantized matrices per layer plus the
/// embedding and lm_head; independent errors add in quadrature to ~1.5% of the logits' RMS,
/// and the largest of 24 x 300 deviations is ~4 sigma: 6%. Q4_0 / Q4_1 steps are amax / 8
/// and range / 15: ~6.5% relative per matrix, so the mixed file (about half Q4 matrices)
/// drifts by ~20% of the RMS, ~60% at the extreme. Leaving q/k permuted gives the Q8_0 file
/// a largest deviation of ~30% of the RMS, so the Q8_0 bound also catches a wrong
/// permutation (tiny random attention is nearly uniform, so the effect is mild).
const Q8_MAX_DIFF: f64 = 0.08;
const MIXED_RMS_DIFF: f64 = 0.25;
const MIXED_MAX_DIFF: f64 = 0.6;
/// How far the activations' 8-bit rounding may move the logits, relative to their RMS.
const ACTIVATION_ROUNDING: f64 = 0.03;

#[test]
fn converted_logits_match_the_source_model() {
    let model = TinyModel::random(TinySpec::llama_tiny(), 11);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model.write_hf(&src);
    let vocab = model.spec.vocab_size as u32;
    let tokens: Vec<u32> = (0..24u32).map(|i| (i * 37 + 5) % vocab).collect();
    let want = logits_f64(&src, &tokens);
    let n = tokens.len();

    let q8 = tempfile::tempdir().unwrap();
    let gap = logit_gap(
        &want,
        &logits_f64(&convert(q8.path(), &gguf_of(&model, q8_matrices)), &tokens),
    );
    assert!(
        gap.max_diff <= Q8_MAX_DIFF * gap.rms,
        "Q8_0: max |diff| {} vs RMS {}",
        gap.max_diff,
        gap.rms
    );
    assert!(
        gap.argmax_agree * 10 >= n * 9,
        "Q8_0: argmax agrees at {}/{n}",
        gap.argmax_agree
    );

    let mixed = tempfile::tempdir().unwrap();
    let gap = logit_gap(
        &want,
        &logits_f64(
            &convert(mixed.path(), &gguf_of(&model, mixed_type)),
            &tokens,
        ),
    );
    assert!(
        gap.rms_diff <= MIXED_RMS_DIFF * gap.rms,
        "mixed: RMS diff {} vs RMS {}",
        gap.rms_diff,
        gap.rms
    );
    assert!(
        gap.max_diff <= MIXED_MAX_DIFF * gap.rms,
        "mixed: max |diff| {} vs RMS {}",
        gap.max_diff,
        gap.rms
    );
    assert!(
        gap.argmax_agree * 3 >= n * 2,
        "mixed: argmax agrees at {}/{n}",
        gap.argmax_agree
    );

    // The same files run as they are stored: the products read the blocks and round the
    // activations to 8 bits per 32 values, as llama.cpp does. Against the source they keep
    // the bounds above; against the dequantized conversion they differ by that rounding
    // alone (about 0.2% of a value per matrix, ~1% of the logits' RMS through the model).
    for (name, type_of, rms_bound, max_bound) in [
        (
            "Q8_0",
            q8_matrices as fn(&str) -> u32,
            Q8_MAX_DIFF,
            Q8_MAX_DIFF,
        ),
        ("mixed", mixed_type, MIXED_RMS_DIFF, MIXED_MAX_DIFF),
    ] {
        let files = tempfile::tempdir().unwrap();
        let w = gguf_of(&model, type_of);
        let imported = engine_logits(&import(files.path(), &w), &tokens);
        let converted = engine_logits(&convert(files.path(), &w), &tokens);
        let gap = logit_gap(&want, &imported);
        assert!(
            gap.rms_diff <= rms_bound * gap.rms && gap.max_diff <= max_bound * gap.rms,
            "{name} as stored: RMS diff {}, max {} vs RMS {}",
            gap.rms_diff,
            gap.max_diff,
            gap.rms
        );
        let rounding = logit_gap(&converted, &imported);
        eprintln!(
            "{name}: as stored vs dequantized: RMS diff {:.4} max {:.4} of RMS {:.4}",
            rounding.rms_diff, rounding.max_diff, rounding.rms
        );
        assert!(
            rounding.rms_diff <= ACTIVATION_ROUNDING * rounding.rms,
            "{name}: as stored vs dequantized: RMS diff {} vs RMS {}",
            rounding.rms_diff,
            rounding.rms
        );
    }

    let wrong = tempfile::tempdir().unwrap();
    let gap = logit_gap(
        &want,
        &logits_f64(
            &convert(wrong.path(), &gguf_with(&model, q8_matrices, false)),
            &tokens,
        ),
    );
    assert!(
        gap.max_diff > Q8_MAX_DIFF * gap.rms,
        "a wrong q/k permutation went unnoticed"
    );
}

#[test]
fn tied_embeddings_and_linear_rope_scaling() {
    let mut spec = TinySpec::llama_tiny();
    spec.tie_embeddings = true;
    let model = TinyModel::random(spec, 13);
    let mut w = gguf_of(&model, q8_matrices);
    w.meta("llama.rope.scaling.type", Meta::str("linear"))
        .meta("llama.rope.scaling.factor", Meta::F32(4.0));
    let dir = tempfile::tempdir().unwrap();
    let out = convert(dir.path(), &w);
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["tie_word_embeddings"], true);
    assert_eq!(config["rope_scaling"]["rope_type"], "linear");
    assert_eq!(config["rope_scaling"]["factor"], 4.0);
    assert!(!read_converted(&out).contains_key("lm_head.weight"));
    // An existing non-empty output folder is refused, not overwritten.
    let again = format!(
        "{:#}",
        convert_gguf(&dir.path().join("model.gguf"), &out).unwrap_err()
    );
    assert!(again.contains("not empty"), "{again}");
}

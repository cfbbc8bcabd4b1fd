//! GGUF import: a tiny random Llama written as GGUF (with llama.cpp's q/k permutation and a
//! mix of Q8_0, Q4_0, Q4_1, F16, BF16 and F32 tensors) converts back to the source weights
//! within each type's quantization error, gives the source model's logits, and carries a
//! byte-level BPE tokenizer that round-trips text exactly.

mod common;

use common::gguf_writer::{self as gw, GgufWriter, Meta};
use common::reference::logits_f64;
use common::tiny_model::{TinyModel, TinySpec};
use peregrine_models::gguf::{convert_gguf, import_gguf, GgmlType, GgufFile, Placement, Value};
use peregrine_models::tokenizer::Tokenizer;
use peregrine_models::LlamaModel;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::Path;

const CHAT_TEMPLATE: &str =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";

/// GGUF name of each Hugging Face tensor (the test's own table).
fn gguf_name(hf: &str) -> String {
    if let Some(rest) = hf.strip_prefix("model.layers.") {
        let (layer, suffix) = rest.split_once('.').unwrap();
        let short = match suffix {
            "self_attn.q_proj.weight" => "attn_q",
            "self_attn.k_proj.weight" => "attn_k",
            "self_attn.v_proj.weight" => "attn_v",
            "self_attn.o_proj.weight" => "attn_output",
            "mlp.gate_proj.weight" => "ffn_gate",
            "mlp.up_proj.weight" => "ffn_up",
            "mlp.down_proj.weight" => "ffn_down",
            "input_layernorm.weight" => "attn_norm",
            "post_attention_layernorm.weight" => "ffn_norm",
            other => panic!("no GGUF name for {other}"),
        };
        return format!("blk.{layer}.{short}.weight");
    }
    match hf {
        "model.embed_tokens.weight" => "token_embd.weight",
        "model.norm.weight" => "output_norm.weight",
        "lm_head.weight" => "output.weight",
        other => panic!("no GGUF name for {other}"),
    }
    .to_string()
}

/// The storage type of each tensor in the mixed-type file: every supported type appears,
/// permuted q/k tensors among them in quantized and float types.
fn mixed_type(hf: &str) -> u32 {
    const LAYER0: [(&str, u32); 7] = [
        ("q_proj", gw::Q4_1),
        ("k_proj", gw::Q4_0),
        ("v_proj", gw::Q8_0),
        ("o_proj", gw::Q4_1),
        ("gate_proj", gw::Q4_0),
        ("up_proj", gw::Q8_0),
        ("down_proj", gw::Q4_1),
    ];
    const LAYER1: [(&str, u32); 7] = [
        ("q_proj", gw::F16),
        ("k_proj", gw::Q8_0),
        ("v_proj", gw::Q4_0),
        ("o_proj", gw::Q8_0),
        ("gate_proj", gw::Q4_1),
        ("up_proj", gw::BF16),
        ("down_proj", gw::Q4_0),
    ];
    if hf.ends_with("norm.weight") {
        return gw::F32;
    }
    match hf {
        "model.embed_tokens.weight" => return gw::Q8_0,
        "lm_head.weight" => return gw::Q4_1,
        _ => {}
    }
    let table = if hf.starts_with("model.layers.0.") {
        LAYER0
    } else {
        LAYER1
    };
    table
        .iter()
        .find(|(part, _)| hf.contains(part))
        .map(|(_, ty)| *ty)
        .unwrap()
}

/// GPT-2's byte-to-unicode table: the character that stands for each byte in the vocab.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

/// Control tokens, one user-defined token, then the 256 byte tokens, then merge results.
const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const USER_TOKEN: &str = "<tool_call>";
const MERGES: &[(&str, &str)] = &[
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "Ġ"),
    ("ĠĠ", "ĠĠ"),
    ("Ċ", "Ċ"),
    ("e", "r"),
    ("o", "r"),
    ("Ġ", "a"),
    ("Ġa", "n"),
    ("Ġan", "d"),
    ("1", "2"),
    ("r", "e"),
    ("Ġ", "w"),
    ("Ġw", "or"),
    ("l", "d"),
    ("Ġwor", "ld"),
    ("æ", "Ĺ"),
    ("æĹ", "¥"),
    ("ĉ", "ĉ"),
    ("Ġ", "{"),
    ("Ġ", "}"),
    ("d", "e"),
    ("de", "f"),
    ("Ġ", "="),
    ("ð", "Ł"),
    ("l", "l"),
];

struct Vocab {
    tokens: Vec<String>,
    types: Vec<i32>,
    merges: Vec<String>,
}

fn test_vocab() -> Vocab {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3; SPECIALS.len()];
    tokens.push(USER_TOKEN.into());
    types.push(4);
    for c in byte_chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    for (a, b) in MERGES {
        tokens.push(format!("{a}{b}"));
        types.push(1);
    }
    let merges = MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    Vocab {
        tokens,
        types,
        merges,
    }
}

/// The tiny model as GGUF: llama metadata, a byte-level BPE tokenizer, and each tensor stored
/// as `type_of(hf_name)` with q/k permuted as llama.cpp does.
fn gguf_of(model: &TinyModel, type_of: impl Fn(&str) -> u32) -> GgufWriter {
    gguf_with(model, type_of, true)
}

/// [`gguf_of`], optionally leaving q/k unpermuted (a file the importer will scramble).
fn gguf_with(model: &TinyModel, type_of: impl Fn(&str) -> u32, permute: bool) -> GgufWriter {
    let s = &model.spec;
    let mut w = GgufWriter::default();
    let u32m = |v: usize| Meta::U32(v as u32);
    w.meta("general.architecture", Meta::str("llama"))
        .meta("general.name", Meta::str("tiny"))
        .meta("llama.block_count", u32m(s.num_layers))
        .meta("llama.context_length", u32m(s.max_position_embeddings))
        .meta("llama.embedding_length", u32m(s.hidden_size))
        .meta("llama.feed_forward_length", u32m(s.intermediate_size))
        .meta("llama.attention.head_count", u32m(s.num_heads))
        .meta("llama.attention.head_count_kv", u32m(s.num_kv_heads))
        .meta("llama.attention.key_length", u32m(s.head_dim))
        .meta("llama.rope.dimension_count", u32m(s.head_dim))
        .meta("llama.rope.freq_base", Meta::F32(s.rope_theta as f32))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            Meta::F32(s.rms_norm_eps as f32),
        )
        .meta("llama.vocab_size", u32m(s.vocab_size));
    let v = test_vocab();
    w.meta("tokenizer.ggml.model", Meta::str("gpt2"))
        .meta("tokenizer.ggml.pre", Meta::str("smollm"))
        .meta("tokenizer.ggml.tokens", Meta::strs(&v.tokens))
        .meta(
            "tokenizer.ggml.token_type",
            Meta::Array(v.types.iter().map(|&t| Meta::I32(t)).collect()),
        )
        .meta("tokenizer.ggml.merges", Meta::strs(&v.merges))
        .meta("tokenizer.ggml.bos_token_id", Meta::U32(1))
        .meta("tokenizer.ggml.eos_token_id", Meta::U32(2))
        .meta("tokenizer.ggml.add_bos_token", Meta::Bool(false))
        .meta("tokenizer.chat_template", Meta::str(CHAT_TEMPLATE));
    for (name, (shape, values)) in &model.tensors {
        let heads = if name.ends_with("q_proj.weight") {
            Some(s.num_heads)
        } else if name.ends_with("k_proj.weight") {
            Some(s.num_kv_heads)
        } else {
            None
        };
        let stored = match heads.filter(|_| permute) {
            Some(h) => gw::llama_cpp_permute(values, shape[0], h),
            None => values.clone(),
        };
        w.tensor_f32(&gguf_name(name), shape, type_of(name), &stored);
    }
    w
}

/// Writes `w` and converts it; returns the converted folder.
fn convert(dir: &Path, w: &GgufWriter) -> std::path::PathBuf {
    let gguf = dir.join("model.gguf");
    w.write(&gguf);
    let out = dir.join("hf");
    convert_gguf(&gguf, &out).unwrap();
    out
}

/// Writes `w` and imports it with its weights kept in the GGUF file; returns the folder.
fn import(dir: &Path, w: &GgufWriter) -> std::path::PathBuf {
    let gguf = dir.join("model.gguf");
    w.write(&gguf);
    let out = dir.join("imported");
    import_gguf(&gguf, &out, Placement::Link).unwrap();
    out
}

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

fn q8_matrices(hf: &str) -> u32 {
    if hf.ends_with("norm.weight") {
        gw::F32
    } else {
        gw::Q8_0
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

/// Texts the tokenizer must give back byte for byte.
const ROUND_TRIP: &[&str] = &[
    "Hello, world! The answer is 12345.\n",
    "def f(x):\n    return {'a': [1, 2]}\n\n\tif x == 3:\n\t\tpass\n",
    "日本語のテキスト、中文字符 and 한국어 — naïve café",
    "emoji 😀👍🏽🇺🇸 mixed\u{200b}zero width",
    "   leading and trailing spaces   ",
    "tabs\t\tand\r\nnewlines\n\n\n  \n",
    "I'm sure they'll say it's fine, don't",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<tool_call>{}",
    "",
];

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Converts the tiny model with tokenizer pre-split `pre` and `add_bos` (None: key absent).
fn convert_with_tokenizer(dir: &Path, pre: &str, add_bos: Option<bool>) -> std::path::PathBuf {
    let model = TinyModel::random(TinySpec::llama_tiny(), 3);
    let mut w = gguf_of(&model, q8_matrices);
    w.meta("tokenizer.ggml.pre", Meta::str(pre));
    match add_bos {
        Some(b) => w.meta("tokenizer.ggml.add_bos_token", Meta::Bool(b)),
        None => w.remove_meta("tokenizer.ggml.add_bos_token"),
    };
    convert(dir, &w)
}

#[test]
fn tokenizer_round_trips_text_and_keeps_special_tokens() {
    // (pre-split, add_bos key, BOS expected, "12" splits into digits)
    let cases = [
        ("gpt2", Some(true), true, false),
        ("smollm", Some(false), false, true),
        ("llama-bpe", None, true, false),
    ];
    for (pre, add_bos, bos_expected, digits_split) in cases {
        let dir = tempfile::tempdir().unwrap();
        let out = convert_with_tokenizer(dir.path(), pre, add_bos);
        let tok = Tokenizer::from_dir(&out).unwrap();
        for text in ROUND_TRIP {
            let ids = tok.encode(text, false).unwrap();
            assert_eq!(
                tok.decode(&ids, false).unwrap(),
                *text,
                "{pre}: {text:?} -> {ids:?}"
            );
        }
        for (id, special) in SPECIALS.iter().enumerate() {
            assert_eq!(
                tok.encode(special, false).unwrap(),
                vec![id as u32],
                "{pre}: {special}"
            );
        }
        assert_eq!(tok.encode(USER_TOKEN, false).unwrap(), vec![3], "{pre}");
        let chat = tok
            .encode("<|im_start|>user\nhi<|im_end|><tool_call>", false)
            .unwrap();
        assert_eq!((chat[0], chat[chat.len() - 2]), (1, 2), "{pre}: {chat:?}");
        // Control tokens are special, user-defined ones are not.
        assert_eq!(
            tok.decode(&chat, true).unwrap(),
            "user\nhi<tool_call>",
            "{pre}"
        );
        assert_eq!(
            tok.encode("12", false).unwrap().len(),
            if digits_split { 2 } else { 1 },
            "{pre}"
        );

        let plain = tok.encode("the world", false).unwrap();
        let with_specials = tok.encode("the world", true).unwrap();
        let bos_added = [&[1][..], &plain].concat();
        assert_eq!(
            with_specials,
            if bos_expected { bos_added } else { plain },
            "{pre}"
        );
        // BOS comes from tokenizer.json's own post-processor, not only from the config.
        let post = &read_json(&out.join("tokenizer.json"))["post_processor"];
        assert_eq!(
            post.to_string().contains("TemplateProcessing"),
            bos_expected,
            "{pre}: {post}"
        );

        let config = read_json(&out.join("tokenizer_config.json"));
        assert_eq!(config["chat_template"], CHAT_TEMPLATE, "{pre}");
        assert_eq!(config["bos_token"], "<|im_start|>", "{pre}");
        assert_eq!(config["eos_token"], "<|im_end|>", "{pre}");
        assert_eq!(config["add_bos_token"], bos_expected, "{pre}");
        assert_eq!(config["add_eos_token"], false, "{pre}");
        assert_eq!(config["model_max_length"], 4096, "{pre}");
    }
}

/// Converting `w` fails with an error that mentions every one of `needles`, and leaves no
/// output folder (finished or partial) behind.
fn assert_conversion_fails(w: &GgufWriter, needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("model.gguf");
    w.write(&gguf);
    let out = dir.path().join("hf");
    let err = format!("{:#}", convert_gguf(&gguf, &out).unwrap_err());
    for needle in needles {
        assert!(
            err.contains(needle),
            "error {err:?} does not mention {needle:?}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("model.gguf")], "{err}");
}

#[test]
fn unsupported_inputs_are_named_in_the_error() {
    let model = TinyModel::random(TinySpec::llama_tiny(), 5);
    let base = || gguf_of(&model, q8_matrices);

    // A type Peregrine does not read: [64, 128] is 8192 elements, 32 Q2_K blocks of 84
    // bytes.
    let mut w = base();
    w.remove_tensor("blk.1.ffn_down.weight").tensor(
        "blk.1.ffn_down.weight",
        &[64, 128],
        gw::Q2_K,
        vec![0; 32 * 84],
    );
    assert_conversion_fails(&w, &["blk.1.ffn_down.weight", "Q2_K"]);

    let mut w = base();
    w.meta("tokenizer.ggml.model", Meta::str("llama"));
    assert_conversion_fails(&w, &["tokenizer model 'llama'"]);
    let mut w = base();
    w.meta("tokenizer.ggml.pre", Meta::str("qwen2"));
    assert_conversion_fails(&w, &["'qwen2'"]);
    let mut w = base();
    w.meta("general.architecture", Meta::str("gemma2"));
    assert_conversion_fails(&w, &["architecture 'gemma2'"]);
    let mut w = base();
    w.meta("llama.rope.scaling.type", Meta::str("yarn"));
    assert_conversion_fails(&w, &["'yarn'"]);
    let mut w = base();
    w.remove_tensor("blk.1.attn_v.weight");
    assert_conversion_fails(&w, &["blk.1.attn_v.weight"]);
    let mut w = base();
    w.tensor_f32("rope_freqs.weight", &[8], gw::F32, &[1.0; 8]);
    assert_conversion_fails(&w, &["rope_freqs.weight"]);
    let mut w = base();
    w.meta("llama.embedding_length", Meta::U32(32));
    assert_conversion_fails(&w, &["token_embd.weight", "shape"]);
    let mut w = base();
    w.remove_meta("llama.block_count");
    assert_conversion_fails(&w, &["llama.block_count"]);
    let mut w = base();
    w.meta("tokenizer.ggml.add_bos_token", Meta::Bool(true))
        .remove_meta("tokenizer.ggml.bos_token_id");
    assert_conversion_fails(&w, &["tokenizer.ggml.bos_token_id"]);
    let mut w = base();
    w.meta("llama.context_length", Meta::str("long"));
    assert_conversion_fails(&w, &["llama.context_length", "string"]);
}

#[test]
fn truncated_files_say_what_was_being_read() {
    let model = TinyModel::random(TinySpec::llama_tiny(), 5);
    let bytes = gguf_of(&model, q8_matrices).to_bytes();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    let open_err = |len: usize| {
        std::fs::write(&path, &bytes[..len]).unwrap();
        format!(
            "{:#}",
            GgufFile::open(&path).err().expect("truncated file opened")
        )
    };
    assert!(open_err(20).contains("metadata count"), "{}", open_err(20));
    let in_tokens = open_err(2000);
    assert!(
        in_tokens.contains("truncated") && in_tokens.contains("tokenizer.ggml.tokens"),
        "{in_tokens}"
    );
    let name = b"blk.0.attn_q.weight";
    let info_at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let in_info = open_err(info_at + 2);
    assert!(
        in_info.contains("'blk.0.attn_q.weight'") && in_info.contains("dimension count"),
        "{in_info}"
    );
    // The last tensor of the file (in name order) is output_norm.weight.
    let in_data = open_err(bytes.len() - 100);
    assert!(
        in_data.contains("truncated") && in_data.contains("output_norm.weight"),
        "{in_data}"
    );
}

#[test]
fn reads_every_metadata_type_in_v2_with_custom_alignment() {
    let all = [
        ("t.u8", Meta::U8(200), Value::U8(200)),
        ("t.i8", Meta::I8(-5), Value::I8(-5)),
        ("t.u16", Meta::U16(60000), Value::U16(60000)),
        ("t.i16", Meta::I16(-300), Value::I16(-300)),
        ("t.u32", Meta::U32(7), Value::U32(7)),
        ("t.i32", Meta::I32(-7), Value::I32(-7)),
        ("t.u64", Meta::U64(1 << 40), Value::U64(1 << 40)),
        ("t.i64", Meta::I64(-(1 << 40)), Value::I64(-(1 << 40))),
        ("t.f32", Meta::F32(0.25), Value::F32(0.25)),
        ("t.f64", Meta::F64(-1e300), Value::F64(-1e300)),
        ("t.bool", Meta::Bool(true), Value::Bool(true)),
        (
            "t.str",
            Meta::str("ünïcode ✓"),
            Value::String("ünïcode ✓".into()),
        ),
        (
            "t.nested",
            Meta::Array(vec![
                Meta::Array(vec![Meta::I16(1), Meta::I16(2)]),
                Meta::Array(vec![]),
            ]),
            Value::Array(vec![
                Value::Array(vec![Value::I16(1), Value::I16(2)]),
                Value::Array(vec![]),
            ]),
        ),
    ];
    let model = TinyModel::random(TinySpec::llama_tiny(), 9);
    let mut w = gguf_of(&model, mixed_type);
    w.version = 2;
    w.alignment = 64;
    for (key, meta, _) in &all {
        w.meta(key, meta.clone());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.gguf");
    w.write(&path);
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.version(), 2);
    for (key, _, value) in &all {
        assert_eq!(file.get(key), Some(value), "{key}");
    }
    let q = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dims, vec![64, 64]);
    assert_eq!(q.ggml_type, GgmlType::Q4_1);
    assert_eq!(q.offset % 64, 0);
    assert_eq!(q.n_bytes, Some(64 * 64 / 32 * 20));
    let norm = file.tensor("output_norm.weight").unwrap();
    let values =
        peregrine_models::gguf::dequantize(norm.ggml_type, file.tensor_bytes(norm).unwrap())
            .unwrap();
    assert_eq!(values, model.tensors["model.norm.weight"].1);
    convert(dir.path(), &w);
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

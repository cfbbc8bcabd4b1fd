//! The tiny random Llama as GGUF, as the tests write it: the tests' own table of GGUF
//! tensor names, the storage type of each tensor, llama metadata and a byte-level BPE
//! tokenizer; and converting or importing such a file.

use crate::gguf_writer::{self as gw, GgufWriter, Meta};
use peregrine_models::gguf::{convert_gguf, import_gguf, Placement};
use peregrine_testkit::tiny_model::TinyModel;
use std::path::Path;

/// The chat template the file carries.
pub const CHAT_TEMPLATE: &str =
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
pub fn mixed_type(hf: &str) -> u32 {
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
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
pub const USER_TOKEN: &str = "<tool_call>";
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
pub fn gguf_of(model: &TinyModel, type_of: impl Fn(&str) -> u32) -> GgufWriter {
    gguf_with(model, type_of, true)
}

/// [`gguf_of`], optionally leaving q/k unpermuted (a file the importer will scramble).
pub fn gguf_with(model: &TinyModel, type_of: impl Fn(&str) -> u32, permute: bool) -> GgufWriter {
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
pub fn convert(dir: &Path, w: &GgufWriter) -> std::path::PathBuf {
    let gguf = dir.join("model.gguf");
    w.write(&gguf);
    let out = dir.join("hf");
    convert_gguf(&gguf, &out).unwrap();
    out
}

/// Writes `w` and imports it with its weights kept in the GGUF file; returns the folder.
pub fn import(dir: &Path, w: &GgufWriter) -> std::path::PathBuf {
    let gguf = dir.join("model.gguf");
    w.write(&gguf);
    let out = dir.join("imported");
    import_gguf(&gguf, &out, Placement::Link).unwrap();
    out
}

/// Q8_0 matrices and float32 norms.
pub fn q8_matrices(hf: &str) -> u32 {
    if hf.ends_with("norm.weight") {
        gw::F32
    } else {
        gw::Q8_0
    }
}

/// A JSON file of the converted folder.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

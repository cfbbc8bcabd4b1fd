//! Reading GGUF files: every metadata type of version 2 with a custom alignment, and
//! unsupported or truncated files refused with errors that say what was being read.

use crate::gguf_writer::{self as gw, GgufWriter, Meta};
use crate::tiny_gguf::{convert, gguf_of, mixed_type, q8_matrices};
use peregrine_models::gguf::{convert_gguf, GgmlType, GgufFile, Value};
use peregrine_testkit::tiny_model::{TinyModel, TinySpec};

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

//! The converted byte-level BPE tokenizer round-trips text exactly, keeps the special
//! tokens, and adds BOS as the file says.

use crate::gguf_writer::Meta;
use crate::tiny_gguf::{
    convert, gguf_of, q8_matrices, read_json, CHAT_TEMPLATE, SPECIALS, USER_TOKEN,
};
use peregrine_models::tokenizer::Tokenizer;
use peregrine_testkit::tiny_model::{TinyModel, TinySpec};
use std::path::Path;

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

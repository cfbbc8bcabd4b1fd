//! Random model outputs: well-formed ones in each format with the content and calls they
//! hold, and garbage stitched from markers and JSON pieces.

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;

use super::super::ToolCallFormat;

/// A generated output and what it holds.
pub(super) struct Generated {
    /// The output's text.
    pub(super) text: String,
    /// Its content.
    pub(super) content: Option<String>,
    /// Its calls: name and compact arguments.
    pub(super) calls: Vec<(String, String)>,
}

/// A random string literal (quotes included): plain and non-ASCII text, escapes, and text
/// that looks like markers or JSON.
fn string_literal(rng: &mut StdRng) -> String {
    const PIECES: &[&str] = &[
        "Paris",
        "a b",
        "é",
        "中文",
        "😀",
        "\\\"",
        "\\\\",
        "\\n",
        "\\t",
        "\\/",
        "\\u00e9",
        "\\ud83d\\ude00",
        "<tool_call>",
        "</tool_call>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "{",
        "}",
        "[",
        "]",
        ";",
        ",",
        ":",
        "<｜tool▁call▁end｜>",
        "```",
        "<|python_tag|>",
        " ",
    ];
    let mut text = String::from('"');
    for _ in 0..rng.random_range(0..5) {
        text.push_str(PIECES.choose(rng).unwrap_or(&""));
    }
    text.push('"');
    text
}

/// A random JSON number that `serde_json` reads (small exponents).
fn number(rng: &mut StdRng) -> String {
    let mut text = String::new();
    if rng.random_bool(0.3) {
        text.push('-');
    }
    match rng.random_range(0..3) {
        0 => text.push('0'),
        _ => text.push_str(&rng.random_range(1..100000u32).to_string()),
    }
    if rng.random_bool(0.3) {
        text.push_str(&format!(".{}", rng.random_range(0..1000u32)));
    }
    if rng.random_bool(0.2) {
        let sign = ["", "+", "-"].choose(rng).copied().unwrap_or("");
        text.push_str(&format!("e{sign}{}", rng.random_range(0..30u32)));
    }
    text
}

/// A random JSON value's tokens, nested at most `depth` more levels.
fn value(rng: &mut StdRng, depth: u32, tokens: &mut Vec<String>) {
    let kinds = if depth == 0 { 5 } else { 7 };
    match rng.random_range(0..kinds) {
        0 => tokens.push(string_literal(rng)),
        1 => tokens.push(number(rng)),
        2 => tokens.push(["true", "false"].choose(rng).unwrap_or(&"true").to_string()),
        3 => tokens.push("null".into()),
        4 => tokens.push(string_literal(rng)),
        5 => object(rng, depth - 1, tokens),
        _ => {
            tokens.push("[".into());
            for i in 0..rng.random_range(0..4) {
                if i > 0 {
                    tokens.push(",".into());
                }
                value(rng, depth - 1, tokens);
            }
            tokens.push("]".into());
        }
    }
}

/// A random JSON object's tokens.
fn object(rng: &mut StdRng, depth: u32, tokens: &mut Vec<String>) {
    tokens.push("{".into());
    for i in 0..rng.random_range(0..4) {
        if i > 0 {
            tokens.push(",".into());
        }
        tokens.push(string_literal(rng));
        tokens.push(":".into());
        value(rng, depth, tokens);
    }
    tokens.push("}".into());
}

/// `tokens` with random whitespace between them.
fn spaced(tokens: &[String], rng: &mut StdRng) -> String {
    const SPACES: &[&str] = &["", "", "", " ", "\n", "\n  ", "\t"];
    let style = rng.random_range(0..3);
    let mut text = String::new();
    for (i, token) in tokens.iter().enumerate() {
        if i > 0 {
            text.push_str(match style {
                0 => "",
                1 if token == ":" || token == "," => "",
                1 if tokens[i - 1] == ":" || tokens[i - 1] == "," => " ",
                1 => "",
                _ => SPACES.choose(rng).unwrap_or(&""),
            });
        }
        text.push_str(token);
    }
    text
}

/// A random call: its name, its arguments as written, and their compact form.
fn call(rng: &mut StdRng, bare_name: bool) -> (String, String, String) {
    const NAMES: &[&str] = &["get_weather", "add", "search.docs", "no-args", "f"];
    const JSON_NAMES: &[&str] = &["a name with spaces", "é\\\"quoted\\\"", "tool;{}"];
    let name = if !bare_name && rng.random_bool(0.2) {
        JSON_NAMES.choose(rng)
    } else {
        NAMES.choose(rng)
    };
    let name = name.copied().unwrap_or("f").to_string();
    let mut tokens = Vec::new();
    object(rng, 2, &mut tokens);
    (name, spaced(&tokens, rng), tokens.concat())
}

/// A call object around `name` (a JSON string's content) and `arguments`.
fn call_object(rng: &mut StdRng, name: &str, arguments: &str, key: &str) -> String {
    match rng.random_range(0..4) {
        0 => format!("{{\"arguments\": {arguments}, \"name\": \"{name}\"}}"),
        1 => format!(
            "{{\"type\": \"function\", \"name\":\"{name}\",\n\"{key}\":{arguments}, \"id\": 3}}"
        ),
        _ => format!("{{\"name\": \"{name}\", \"{key}\": {arguments}}}"),
    }
}

/// A run of 1 to 3 calls in `format`, as one group: its text and its calls (with the JSON
/// names decoded). `tagged` says whether Llama calls begin with `<|python_tag|>` (a must
/// after text, a must not after `;`), where it is not left to chance.
fn group(
    format: ToolCallFormat,
    rng: &mut StdRng,
    tagged: Option<bool>,
) -> (String, Vec<(String, String)>) {
    let bare = matches!(format, ToolCallFormat::DeepSeekV3)
        || (format == ToolCallFormat::Mistral && rng.random_bool(0.5));
    let calls: Vec<(String, String, String)> = (0..rng.random_range(1..4))
        .map(|_| call(rng, bare))
        .collect();
    let key = ["arguments", "parameters"]
        .choose(rng)
        .copied()
        .unwrap_or("arguments");
    let objects: Vec<String> = calls
        .iter()
        .map(|(name, written, _)| call_object(rng, name, written, key))
        .collect();
    let text = match format {
        ToolCallFormat::Hermes if rng.random_bool(0.5) => {
            format!("<tool_call>[{}]</tool_call>", objects.join(", "))
        }
        ToolCallFormat::Hermes => objects
            .iter()
            .map(|object| format!("<tool_call>\n{object}\n</tool_call>"))
            .collect::<Vec<_>>()
            .join(["\n", "", " \n"].choose(rng).copied().unwrap_or("")),
        ToolCallFormat::Llama3Json => {
            let tag = if tagged.unwrap_or_else(|| rng.random_bool(0.5)) {
                "<|python_tag|>"
            } else {
                ""
            };
            format!(
                "{tag}{}",
                objects.join(["; ", ";", " ;\n"].choose(rng).copied().unwrap_or(";"))
            )
        }
        ToolCallFormat::Mistral if bare => calls
            .iter()
            .map(|(name, written, _)| format!("[TOOL_CALLS]{name}[ARGS]{written}"))
            .collect(),
        ToolCallFormat::Mistral => format!("[TOOL_CALLS] [{}]", objects.join(",\n")),
        ToolCallFormat::DeepSeekV3 => {
            let calls: Vec<String> = calls
                .iter()
                .map(|(name, written, _)| {
                    format!("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{written}\n```<｜tool▁call▁end｜>")
                })
                .collect();
            format!(
                "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>",
                calls.join("\n")
            )
        }
    };
    let calls = calls
        .into_iter()
        .map(|(name, _, compact)| {
            let name = serde_json::from_str(&format!("\"{name}\"")).unwrap_or(name);
            (name, compact)
        })
        .collect();
    (text, calls)
}

/// Random text without markers, not starting or ending with whitespace.
fn text(rng: &mut StdRng) -> String {
    const WORDS: &[&str] = &[
        "Sure", "the", "weather", "is", "nice.", "é", "中文", "😀", "(ok)", "1,2", "it's", "done!",
    ];
    let words: Vec<&str> = (0..rng.random_range(1..6))
        .map(|_| WORDS.choose(rng).copied().unwrap_or("ok"))
        .collect();
    words.join(" ")
}

/// A random well-formed output in `format`: text and groups of calls, never two texts in a
/// row, separated by random whitespace.
pub(super) fn output(format: ToolCallFormat, rng: &mut StdRng) -> Generated {
    const SEPARATORS: &[&str] = &["", "", " ", "\n", "\n\n", " \n "];
    let items = rng.random_range(0..5);
    let separators: Vec<&str> = (0..=items)
        .map(|_| SEPARATORS.choose(rng).copied().unwrap_or(""))
        .collect();
    let mut out = String::new();
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut previous: Option<bool> = None;
    for i in 0..items {
        out.push_str(separators[i]);
        let is_text = previous != Some(true) && rng.random_bool(0.5);
        if is_text {
            let words = text(rng);
            content.push_str(separators[i]);
            content.push_str(&words);
            content.push_str(separators[i + 1]);
            out.push_str(&words);
        } else {
            // A `;` may also join two groups of Llama calls (then no `<|python_tag|>`).
            let joined = format == ToolCallFormat::Llama3Json
                && previous == Some(false)
                && rng.random_bool(0.5);
            if joined {
                out.push_str("; ");
            }
            let tagged = match previous {
                Some(true) => Some(true),
                _ if joined => Some(false),
                _ => None,
            };
            let (group_text, group_calls) = group(format, rng, tagged);
            out.push_str(&group_text);
            calls.extend(group_calls);
        }
        previous = Some(is_text);
    }
    out.push_str(separators[items]);
    if items == 0 {
        // Whitespace alone is the content of an output without calls.
        content.push_str(separators[0]);
    }
    Generated {
        text: out,
        content: (!content.is_empty()).then_some(content),
        calls,
    }
}

/// Random garbage for `format`'s reader: markers of every format, whole and cut, JSON
/// pieces, text and whitespace.
pub(super) fn garbage(rng: &mut StdRng) -> String {
    const PIECES: &[&str] = &[
        "<tool_call>",
        "</tool_call>",
        "<tool_",
        "</tool",
        "<|python_tag|>",
        "<|python",
        "[TOOL_CALLS]",
        "[TOOL_",
        "[ARGS]",
        "[CALL_ID]",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool",
        "function",
        "```json",
        "```",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        ";",
        "\"",
        "\\",
        "\"name\"",
        "\"arguments\"",
        "\"parameters\"",
        "\"f\"",
        "add",
        "12",
        "-0.5",
        "true",
        "null",
        " ",
        "\n",
        "hello",
        "é",
        "😀",
    ];
    (0..rng.random_range(0..40))
        .map(|_| PIECES.choose(rng).copied().unwrap_or(""))
        .collect()
}

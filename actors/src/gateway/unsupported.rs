//! Request fields that would change what the output must be but that Peregrine does not
//! implement. A request that sets one to anything but its neutral value is refused with a
//! 400 naming the field, never served as if the field were absent: a client that asks for
//! constrained output and gets free text has been corrupted as surely as by a bad kernel.
//! Unknown fields that change nothing (`user`, `metadata`, `store`, ...) still pass.

use serde_json::Value;

use super::errors::ApiError;

/// The values of a refused field that ask for nothing it would change.
#[derive(Clone, Copy, Debug)]
pub enum Neutral {
    /// Only absent or null.
    Null,
    /// Also `false`.
    False,
    /// Also `true`.
    True,
    /// Also an empty list, object or string.
    Empty,
    /// Also this number.
    Number(f64),
    /// Also one of these strings.
    Strings(&'static [&'static str]),
    /// Also `["text"]`.
    TextOnly,
    /// Also an object whose `type` is this, like Anthropic's `{"type": "disabled"}`.
    Kind(&'static str),
}

impl Neutral {
    /// Whether `value` asks for nothing.
    fn admits(self, value: &Value) -> bool {
        if value.is_null() {
            return true;
        }
        match self {
            Neutral::Null => false,
            Neutral::False => value == &Value::Bool(false),
            Neutral::True => value == &Value::Bool(true),
            Neutral::Empty => match value {
                Value::Array(items) => items.is_empty(),
                Value::Object(fields) => fields.is_empty(),
                Value::String(text) => text.is_empty(),
                _ => false,
            },
            Neutral::Number(neutral) => value.as_f64() == Some(neutral),
            Neutral::Strings(names) => value.as_str().is_some_and(|name| names.contains(&name)),
            Neutral::TextOnly => value
                .as_array()
                .is_some_and(|kinds| kinds.iter().all(|kind| kind == "text")),
            Neutral::Kind(kind) => value.get("type").and_then(Value::as_str) == Some(kind),
        }
    }

    /// How a client says "nothing", for the error message.
    fn described(self) -> String {
        match self {
            Neutral::Null => "leave it out".into(),
            Neutral::False => "leave it out or send false".into(),
            Neutral::True => "leave it out or send true".into(),
            Neutral::Empty => "leave it out or send it empty".into(),
            Neutral::Number(neutral) => format!("leave it out or send {neutral}"),
            Neutral::Strings(names) => format!("leave it out or send {}", quoted(names)),
            Neutral::TextOnly => "leave it out or send [\"text\"]".into(),
            Neutral::Kind(kind) => format!("leave it out or send {{\"type\": \"{kind}\"}}"),
        }
    }
}

/// `"a"` or `"a" or "b"`.
fn quoted(names: &[&str]) -> String {
    let names: Vec<String> = names.iter().map(|name| format!("\"{name}\"")).collect();
    names.join(" or ")
}

/// One refused field: its name, its neutral values, and what setting it asks for.
pub struct Refused {
    field: &'static str,
    neutral: Neutral,
    asks_for: &'static str,
}

/// The rule refusing `field` unless it is `neutral`; setting it `asks_for` this.
pub const fn refused(field: &'static str, neutral: Neutral, asks_for: &'static str) -> Refused {
    Refused {
        field,
        neutral,
        asks_for,
    }
}

/// Every refused field of both generation endpoints: OpenAI's, and the extras of vLLM,
/// SGLang and llama.cpp that their users send.
const REFUSED: &[Refused] = &[
    // Choices and candidates.
    refused("best_of", Neutral::Number(1.0), "a best-of search"),
    refused("use_beam_search", Neutral::False, "beam search"),
    // Function calls in their deprecated spelling (chat serves `tools`; completions
    // refuse them in `completions.rs`).
    refused("functions", Neutral::Empty, "function calling"),
    refused(
        "function_call",
        Neutral::Strings(&["none", "auto"]),
        "a forced function call",
    ),
    // Constrained output the gateway does not read (`gateway/constraints.rs` reads the rest).
    refused(
        "structural_tag",
        Neutral::Null,
        "output constrained by structural tags",
    ),
    // Token-level constraints and biases.
    refused("bad_words", Neutral::Empty, "banned words"),
    refused(
        "allowed_token_ids",
        Neutral::Null,
        "output restricted to some tokens",
    ),
    // What the response holds.
    refused("suffix", Neutral::Empty, "text after the completion"),
    refused(
        "include_stop_str_in_output",
        Neutral::False,
        "the stop string kept in the output",
    ),
    refused(
        "no_stop_trim",
        Neutral::False,
        "the stop string kept in the output",
    ),
    refused(
        "skip_special_tokens",
        Neutral::True,
        "special tokens in the text",
    ),
    refused(
        "spaces_between_special_tokens",
        Neutral::True,
        "other spacing of special tokens",
    ),
    refused(
        "n_probs",
        Neutral::Number(0.0),
        "llama.cpp's token probabilities",
    ),
    refused("modalities", Neutral::TextOnly, "output other than text"),
    refused("audio", Neutral::Null, "audio output"),
    // What the prompt is.
    refused(
        "truncate_prompt_tokens",
        Neutral::Null,
        "a truncated prompt",
    ),
    refused("chat_template", Neutral::Null, "another chat template"),
    refused(
        "chat_template_kwargs",
        Neutral::Empty,
        "chat template arguments",
    ),
    refused(
        "continue_final_message",
        Neutral::False,
        "the last message continued",
    ),
    refused(
        "documents",
        Neutral::Empty,
        "documents in the chat template",
    ),
    // llama.cpp's own names and samplers.
    refused(
        "n_predict",
        Neutral::Null,
        "an output length (send `max_tokens`)",
    ),
    refused(
        "typical_p",
        Neutral::Number(1.0),
        "locally typical sampling",
    ),
    refused("mirostat", Neutral::Number(0.0), "Mirostat sampling"),
    refused(
        "dynatemp_range",
        Neutral::Number(0.0),
        "dynamic temperature",
    ),
    refused("xtc_probability", Neutral::Number(0.0), "XTC sampling"),
    refused(
        "dry_multiplier",
        Neutral::Number(0.0),
        "DRY repetition penalties",
    ),
];

/// Refuses the first field of `body` that asks for something Peregrine does not do.
pub fn check(body: &Value) -> Result<(), ApiError> {
    refuse_any(body, REFUSED)
}

/// The fields `/v1/completions` serves that `/v1/chat/completions` refuses.
pub const REFUSED_IN_CHAT: &[Refused] = &[refused(
    "echo",
    Neutral::False,
    "the last message echoed before the reply",
)];

/// Refuses the first field of `body` that one of `rules` refuses.
pub fn refuse_any(body: &Value, rules: &[Refused]) -> Result<(), ApiError> {
    let Some(fields) = body.as_object() else {
        return Ok(());
    };
    for rule in rules {
        let Some(value) = fields.get(rule.field) else {
            continue;
        };
        if rule.neutral.admits(value) {
            continue;
        }
        return Err(ApiError::invalid(
            rule.field,
            format!(
                "`{}` = {value} is not supported: Peregrine does not implement {}; {}",
                rule.field,
                rule.asks_for,
                rule.neutral.described()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_refused_field_is_named_and_its_neutral_value_passes() {
        let asked = [
            ("best_of", json!(3), json!(1)),
            ("use_beam_search", json!(true), json!(false)),
            ("functions", json!([{"name": "f"}]), json!([])),
            ("function_call", json!({"name": "f"}), json!("none")),
            ("structural_tag", json!("{}"), Value::Null),
            ("bad_words", json!(["x"]), json!([])),
            ("allowed_token_ids", json!([1, 2]), Value::Null),
            ("suffix", json!("!"), json!("")),
            ("include_stop_str_in_output", json!(true), json!(false)),
            ("no_stop_trim", json!(true), json!(false)),
            ("skip_special_tokens", json!(false), json!(true)),
            ("spaces_between_special_tokens", json!(false), json!(true)),
            ("n_probs", json!(3), json!(0)),
            ("modalities", json!(["text", "audio"]), json!(["text"])),
            ("audio", json!({"voice": "alloy"}), Value::Null),
            ("truncate_prompt_tokens", json!(8), Value::Null),
            ("chat_template", json!("{{ x }}"), Value::Null),
            (
                "chat_template_kwargs",
                json!({"enable_thinking": true}),
                json!({}),
            ),
            ("continue_final_message", json!(true), json!(false)),
            ("documents", json!([{"text": "d"}]), json!([])),
            ("n_predict", json!(16), Value::Null),
            ("typical_p", json!(0.5), json!(1.0)),
            ("mirostat", json!(2), json!(0)),
            ("dynatemp_range", json!(0.5), json!(0)),
            ("xtc_probability", json!(0.5), json!(0)),
            ("dry_multiplier", json!(0.8), json!(0)),
        ];
        for (field, value, neutral) in asked.clone() {
            let err = check(&json!({ field: value })).unwrap_err();
            assert_eq!(
                (err.status().as_u16(), err.param()),
                (400, Some(field)),
                "{field}"
            );
            assert!(
                err.message().contains(&format!("`{field}`")),
                "{}",
                err.message()
            );
            check(&json!({ field: neutral })).unwrap();
            check(&json!({ field: null })).unwrap();
        }
        let listed: std::collections::BTreeSet<&str> =
            asked.iter().map(|(field, ..)| *field).collect();
        let table: std::collections::BTreeSet<&str> =
            REFUSED.iter().map(|rule| rule.field).collect();
        assert_eq!(listed, table, "every rule is tested");
    }

    #[test]
    fn fields_that_change_nothing_pass() {
        let body = json!({"user": "u", "metadata": {"k": "v"}, "store": false,
            "parallel_tool_calls": true, "service_tier": "auto", "prompt": "x"});
        check(&body).unwrap();
        check(&json!([1, 2])).unwrap();
    }

    #[test]
    fn the_message_shows_the_value_and_the_way_out() {
        let err = check(&json!({"best_of": 2})).unwrap_err();
        assert_eq!(
            err.message(),
            "`best_of` = 2 is not supported: Peregrine does not implement a best-of search; \
             leave it out or send 1"
        );
        let err = check(&json!({"function_call": {"name": "f"}})).unwrap_err();
        assert!(
            err.message().ends_with("send \"none\" or \"auto\""),
            "{}",
            err.message()
        );
    }
}

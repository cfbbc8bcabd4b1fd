//! Chat templates, rendered with minijinja the way Hugging Face's `apply_chat_template`
//! renders them with Jinja2: `trim_blocks` and `lstrip_blocks` on, no trailing newline,
//! Python string and dict methods, `raise_exception`, `strftime_now` and a Python-style
//! `tojson`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{anyhow, Context};
use minijinja::value::Kwargs;
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::tokenizer::{TemplateField, TokenizerConfig};

/// The name the template is registered under; it appears in error messages.
const NAME: &str = "chat_template";

/// One message of a chat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, or whatever else the template knows.
    pub role: String,
    /// The message's text.
    pub content: String,
    /// An assistant message's calls, as templates read them: `{"id", "type": "function",
    /// "function": {"name", "arguments"}}` with the arguments as an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` message's answer to this call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message's function name (or a participant's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A compiled chat template with the special tokens it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// The template of a model directory: `tokenizer_config.json`'s `chat_template` (a
    /// string, or the entry named `default` of a list), else `chat_template.jinja`; `None`
    /// if there is neither. BOS and EOS come from `tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> anyhow::Result<Option<Self>> {
        let config = TokenizerConfig::from_dir(dir)?;
        let source = match config.chat_template {
            Some(TemplateField::Single(source)) => source,
            Some(TemplateField::Named(templates)) => templates
                .into_iter()
                .find(|entry| entry.name == "default")
                .map(|entry| entry.template)
                .context(
                    "tokenizer_config.json: `chat_template` has no template named \"default\"",
                )?,
            None => {
                let path = dir.join("chat_template.jinja");
                if !path.exists() {
                    return Ok(None);
                }
                std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?
            }
        };
        Self::new(source, config.bos_token, config.eos_token).map(Some)
    }

    /// Compiles `source`; `bos_token` and `eos_token` are the texts the template sees as
    /// `bos_token` and `eos_token` (undefined when `None`).
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> anyhow::Result<Self> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.clone())
            .map_err(|err| anyhow!("invalid chat template: {err}"))?;
        Ok(Self {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template renders a request's `tools` itself (it refers to `tools`);
    /// for one that does not, tools are described in the system turn instead.
    pub fn renders_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// Renders `messages`, ending with the assistant's header if `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> anyhow::Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Renders `messages` with the request's `tools` (OpenAI's `tools` entries, as
    /// Hugging Face's `apply_chat_template` passes them; undefined when `None`).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> anyhow::Result<String> {
        let token = |text: &Option<String>| text.as_deref().map_or(Value::UNDEFINED, Value::from);
        let tools = tools.map_or(Value::UNDEFINED, Value::from_serialize);
        self.env
            .get_template(NAME)
            .and_then(|template| {
                template.render(context! {
                    messages => messages,
                    tools => tools,
                    add_generation_prompt => add_generation_prompt,
                    bos_token => token(&self.bos_token),
                    eos_token => token(&self.eos_token),
                })
            })
            .map_err(|err| anyhow!("cannot render the chat template: {err}"))
    }
}

/// `raise_exception(message)`: fails the render with `message`.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time formatted as by Python's `strftime`.
fn strftime_now(format: String) -> Result<String, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|err| Error::new(ErrorKind::InvalidOperation, err.to_string()))?;
    strftime::format(&format, now.as_secs()).map_err(|directive| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported directive {directive:?}"),
        )
    })
}

/// `tojson`, as Hugging Face defines it: Python's `json.dumps` with `ensure_ascii=False`
/// (unless given), `", "` and `": "` separators, or newlines and `indent` spaces.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let written = match indent {
        Some(width) => {
            let spaces = " ".repeat(width);
            let formatter = serde_json::ser::PrettyFormatter::with_indent(spaces.as_bytes());
            value.serialize(&mut serde_json::Serializer::with_formatter(
                &mut out, formatter,
            ))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonFormatter,
        )),
    };
    written.map_err(|err| Error::new(ErrorKind::InvalidOperation, format!("tojson: {err}")))?;
    let json = String::from_utf8(out)
        .map_err(|err| Error::new(ErrorKind::InvalidOperation, err.to_string()))?;
    Ok(Value::from_safe_string(if ensure_ascii == Some(true) {
        escape_non_ascii(&json)
    } else {
        json
    }))
}

/// Writes JSON with Python's default separators, `", "` and `": "`.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.begin_array_value(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// Replaces every non-ASCII character by `\uXXXX` escapes (UTF-16, as Python writes them).
fn escape_non_ascii(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    out
}

/// A small `strftime` over UTC Unix time, enough for chat templates' dates.
mod strftime {
    use std::fmt::Write as _;

    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const WEEKDAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];

    /// Formats `unix_secs` (UTC) with `format`'s directives: `%Y %y %m %B %b %d %e %j %A %a
    /// %H %I %M %S %p %%`, and `%-` before a numeric one to drop its padding (as glibc).
    /// An unsupported directive is returned as the error.
    pub fn format(format: &str, unix_secs: u64) -> Result<String, String> {
        let days = unix_secs / 86_400;
        let seconds = unix_secs % 86_400;
        let (year, month, day) = civil_from_days(days);
        let weekday = ((days + 4) % 7) as usize; // 1970-01-01 was a Thursday.
        let hour = seconds / 3600;
        let day_of_year = days - days_before_year(year) + 1;
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut directive = chars.next().ok_or("%")?;
            let padded = directive != '-';
            if !padded {
                directive = chars.next().ok_or("%-")?;
            }
            let number = |value: u64, width: usize| {
                if padded {
                    format!("{value:0width$}")
                } else {
                    value.to_string()
                }
            };
            let text = match directive {
                'Y' => year.to_string(),
                'y' => number(year % 100, 2),
                'm' => number(month, 2),
                'B' => MONTHS[month as usize - 1].to_owned(),
                'b' => MONTHS[month as usize - 1][..3].to_owned(),
                'd' => number(day, 2),
                'e' if padded => format!("{day:2}"),
                'j' => number(day_of_year, 3),
                'A' => WEEKDAYS[weekday].to_owned(),
                'a' => WEEKDAYS[weekday][..3].to_owned(),
                'H' => number(hour, 2),
                'I' => number((hour + 11) % 12 + 1, 2),
                'M' => number(seconds / 60 % 60, 2),
                'S' => number(seconds % 60, 2),
                'p' => (if hour < 12 { "AM" } else { "PM" }).to_owned(),
                '%' if padded => "%".to_owned(),
                _ => {
                    let flag = if padded { "" } else { "-" };
                    return Err(format!("%{flag}{directive}"));
                }
            };
            let _ = write!(out, "{text}");
        }
        Ok(out)
    }

    /// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Hinnant's algorithm).
    fn civil_from_days(days: u64) -> (u64, u64, u64) {
        let z = days + 719_468;
        let era = z / 146_097;
        let day_of_era = z % 146_097;
        let year_of_era =
            (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
        let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let shifted_month = (5 * day_of_year + 2) / 153;
        let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
        let month = if shifted_month < 10 {
            shifted_month + 3
        } else {
            shifted_month - 9
        };
        let year = year_of_era + era * 400 + u64::from(month <= 2);
        (year, month, day)
    }

    /// Days from 1970-01-01 to January 1st of `year` (>= 1970).
    fn days_before_year(year: u64) -> u64 {
        let leap_days = |y: u64| y / 4 - y / 100 + y / 400;
        365 * (year - 1970) + leap_days(year - 1) - leap_days(1969)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn formats_known_dates() {
            // 2024-07-26 14:05:09 UTC, a Friday, day 208 of a leap year.
            let friday = 1_721_952_000 + 14 * 3600 + 5 * 60 + 9;
            assert_eq!(format("%d %b %Y", friday).unwrap(), "26 Jul 2024");
            assert_eq!(
                format("%A %B %-d, %y %H:%M:%S %I%p day %j %%", friday).unwrap(),
                "Friday July 26, 24 14:05:09 02PM day 208 %"
            );
            // 2000-02-29 00:00:00 UTC (a Tuesday) and the epoch.
            assert_eq!(
                format("%Y-%m-%d %a %e %j", 951_782_400).unwrap(),
                "2000-02-29 Tue 29 060"
            );
            assert_eq!(
                format("%Y-%m-%d %a %I %p %j", 0).unwrap(),
                "1970-01-01 Thu 12 AM 001"
            );
            assert_eq!(
                format("%Y-%m-%d %j", 1_767_139_200).unwrap(),
                "2025-12-31 365"
            );
        }

        #[test]
        fn unsupported_directives_are_named() {
            assert_eq!(format("%Y %Q", 0), Err("%Q".to_owned()));
            assert_eq!(format("%-e", 0), Err("%-e".to_owned()));
            assert_eq!(format("50%", 0), Err("%".to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// Llama 3's template, with `.strip()` in place of `| trim`.
    const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'].strip() + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content: content.to_owned(),
            ..ChatMessage::default()
        }
    }

    /// A seeded random text of letters, digits, spaces, newlines and non-ASCII characters.
    fn random_text(seed: u64) -> String {
        const ALPHABET: &[char] = &[
            'a', 'Z', '7', ' ', '\n', 'é', '中', '🦀', '{', '}', '%', '\'',
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..40)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
            .collect()
    }

    #[test]
    fn smollm2_renders_chatml_with_its_default_system_prompt() {
        let template = ChatTemplate::new(SMOLLM2, None, Some("<|im_end|>".to_owned())).unwrap();
        let question = random_text(1);
        let got = template
            .render(&[message("user", &question)], true)
            .unwrap();
        let want = format!(
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(got, want);
    }

    #[test]
    fn smollm2_renders_a_given_system_message() {
        let template = ChatTemplate::new(SMOLLM2, None, None).unwrap();
        let (system, question) = (random_text(2), random_text(3));
        let messages = [message("system", &system), message("user", &question)];
        let prompt = format!(
            "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
        );
        assert_eq!(template.render(&messages, false).unwrap(), prompt);
        assert_eq!(
            template.render(&messages, true).unwrap(),
            format!("{prompt}<|im_start|>assistant\n")
        );
    }

    #[test]
    fn llama3_uses_bos_and_python_strip() {
        let bos = Some("<|begin_of_text|>".to_owned());
        let template = ChatTemplate::new(LLAMA3, bos, Some("<|eot_id|>".to_owned())).unwrap();
        let messages = [
            message("system", "\n You are terse. "),
            message("user", "  Hi there \n\n"),
        ];
        assert_eq!(
            template.render(&messages, true).unwrap(),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn raise_exception_surfaces_its_message() {
        let source = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok";
        let template = ChatTemplate::new(source, None, None).unwrap();
        assert_eq!(
            template.render(&[message("user", "x")], false).unwrap(),
            "ok"
        );
        let err = template
            .render(&[message("system", "x")], false)
            .unwrap_err();
        assert!(
            err.to_string().contains("System role not supported"),
            "{err}"
        );
    }

    #[test]
    fn whitespace_control_matches_hugging_face() {
        let source = "{% for message in messages %}\n    {% if message.role.startswith('us') %}\nU: {{ message.content | upper }}\n    {% else %}\nA: {{ message.content }}\n    {% endif %}\n{% endfor %}\n{{ eos_token }}\n";
        let template = ChatTemplate::new(source, None, Some("</s>".to_owned())).unwrap();
        let messages = [message("user", "hi"), message("assistant", "yo")];
        assert_eq!(
            template.render(&messages, false).unwrap(),
            "U: HI\nA: yo\n</s>"
        );
    }

    #[test]
    fn tojson_writes_python_style_json() {
        let source = "{{ messages | tojson }}|{{ {'b': [1, 2.5], 'a': none} | tojson(indent=2) }}|{{ messages[0].content | tojson(ensure_ascii=True) }}";
        let template = ChatTemplate::new(source, None, None).unwrap();
        let got = template
            .render(&[message("user", "é <b>🦀")], false)
            .unwrap();
        assert_eq!(
            got,
            "[{\"role\": \"user\", \"content\": \"é <b>🦀\"}]|{\n  \"b\": [\n    1,\n    2.5\n  ],\n  \"a\": null\n}|\"\\u00e9 <b>\\ud83e\\udd80\""
        );
    }

    #[test]
    fn strftime_now_and_undefined_tokens() {
        let template =
            ChatTemplate::new("{{ bos_token }}{{ strftime_now('%Y') }}", None, None).unwrap();
        let year: u32 = template.render(&[], false).unwrap().parse().unwrap();
        assert!(year >= 2025, "{year}");
    }

    #[test]
    fn template_errors_name_the_problem() {
        let err = ChatTemplate::new("{% for message in %}", None, None).unwrap_err();
        assert!(err.to_string().contains("syntax error"), "{err}");
        let template = ChatTemplate::new("{{ strftime_now('%Q') }}", None, None).unwrap();
        let err = template.render(&[], false).unwrap_err();
        assert!(err.to_string().contains("%Q"), "{err}");
        let template =
            ChatTemplate::new("{{ messages | tojson(sort_keys=true) }}", None, None).unwrap();
        let err = template.render(&[], false).unwrap_err();
        assert!(err.to_string().contains("sort_keys"), "{err}");
    }

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn from_dir_reads_the_template_and_its_tokens() {
        let config = serde_json::json!({
            "bos_token": {"content": "<s>", "special": true},
            "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
        });
        let dir = dir_with(&[("tokenizer_config.json", &config.to_string())]);
        let template = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
        assert_eq!(
            template.render(&[message("user", "q")], false).unwrap(),
            "<s>q</s>"
        );

        let config = serde_json::json!({
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "default {{ messages | length }}"},
            ],
        });
        let dir = dir_with(&[("tokenizer_config.json", &config.to_string())]);
        let template = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
        assert_eq!(
            template.render(&[message("user", "q")], false).unwrap(),
            "default 1"
        );

        let dir = dir_with(&[
            ("tokenizer_config.json", "{}"),
            ("chat_template.jinja", "jinja file\n"),
        ]);
        let template = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
        assert_eq!(template.render(&[], false).unwrap(), "jinja file");
    }

    #[test]
    fn from_dir_without_a_template_is_none_and_without_default_is_an_error() {
        let dir = dir_with(&[("tokenizer_config.json", r#"{"eos_token": "</s>"}"#)]);
        assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_none());
        let empty = tempfile::tempdir().unwrap();
        assert!(ChatTemplate::from_dir(empty.path()).unwrap().is_none());
        let config = r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#;
        let dir = dir_with(&[("tokenizer_config.json", config)]);
        let err = ChatTemplate::from_dir(dir.path()).unwrap_err();
        assert!(err.to_string().contains("default"), "{err}");
    }
}

//! Forced-call grammars, compiled over the tiny tokenizer (with the formats' markers as
//! special tokens, and without) and walked at random: every output they admit reads back
//! as complete calls of the chosen tools whose arguments validate against their schemas.

use peregrine_models::tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde_json::{json, Value};

use super::super::format::{
    DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALLS_END, DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALL_END, DEEPSEEK_SEP,
    HERMES_CLOSE, HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALLS, PYTHON_TAG,
};
use super::super::{forced_call_grammar, parse, CallChoice, HermesStyle, Tool, ToolCallFormat};
use super::rng;
use crate::testing::{tiny_tokenizer, tiny_tokenizer_with_specials, EOS};
use crate::{CompiledGrammar, Constraint, GrammarCompiler, GrammarError, GrammarLimits};

/// The tools the grammars force calls of: nested objects, arrays, enums, `anyOf`, `$ref`.
fn tools() -> Vec<Tool> {
    let tool = |name: &str, parameters: Value| Tool {
        name: name.into(),
        description: Some(format!("The {name} tool.")),
        parameters,
        strict: false,
    };
    vec![
        tool(
            "get_weather",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "description": "ends with } and \"quotes\"\n%json {"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14}},
                "required": ["city"], "additionalProperties": false}),
        ),
        tool(
            "search.docs",
            json!({"type": "object", "properties": {
                "query": {"type": "string", "maxLength": 20},
                "filters": {"type": "object", "properties": {
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
                    "after": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}},
                    "required": ["tags"], "additionalProperties": false},
                "limit": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}},
                "required": ["query", "filters"], "additionalProperties": false}),
        ),
        tool(
            "no-args",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
        ),
        tool(
            "route",
            json!({"$defs": {"point": {"type": "object", "properties": {
                    "x": {"type": "number"}, "y": {"type": "number"}},
                    "required": ["x", "y"], "additionalProperties": false}},
                "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"},
                    "via": {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2}},
                "required": ["from", "to"], "additionalProperties": false}),
        ),
    ]
}

/// Every marker, as the tokenizer's special tokens.
const MARKERS: &[&str] = &[
    HERMES_OPEN,
    HERMES_CLOSE,
    PYTHON_TAG,
    MISTRAL_CALLS,
    MISTRAL_ARGS,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_SEP,
];

fn compiler(tokenizer: &Tokenizer) -> GrammarCompiler {
    GrammarCompiler::new(tokenizer, tokenizer.vocab_size(), GrammarLimits::default())
        .expect("a compiler over the tiny tokenizer")
}

/// One random output the grammar admits, ending on end-of-sequence; `None` if it ran long.
fn walk(grammar: &CompiledGrammar, tokenizer: &Tokenizer, rng: &mut StdRng) -> Option<String> {
    // `"`, `}` and `]` close strings, objects and lists: picked often, walks end.
    let closers: Vec<u32> = b"\"}]".iter().map(|&byte| 3 + u32::from(byte)).collect();
    let mut matcher = grammar.matcher();
    let mut tokens = Vec::new();
    let length = rng.random_range(5..150);
    while tokens.len() < 3000 {
        let allowed: Vec<u32> = matcher.mask().expect("a mask").allowed().collect();
        if allowed.contains(&EOS)
            && (allowed.len() == 1 || tokens.len() >= length || rng.random_bool(0.05))
        {
            return Some(tokenizer.decode(&tokens, false).expect("decoding the walk"));
        }
        let choices: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&token| token != EOS)
            .collect();
        let closing: Vec<u32> = choices
            .iter()
            .copied()
            .filter(|token| closers.contains(token))
            .collect();
        let eager = if tokens.len() >= length { 0.8 } else { 0.3 };
        let pool = if !closing.is_empty() && rng.random_bool(eager) {
            &closing
        } else {
            &choices
        };
        let token = *pool.choose(rng).expect("the grammar allows a token");
        matcher.consume(&[token]).expect("an allowed token");
        tokens.push(token);
    }
    None
}

/// `json` with each number beyond `f64`'s range written as the largest finite one.
fn clamp_numbers(json: &str) -> String {
    let mut out = String::new();
    let mut number = String::new();
    let (mut in_string, mut escaped) = (false, false);
    let flush = |number: &mut String, out: &mut String| {
        match number.parse::<f64>() {
            Ok(value) if value.is_infinite() && value < 0.0 => {
                out.push_str("-1.7976931348623157e308")
            }
            Ok(value) if value.is_infinite() => out.push_str("1.7976931348623157e308"),
            _ => out.push_str(number),
        }
        number.clear();
    };
    for c in json.chars() {
        if in_string {
            (in_string, escaped) = (escaped || c != '"', !escaped && c == '\\');
            out.push(c);
        } else if c.is_ascii_digit() || "+-.eE".contains(c) {
            number.push(c);
        } else {
            flush(&mut number, &mut out);
            in_string = c == '"';
            out.push(c);
        }
    }
    flush(&mut number, &mut out);
    out
}

/// Checks `text` reads back as complete calls that `choice` allows, valid for their tools.
fn check_calls(format: ToolCallFormat, text: &str, tools: &[Tool], choice: &CallChoice) -> usize {
    let parsed = parse(format, text);
    assert_eq!(parsed.content, None, "{format:?} {text:?}");
    match choice {
        CallChoice::Required { parallel: true } => assert!(!parsed.calls.is_empty(), "{text:?}"),
        _ => assert_eq!(parsed.calls.len(), 1, "{format:?} {text:?}"),
    }
    let mut out_of_range = 0;
    for call in &parsed.calls {
        assert!(call.complete, "{format:?} {text:?}");
        if let CallChoice::Named(name) = choice {
            assert_eq!(call.name, *name);
        }
        let tool = tools
            .iter()
            .find(|tool| tool.name == call.name)
            .unwrap_or_else(|| panic!("{text:?} calls an unknown tool"));
        let arguments: Value = match serde_json::from_str(&call.arguments) {
            Ok(arguments) => arguments,
            // Valid JSON that `serde_json` refuses: a number such as 1e400, which the
            // schema validates as the largest finite number of its sign.
            Err(err) if err.to_string().contains("out of range") => {
                out_of_range += 1;
                serde_json::from_str(&clamp_numbers(&call.arguments))
                    .unwrap_or_else(|err| panic!("{format:?} {text:?}: {err}"))
            }
            Err(err) => panic!("{format:?} {text:?}: {err}"),
        };
        let validator = jsonschema::validator_for(&tool.parameters).expect("a valid schema");
        if let Err(err) = validator.validate(&arguments) {
            panic!("{format:?} {text:?}: {err}");
        }
    }
    out_of_range
}

/// Walks the grammar of every choice in `format` over `tokenizer` at random.
fn walk_format(
    format: ToolCallFormat,
    style: HermesStyle,
    tokenizer: &Tokenizer,
    rng: &mut StdRng,
) {
    let tools = tools();
    let compiler = compiler(tokenizer);
    let choices = [
        CallChoice::Required { parallel: true },
        CallChoice::Required { parallel: false },
        CallChoice::Named(tools[rng.random_range(0..tools.len())].name.clone()),
    ];
    for choice in choices {
        let constraint =
            forced_call_grammar(format, style, &tools, &choice, tokenizer).expect("a grammar");
        let (grammar, _) = compiler
            .compile(&constraint)
            .unwrap_or_else(|err| panic!("{format:?} {choice:?}: {err}\n{constraint:?}"));
        let (mut walked, mut skipped) = (0, 0);
        for _ in 0..25 {
            if let Some(text) = walk(&grammar, tokenizer, rng) {
                skipped += check_calls(format, &text, &tools, &choice);
                walked += 1;
            }
        }
        assert!(
            walked >= 20,
            "{format:?} {choice:?}: {walked} walks ended ({skipped} numbers out of range)"
        );
    }
}

#[test]
fn forced_calls_read_back_valid_with_markers_as_special_tokens() {
    let tokenizer = tiny_tokenizer_with_specials(300, MARKERS);
    let mut rng = rng("forced_calls_special_tokens");
    for format in ToolCallFormat::ALL {
        walk_format(format, HermesStyle::Blocks, &tokenizer, &mut rng);
    }
    walk_format(
        ToolCallFormat::Hermes,
        HermesStyle::List,
        &tokenizer,
        &mut rng,
    );
}

#[test]
fn forced_calls_read_back_valid_with_markers_as_text() {
    let tokenizer = tiny_tokenizer(300);
    let mut rng = rng("forced_calls_text_markers");
    for format in ToolCallFormat::ALL {
        walk_format(format, HermesStyle::Blocks, &tokenizer, &mut rng);
    }
    walk_format(
        ToolCallFormat::Hermes,
        HermesStyle::List,
        &tokenizer,
        &mut rng,
    );
}

#[test]
fn markers_are_special_tokens_where_the_tokenizer_has_them() {
    let tokenizer = tiny_tokenizer_with_specials(300, MARKERS);
    let tools = tools();
    let grammar = |format| {
        let choice = CallChoice::Named("no-args".into());
        match forced_call_grammar(format, HermesStyle::Blocks, &tools, &choice, &tokenizer) {
            Ok(Constraint::ToolCall(text)) => text,
            other => panic!("{other:?}"),
        }
    };
    // The specials follow the 300 tokens in MARKERS' order.
    let hermes = grammar(ToolCallFormat::Hermes);
    assert!(
        hermes.contains(
            r#"<[300]> "\n" "{\"name\": \"no-args\", \"arguments\": " args_0 "}" "\n" <[301]>"#
        ),
        "{hermes}"
    );
    assert!(grammar(ToolCallFormat::Mistral).contains("<[303]> \"no-args\" <[304]> args_0"));
    assert!(grammar(ToolCallFormat::DeepSeekV3).starts_with("start: <[305]> item <[306]>"));
    let plain = tiny_tokenizer(300);
    let choice = CallChoice::Required { parallel: true };
    let Ok(Constraint::ToolCall(text)) = forced_call_grammar(
        ToolCallFormat::Mistral,
        HermesStyle::Blocks,
        &tools,
        &choice,
        &plain,
    ) else {
        panic!("no grammar")
    };
    assert!(
        text.starts_with("start: \"[TOOL_CALLS]\" \"[\" item (\", \" item)* \"]\""),
        "{text}"
    );
}

#[test]
fn choices_that_cannot_be_forced_are_refused() {
    let tokenizer = tiny_tokenizer(300);
    let tools = tools();
    let refused = |format, tools: &[Tool], choice: CallChoice| {
        forced_call_grammar(format, HermesStyle::Blocks, tools, &choice, &tokenizer).unwrap_err()
    };
    let required = CallChoice::Required { parallel: true };
    assert!(refused(ToolCallFormat::Hermes, &[], required.clone())
        .0
        .contains("at least one tool"));
    assert!(refused(
        ToolCallFormat::Hermes,
        &tools,
        CallChoice::Named("nope".into())
    )
    .0
    .contains("nope"));
    let spaced = Tool {
        name: "two words".into(),
        description: None,
        parameters: json!({}),
        strict: false,
    };
    assert!(refused(
        ToolCallFormat::DeepSeekV3,
        std::slice::from_ref(&spaced),
        required.clone()
    )
    .0
    .contains("two words"));
    assert!(forced_call_grammar(
        ToolCallFormat::Hermes,
        HermesStyle::Blocks,
        std::slice::from_ref(&spaced),
        &required,
        &tokenizer
    )
    .is_ok());
    for parameters in [json!(false), json!(7), json!({"type": "string"})] {
        let tool = Tool {
            parameters,
            ..spaced.clone()
        };
        assert!(refused(ToolCallFormat::Hermes, &[tool], required.clone())
            .0
            .contains("two words"));
    }
}

#[test]
fn strict_tools_refuse_what_cannot_be_enforced_exactly() {
    let tokenizer = tiny_tokenizer(300);
    let compiler = compiler(&tokenizer);
    let schemas = [
        json!({"type": "object", "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}),
        json!({"type": "object", "properties": {"v": {"type": "string", "format": "no-such-format"}}}),
    ];
    let choice = CallChoice::Required { parallel: false };
    for parameters in schemas {
        let compile = |strict| {
            let tool = Tool {
                name: "pick".into(),
                description: None,
                parameters: parameters.clone(),
                strict,
            };
            let constraint = forced_call_grammar(
                ToolCallFormat::Hermes,
                HermesStyle::Blocks,
                &[tool],
                &choice,
                &tokenizer,
            )
            .expect("a grammar");
            compiler.compile(&constraint).map(|_| ())
        };
        assert_eq!(compile(false), Ok(()), "{parameters}");
        assert!(
            matches!(compile(true), Err(GrammarError::Invalid(_))),
            "{parameters}"
        );
    }
}

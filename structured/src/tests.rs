//! Compiling, caching and matching constraints over the tiny tokenizer.

use serde_json::json;

use crate::testing::{tiny_compiler, tiny_tokenizer, walk_bytes};
use crate::{Constraint, GrammarError};

#[test]
fn a_schema_allows_what_it_matches_and_ends_on_eos_only() {
    let compiler = tiny_compiler();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
        "required": ["n"], "additionalProperties": false});
    let (grammar, report) = compiler
        .compile(&Constraint::JsonSchema(schema.clone()))
        .unwrap();
    assert!(!report.cached);
    let mut matcher = grammar.matcher();
    assert!(
        walk_bytes(&mut matcher.clone(), "{\"m\"").is_err(),
        "an unknown key"
    );
    walk_bytes(&mut matcher, "{\"n\": 12}").unwrap();
    let end = matcher.mask().unwrap();
    assert_eq!(
        end.allowed().collect::<Vec<_>>(),
        [2],
        "only <|im_end|> once complete"
    );
    let (_, again) = compiler.compile(&Constraint::JsonSchema(schema)).unwrap();
    assert!(again.cached, "the second compile comes from the cache");
}

#[test]
fn regex_choice_and_json_object() {
    let compiler = tiny_compiler();
    let (regex, _) = compiler
        .compile(&Constraint::Regex("[a-c]{2}x".into()))
        .unwrap();
    let mut m = regex.matcher();
    walk_bytes(&mut m, "abx").unwrap();
    assert!(walk_bytes(&mut regex.matcher(), "ad").is_err());
    let choice = Constraint::Choice(vec!["yes".into(), "no \"way\"".into()]);
    let (choice, _) = compiler.compile(&choice).unwrap();
    walk_bytes(&mut choice.matcher(), "no \"way\"").unwrap();
    assert!(walk_bytes(&mut choice.matcher(), "maybe").is_err());
    let (object, _) = compiler.compile(&Constraint::JsonObject).unwrap();
    assert!(walk_bytes(&mut object.matcher(), "[1]").is_err());
    walk_bytes(&mut object.matcher(), "{\"a\": [1, 2]}").unwrap();
}

#[test]
fn bad_constraints_are_refused_with_a_reason() {
    let compiler = tiny_compiler();
    let cases = [
        Constraint::Regex("(unclosed".into()),
        Constraint::Lark("start: missing_rule".into()),
        Constraint::JsonSchema(json!({"type": "no-such-type"})),
        Constraint::JsonSchema(json!(false)),
        Constraint::JsonSchema(json!(12)),
        Constraint::Choice(Vec::new()),
    ];
    for constraint in cases {
        match compiler.compile(&constraint) {
            Err(GrammarError::Invalid(reason)) => assert!(!reason.is_empty()),
            other => panic!("{constraint:?} gave {other:?}"),
        }
    }
}

#[test]
fn forced_tokens_are_consumed() {
    let compiler = tiny_compiler();
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}},
        "required": ["name"], "additionalProperties": false});
    let (grammar, _) = compiler.compile(&Constraint::JsonSchema(schema)).unwrap();
    let mut matcher = grammar.matcher();
    let forced = matcher.forced();
    let text = tiny_tokenizer(300).decode(&forced, false).unwrap();
    assert_eq!(text, "{\"name\": \"", "the grammar forces the key");
    walk_bytes(&mut matcher, "x\"}").unwrap();
}

#[test]
fn drafts_are_cut_where_the_grammar_forbids_and_settled() {
    let compiler = tiny_compiler();
    let (grammar, _) = compiler.compile(&Constraint::Regex("ab+c".into())).unwrap();
    let byte = |c: u8| 3 + u32::from(c);
    let mut matcher = grammar.matcher();
    let drafts = [byte(b'a'), byte(b'b'), byte(b'x'), byte(b'c')];
    let masks = matcher.draft_masks(&drafts).unwrap();
    assert_eq!(masks.admitted, 2);
    assert_eq!(masks.masks.len(), 3);
    assert!(!masks.masks[2].allows(byte(b'x')));
    // Verification accepted one draft and chose `b` after it.
    matcher.settle(masks.admitted, 1, byte(b'b')).unwrap();
    walk_bytes(&mut matcher, "bc").unwrap();
    assert!(matcher.settle(0, 1, byte(b'b')).is_err());
}

#[test]
fn oversized_constraints_are_refused_before_compiling() {
    let compiler = crate::GrammarCompiler::new(
        &tiny_tokenizer(300),
        300,
        crate::GrammarLimits {
            max_bytes: 8,
            ..Default::default()
        },
    )
    .unwrap();
    let err = compiler
        .compile(&Constraint::Regex("a".repeat(9)))
        .unwrap_err();
    assert!(
        matches!(err, GrammarError::TooLarge { bytes: 9, .. }),
        "{err}"
    );
}

#[test]
fn choices_with_control_characters_compile() {
    let compiler = tiny_compiler();
    let choice = Constraint::Choice(vec!["a\u{7f}".into(), "b\u{1}\"\\".into()]);
    let (grammar, _) = compiler.compile(&choice).unwrap();
    walk_bytes(&mut grammar.matcher(), "b\u{1}\"\\").unwrap();
}

#[test]
fn unenforceable_schemas_are_refused_by_name() {
    let compiler = tiny_compiler();
    let schema = json!({"type": "object", "minProperties": 2,
        "patternProperties": {"^k[0-9]$": {"type": "integer"}}});
    match compiler.compile(&Constraint::JsonSchema(schema)) {
        Err(GrammarError::Invalid(why)) => assert!(why.contains("minProperties"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_compile_past_its_time_is_refused() {
    let compiler = crate::GrammarCompiler::new(
        &tiny_tokenizer(300),
        300,
        crate::GrammarLimits {
            compile_timeout: std::time::Duration::from_nanos(1),
            ..Default::default()
        },
    )
    .unwrap();
    let properties: serde_json::Map<String, serde_json::Value> = (0..200)
        .map(|i| {
            (
                format!("key{i}"),
                json!({"type": "string", "pattern": "^[a-z]{3,9}$"}),
            )
        })
        .collect();
    let schema = json!({"type": "object", "properties": properties});
    let err = compiler
        .compile(&Constraint::JsonSchema(schema))
        .unwrap_err();
    assert!(matches!(err, GrammarError::TooSlow { .. }), "{err}");
}

/// A random JSON value built from schema keywords and odd values, `depth` levels deep.
fn random_schema(rng: &mut impl rand::Rng, depth: usize) -> serde_json::Value {
    const KEYS: [&str; 24] = [
        "type",
        "properties",
        "items",
        "anyOf",
        "oneOf",
        "allOf",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "pattern",
        "minLength",
        "maxLength",
        "required",
        "additionalProperties",
        "patternProperties",
        "$ref",
        "$defs",
        "minItems",
        "maxItems",
        "format",
        "not",
        "prefixItems",
    ];
    const TYPES: [&str; 8] = [
        "object", "array", "string", "integer", "number", "boolean", "null", "nope",
    ];
    match rng.random_range(0..if depth == 0 { 5 } else { 8 }) {
        0 => json!(TYPES[rng.random_range(0..TYPES.len())]),
        1 => json!(rng.random_range(-5i64..50)),
        2 => json!(["#/$defs/a", "(", "^[a-z]+$", "", "date-time"][rng.random_range(0..5)]),
        3 => json!(rng.random_bool(0.5)),
        4 => serde_json::Value::Null,
        5 => (0..rng.random_range(0..4))
            .map(|_| random_schema(rng, depth - 1))
            .collect(),
        _ => {
            let fields: serde_json::Map<String, serde_json::Value> = (0..rng.random_range(0..5))
                .map(|_| {
                    let key = KEYS[rng.random_range(0..KEYS.len())].to_owned();
                    (key, random_schema(rng, depth - 1))
                })
                .collect();
            serde_json::Value::Object(fields)
        }
    }
}

#[test]
fn random_schemas_compile_or_are_refused_never_panic() {
    use rand::SeedableRng;
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let compiler = tiny_compiler();
    let (mut compiled, mut refused) = (0, 0);
    for _ in 0..300 {
        let schema = random_schema(&mut rng, 4);
        match compiler.compile(&Constraint::JsonSchema(schema.clone())) {
            Ok((grammar, _)) => {
                // A compiled grammar gives a first mask with something in it.
                let mut matcher = grammar.matcher();
                assert!(matcher.mask().is_ok(), "seed {seed}: {schema}");
                compiled += 1;
            }
            Err(GrammarError::Invalid(why)) => {
                assert!(!why.is_empty(), "seed {seed}: {schema}");
                refused += 1;
            }
            Err(other) => panic!("seed {seed}: {schema}: {other}"),
        }
    }
    assert!(
        compiled > 0 && refused > 0,
        "seed {seed}: {compiled} compiled, {refused} refused"
    );
}

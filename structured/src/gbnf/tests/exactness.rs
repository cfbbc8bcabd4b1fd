//! The converted grammars match exactly what GBNF matches, where llguidance's greedy lexer
//! would otherwise cut lexemes where GBNF does not: hand-picked cases, then random
//! grammars checked against the reference matcher on every short string.

use super::reference::derives;
use super::{check, try_compile, Rng};
use crate::gbnf::parser::parse;
use crate::testing::matches_whole;

#[test]
fn a_lexeme_that_could_run_on_is_split() {
    // `ws` may eat the line break that `root` wants after it.
    let arithmetic = "root ::= (term \"=\" ws term \"\\n\")+\nterm ::= [a-z]+ ws | \"(\" ws term \")\" ws\nws ::= [ \\t\\n]*";
    check(
        arithmetic,
        &["a=b\n", "a = b \n", "(a)=b\n\nc=d\n", "a=b\n\n"],
        &["a=b", "a=\n"],
    );
    // `[a-z]*` may eat the `b` that `tail` starts with.
    check(
        "root ::= [a-z]* tail\ntail ::= \"b\" | \"(\" root \")\"",
        &["b", "ab", "aab", "a(b)", "(ab)"],
        &["a", "ba", "a(b"],
    );
}

#[test]
fn keywords_and_identifiers_both_match() {
    // "int" is a type and an identifier: both readings go on.
    let c = "root ::= (stmt \";\")*\nstmt ::= type ident | ident \" = \" expr | \"{\" root \"}\"\ntype ::= \"int\" \" \"+\nident ::= [a-z]+\nexpr ::= [0-9]+ | ident";
    check(
        c,
        &[
            "int x;",
            "int = 1;",
            "x = int;",
            "{int  int;};",
            "integer = 2;",
        ],
        &["int;", "int x", "int = ;"],
    );
}

#[test]
fn alternatives_sharing_a_prefix_stay_apart() {
    check(
        "root ::= \"<\" body \">\"\nbody ::= \"a\" \"b\"* | \"ab\" \"c\" | \"(\" body \")\"",
        &["<a>", "<abbb>", "<abc>", "<(ab)>"],
        &["<abcc>", "<ac>"],
    );
}

/// Characters the random grammars and strings use: two ASCII letters and a two-byte one.
const ALPHABET: [char; 3] = ['a', 'b', 'é'];

#[test]
fn random_grammars_match_what_the_reference_matches() {
    let mut rng = Rng(0x5EED_6B4F);
    let strings = all_strings(4);
    let mut compared = 0;
    for _ in 0..150 {
        let gbnf = random_grammar(&mut rng);
        let grammar = parse(&gbnf).unwrap_or_else(|err| panic!("{gbnf:?}: {err}"));
        let compiled = match try_compile(&gbnf) {
            Ok(compiled) => compiled,
            Err(err) if err.contains("matches no string") => {
                let matched = strings.iter().find(|text| derives(&grammar, text));
                assert_eq!(matched, None, "{gbnf:?} was refused as matching nothing");
                continue;
            }
            Err(err) => panic!("{gbnf:?}: {err}"),
        };
        compared += 1;
        for text in &strings {
            let expected = derives(&grammar, text);
            let got = matches_whole(&compiled, text);
            assert_eq!(
                got.is_ok(),
                expected,
                "{gbnf:?} on {text:?}: the reference says {expected}, llguidance {got:?}\nLark:\n{}",
                super::super::gbnf_to_lark(&gbnf).unwrap_or_default()
            );
        }
    }
    assert!(
        compared > 100,
        "only {compared} random grammars match something"
    );
}

/// Every string of up to `len` characters of [`ALPHABET`].
fn all_strings(len: usize) -> Vec<String> {
    let mut all = vec![String::new()];
    let mut last = vec![String::new()];
    for _ in 0..len {
        last = last
            .iter()
            .flat_map(|s| ALPHABET.iter().map(move |c| format!("{s}{c}")))
            .collect();
        all.extend(last.iter().cloned());
    }
    all
}

/// A random grammar of up to three rules over [`ALPHABET`], recursion and all.
fn random_grammar(rng: &mut Rng) -> String {
    let names = ["root", "x", "y"];
    let rules = &names[..1 + rng.below(3)];
    rules
        .iter()
        .map(|name| format!("{name} ::= {}\n", alternatives(rng, rules, 0)))
        .collect()
}

fn alternatives(rng: &mut Rng, rules: &[&str], depth: usize) -> String {
    let options = if depth < 2 { 1 + rng.below(2) } else { 1 };
    (0..options)
        .map(|_| {
            let items = 1 + rng.below(3);
            (0..items)
                .map(|_| item(rng, rules, depth))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn item(rng: &mut Rng, rules: &[&str], depth: usize) -> String {
    const LITERALS: [&str; 7] = [
        "\"a\"", "\"b\"", "\"é\"", "\"ab\"", "\"ba\"", "\"aa\"", "\"\"",
    ];
    const CLASSES: [&str; 6] = ["[ab]", "[a]", "[^a]", "[a-b]", "[b-é]", "."];
    const REPEATS: [&str; 10] = ["", "", "", "*", "+", "?", "{2}", "{0,2}", "{1,3}", "{2,}"];
    let base = match rng.below(if depth < 2 { 8 } else { 6 }) {
        0 | 1 => LITERALS[rng.below(LITERALS.len())].to_string(),
        2 | 3 => CLASSES[rng.below(CLASSES.len())].to_string(),
        4 | 5 => rules[rng.below(rules.len())].to_string(),
        _ => format!("({})", alternatives(rng, rules, depth + 1)),
    };
    base + REPEATS[rng.below(REPEATS.len())]
}

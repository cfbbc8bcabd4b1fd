//! Large grammars convert in bounded time: those of a usual shape quickly, those whose
//! analysis would take too long are refused.

use std::time::{Duration, Instant};

use super::{check, compile};
use crate::gbnf::gbnf_to_lark;

#[test]
fn a_large_schema_like_grammar_converts_quickly() {
    let properties = 300;
    let names: Vec<String> = (0..properties).map(|i| format!("p{i}-kv")).collect();
    let mut gbnf = format!(
        "root ::= \"{{\" space {} \"}}\" space\n",
        names.join(" \",\" space ")
    );
    for (i, name) in names.iter().enumerate() {
        gbnf.push_str(&format!(
            "{name} ::= \"\\\"p{i}\\\"\" space \":\" space value\n"
        ));
    }
    gbnf.push_str(concat!(
        "value ::= string | [0-9]+ space | \"[\" space (value (\",\" space value)*)? \"]\" space | root\n",
        "string ::= \"\\\"\" [^\"\\\\]* \"\\\"\" space\n",
        "space ::= | \" \" | \"\\n\" [ \\t]{0,20}\n",
    ));
    let started = Instant::now();
    gbnf_to_lark(&gbnf).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let grammar = compile(&gbnf);
    let text: Vec<String> = (0..properties)
        .map(|i| format!("\"p{i}\": [{i}, \"x\"]"))
        .collect();
    let text = format!("{{{}}}", text.join(", "));
    crate::testing::matches_whole(&grammar, &text).unwrap();
}

#[test]
fn many_keyword_options_stay_one_lexeme() {
    let mut gbnf = String::from("root ::= (stmt \";\")*\nstmt ::= [a-z]+ \"=\" [0-9]+");
    for i in 0..3000 {
        gbnf.push_str(&format!(" | \"kw{i}\" \" \" [a-z]+"));
    }
    check(&gbnf, &["kw1 x;kw2999 y;a=1;"], &["kw3000 x;", "kw1x;"]);
}

#[test]
fn grammars_too_complex_to_analyse_are_refused() {
    // Thousands of keywords each followed by a recursive rule: thousands of lexemes
    // allowed together, whose pairs the analysis would check.
    let mut gbnf = String::from("root ::= (stmt \";\")*\nstmt ::= \"(\" stmt \")\"");
    for i in 0..3000 {
        gbnf.push_str(&format!(" | \"kw{i}\" \" \" stmt"));
    }
    let started = Instant::now();
    let err = gbnf_to_lark(&gbnf).unwrap_err();
    assert!(err.to_string().contains("too complex"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

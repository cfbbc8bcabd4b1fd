//! Each GBNF construct, converted, compiled and matched.

use super::{check, compile, compiler};
use crate::testing::{matches_whole, walk_bytes, EOS};
use crate::Constraint;

#[test]
fn literals_and_their_escapes() {
    check(
        r#"root ::= "a\n\t\r\\\"\[\]\-" "\x41\u00e9\U0001F600" "/.*""#,
        &["a\n\t\r\\\"[]-Aé😀/.*"],
        &["a", "a\n\t\r\\\"[]-Aé😀/.", "a\n\t\r\\\"[]-Aé😀/.*x"],
    );
    check(r#"root ::= "" "a" """#, &["a"], &["", "aa"]);
    check("root ::= \"line\nbreak\"", &["line\nbreak"], &["linebreak"]);
}

#[test]
fn classes_ranges_and_negation() {
    check(
        r"root ::= [a-cx] [^a-z\n] [\[\]\-\\] [ぁ-ゟ]",
        &["aA[ぁ", "xé]ゟ", "c--ぃ", "b\\\\ぁ"],
        &["dA[ぁ", "ab[ぁ", "a\n[ぁ", "aA^ぁ", "aA[a", "aA[ぁ "],
    );
    check(r"root ::= [,-.]+", &[",-.", "."], &["/", ""]);
    check(r"root ::= [a-]", &["a", "-"], &["b"]);
    check(r"root ::= [^^]", &["a"], &["^"]);
    // Reversed ranges and surrogates match nothing, as in llama.cpp.
    check(
        r#"root ::= [z-a] | [\uD800-\uDFFF] | "x""#,
        &["x"],
        &["a", "z", ""],
    );
}

#[test]
fn any_character() {
    check(
        "root ::= . .",
        &["ab", "\n\n", "é😀", "\0\u{10FFFF}"],
        &["a", "abc"],
    );
}

#[test]
fn groups_alternatives_and_empty_options() {
    check(
        r#"root ::= ("ab" | "c")+ "d" ( | "e")"#,
        &["abd", "cabcde", "ccd"],
        &["d", "abce", "ab", "ade"],
    );
    check(r#"root ::= | "a""#, &["", "a"], &["aa"]);
}

#[test]
fn repetitions() {
    check(
        r#"root ::= "a"* "b"+ "c"?"#,
        &["b", "aabbc", "bbb"],
        &["", "a", "bcc", "ab c"],
    );
    check(r#"root ::= "ab"{2}"#, &["abab"], &["ab", "ababab"]);
    check(r#"root ::= "a"{2,}"#, &["aa", "aaaaa"], &["a"]);
    check(r#"root ::= "a"{1,3} "b""#, &["ab", "aaab"], &["b", "aaaab"]);
    check(r#"root ::= "a"{,2} "b""#, &["b", "aab"], &["aaab"]);
    check(
        r#"root ::= "a"{ 0 , 1 } "b" "c"{0}"#,
        &["b", "ab"],
        &["abc"],
    );
    check(
        r#"root ::= ("a"{2})* "b""#,
        &["b", "aab", "aaaab"],
        &["ab", "aaab"],
    );
    check(r#"root ::= "a"*? "b""#, &["b", "aaab"], &["c"]);
}

#[test]
fn more_than_llama_cpp_counts_is_unbounded() {
    // llama.cpp repeats without bound where the most is above 2000.
    let many = "a".repeat(2100);
    check(r#"root ::= "a"{0,3000}"#, &[&many, ""], &["b"]);
}

#[test]
fn comments_line_breaks_and_continued_rules() {
    let gbnf = "# a comment\r\nroot ::= \"a\" | # after a bar\r\n  \"b\" ( # in a group\n  \"c\"\n  | \"d\" ) # end\n\n# done";
    check(gbnf, &["a", "bc", "bd"], &["b", "ac"]);
}

#[test]
fn rule_names_of_any_case_and_shape() {
    check(
        "root ::= Foo foo foo-bar foo_bar 1st start\nFoo ::= \"A\"\nfoo ::= \"b\"\nfoo-bar ::= \"c\"\nfoo_bar ::= \"d\"\n1st ::= \"e\"\nstart ::= \"f\"",
        &["Abcdef"],
        &["abcdef"],
    );
}

#[test]
fn later_definitions_replace_earlier_ones() {
    check("root ::= \"a\"\nroot ::= \"b\"", &["b"], &["a"]);
}

#[test]
fn recursive_rules() {
    check(
        r#"root ::= "(" root ")" | """#,
        &["", "()", "((()))"],
        &["(", "())", ")("],
    );
    check(r#"root ::= root "a" | "b""#, &["b", "baaa"], &["a", "ab"]);
    check(
        "root ::= list\nlist ::= item (\",\" item)*\nitem ::= [0-9]+ | \"[\" list \"]\"",
        &["1", "1,[2,[3]],45"],
        &["1,", "[1", "1,,2"],
    );
}

#[test]
fn token_ids_and_special_tokens() {
    let grammar = compile(r#"root ::= <[1]> "a" | <|im_start|> "b" | !<[1]> "c""#);
    let mut matcher = grammar.matcher();
    matcher.consume(&[1]).unwrap();
    walk_bytes(&mut matcher, "a").unwrap();
    assert!(matcher.mask().unwrap().allows(EOS));
    assert!(matches_whole(&grammar, "b").is_err());
    let mut matcher = grammar.matcher();
    assert!(matcher.mask().unwrap().allows(1));
    matcher.consume(&[3 + u32::from(b'x')]).unwrap();
    walk_bytes(&mut matcher, "c").unwrap();
    assert!(matcher.mask().unwrap().allows(EOS));
}

#[test]
fn unknown_special_tokens_fail_to_compile() {
    let err = compiler()
        .compile(&Constraint::Gbnf("root ::= <think> \"a\"".into()))
        .unwrap_err();
    assert!(err.to_string().contains("<think>"), "{err}");
}

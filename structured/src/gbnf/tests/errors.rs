//! Grammars that do not convert, and what their errors say.

use crate::gbnf::gbnf_to_lark;

/// Asserts that `gbnf` is refused with a message holding each of `parts`.
fn refused(gbnf: &str, parts: &[&str]) {
    let err = gbnf_to_lark(gbnf).expect_err(gbnf).to_string();
    for part in parts {
        assert!(err.contains(part), "{gbnf:?}: {err:?} lacks {part:?}");
    }
}

#[test]
fn syntax_errors_name_the_line_and_column() {
    refused(
        "root ::= \"abc",
        &["line 1, column 10", "unterminated string"],
    );
    refused(
        "root ::= [a-",
        &["line 1, column 10", "unterminated character class"],
    );
    refused(
        "root ::= \"a\"\nx ::= [b-c",
        &["line 2, column 7", "unterminated character class"],
    );
    refused(
        "root ::= []",
        &["line 1, column 10", "empty character class"],
    );
    refused(
        "root ::= [^]",
        &["line 1, column 10", "empty character class"],
    );
    refused(
        "root = \"a\"",
        &[
            "line 1, column 6",
            "expected `::=` after the rule name `root`",
        ],
    );
    refused(
        "::= \"a\"",
        &["line 1, column 1", "expected a rule name, found `:`"],
    );
    refused(
        "root ::= (\"a\"\n",
        &[
            "line 2, column 1",
            "expected `)` to close the group opened at line 1, column 10",
        ],
    );
    refused(
        "root ::= \"a\" )",
        &["line 1, column 14", "in rule `root`, found `)`"],
    );
    refused(
        "root ::= \"a\"\n  | \"b\"",
        &["line 2, column 3", "expected a rule name, found `|`"],
    );
    refused(
        "root ::= * \"a\"",
        &["line 1, column 10", "`*` must follow an item"],
    );
    refused(
        "root ::= \"\\q\"",
        &["line 1, column 11", "unknown escape `\\q`"],
    );
    refused(
        "root ::= \"\\x4\"",
        &["line 1, column 11", "expected 2 hex digits"],
    );
    refused(
        "root ::= \"\\uD800\"",
        &["line 1, column 11", "U+D800 is not a Unicode character"],
    );
    refused(
        "root ::= \"a\"{3,2}",
        &["line 1, column 13", "most is below its least"],
    );
    refused(
        "root ::= \"a\"{2001}",
        &["line 1, column 13", "more than the 2000"],
    );
    refused(
        "root ::= \"a\"{x}",
        &["line 1, column 14", "expected a number after `{`"],
    );
    refused(
        "root ::= \"a\"{1;}",
        &["line 1, column 15", "expected `,` or `}`"],
    );
    refused(
        "root ::= \"é\" \"\\",
        &["line 1, column 15", "unfinished escape"],
    );
}

#[test]
fn rules_must_be_defined_and_root_present() {
    refused(
        "root ::= item\n\nitem ::= thing",
        &[
            "line 3, column 10",
            "the rule `thing` is used but never defined",
        ],
    );
    refused("item ::= \"a\"", &["the grammar has no `root` rule"]);
    refused("# only a comment\n", &["no `root` rule"]);
    refused("", &["no `root` rule"]);
    refused(
        "root ::= \"a\" root",
        &["matches no string: rule `root` can never finish"],
    );
    refused("root ::= x | [z-a]\nx ::= x", &["matches no string"]);
}

#[test]
fn tokens_llguidance_cannot_express_are_refused() {
    refused(
        "root ::= !<think>",
        &[
            "line 1, column 10",
            "`!<think>` cannot be converted",
            "!<[1234]>",
        ],
    );
    refused(
        "root ::= <a b>",
        &["line 1, column 10", "the token `<a b>` cannot be converted"],
    );
    refused(
        "root ::= <[99999999999]>",
        &["line 1, column 12", "the token id 99999999999 is too large"],
    );
    refused(
        "root ::= <[x]>",
        &["line 1, column 12", "expected a token id"],
    );
    refused("root ::= <[1]", &["line 1, column 13", "expected `]>`"]);
    refused(
        "root ::= !x",
        &["line 1, column 11", "expected `<` after `!`"],
    );
    refused(
        "root ::= <think",
        &["line 1, column 10", "unterminated token"],
    );
}

#[test]
fn nesting_is_bounded() {
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(60), ")".repeat(60));
    refused(&deep, &["line 1, column 60", "nest more than 50 deep"]);
    let stacked = format!("root ::= \"a\"{}", "?".repeat(60));
    refused(&stacked, &["line 1, column 63", "nest more than 50 deep"]);
    let fine = format!("root ::= {}\"a\"{}", "(".repeat(40), ")".repeat(40));
    gbnf_to_lark(&fine).unwrap();
}

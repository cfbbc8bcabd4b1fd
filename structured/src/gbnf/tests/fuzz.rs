//! Random and broken grammars: the converter answers every one without panicking, and
//! whatever it converts compiles.

use super::{try_compile, Rng};
use crate::gbnf::gbnf_to_lark;

/// Grammars to cut and mutate.
const SEEDS: [&str; 4] = [
    "root ::= (expr \"=\" ws term \"\\n\")+\nexpr ::= term ([-+*/] term)*\nterm ::= [a-z] [a-z0-9_]* ws | [0-9]+ ws | \"(\" ws expr \")\" ws\nws ::= [ \\t\\n]*",
    "root ::= \"{\" ws (pair (\",\" ws pair)*)? \"}\"\npair ::= str \":\" ws value\nvalue ::= str | [0-9]{1,3} | root\nstr ::= \"\\\"\" [^\"\\\\\\x00-\\x1F]* \"\\\"\" ws\nws ::= | \" \" | \"\\n\" [ \\t]{0,20}",
    "# comment\nroot ::= <[1]> \"a\"{2,} !<[5]>* ( \"\\u00e9\" | [^a-c\\]] )? .\n",
    "root ::= x\nx ::= \"a\" x \"b\" | y\ny ::= [\\x00-\\U0010FFFF]{,3}",
];

/// Pieces random grammars are made of.
const PIECES: [&str; 34] = [
    "root", "x", " ::= ", "\"", "\"a\"", "[", "]", "^", "-", "(", ")", "|", "*", "+", "?", "{",
    "}", ",", "1", "2", "\\", "\\x", "\\u", "a", "\n", " ", "#", "<", ">", "!", ".", "é", "\r",
    "<[1]>",
];

/// Converts `gbnf`; where that succeeds, the Lark must compile (tokens aside: the tiny
/// tokenizer has few).
fn convert_and_compile(gbnf: &str) {
    if gbnf_to_lark(gbnf).is_ok() {
        if let Err(err) = try_compile(gbnf) {
            assert!(
                err.contains("special token") || err.contains("Token range"),
                "{gbnf:?} converted but did not compile: {err}"
            );
        }
    }
}

#[test]
fn cut_grammars_never_panic() {
    for seed in SEEDS {
        convert_and_compile(seed);
        for (end, _) in seed.char_indices() {
            convert_and_compile(&seed[..end]);
            convert_and_compile(&seed[end..]);
        }
    }
}

#[test]
fn mutated_grammars_never_panic() {
    let mut rng = Rng(0xB0B5_1EDD);
    for _ in 0..1500 {
        let seed = SEEDS[rng.below(SEEDS.len())];
        let mut chars: Vec<char> = seed.chars().collect();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(chars.len());
            let piece: Vec<char> = PIECES[rng.below(PIECES.len())].chars().collect();
            match rng.below(3) {
                0 => {
                    chars.remove(at);
                }
                1 => {
                    chars.splice(at..at, piece);
                }
                _ => {
                    chars.splice(at..at + 1, piece);
                }
            }
        }
        convert_and_compile(&chars.into_iter().collect::<String>());
    }
}

#[test]
fn random_text_never_panics() {
    let mut rng = Rng(0xFEED_F00D);
    for _ in 0..3000 {
        let pieces = 1 + rng.below(24);
        let text: String = (0..pieces)
            .map(|_| PIECES[rng.below(PIECES.len())])
            .collect();
        convert_and_compile(&format!("root ::= {text}"));
        convert_and_compile(&text);
    }
}

//! The GBNF converter's tests: grammars converted, compiled over the tiny byte-level
//! tokenizer, and walked byte by byte.

mod constructs;
mod errors;
mod exactness;
mod fuzz;
mod reference;
mod scale;
mod shipped;

use std::sync::{Arc, OnceLock};

use crate::testing::{matches_whole, tiny_compiler};
use crate::{CompiledGrammar, Constraint, GrammarCompiler};

/// The compiler all these tests share.
fn compiler() -> &'static GrammarCompiler {
    static COMPILER: OnceLock<GrammarCompiler> = OnceLock::new();
    COMPILER.get_or_init(tiny_compiler)
}

/// `gbnf` converted and compiled; the error names the Lark text that did not compile.
fn try_compile(gbnf: &str) -> Result<Arc<CompiledGrammar>, String> {
    let lark = super::gbnf_to_lark(gbnf).map_err(|err| err.to_string())?;
    compiler()
        .compile(&Constraint::Gbnf(gbnf.to_string()))
        .map(|(grammar, _)| grammar)
        .map_err(|err| format!("{err}\nin the Lark grammar:\n{lark}"))
}

/// `gbnf` converted and compiled.
fn compile(gbnf: &str) -> Arc<CompiledGrammar> {
    try_compile(gbnf).unwrap_or_else(|err| panic!("{gbnf:?} did not compile: {err}"))
}

/// Checks that `gbnf` matches each of `accepted` and none of `rejected`.
fn check(gbnf: &str, accepted: &[&str], rejected: &[&str]) {
    let grammar = compile(gbnf);
    let lark = super::gbnf_to_lark(gbnf).unwrap_or_default();
    for text in accepted {
        if let Err(err) = matches_whole(&grammar, text) {
            panic!("{gbnf:?} rejects {text:?}: {err}\nLark:\n{lark}");
        }
    }
    for text in rejected {
        assert!(
            matches_whole(&grammar, text).is_err(),
            "{gbnf:?} accepts {text:?}\nLark:\n{lark}"
        );
    }
}

/// A small deterministic pseudo-random generator (xorshift64*) for the randomized tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (above zero).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

//! llama.cpp's GBNF grammars converted to llguidance's Lark syntax.
//!
//! GBNF matches character by character; llguidance splits a grammar into lexemes (its
//! terminals, matched by regexes, greedily) and an Earley parser over them. The conversion
//! keeps GBNF's language exactly: it plans lexemes as large as possible (a regular rule or
//! node, a run of regular items, is one lexeme, which lexes fast; see [`plan`]), then
//! splits every
//! lexeme where greedy lexing could end a lexeme elsewhere than GBNF allows, until none
//! can (see [`conflicts`]). The rest stays Earley rules, which match any context-free
//! language exactly.

mod automaton;
mod chars;
mod conflicts;
mod emit;
mod follow;
mod fuel;
mod lark;
mod names;
mod parser;
mod plan;
mod productive;
mod regular;
mod syntax;
#[cfg(test)]
mod tests;

use fuel::Fuel;
use names::Names;
use regular::Regular;

/// The work the conversion may do (see [`fuel`]).
const FUEL: u64 = 50_000_000;

/// A GBNF grammar that cannot be converted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GbnfError(pub String);

/// The Lark grammar of `gbnf`, which matches the same strings.
pub fn gbnf_to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let grammar = parser::parse(gbnf)?;
    productive::check_root(&grammar)?;
    let regular = Regular::of(&grammar);
    let mut names = Names::of(&grammar);
    let mut split = vec![false; grammar.nodes];
    let mut fuel = Fuel::new(FUEL);
    loop {
        let plan = plan::plan(&grammar, &regular, &split, &names);
        let mut more = false;
        for lexeme in conflicts::conflicting(&plan, &grammar, &mut fuel)? {
            for &node in &plan.lexemes[lexeme].splits {
                more |= !std::mem::replace(&mut split[node], true);
            }
        }
        if !more {
            return Ok(emit::emit(&plan, &grammar, &mut names));
        }
    }
}

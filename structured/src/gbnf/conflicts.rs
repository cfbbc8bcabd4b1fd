//! Finding the lexemes whose greedy lexing could reject what GBNF accepts.
//!
//! llguidance lexes greedily: while any lexeme the parser allows can go on with the next
//! byte, the lexeme being read does not end. GBNF matches character by character, so a
//! string is lost where a lexeme `a` has read a word, the grammar lets the next lexeme
//! start with the next character, and some lexeme `b` allowed alongside `a` could go on
//! with it. The lexemes allowed together are over-approximated: those that may follow one
//! same lexeme (or start the grammar), together with those that may follow lexemes which
//! match one same string there (the parser then goes on from all of them). A conflict
//! splits `b` (or `a`, when `b` is `a`) into smaller lexemes; a grammar of single
//! characters has none, so splitting ends.

use std::collections::{BTreeSet, HashMap, HashSet};

use toktrie::SimpleVob;

use super::automaton::{Automaton, TooLarge};
use super::follow::Follow;
use super::fuel::Fuel;
use super::plan::Plan;
use super::syntax::Grammar;
use super::GbnfError;

/// The lexemes of `plan` to split: those in a conflict, or too large to analyse.
pub fn conflicting(
    plan: &Plan,
    grammar: &Grammar,
    fuel: &mut Fuel,
) -> Result<Vec<usize>, GbnfError> {
    let mut automata = Vec::with_capacity(plan.lexemes.len());
    let mut too_large = Vec::new();
    for (index, lexeme) in plan.lexemes.iter().enumerate() {
        automata.push(match Automaton::of(&lexeme.kind, grammar) {
            None => None,
            Some(Ok(automaton)) => {
                // All automata are kept for the whole analysis: their size costs more.
                fuel.burn(10 * automaton.size())?;
                Some(automaton)
            }
            Some(Err(TooLarge)) => {
                too_large.push(index);
                None
            }
        });
    }
    if !too_large.is_empty() {
        return Ok(too_large);
    }
    let nullable: Vec<bool> = automata
        .iter()
        .map(|a| a.as_ref().is_some_and(|a| a.nullable))
        .collect();
    let follow = Follow::of(plan, &nullable, fuel)?;
    let leads = |of: fn(&Automaton) -> SimpleVob| -> Vec<SimpleVob> {
        automata
            .iter()
            .map(|a| a.as_ref().map_or_else(|| SimpleVob::alloc(256), of))
            .collect()
    };
    let lexemes = Lexemes {
        first_leads: leads(Automaton::first_leads),
        all_leads: leads(Automaton::all_leads),
        automata,
    };
    let together = allowed_together(&follow, &lexemes, fuel)?;
    let mut split = BTreeSet::new();
    for (a, automaton) in lexemes.automata.iter().enumerate() {
        let Some(automaton) = automaton else { continue };
        let mut next = SimpleVob::alloc(256);
        for m in follow.lexemes[a].iter() {
            next.or(&lexemes.first_leads[m as usize]);
        }
        if next.is_zero() {
            continue;
        }
        fuel.burn(together[a].num_set())?;
        for b in together[a].iter().map(|b| b as usize) {
            let Some(other) = &lexemes.automata[b] else {
                continue;
            };
            let may_share_start = !lexemes.first_leads[a].and_is_zero(&lexemes.first_leads[b]);
            if may_share_start
                && !lexemes.all_leads[b].and_is_zero(&next)
                && automaton.runs_on(other, &next, fuel)?
            {
                split.insert(b);
            }
        }
    }
    Ok(split.into_iter().collect())
}

/// The lexemes of a plan, as the analysis sees them.
struct Lexemes {
    /// By lexeme: its automaton (`None`: a token).
    automata: Vec<Option<Automaton>>,
    /// By lexeme: the lead bytes of its first characters.
    first_leads: Vec<SimpleVob>,
    /// By lexeme: the lead bytes of all its characters.
    all_leads: Vec<SimpleVob>,
}

impl Lexemes {
    /// Whether lexemes `a` and `b` may both match one string there: a non-empty word
    /// both have, the empty string if both match it, or any token for two tokens.
    fn share(&self, a: usize, b: usize, fuel: &mut Fuel) -> Result<bool, GbnfError> {
        fuel.burn(1)?;
        Ok(match (&self.automata[a], &self.automata[b]) {
            (None, None) => true,
            (Some(x), Some(y)) => {
                (x.nullable && y.nullable)
                    || (!self.first_leads[a].and_is_zero(&self.first_leads[b])
                        && x.overlaps(y, fuel)?)
            }
            _ => false,
        })
    }
}

/// By lexeme: the lexemes that may be allowed at a position where it is (itself among them).
fn allowed_together(
    follow: &Follow,
    lexemes: &Lexemes,
    fuel: &mut Fuel,
) -> Result<Vec<SimpleVob>, GbnfError> {
    let width = follow.lexemes.len();
    let mut contexts: Vec<SimpleVob> = vec![follow.start.clone()];
    contexts.extend(follow.lexemes.iter().cloned());
    let mut seen: HashSet<SimpleVob> = contexts.iter().cloned().collect();
    let mut next = 0;
    while next < contexts.len() {
        let members: Vec<usize> = contexts[next].iter().map(|m| m as usize).collect();
        next += 1;
        fuel.burn(members.len() * members.len())?;
        // Group the lexemes that may match one same string (transitively).
        let mut group: Vec<usize> = (0..members.len()).collect();
        for i in 0..members.len() {
            for j in i + 1..members.len() {
                let (gi, gj) = (root(&group, i), root(&group, j));
                if gi != gj && lexemes.share(members[i], members[j], fuel)? {
                    group[gj] = gi;
                }
            }
        }
        let mut unions: HashMap<usize, (usize, SimpleVob)> = HashMap::new();
        for (i, &m) in members.iter().enumerate() {
            let (count, set) = unions
                .entry(root(&group, i))
                .or_insert_with(|| (0, SimpleVob::alloc(width)));
            *count += 1;
            set.or(&follow.lexemes[m]);
        }
        for (count, set) in unions.into_values() {
            if count > 1 && seen.insert(set.clone()) {
                contexts.push(set);
            }
        }
    }
    fuel.burn(width * (1 + width / 32))?;
    let mut together: Vec<SimpleVob> = (0..width)
        .map(|m| {
            let mut set = SimpleVob::alloc(width);
            set.set(m, true);
            set
        })
        .collect();
    for context in &contexts {
        fuel.burn(context.num_set() * (1 + width / 32))?;
        for m in context.iter() {
            together[m as usize].or(context);
        }
    }
    Ok(together)
}

/// The representative of `i`'s group.
fn root(group: &[usize], mut i: usize) -> usize {
    while group[i] != i {
        i = group[i];
    }
    i
}

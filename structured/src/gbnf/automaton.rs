//! A lexeme's language as a Glushkov automaton over character sets (one state per
//! character position, no empty moves), and the two questions the analysis asks of pairs
//! of them: do they share a word, and can one run on past a word of the other.
//!
//! Long counted repetitions are widened (`x{m,n}` to `x{min(m,K),}` past `K` copies), so an
//! automaton may accept more than its lexeme: the analysis then finds more conflicts, never
//! fewer. An automaton too large to build is refused ([`TooLarge`]).

use std::collections::HashSet;

use toktrie::SimpleVob;

use super::chars::CharSet;
use super::fuel::Fuel;
use super::plan::LexemeKind;
use super::syntax::{Grammar, Kind, Node};
use super::GbnfError;

/// How many copies of a repeated item are made before the repetition is widened.
const MAX_COPIES: u32 = 8;
/// The most positions an automaton may have.
const MAX_POSITIONS: usize = 1 << 16;
/// The most follow edges an automaton may have.
const MAX_EDGES: usize = 1 << 20;

/// A lexeme's language was too large to analyse.
#[derive(Debug)]
pub struct TooLarge;

/// A Glushkov automaton: position `p` matches one character of `sets[p]`.
#[derive(Debug)]
pub struct Automaton {
    sets: Vec<CharSet>,
    /// The lead bytes of each position's characters.
    leads: Vec<SimpleVob>,
    /// The positions that may come after each position.
    follow: Vec<Vec<usize>>,
    /// The positions a word may start at.
    first: Vec<usize>,
    /// Whether a word may end at each position.
    last: Vec<bool>,
    /// Whether the empty string is a word.
    pub nullable: bool,
    /// How many follow edges there are.
    edges: usize,
}

/// The positions a fragment starts and ends at, and whether it matches the empty string.
struct Fragment {
    first: Vec<usize>,
    last: Vec<usize>,
    nullable: bool,
}

impl Fragment {
    fn empty() -> Fragment {
        Fragment {
            first: Vec::new(),
            last: Vec::new(),
            nullable: true,
        }
    }
}

impl Automaton {
    /// The automaton of a text lexeme (`None` for a token).
    pub fn of(kind: &LexemeKind, grammar: &Grammar) -> Option<Result<Automaton, TooLarge>> {
        let mut automaton = Automaton {
            sets: Vec::new(),
            leads: Vec::new(),
            follow: Vec::new(),
            first: Vec::new(),
            last: Vec::new(),
            nullable: false,
            edges: 0,
        };
        let fragment = match kind {
            LexemeKind::Token => return None,
            LexemeKind::Char(c) => automaton.position(CharSet::single(*c)),
            LexemeKind::Seq(nodes) => nodes.iter().try_fold(Fragment::empty(), |done, node| {
                let next = automaton.node(node, grammar)?;
                automaton.concat(done, next)
            }),
            LexemeKind::Alt(nodes) => automaton.union(nodes.iter().copied(), grammar),
        };
        Some(fragment.map(|fragment| automaton.finish(fragment)))
    }

    /// The lead bytes of the characters a word may start with.
    pub fn first_leads(&self) -> SimpleVob {
        let mut leads = SimpleVob::alloc(256);
        for &p in &self.first {
            leads.or(&self.leads[p]);
        }
        leads
    }

    /// The lead bytes of all its characters.
    pub fn all_leads(&self) -> SimpleVob {
        let mut leads = SimpleVob::alloc(256);
        for lead in &self.leads {
            leads.or(lead);
        }
        leads
    }

    /// How large it is: positions and edges.
    pub fn size(&self) -> usize {
        self.sets.len() + self.edges
    }

    /// Whether the two languages share a non-empty word.
    pub fn overlaps(&self, other: &Automaton, fuel: &mut Fuel) -> Result<bool, GbnfError> {
        self.pairs(other, fuel, |p, q| self.last[p] && other.last[q])
    }

    /// Whether a non-empty word of `self`, followed by a character whose first byte is in
    /// `next`, is a prefix of a word of `other` (as bytes): a lexer reading `other` greedily
    /// would then run past the end of `self`'s word.
    pub fn runs_on(
        &self,
        other: &Automaton,
        next: &SimpleVob,
        fuel: &mut Fuel,
    ) -> Result<bool, GbnfError> {
        self.pairs(other, fuel, |p, q| {
            self.last[p]
                && other.follow[q]
                    .iter()
                    .any(|&r| !other.leads[r].and_is_zero(next))
        })
    }

    /// Walks the pairs of positions the two automata reach on one same non-empty word;
    /// whether `stop` held for one of them.
    fn pairs(
        &self,
        other: &Automaton,
        fuel: &mut Fuel,
        mut stop: impl FnMut(usize, usize) -> bool,
    ) -> Result<bool, GbnfError> {
        let mut seen = HashSet::new();
        let mut todo = Vec::new();
        let mut visit = |p: usize, q: usize, todo: &mut Vec<(usize, usize)>| {
            if self.sets[p].intersects(&other.sets[q]) && seen.insert((p, q)) {
                todo.push((p, q));
            }
        };
        for &p in &self.first {
            for &q in &other.first {
                visit(p, q, &mut todo);
            }
        }
        while let Some((p, q)) = todo.pop() {
            fuel.burn(1 + self.follow[p].len() * other.follow[q].len())?;
            if stop(p, q) {
                return Ok(true);
            }
            for &p2 in &self.follow[p] {
                for &q2 in &other.follow[q] {
                    visit(p2, q2, &mut todo);
                }
            }
        }
        Ok(false)
    }

    fn node(&mut self, node: &Node, grammar: &Grammar) -> Result<Fragment, TooLarge> {
        match &node.kind {
            Kind::Empty | Kind::Token(_) => Ok(Fragment::empty()),
            Kind::Chars(set) => self.position(set.clone()),
            Kind::Literal(chars) => chars.iter().try_fold(Fragment::empty(), |done, &c| {
                let next = self.position(CharSet::single(c))?;
                self.concat(done, next)
            }),
            Kind::Ref(rule) => self.node(&grammar.rules[*rule].body, grammar),
            Kind::Seq(nodes) => nodes.iter().try_fold(Fragment::empty(), |done, node| {
                let next = self.node(node, grammar)?;
                self.concat(done, next)
            }),
            Kind::Alt(nodes) => self.union(nodes, grammar),
            Kind::Repeat { inner, min, max } => {
                let (copies, optional, unbounded) = match *max {
                    Some(max) if max <= MAX_COPIES => (*min, max - min, false),
                    _ => ((*min).min(MAX_COPIES), 0, true),
                };
                let mut done = Fragment::empty();
                for _ in 0..copies {
                    let next = self.node(inner, grammar)?;
                    done = self.concat(done, next)?;
                }
                for _ in 0..optional {
                    let mut next = self.node(inner, grammar)?;
                    next.nullable = true;
                    done = self.concat(done, next)?;
                }
                if unbounded {
                    let mut next = self.node(inner, grammar)?;
                    self.link(&next.last, &next.first)?;
                    next.nullable = true;
                    done = self.concat(done, next)?;
                }
                Ok(done)
            }
        }
    }

    /// One of `nodes`.
    fn union<'n>(
        &mut self,
        nodes: impl IntoIterator<Item = &'n Node>,
        grammar: &Grammar,
    ) -> Result<Fragment, TooLarge> {
        let mut union = Fragment {
            nullable: false,
            ..Fragment::empty()
        };
        for node in nodes {
            let option = self.node(node, grammar)?;
            union.first.extend(option.first);
            union.last.extend(option.last);
            union.nullable |= option.nullable;
        }
        Ok(union)
    }

    /// A new position matching one character of `set`.
    fn position(&mut self, set: CharSet) -> Result<Fragment, TooLarge> {
        let p = self.sets.len();
        if p == MAX_POSITIONS {
            return Err(TooLarge);
        }
        self.leads.push(set.lead_bytes());
        self.sets.push(set);
        self.follow.push(Vec::new());
        Ok(Fragment {
            first: vec![p],
            last: vec![p],
            nullable: false,
        })
    }

    /// `a` then `b`.
    fn concat(&mut self, a: Fragment, b: Fragment) -> Result<Fragment, TooLarge> {
        self.link(&a.last, &b.first)?;
        let mut first = a.first;
        if a.nullable {
            first.extend(&b.first);
        }
        let mut last = b.last;
        if b.nullable {
            last.extend(a.last);
        }
        Ok(Fragment {
            first,
            last,
            nullable: a.nullable && b.nullable,
        })
    }

    /// Lets each position of `to` follow each of `from`.
    fn link(&mut self, from: &[usize], to: &[usize]) -> Result<(), TooLarge> {
        self.edges += from.len() * to.len();
        if self.edges > MAX_EDGES {
            return Err(TooLarge);
        }
        for &p in from {
            self.follow[p].extend(to);
        }
        Ok(())
    }

    fn finish(mut self, fragment: Fragment) -> Automaton {
        for follow in &mut self.follow {
            follow.sort_unstable();
            follow.dedup();
        }
        self.last = vec![false; self.sets.len()];
        for &p in &fragment.last {
            self.last[p] = true;
        }
        self.first = fragment.first;
        self.first.sort_unstable();
        self.first.dedup();
        self.nullable = fragment.nullable;
        self
    }
}

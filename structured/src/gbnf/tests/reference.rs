//! A reference matcher for the tests: whether a parsed GBNF grammar derives a string,
//! character by character, as llama.cpp matches it (a fixpoint of the spans each rule
//! derives, so left recursion is fine).

use std::collections::BTreeSet;

use crate::gbnf::chars::CharSet;
use crate::gbnf::syntax::{Grammar, Kind, Node};

/// Whether `grammar` derives all of `text`.
pub fn derives(grammar: &Grammar, text: &str) -> bool {
    let chars: Vec<char> = text.chars().collect();
    let mut spans = Spans {
        chars: &chars,
        ends: vec![vec![BTreeSet::new(); chars.len() + 1]; grammar.rules.len()],
    };
    loop {
        let mut changed = false;
        for (rule, definition) in grammar.rules.iter().enumerate() {
            for start in 0..=chars.len() {
                let ends = spans.ends_of(&definition.body, start);
                if ends != spans.ends[rule][start] {
                    spans.ends[rule][start] = ends;
                    changed = true;
                }
            }
        }
        if !changed {
            return spans.ends_of(&grammar.start, 0).contains(&chars.len());
        }
    }
}

/// What each rule is known to derive: by rule and start, the ends of its spans.
struct Spans<'a> {
    chars: &'a [char],
    ends: Vec<Vec<BTreeSet<usize>>>,
}

impl Spans<'_> {
    /// Where `node` may end when it starts at `start`, as far as the rules are known.
    fn ends_of(&self, node: &Node, start: usize) -> BTreeSet<usize> {
        let rest = &self.chars[start..];
        match &node.kind {
            Kind::Empty => BTreeSet::from([start]),
            Kind::Chars(set) => match rest.first() {
                Some(&c) if set.intersects(&CharSet::single(c)) => BTreeSet::from([start + 1]),
                _ => BTreeSet::new(),
            },
            Kind::Literal(chars) if rest.starts_with(chars) => {
                BTreeSet::from([start + chars.len()])
            }
            Kind::Literal(_) | Kind::Token(_) => BTreeSet::new(),
            Kind::Ref(rule) => self.ends[*rule][start].clone(),
            Kind::Seq(nodes) => nodes.iter().fold(BTreeSet::from([start]), |at, node| {
                at.iter().flat_map(|&p| self.ends_of(node, p)).collect()
            }),
            Kind::Alt(nodes) => nodes.iter().flat_map(|n| self.ends_of(n, start)).collect(),
            Kind::Repeat { inner, min, max } => {
                let step = |at: &BTreeSet<usize>| -> BTreeSet<usize> {
                    at.iter().flat_map(|&p| self.ends_of(inner, p)).collect()
                };
                let mut reached = BTreeSet::from([start]);
                for _ in 0..*min {
                    reached = step(&reached);
                }
                let mut ends = reached.clone();
                match max {
                    Some(max) => {
                        for _ in *min..*max {
                            reached = step(&reached);
                            ends.extend(&reached);
                        }
                    }
                    // Any number more: the closure of what one more repetition reaches.
                    None => {
                        while !reached.is_empty() {
                            let next = step(&reached);
                            reached = next.difference(&ends).copied().collect();
                            ends.extend(&reached);
                        }
                    }
                }
                ends
            }
        }
    }
}

//! Lark names for a grammar's rules and terminals: Lark tells rules (lowercase) from
//! terminals (uppercase) by case, and GBNF names may hold either case and start with a
//! digit, so each GBNF rule gets a lowercase and an uppercase name of its own, unique.

use std::collections::HashSet;

use super::syntax::Grammar;

/// The names used in one Lark grammar.
#[derive(Clone, Debug)]
pub struct Names {
    /// Each GBNF rule's name as a Lark rule, by rule index.
    pub rules: Vec<String>,
    /// Each GBNF rule's name as a Lark terminal, by rule index.
    pub terminals: Vec<String>,
    taken: HashSet<String>,
}

impl Names {
    /// Names for `grammar`'s rules; `start`, the Lark grammar's own start, is kept free.
    pub fn of(grammar: &Grammar) -> Names {
        let mut names = Names {
            rules: Vec::new(),
            terminals: Vec::new(),
            taken: HashSet::from(["start".to_string()]),
        };
        for rule in &grammar.rules {
            let rule_name = names.fresh(&rule.name.to_ascii_lowercase(), "r");
            names.rules.push(rule_name);
            let terminal = names.fresh(&rule.name.to_ascii_uppercase(), "T");
            names.terminals.push(terminal);
        }
        names
    }

    /// A new terminal name based on `base` (a GBNF rule name).
    pub fn fresh_terminal(&mut self, base: &str) -> String {
        self.fresh(&base.to_ascii_uppercase(), "T")
    }

    /// `base` made a Lark identifier (it must start with a letter: else `prefix-` goes
    /// first) and made unique with a `-n` suffix.
    fn fresh(&mut self, base: &str, prefix: &str) -> String {
        let base = if base.starts_with(|c: char| c.is_ascii_alphabetic()) {
            base.to_string()
        } else {
            format!("{prefix}-{base}")
        };
        let mut name = base.clone();
        let mut n = 1;
        while !self.taken.insert(name.clone()) {
            n += 1;
            name = format!("{base}-{n}");
        }
        name
    }
}

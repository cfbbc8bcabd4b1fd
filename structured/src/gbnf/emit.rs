//! Writing a planned grammar as Lark: `start`, the rules, then the terminals: the lexemes
//! that are not one regex or name, and the regular GBNF rules the lexemes use.

use super::lark::{terminal, Lark};
use super::names::Names;
use super::plan::{Item, LexemeKind, Plan};
use super::syntax::{Grammar, Kind, Node};

/// The Lark text of `plan`.
pub fn emit(plan: &Plan, grammar: &Grammar, names: &mut Names) -> String {
    let mut terminals = Vec::new();
    let lexemes: Vec<String> = plan
        .lexemes
        .iter()
        .map(|lexeme| {
            if lexeme.atomic {
                return lexeme.text.clone();
            }
            let name = names.fresh_terminal(&grammar.rules[lexeme.home].name);
            terminals.push(format!("{name}: {}", lexeme.text));
            name
        })
        .collect();
    let writer = Writer {
        plan,
        names,
        lexemes: &lexemes,
    };
    let mut out = format!("start: {}\n", writer.item(&plan.start).into_text());
    for rule in &plan.rules {
        let body = writer.item(&rule.body).into_text();
        out.push_str(&format!("{}: {body}\n", names.rules[rule.rule]));
    }
    for line in terminals {
        out.push_str(&line);
        out.push('\n');
    }
    for rule in used_rules(plan, grammar) {
        let body = terminal(&grammar.rules[rule].body, names).into_text();
        out.push_str(&format!("{}: {body}\n", names.terminals[rule]));
    }
    out
}

/// Writes items, with the lexemes' texts as rules use them.
struct Writer<'a> {
    plan: &'a Plan<'a>,
    names: &'a Names,
    lexemes: &'a [String],
}

impl Writer<'_> {
    fn item(&self, item: &Item) -> Lark {
        match item {
            Item::Empty => Lark::empty(),
            Item::Lexeme(lexeme) => Lark::atom(self.lexemes[*lexeme].clone()),
            Item::Rule(rule) => Lark::atom(self.names.rules[self.plan.rules[*rule].rule].clone()),
            Item::Seq(items) => Lark::seq(items.iter().map(|i| self.item(i)).collect()),
            Item::Alt(items) => Lark::alt(items.iter().map(|i| self.item(i)).collect()),
            Item::Repeat { inner, min, max } => Lark::repeat(self.item(inner), *min, *max),
        }
    }
}

/// The GBNF rules the lexemes use as terminals, directly or through one another, each once.
fn used_rules(plan: &Plan, grammar: &Grammar) -> Vec<usize> {
    let mut used = vec![false; grammar.rules.len()];
    let mut order = Vec::new();
    let mut todo: Vec<&Node> = plan
        .lexemes
        .iter()
        .flat_map(|lexeme| match &lexeme.kind {
            LexemeKind::Seq(nodes) | LexemeKind::Alt(nodes) => nodes.clone(),
            LexemeKind::Char(_) | LexemeKind::Token => Vec::new(),
        })
        .collect();
    while let Some(node) = todo.pop() {
        if let Kind::Ref(rule) = node.kind {
            if !used[rule] {
                used[rule] = true;
                order.push(rule);
                todo.push(&grammar.rules[rule].body);
            }
        }
        todo.extend(node.children());
    }
    order.sort_unstable();
    order
}

//! The Lark grammar planned for a GBNF grammar: which parts become lexemes (llguidance
//! terminals, matched by regexes) and which stay grammar rules.
//!
//! Lexemes are as large as the grammar allows: a regular node is one lexeme, and so are
//! each run of regular items in a sequence that is not regular, and the regular options
//! of an alternative that is not regular, together. A node marked split is planned one
//! level finer instead: a sequence's items, an alternative's options, a repetition's item,
//! a literal's characters, or a rule's body as a grammar rule. The analysis
//! ([`super::conflicts`]) marks the lexemes whose greedy lexing could differ from GBNF's
//! matching.

use std::collections::HashMap;

use super::lark::{literal_regex, terminal, token_text, Lark};
use super::names::Names;
use super::regular::Regular;
use super::syntax::{Grammar, Kind, Node, NodeId};

/// A planned Lark grammar.
#[derive(Debug)]
pub struct Plan<'g> {
    /// The body of Lark's `start` rule (which stands for GBNF's `root`).
    pub start: Item,
    /// The GBNF rules kept as grammar rules.
    pub rules: Vec<PlannedRule>,
    /// The lexemes, each once.
    pub lexemes: Vec<Lexeme<'g>>,
}

/// A GBNF rule kept as a Lark rule.
#[derive(Debug)]
pub struct PlannedRule {
    /// The GBNF rule's index.
    pub rule: usize,
    /// Its body.
    pub body: Item,
}

/// A part of a Lark rule's body.
#[derive(Debug)]
pub enum Item {
    /// The empty string.
    Empty,
    /// The lexeme of this index.
    Lexeme(usize),
    /// The planned rule of this index.
    Rule(usize),
    /// Each item in turn.
    Seq(Vec<Item>),
    /// One of the items.
    Alt(Vec<Item>),
    /// `inner` from `min` to `max` times (`None`: unbounded).
    Repeat {
        inner: Box<Item>,
        min: u32,
        max: Option<u32>,
    },
}

/// One lexeme.
#[derive(Debug)]
pub struct Lexeme<'g> {
    /// Its Lark terminal expansion, which also tells lexemes apart.
    pub text: String,
    /// Whether `text` is one regex or name, which a rule may use as it is.
    pub atomic: bool,
    /// What it matches.
    pub kind: LexemeKind<'g>,
    /// The GBNF rule it was first planned in (to name it).
    pub home: usize,
    /// The nodes to mark split to break it into smaller lexemes (none for one character).
    pub splits: Vec<NodeId>,
}

/// What a lexeme matches.
#[derive(Debug)]
pub enum LexemeKind<'g> {
    /// The nodes' strings, one after another.
    Seq(Vec<&'g Node>),
    /// One of the nodes' strings.
    Alt(Vec<&'g Node>),
    /// One character of a split literal.
    Char(char),
    /// A token.
    Token,
}

/// Plans `grammar`, finer at the nodes `split` marks (by node id).
pub fn plan<'g>(
    grammar: &'g Grammar,
    regular: &Regular,
    split: &[bool],
    names: &Names,
) -> Plan<'g> {
    let mut planner = Planner {
        grammar,
        regular,
        split,
        names,
        lexemes: Vec::new(),
        by_text: HashMap::new(),
        rules: Vec::new(),
        planned: vec![None; grammar.rules.len()],
    };
    let start = planner.item(&grammar.start, grammar.root);
    let mut next = 0;
    while next < planner.rules.len() {
        let rule = planner.rules[next].rule;
        planner.rules[next].body = planner.body(rule);
        next += 1;
    }
    Plan {
        start,
        rules: planner.rules,
        lexemes: planner.lexemes,
    }
}

struct Planner<'g, 'a> {
    grammar: &'g Grammar,
    regular: &'a Regular,
    split: &'a [bool],
    names: &'a Names,
    lexemes: Vec<Lexeme<'g>>,
    by_text: HashMap<String, usize>,
    rules: Vec<PlannedRule>,
    /// Each GBNF rule's planned rule, once it has one.
    planned: Vec<Option<usize>>,
}

impl<'g> Planner<'g, '_> {
    /// The body of the GBNF rule `rule`, planned as a Lark rule's: split where its body
    /// node is marked split (a reference to it was split).
    fn body(&mut self, rule: usize) -> Item {
        let grammar: &'g Grammar = self.grammar;
        self.item(&grammar.rules[rule].body, rule)
    }

    /// `node` (in the GBNF rule `home`) as an item of a Lark rule.
    fn item(&mut self, node: &'g Node, home: usize) -> Item {
        let whole = self.whole(node);
        match &node.kind {
            Kind::Empty => Item::Empty,
            Kind::Token(token) => {
                self.lexeme(token_text(token), LexemeKind::Token, home, Vec::new())
            }
            _ if whole => self.node_lexeme(node, home),
            Kind::Chars(_) => self.node_lexeme(node, home),
            Kind::Literal(chars) => Item::Seq(
                chars
                    .iter()
                    .map(|&c| {
                        self.lexeme(literal_regex(&[c]), LexemeKind::Char(c), home, Vec::new())
                    })
                    .collect(),
            ),
            Kind::Ref(rule) => Item::Rule(self.rule(*rule)),
            Kind::Seq(nodes) if self.regular.nodes[node.id] => {
                Item::Seq(nodes.iter().map(|n| self.item(n, home)).collect())
            }
            Kind::Seq(nodes) => self.runs(node, nodes, home),
            Kind::Alt(nodes) if self.split[node.id] => {
                Item::Alt(nodes.iter().map(|n| self.item(n, home)).collect())
            }
            Kind::Alt(nodes) => self.options(node, nodes, home),
            Kind::Repeat { inner, min, max } => Item::Repeat {
                inner: Box::new(self.item(inner, home)),
                min: *min,
                max: *max,
            },
        }
    }

    /// Whether `node` is regular and not marked split: one lexeme as a whole.
    fn whole(&self, node: &Node) -> bool {
        self.regular.nodes[node.id] && !self.split[node.id]
    }

    /// A sequence that is not regular: each run of whole items one lexeme (unless the
    /// sequence is marked split), the other items planned one by one.
    fn runs(&mut self, seq: &'g Node, nodes: &'g [Node], home: usize) -> Item {
        let merge = !self.split[seq.id];
        let mut items = Vec::new();
        let mut run: Vec<&'g Node> = Vec::new();
        for node in nodes {
            if merge && self.whole(node) {
                run.push(node);
                continue;
            }
            if !run.is_empty() {
                items.push(self.group(std::mem::take(&mut run), seq, home, false));
            }
            items.push(self.item(node, home));
        }
        if !run.is_empty() {
            items.push(self.group(run, seq, home, false));
        }
        Item::Seq(items)
    }

    /// An alternative that is not regular, not marked split: its whole options together
    /// one lexeme, the other options planned one by one.
    fn options(&mut self, alt: &'g Node, nodes: &'g [Node], home: usize) -> Item {
        let (whole, other): (Vec<&'g Node>, Vec<&'g Node>) =
            nodes.iter().partition(|node| self.whole(node));
        let mut options = Vec::new();
        if !whole.is_empty() {
            options.push(self.group(whole, alt, home, true));
        }
        options.extend(other.into_iter().map(|node| self.item(node, home)));
        Item::Alt(options)
    }

    /// The whole nodes `nodes` of `parent`, one after another or (`alternatives`) one of
    /// them, as one lexeme which splitting `parent` breaks up; a lone node as it plans
    /// itself.
    fn group(
        &mut self,
        mut nodes: Vec<&'g Node>,
        parent: &'g Node,
        home: usize,
        alternatives: bool,
    ) -> Item {
        if nodes.len() == 1 {
            return self.item(nodes.remove(0), home);
        }
        let parts = nodes.iter().map(|n| terminal(n, self.names)).collect();
        let (text, kind) = if alternatives {
            (Lark::alt(parts), LexemeKind::Alt(nodes))
        } else {
            (Lark::seq(parts), LexemeKind::Seq(nodes))
        };
        self.lexeme(text.into_text(), kind, home, vec![parent.id])
    }

    /// The regular node `node` as one lexeme.
    fn node_lexeme(&mut self, node: &'g Node, home: usize) -> Item {
        let splits = match &node.kind {
            Kind::Chars(_) => Vec::new(),
            Kind::Literal(chars) if chars.len() == 1 => Vec::new(),
            Kind::Ref(rule) => vec![node.id, self.grammar.rules[*rule].body.id],
            _ => vec![node.id],
        };
        let text = terminal(node, self.names).into_text();
        self.lexeme(text, LexemeKind::Seq(vec![node]), home, splits)
    }

    /// The lexeme `text`, added unless it is known; its nodes to split are added to.
    fn lexeme(
        &mut self,
        text: String,
        kind: LexemeKind<'g>,
        home: usize,
        splits: Vec<NodeId>,
    ) -> Item {
        if let Some(&index) = self.by_text.get(&text) {
            self.lexemes[index].splits.extend(splits);
            return Item::Lexeme(index);
        }
        let atomic = match &kind {
            LexemeKind::Seq(nodes) => matches!(
                nodes[..],
                [Node {
                    kind: Kind::Chars(_) | Kind::Literal(_) | Kind::Ref(_),
                    ..
                }]
            ),
            LexemeKind::Alt(_) => false,
            LexemeKind::Char(_) | LexemeKind::Token => true,
        };
        let index = self.lexemes.len();
        self.by_text.insert(text.clone(), index);
        self.lexemes.push(Lexeme {
            text,
            atomic,
            kind,
            home,
            splits,
        });
        Item::Lexeme(index)
    }

    /// The planned rule of the GBNF rule `rule`, planned later if it is new.
    fn rule(&mut self, rule: usize) -> usize {
        if let Some(index) = self.planned[rule] {
            return index;
        }
        let index = self.rules.len();
        self.rules.push(PlannedRule {
            rule,
            body: Item::Empty,
        });
        self.planned[rule] = Some(index);
        index
    }
}

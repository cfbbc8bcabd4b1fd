//! A parsed GBNF grammar: its rules' bodies as trees of nodes, each with an id by which the
//! converter marks the nodes it splits into smaller lexemes.

use super::chars::CharSet;

/// A node's id: its index among the grammar's nodes.
pub type NodeId = usize;

/// A parsed GBNF grammar.
#[derive(Clone, Debug)]
pub struct Grammar {
    /// The rules, by the order their names first appear.
    pub rules: Vec<Rule>,
    /// The index of `root`, the grammar's start.
    pub root: usize,
    /// A reference to `root`.
    pub start: Node,
    /// How many nodes the grammar has (ids are below this).
    pub nodes: usize,
}

/// One rule: `name ::= body`.
#[derive(Clone, Debug)]
pub struct Rule {
    /// The rule's GBNF name.
    pub name: String,
    /// What the rule matches.
    pub body: Node,
}

/// One node of a rule's body.
#[derive(Clone, Debug)]
pub struct Node {
    /// The node's id, unique in the grammar.
    pub id: NodeId,
    /// What the node matches.
    pub kind: Kind,
}

/// What a node matches.
#[derive(Clone, Debug)]
pub enum Kind {
    /// The empty string.
    Empty,
    /// One character of a set: a class `[...]` or `.`.
    Chars(CharSet),
    /// A string literal's characters (at least one).
    Literal(Vec<char>),
    /// The rule of this index.
    Ref(usize),
    /// One token of the tokenizer.
    Token(Token),
    /// Each node in turn.
    Seq(Vec<Node>),
    /// One of the nodes.
    Alt(Vec<Node>),
    /// `inner` from `min` to `max` times (no `max`: unbounded); never exactly once, never
    /// at most zero times.
    Repeat {
        inner: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

/// A token reference, which matches one whole token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    /// `<[id]>`: the token of this id.
    Id(u32),
    /// `!<[id]>`: any token but this one.
    NotId(u32),
    /// `<text>`: the special token spelled `text` (with its angle brackets).
    Named(String),
}

impl Node {
    /// The node's children.
    pub fn children(&self) -> &[Node] {
        match &self.kind {
            Kind::Seq(nodes) | Kind::Alt(nodes) => nodes,
            Kind::Repeat { inner, .. } => std::slice::from_ref(inner),
            _ => &[],
        }
    }
}

//! Whether the grammar matches any string at all: where `root` can never finish (every
//! way through it recurses for ever, or needs a character class that holds none), the
//! grammar matches nothing, and is refused.

use super::syntax::{Grammar, Kind, Node};
use super::GbnfError;

/// An error where `grammar`'s `root` derives no string.
pub fn check_root(grammar: &Grammar) -> Result<(), GbnfError> {
    let mut productive = vec![false; grammar.rules.len()];
    loop {
        let mut changed = false;
        for (rule, definition) in grammar.rules.iter().enumerate() {
            if !productive[rule] && derives(&definition.body, &productive) {
                productive[rule] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    if derives(&grammar.start, &productive) {
        Ok(())
    } else {
        Err(GbnfError(
            "the grammar matches no string: rule `root` can never finish".into(),
        ))
    }
}

/// Whether `node` derives some string, given the rules known to.
fn derives(node: &Node, productive: &[bool]) -> bool {
    match &node.kind {
        Kind::Empty | Kind::Literal(_) | Kind::Token(_) => true,
        Kind::Chars(set) => !set.is_empty(),
        Kind::Ref(rule) => productive[*rule],
        Kind::Seq(nodes) => nodes.iter().all(|n| derives(n, productive)),
        Kind::Alt(nodes) => nodes.iter().any(|n| derives(n, productive)),
        Kind::Repeat { inner, min, .. } => *min == 0 || derives(inner, productive),
    }
}

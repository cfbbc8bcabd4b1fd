//! Which rules and nodes are regular: match a regular language, so that they can become
//! llguidance terminals (regexes). A rule is regular when it is on no reference cycle, uses
//! no tokens, uses only regular rules, and inlining them nests at most [`MAX_HEIGHT`] deep.

use super::syntax::{Grammar, Kind, Node};

/// How deeply a regular rule's body may nest, rules it uses inlined; deeper rules are kept
/// as grammar rules (which bounds the recursion of whatever walks a terminal).
const MAX_HEIGHT: usize = 64;

/// The regular nodes of a grammar.
#[derive(Clone, Debug)]
pub struct Regular {
    /// By node id.
    pub nodes: Vec<bool>,
}

impl Regular {
    /// Classifies `grammar`'s nodes.
    pub fn of(grammar: &Grammar) -> Regular {
        let uses: Vec<Vec<usize>> = grammar
            .rules
            .iter()
            .map(|rule| {
                let mut used = Vec::new();
                refs(&rule.body, &mut used);
                used
            })
            .collect();
        let mut rules = vec![false; grammar.rules.len()];
        let mut heights = vec![0; grammar.rules.len()];
        for component in components(&uses) {
            let [rule] = component[..] else {
                continue; // a cycle of several rules
            };
            let body = &grammar.rules[rule].body;
            if uses[rule].contains(&rule) || has_token(body) {
                continue;
            }
            if uses[rule].iter().all(|&used| rules[used]) {
                let inlined = uses[rule].iter().map(|&used| heights[used]).max();
                heights[rule] = height(body) + inlined.unwrap_or(0);
                rules[rule] = heights[rule] <= MAX_HEIGHT;
            }
        }
        let mut nodes = vec![false; grammar.nodes];
        for rule in &grammar.rules {
            mark_nodes(&rule.body, &rules, &mut nodes);
        }
        mark_nodes(&grammar.start, &rules, &mut nodes);
        Regular { nodes }
    }
}

/// Marks the regular nodes of `node`'s tree; returns whether `node` is regular.
fn mark_nodes(node: &Node, rules: &[bool], nodes: &mut [bool]) -> bool {
    let mut regular = match &node.kind {
        Kind::Token(_) => false,
        Kind::Ref(rule) => rules[*rule],
        _ => true,
    };
    for child in node.children() {
        regular &= mark_nodes(child, rules, nodes);
    }
    nodes[node.id] = regular;
    regular
}

/// Adds the rules `node` refers to to `used`.
fn refs(node: &Node, used: &mut Vec<usize>) {
    if let Kind::Ref(rule) = node.kind {
        used.push(rule);
    }
    for child in node.children() {
        refs(child, used);
    }
}

fn has_token(node: &Node) -> bool {
    matches!(node.kind, Kind::Token(_)) || node.children().iter().any(has_token)
}

/// The height of `node`'s tree.
fn height(node: &Node) -> usize {
    1 + node.children().iter().map(height).max().unwrap_or(0)
}

/// The strongly connected components of the graph `edges` (Tarjan's algorithm, without
/// recursion), each after every component it reaches.
fn components(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let count = edges.len();
    let mut index: Vec<Option<usize>> = vec![None; count];
    let mut low = vec![0; count];
    let mut on_stack = vec![false; count];
    let mut stack = Vec::new();
    let mut found = Vec::new();
    let mut next = 0;
    for root in 0..count {
        if index[root].is_some() {
            continue;
        }
        let mut calls = vec![(root, 0)];
        index[root] = Some(next);
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut edge)) = calls.last_mut() {
            if let Some(&w) = edges[v].get(*edge) {
                *edge += 1;
                match index[w] {
                    None => {
                        index[w] = Some(next);
                        low[w] = next;
                        next += 1;
                        stack.push(w);
                        on_stack[w] = true;
                        calls.push((w, 0));
                    }
                    Some(w_index) if on_stack[w] => low[v] = low[v].min(w_index),
                    Some(_) => {}
                }
                continue;
            }
            calls.pop();
            if let Some(&(u, _)) = calls.last() {
                low[u] = low[u].min(low[v]);
            }
            if Some(low[v]) == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                found.push(component);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_come_after_those_they_reach() {
        // 0 -> 1 <-> 2 -> 3, 4 alone
        let edges = vec![vec![1], vec![2], vec![1, 3], vec![], vec![]];
        let mut found = components(&edges);
        for component in &mut found {
            component.sort_unstable();
        }
        assert_eq!(found, [vec![3], vec![1, 2], vec![0], vec![4]]);
    }

    #[test]
    fn recursive_rules_and_their_users_are_not_regular() {
        let grammar = super::super::parser::parse(
            "root ::= list \"!\"\nlist ::= item | item \",\" list\nitem ::= [a-z]+ ws\nws ::= \" \"?",
        )
        .unwrap();
        let regular = Regular::of(&grammar);
        let bodies: Vec<bool> = grammar
            .rules
            .iter()
            .map(|r| regular.nodes[r.body.id])
            .collect();
        assert_eq!(bodies, [false, false, true, true]);
        assert!(!regular.nodes[grammar.start.id]);
    }
}

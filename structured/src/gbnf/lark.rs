//! Writing Lark expressions: regexes for characters and literals, and sequences,
//! alternatives and repetitions parenthesized as Lark's precedence needs.

use std::fmt::Write;

use super::chars::CharSet;
use super::names::Names;
use super::syntax::{Kind, Node, Token};

/// How tightly an expression's text binds, loosest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Binding {
    Alternatives,
    Sequence,
    Repeated,
    Atom,
}

/// A Lark expression's text.
#[derive(Clone, Debug)]
pub struct Lark {
    text: String,
    binding: Binding,
}

impl Lark {
    /// A name, string or regex.
    pub fn atom(text: String) -> Lark {
        Lark {
            text,
            binding: Binding::Atom,
        }
    }

    /// The empty string.
    pub fn empty() -> Lark {
        Lark::atom("\"\"".into())
    }

    /// `parts` one after another.
    pub fn seq(parts: Vec<Lark>) -> Lark {
        Lark::join(parts, " ", Binding::Sequence)
    }

    /// One of `parts`.
    pub fn alt(parts: Vec<Lark>) -> Lark {
        Lark::join(parts, " | ", Binding::Alternatives)
    }

    /// `inner` from `min` to `max` times (`None`: unbounded); `max` is above zero.
    pub fn repeat(inner: Lark, min: u32, max: Option<u32>) -> Lark {
        let suffix = match (min, max) {
            (0, None) => "*".to_string(),
            (1, None) => "+".to_string(),
            (0, Some(1)) => "?".to_string(),
            (min, None) => format!("{{{min},}}"),
            (min, Some(max)) if min == max => format!("{{{min}}}"),
            (min, Some(max)) => format!("{{{min},{max}}}"),
        };
        Lark {
            text: inner.wrapped(Binding::Atom) + &suffix,
            binding: Binding::Repeated,
        }
    }

    /// The text.
    pub fn into_text(self) -> String {
        self.text
    }

    fn join(mut parts: Vec<Lark>, separator: &str, binding: Binding) -> Lark {
        match parts.len() {
            0 => Lark::empty(),
            1 => parts.remove(0),
            _ => Lark {
                text: parts
                    .into_iter()
                    .map(|part| part.wrapped(binding))
                    .collect::<Vec<_>>()
                    .join(separator),
                binding,
            },
        }
    }

    /// The text, in parentheses if it binds less tightly than `needed`.
    fn wrapped(self, needed: Binding) -> String {
        if self.binding < needed {
            format!("({})", self.text)
        } else {
            self.text
        }
    }
}

/// A regular node in Lark's terminal syntax, the rules it uses by their terminal names.
pub fn terminal(node: &Node, names: &Names) -> Lark {
    match &node.kind {
        Kind::Empty => Lark::empty(),
        Kind::Chars(set) => Lark::atom(class_regex(set)),
        Kind::Literal(chars) => Lark::atom(literal_regex(chars)),
        Kind::Ref(rule) => Lark::atom(names.terminals[*rule].clone()),
        Kind::Token(token) => Lark::atom(token_text(token)),
        Kind::Seq(nodes) => Lark::seq(nodes.iter().map(|n| terminal(n, names)).collect()),
        Kind::Alt(nodes) => Lark::alt(nodes.iter().map(|n| terminal(n, names)).collect()),
        Kind::Repeat { inner, min, max } => Lark::repeat(terminal(inner, names), *min, *max),
    }
}

/// A token reference in Lark's syntax.
pub fn token_text(token: &Token) -> String {
    match token {
        Token::Id(id) => format!("<[{id}]>"),
        Token::NotId(id) => format!("<[^{id}]>"),
        Token::Named(text) => text.clone(),
    }
}

/// A regex matching exactly `chars`.
pub fn literal_regex(chars: &[char]) -> String {
    let mut regex = String::from("/");
    for &c in chars {
        push_char(&mut regex, c);
    }
    regex.push('/');
    regex
}

/// A regex matching one character of `set`.
pub fn class_regex(set: &CharSet) -> String {
    if set.is_any() {
        return "/(?s:.)/".into();
    }
    let ranges: Vec<(char, char)> = set.ranges().collect();
    if let [(lo, hi)] = ranges[..] {
        if lo == hi {
            return literal_regex(&[lo]);
        }
    }
    let complement: Vec<(char, char)> = set.complement().ranges().collect();
    // An empty set is the complement of every character.
    let (negated, ranges) = if ranges.is_empty() || complement.len() <= ranges.len() {
        (true, complement)
    } else {
        (false, ranges)
    };
    let mut regex = String::from(if negated { "/[^" } else { "/[" });
    for (lo, hi) in ranges {
        push_char(&mut regex, lo);
        if hi != lo {
            if u32::from(hi) != u32::from(lo) + 1 {
                regex.push('-');
            }
            push_char(&mut regex, hi);
        }
    }
    regex.push_str("]/");
    regex
}

/// Adds `c` to a regex (inside or outside a class) as a literal character: escaped where
/// it is a regex operator, as `\x{..}` where it is `/` (which ends a Lark regex), a
/// control or other invisible character.
fn push_char(regex: &mut String, c: char) {
    match c {
        '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$'
        | '#' | '&' | '-' | '~' => {
            regex.push('\\');
            regex.push(c);
        }
        '/' => regex.push_str("\\x{2F}"),
        c if c.is_ascii_graphic() || c == ' ' || (!c.is_ascii() && c.is_alphanumeric()) => {
            regex.push(c)
        }
        c => {
            // Writing to a String cannot fail.
            let _ = write!(regex, "\\x{{{:X}}}", u32::from(c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_are_parenthesized_by_binding() {
        let a = || Lark::atom("a".into());
        let ab = Lark::alt(vec![a(), Lark::seq(vec![a(), a()])]);
        assert_eq!(ab.clone().into_text(), "a | a a");
        let seq = Lark::seq(vec![ab.clone(), a()]);
        assert_eq!(seq.into_text(), "(a | a a) a");
        let twice = Lark::repeat(Lark::repeat(a(), 0, None), 2, Some(3));
        assert_eq!(twice.into_text(), "(a*){2,3}");
        assert_eq!(Lark::repeat(a(), 4, None).into_text(), "a{4,}");
        assert_eq!(Lark::repeat(a(), 4, Some(4)).into_text(), "a{4}");
        assert_eq!(Lark::seq(Vec::new()).into_text(), "\"\"");
    }

    #[test]
    fn regexes_escape_what_they_must() {
        assert_eq!(
            literal_regex(&['a', '/', '.', '\n', 'é', '"']),
            r#"/a\x{2F}\.\x{A}é"/"#
        );
        let json_char = CharSet::from_ranges([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]);
        assert_eq!(
            class_regex(&json_char.complement()),
            r#"/[^\x{0}-\x{1F}"\\\x{7F}]/"#
        );
        assert_eq!(class_regex(&CharSet::from_ranges([(0x61, 0x62)])), "/[ab]/");
        assert_eq!(class_regex(&CharSet::any()), "/(?s:.)/");
        assert_eq!(class_regex(&CharSet::single('-')), r"/\-/");
    }
}

//! The GBNF parser: llama.cpp's grammar language (its `grammars/README.md` and its parser in
//! `llama-grammar.cpp`) read into a [`Grammar`], with errors that name the line and column.
//!
//! As in llama.cpp: a rule ends at a line break unless inside parentheses or right after
//! `|`; a later definition of a rule replaces an earlier one; `{m,n}` with `n` above 2000
//! is unbounded and `m` above 2000 is refused. Beyond llama.cpp, rule names may hold `_`
//! (as its README says) and `{,n}` means `{0,n}`. Token references `<[id]>`, `!<[id]>` and
//! `<text>` are read; `!<text>` is refused, as llguidance can only negate token ids.

use std::collections::HashMap;

use super::chars::CharSet;
use super::syntax::{Grammar, Kind, Node, Rule, Token};
use super::GbnfError;

/// The most repetitions llama.cpp allows (`MAX_REPETITION_THRESHOLD`).
const MAX_REPETITIONS: u64 = 2000;
/// How deeply groups and stacked repetition operators may nest.
const MAX_DEPTH: usize = 50;

/// Parses `text` as a GBNF grammar whose start is the rule `root`.
pub fn parse(text: &str) -> Result<Grammar, GbnfError> {
    let mut parser = Parser {
        text,
        pos: 0,
        nodes: 0,
        depth: 0,
        symbols: HashMap::new(),
        names: Vec::new(),
        first_use: Vec::new(),
        bodies: Vec::new(),
    };
    parser.skip_space(true);
    while parser.peek().is_some() {
        parser.rule()?;
    }
    parser.finish()
}

struct Parser<'a> {
    text: &'a str,
    /// The byte offset of the next character.
    pos: usize,
    /// How many nodes were made.
    nodes: usize,
    /// How many groups and stacked repetitions enclose the current item.
    depth: usize,
    symbols: HashMap<String, usize>,
    names: Vec<String>,
    /// Where each rule name first appears.
    first_use: Vec<usize>,
    bodies: Vec<Option<Node>>,
}

impl<'a> Parser<'a> {
    /// `name ::= alternatives` and the line break (or end) after it.
    fn rule(&mut self) -> Result<(), GbnfError> {
        let start = self.pos;
        let name = self.name()?;
        let id = self.symbol(name, start);
        self.skip_space(false);
        if !self.rest().starts_with("::=") {
            return Err(self.error_here(format!(
                "expected `::=` after the rule name `{name}`, found {}",
                self.found()
            )));
        }
        self.pos += 3;
        self.skip_space(true);
        let body = self.alternatives(false)?;
        match self.peek() {
            None => {}
            Some('\n') => self.pos += 1,
            Some('\r') => {
                self.pos += 1;
                if self.peek() == Some('\n') {
                    self.pos += 1;
                }
            }
            Some(_) => {
                return Err(self.error_here(format!(
                    "expected another item, `|` or the end of the line in rule `{name}`, found {}",
                    self.found()
                )))
            }
        }
        self.bodies[id] = Some(body);
        self.skip_space(true);
        Ok(())
    }

    /// Sequences separated by `|`. Outside parentheses (`nested` false) a line break ends
    /// them, except right after `|`.
    fn alternatives(&mut self, nested: bool) -> Result<Node, GbnfError> {
        let mut options = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.skip_space(true);
            options.push(self.sequence(nested)?);
        }
        Ok(if options.len() == 1 {
            options.remove(0)
        } else {
            self.node(Kind::Alt(options))
        })
    }

    /// Items, each followed by any repetition operators, until something that is no item.
    fn sequence(&mut self, nested: bool) -> Result<Node, GbnfError> {
        let mut items: Vec<Node> = Vec::new();
        let mut stacked = 0;
        loop {
            let start = self.pos;
            let item = match self.peek() {
                Some('"') => self.literal()?,
                Some('[') => self.class()?,
                Some('<' | '!') => self.token()?,
                Some('.') => {
                    self.pos += 1;
                    self.node(Kind::Chars(CharSet::any()))
                }
                Some('(') => self.group()?,
                Some(c) if is_name_char(c) => {
                    let name = self.name()?;
                    let id = self.symbol(name, start);
                    self.node(Kind::Ref(id))
                }
                Some(op @ ('*' | '+' | '?' | '{')) => {
                    let (min, max) = self.repetition(op)?;
                    let Some(inner) = items.pop() else {
                        return Err(
                            self.error_at(start, format!("`{op}` must follow an item to repeat"))
                        );
                    };
                    stacked += 1;
                    if self.depth + stacked > MAX_DEPTH {
                        return Err(self.error_at(start, too_deep()));
                    }
                    items.push(self.repeat(inner, min, max));
                    self.skip_space(nested);
                    continue;
                }
                _ => break,
            };
            stacked = 0;
            items.push(item);
            self.skip_space(nested);
        }
        Ok(match items.len() {
            0 => self.node(Kind::Empty),
            1 => items.remove(0),
            _ => self.node(Kind::Seq(items)),
        })
    }

    /// `( alternatives )`, over any number of lines.
    fn group(&mut self) -> Result<Node, GbnfError> {
        let open = self.pos;
        self.pos += 1;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error_at(open, too_deep()));
        }
        self.skip_space(true);
        let inner = self.alternatives(true)?;
        if self.peek() != Some(')') {
            let (line, column) = self.line_column(open);
            return Err(self.error_here(format!(
                "expected `)` to close the group opened at line {line}, column {column}, found {}",
                self.found()
            )));
        }
        self.pos += 1;
        self.depth -= 1;
        Ok(inner)
    }

    /// `"..."`: its characters, escapes decoded.
    fn literal(&mut self) -> Result<Node, GbnfError> {
        let open = self.pos;
        self.pos += 1;
        let mut chars = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.error_at(open, "unterminated string literal".into())),
                Some('"') => break,
                Some(_) => {
                    let at = self.pos;
                    let code = self.char()?;
                    let c = char::from_u32(code).ok_or_else(|| {
                        self.error_at(at, format!("U+{code:X} is not a Unicode character"))
                    })?;
                    chars.push(c);
                }
            }
        }
        self.pos += 1;
        Ok(self.node(if chars.is_empty() {
            Kind::Empty
        } else {
            Kind::Literal(chars)
        }))
    }

    /// `[...]` or `[^...]`: single characters and ranges `a-z`.
    fn class(&mut self) -> Result<Node, GbnfError> {
        let open = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.error_at(open, "unterminated character class".into())),
                Some(']') => break,
                Some(_) => {
                    let lo = self.char()?;
                    let rest = self.rest();
                    let hi = if rest.starts_with('-') && !rest[1..].starts_with(']') {
                        self.pos += 1;
                        if self.peek().is_none() {
                            return Err(self.error_at(open, "unterminated character class".into()));
                        }
                        self.char()?
                    } else {
                        lo
                    };
                    ranges.push((lo, hi));
                }
            }
        }
        if ranges.is_empty() {
            return Err(self.error_at(open, "empty character class".into()));
        }
        self.pos += 1;
        let set = CharSet::from_ranges(ranges);
        Ok(self.node(Kind::Chars(if negated { set.complement() } else { set })))
    }

    /// `<[id]>`, `<text>`, or either after `!`.
    fn token(&mut self) -> Result<Node, GbnfError> {
        let start = self.pos;
        let negated = self.peek() == Some('!');
        if negated {
            self.pos += 1;
            if self.peek() != Some('<') {
                return Err(
                    self.error_here(format!("expected `<` after `!`, found {}", self.found()))
                );
            }
        }
        self.pos += 1;
        let token = if self.peek() == Some('[') {
            self.pos += 1;
            let at = self.pos;
            let digits = self.digits();
            let id = digits.as_deref().and_then(|d| d.parse::<u32>().ok());
            let Some(id) = id else {
                return Err(match digits {
                    Some(d) => self.error_at(at, format!("the token id {d} is too large")),
                    None => self.error_here(format!("expected a token id, found {}", self.found())),
                });
            };
            if !self.rest().starts_with("]>") {
                return Err(self.error_here(format!(
                    "expected `]>` after the token id, found {}",
                    self.found()
                )));
            }
            self.pos += 2;
            if negated {
                Token::NotId(id)
            } else {
                Token::Id(id)
            }
        } else {
            let Some(len) = self.rest().find('>') else {
                return Err(self.error_at(start, "unterminated token `<...>`".into()));
            };
            let text = &self.text[self.pos - 1..self.pos + len + 1];
            self.pos += len + 1;
            if negated {
                return Err(self.error_at(
                    start,
                    format!("`!{text}` cannot be converted: llguidance negates tokens by id only, as in `!<[1234]>`"),
                ));
            }
            let inner = &text[1..text.len() - 1];
            if inner.is_empty() || inner.contains(|c: char| c == '<' || c.is_whitespace()) {
                return Err(self.error_at(
                    start,
                    format!("the token `{text}` cannot be converted: llguidance names special tokens without blanks or `<` inside"),
                ));
            }
            Token::Named(text.to_string())
        };
        Ok(self.node(Kind::Token(token)))
    }

    /// The bounds of the repetition operator `op` (`*`, `+`, `?` or `{...}`), consumed.
    fn repetition(&mut self, op: char) -> Result<(u32, Option<u32>), GbnfError> {
        self.pos += 1;
        let bounds = match op {
            '*' => (0, None),
            '+' => (1, None),
            '?' => (0, Some(1)),
            _ => return self.counted(),
        };
        Ok(bounds)
    }

    /// The rest of `{m}`, `{m,}`, `{m,n}` or `{,n}` after its `{`.
    fn counted(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        let start = self.pos - 1;
        self.skip_space(true);
        let min = match self.count() {
            Some(min) => min,
            None if self.peek() == Some(',') => 0,
            None => {
                return Err(self.error_here(format!(
                    "expected a number after `{{`, found {}",
                    self.found()
                )))
            }
        };
        self.skip_space(true);
        let max = match self.peek() {
            Some('}') => Some(min),
            Some(',') => {
                self.pos += 1;
                self.skip_space(true);
                let max = self.count();
                self.skip_space(true);
                if self.peek() != Some('}') {
                    return Err(self.error_here(format!("expected `}}`, found {}", self.found())));
                }
                max
            }
            _ => {
                return Err(self.error_here(format!(
                    "expected `,` or `}}` in the repetition, found {}",
                    self.found()
                )))
            }
        };
        self.pos += 1;
        if min > MAX_REPETITIONS {
            return Err(self.error_at(
                start,
                format!("{min} repetitions are more than the {MAX_REPETITIONS} llama.cpp allows"),
            ));
        }
        // llama.cpp repeats without bound where the most exceeds its threshold.
        let max = max.filter(|&max| max <= MAX_REPETITIONS);
        if max.is_some_and(|max| max < min) {
            return Err(self.error_at(start, "the repetition's most is below its least".into()));
        }
        // Both fit: they are at most MAX_REPETITIONS.
        let narrow = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        Ok((narrow(min), max.map(narrow)))
    }

    /// A decimal number, saturating; `None` without digits.
    fn count(&mut self) -> Option<u64> {
        let digits = self.digits()?;
        Some(digits.parse().unwrap_or(u64::MAX))
    }

    /// The run of ASCII digits here, consumed; `None` if there is none.
    fn digits(&mut self) -> Option<String> {
        let len = self.rest().bytes().take_while(u8::is_ascii_digit).count();
        let digits = &self.text[self.pos..self.pos + len];
        self.pos += len;
        (len > 0).then(|| digits.to_string())
    }

    /// One character of a literal or class, with escapes, as a code point.
    fn char(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        let Some(c) = self.peek() else {
            return Err(self.error_here("unexpected end of the grammar".into()));
        };
        self.pos += c.len_utf8();
        if c != '\\' {
            return Ok(c.into());
        }
        let Some(e) = self.peek() else {
            return Err(self.error_at(start, "unfinished escape at the end of the grammar".into()));
        };
        self.pos += e.len_utf8();
        let simple = match e {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            '\\' | '"' | '[' | ']' | '-' => e,
            'x' => return self.hex(start, 2),
            'u' => return self.hex(start, 4),
            'U' => return self.hex(start, 8),
            _ => return Err(self.error_at(start, format!("unknown escape `\\{e}`"))),
        };
        Ok(simple.into())
    }

    /// The `digits` hex digits of an escape that began at `start`.
    fn hex(&mut self, start: usize, digits: usize) -> Result<u32, GbnfError> {
        let hex: String = self.rest().chars().take(digits).collect();
        if hex.len() != digits || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.error_at(start, format!("expected {digits} hex digits in the escape")));
        }
        self.pos += digits;
        // At most 8 hex digits: they fit in 32 bits.
        Ok(u32::from_str_radix(&hex, 16).unwrap_or(u32::MAX))
    }

    /// A rule name: letters, digits, `-` and `_`.
    fn name(&mut self) -> Result<&'a str, GbnfError> {
        let text: &'a str = self.text;
        let len = self
            .rest()
            .find(|c| !is_name_char(c))
            .unwrap_or(self.rest().len());
        if len == 0 {
            return Err(self.error_here(format!("expected a rule name, found {}", self.found())));
        }
        let name = &text[self.pos..self.pos + len];
        self.pos += len;
        Ok(name)
    }

    /// The index of the rule `name`, first mentioned at `at` if it is new.
    fn symbol(&mut self, name: &str, at: usize) -> usize {
        if let Some(&id) = self.symbols.get(name) {
            return id;
        }
        let id = self.names.len();
        self.symbols.insert(name.to_string(), id);
        self.names.push(name.to_string());
        self.first_use.push(at);
        self.bodies.push(None);
        id
    }

    /// Blanks and `#` comments; line breaks too where `newlines`.
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    let len = self.rest().find(['\r', '\n']).unwrap_or(self.rest().len());
                    self.pos += len;
                }
                _ => break,
            }
        }
    }

    /// The grammar, once every rule used is defined and `root` is.
    fn finish(self) -> Result<Grammar, GbnfError> {
        if let Some(id) = self.bodies.iter().position(Option::is_none) {
            return Err(self.error_at(
                self.first_use[id],
                format!("the rule `{}` is used but never defined", self.names[id]),
            ));
        }
        let root = *self
            .symbols
            .get("root")
            .ok_or_else(|| GbnfError("the grammar has no `root` rule".into()))?;
        let rules = self
            .names
            .into_iter()
            .zip(self.bodies.into_iter().flatten())
            .map(|(name, body)| Rule { name, body })
            .collect();
        let start = Node {
            id: self.nodes,
            kind: Kind::Ref(root),
        };
        Ok(Grammar {
            rules,
            root,
            start,
            nodes: self.nodes + 1,
        })
    }

    /// `inner` repeated from `min` to `max` times, simplified where that is trivial.
    fn repeat(&mut self, inner: Node, min: u32, max: Option<u32>) -> Node {
        match (&inner.kind, min, max) {
            (Kind::Empty, _, _) | (_, _, Some(0)) => self.node(Kind::Empty),
            (_, 1, Some(1)) => inner,
            _ => self.node(Kind::Repeat {
                inner: Box::new(inner),
                min,
                max,
            }),
        }
    }

    fn node(&mut self, kind: Kind) -> Node {
        self.nodes += 1;
        Node {
            id: self.nodes - 1,
            kind,
        }
    }

    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    /// What is at the current position, in words.
    fn found(&self) -> String {
        match self.peek() {
            None => "the end of the grammar".into(),
            Some('\n' | '\r') => "a line break".into(),
            Some(c) => format!("`{}`", c.escape_debug()),
        }
    }

    /// The 1-based line and column (in characters) of the byte offset `at`.
    fn line_column(&self, at: usize) -> (usize, usize) {
        let before = &self.text[..at];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        (
            before.matches('\n').count() + 1,
            before[line_start..].chars().count() + 1,
        )
    }

    fn error_at(&self, at: usize, message: String) -> GbnfError {
        let (line, column) = self.line_column(at);
        GbnfError(format!("line {line}, column {column}: {message}"))
    }

    fn error_here(&self, message: String) -> GbnfError {
        self.error_at(self.pos, message)
    }
}

/// Whether `c` may be part of a rule name.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

fn too_deep() -> String {
    format!("groups and repetitions nest more than {MAX_DEPTH} deep")
}

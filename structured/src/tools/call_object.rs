//! One call written as a JSON object, `{"name": "f", "arguments": {...}}` (or
//! `"parameters"`), as the Hermes, Llama 3 and older Mistral formats write them. Keys may
//! come in any order and others are skipped; the arguments must be an object. The call
//! begins once its name and the first character of its arguments are known (arguments
//! written before the name are held until then); a call without arguments takes `{}`.

use super::json::{JsonScanner, Scan};
use super::region::Found;

/// Where a call object stands after a character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ObjectFlow {
    /// The character belongs to the object, which goes on.
    More,
    /// The character closed the object.
    Closed,
    /// The text is not a call object.
    Fail,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Name,
    Arguments,
    Other,
}

#[derive(Clone, Debug)]
enum Part {
    Open,
    Key { first: bool },
    KeyText(JsonScanner),
    Colon(Field),
    Value(Field, JsonScanner),
    CommaOrClose,
    Closed,
}

/// Reads one call object, from before its `{`.
#[derive(Clone, Debug)]
pub(super) struct CallObject {
    part: Part,
    /// The key or name string being read, quotes included.
    text: String,
    name: Option<String>,
    /// Arguments read while the name is not known yet.
    held_args: String,
    args_seen: bool,
    args_done: bool,
    started: bool,
}

impl CallObject {
    /// A reader expecting the object's `{` (whitespace before it is skipped).
    pub(super) fn new() -> CallObject {
        CallObject {
            part: Part::Open,
            text: String::new(),
            name: None,
            held_args: String::new(),
            args_seen: false,
            args_done: false,
            started: false,
        }
    }

    /// Reads `c`, adding the call's start, arguments and end to `found` as they are known.
    pub(super) fn feed(&mut self, c: char, found: &mut Vec<Found>) -> ObjectFlow {
        match std::mem::replace(&mut self.part, Part::Closed) {
            Part::Open => match c {
                _ if super::json::is_space(c) => self.stay(Part::Open),
                '{' => self.stay(Part::Key { first: true }),
                _ => ObjectFlow::Fail,
            },
            Part::Key { first } => match c {
                _ if super::json::is_space(c) => self.stay(Part::Key { first }),
                '"' => {
                    self.text = String::from('"');
                    let mut scanner = JsonScanner::new();
                    scanner.feed('"');
                    self.stay(Part::KeyText(scanner))
                }
                '}' if first => self.close(found),
                _ => ObjectFlow::Fail,
            },
            Part::KeyText(mut scanner) => match scanner.feed(c) {
                Scan::Char => {
                    self.text.push(c);
                    self.stay(Part::KeyText(scanner))
                }
                Scan::Done => {
                    self.text.push(c);
                    let field = match decode(&self.text) {
                        Some(key) if key == "name" && self.name.is_none() => Field::Name,
                        Some(key)
                            if (key == "arguments" || key == "parameters") && !self.args_seen =>
                        {
                            Field::Arguments
                        }
                        Some(_) => Field::Other,
                        None => return ObjectFlow::Fail,
                    };
                    self.stay(Part::Colon(field))
                }
                _ => ObjectFlow::Fail,
            },
            Part::Colon(field) => match c {
                _ if super::json::is_space(c) => self.stay(Part::Colon(field)),
                ':' => self.stay(Part::Value(field, JsonScanner::new())),
                _ => ObjectFlow::Fail,
            },
            Part::Value(field, scanner) => self.value(field, scanner, c, found),
            Part::CommaOrClose => match c {
                _ if super::json::is_space(c) => self.stay(Part::CommaOrClose),
                ',' => self.stay(Part::Key { first: false }),
                '}' => self.close(found),
                _ => ObjectFlow::Fail,
            },
            Part::Closed => ObjectFlow::Fail,
        }
    }

    fn stay(&mut self, part: Part) -> ObjectFlow {
        self.part = part;
        ObjectFlow::More
    }

    fn value(
        &mut self,
        field: Field,
        mut scanner: JsonScanner,
        c: char,
        found: &mut Vec<Found>,
    ) -> ObjectFlow {
        let first = !scanner.started();
        let scan = scanner.feed(c);
        match (field, scan) {
            (_, Scan::Invalid) => ObjectFlow::Fail,
            (_, Scan::Space) => self.stay(Part::Value(field, scanner)),
            (Field::Name, _) if first && c != '"' => ObjectFlow::Fail,
            (Field::Name, Scan::Char) => {
                if first {
                    self.text.clear();
                }
                self.text.push(c);
                self.stay(Part::Value(field, scanner))
            }
            (Field::Name, _) => {
                self.text.push(c);
                match decode(&self.text) {
                    Some(name) if !name.is_empty() => {
                        self.name = Some(name);
                        self.announce(found);
                        self.stay(Part::CommaOrClose)
                    }
                    _ => ObjectFlow::Fail,
                }
            }
            (Field::Arguments, _) if first && c != '{' => ObjectFlow::Fail,
            (Field::Arguments, _) => {
                self.args_seen = true;
                self.args_done = scan == Scan::Done;
                if self.started {
                    found.push(Found::Args(c.to_string()));
                    if self.args_done {
                        found.push(Found::CallDone);
                    }
                } else {
                    self.held_args.push(c);
                    self.announce(found);
                }
                match self.args_done {
                    true => self.stay(Part::CommaOrClose),
                    false => self.stay(Part::Value(field, scanner)),
                }
            }
            (Field::Other, Scan::Char) => self.stay(Part::Value(field, scanner)),
            (Field::Other, Scan::Done) => self.stay(Part::CommaOrClose),
            (Field::Other, Scan::DoneBefore) => {
                self.part = Part::CommaOrClose;
                self.feed(c, found)
            }
        }
    }

    /// Reports the call's start (and what is known of its arguments) once it can.
    fn announce(&mut self, found: &mut Vec<Found>) {
        let Some(name) = &self.name else { return };
        if self.started || !self.args_seen {
            return;
        }
        self.started = true;
        found.push(Found::Start(name.clone()));
        found.push(Found::Args(std::mem::take(&mut self.held_args)));
        if self.args_done {
            found.push(Found::CallDone);
        }
    }

    fn close(&mut self, found: &mut Vec<Found>) -> ObjectFlow {
        if self.name.is_none() {
            return ObjectFlow::Fail;
        }
        if !self.args_seen {
            self.args_seen = true;
            self.args_done = true;
            self.held_args = "{}".into();
            self.announce(found);
        }
        self.part = Part::Closed;
        ObjectFlow::Closed
    }
}

/// The text of a JSON string literal.
fn decode(literal: &str) -> Option<String> {
    serde_json::from_str(literal).ok()
}

//! An incremental JSON reader: fed one character at a time, it says whether the text so
//! far can still be the start of one JSON value, which characters are whitespace between
//! tokens (left out of compact arguments), and where the value ends.
//!
//! It reads RFC 8259's grammar as `serde_json` does (surrogate escapes must pair, arrays
//! and objects nest at most 127 deep), except that a number beyond `f64`'s range (`1e400`)
//! is read as the valid JSON it is, which `serde_json` refuses.

/// How deep arrays and objects may nest, as deep as `serde_json` reads.
const MAX_DEPTH: usize = 127;

/// What one character is to the value being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scan {
    /// Whitespace between tokens: part of the text, not of the compact value.
    Space,
    /// A character of the value, which goes on.
    Char,
    /// The character that completes the value.
    Done,
    /// The value (a number) was complete before this character, which is not part of it.
    DoneBefore,
    /// The text cannot be JSON.
    Invalid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    Object,
    Array,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Number {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl Number {
    /// Whether a number may end here.
    fn complete(self) -> bool {
        matches!(
            self,
            Number::Zero | Number::Int | Number::Frac | Number::ExpDigits
        )
    }

    /// The state after `c`, or `None` where `c` does not continue the number.
    fn next(self, c: char) -> Option<Number> {
        let digit = c.is_ascii_digit();
        let exp = c == 'e' || c == 'E';
        match self {
            Number::Minus if c == '0' => Some(Number::Zero),
            Number::Minus if digit => Some(Number::Int),
            Number::Zero | Number::Int | Number::Frac if exp => Some(Number::Exp),
            Number::Zero | Number::Int if c == '.' => Some(Number::Dot),
            Number::Int if digit => Some(Number::Int),
            Number::Dot | Number::Frac if digit => Some(Number::Frac),
            Number::Exp if c == '+' || c == '-' => Some(Number::ExpSign),
            Number::Exp | Number::ExpSign | Number::ExpDigits if digit => Some(Number::ExpDigits),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escape {
    None,
    Backslash,
    /// Inside `\u`: the hex digits read (`read` of them), and whether it must be a low
    /// surrogate, the second half of a pair.
    Hex {
        read: u8,
        value: u16,
        low: bool,
    },
    /// After a high surrogate's escape: its low half's `\` is next.
    LowBackslash,
    /// After that `\`: its `u`.
    LowU,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A value is next; in an empty array, `]` may close it instead.
    Value {
        array_start: bool,
    },
    /// A key is next; in an empty object, `}` may close it instead.
    Key {
        object_start: bool,
    },
    Colon,
    /// After a value inside an array or object.
    After,
    Str {
        key: bool,
        escape: Escape,
    },
    Number(Number),
    /// A literal (`true`, `false`, `null`) with these bytes still to come.
    Literal(&'static str),
    Done,
}

/// Reads one JSON value.
#[derive(Clone, Debug)]
pub(super) struct JsonScanner {
    stack: Vec<Frame>,
    state: State,
}

impl JsonScanner {
    /// A reader at the start of a value (leading whitespace allowed).
    pub(super) fn new() -> JsonScanner {
        JsonScanner {
            stack: Vec::new(),
            state: State::Value { array_start: false },
        }
    }

    /// Whether the value's first character has been read.
    pub(super) fn started(&self) -> bool {
        self.state != State::Value { array_start: false } || !self.stack.is_empty()
    }

    /// Reads `c`.
    pub(super) fn feed(&mut self, c: char) -> Scan {
        match self.state {
            State::Done => Scan::Invalid,
            State::Value { array_start } => self.value(c, array_start),
            State::Key { object_start } => match c {
                _ if is_space(c) => Scan::Space,
                '"' => self.go(State::Str {
                    key: true,
                    escape: Escape::None,
                }),
                '}' if object_start => self.close(Frame::Object),
                _ => Scan::Invalid,
            },
            State::Colon => match c {
                _ if is_space(c) => Scan::Space,
                ':' => self.go(State::Value { array_start: false }),
                _ => Scan::Invalid,
            },
            State::After => self.after(c),
            State::Str { key, escape } => self.string(c, key, escape),
            State::Number(number) => match number.next(c) {
                Some(next) => self.go(State::Number(next)),
                None if !number.complete() => Scan::Invalid,
                None if self.stack.is_empty() => {
                    self.state = State::Done;
                    Scan::DoneBefore
                }
                None => {
                    self.state = State::After;
                    self.after(c)
                }
            },
            State::Literal(rest) => {
                let mut chars = rest.chars();
                if chars.next() != Some(c) {
                    return Scan::Invalid;
                }
                let rest = chars.as_str();
                if rest.is_empty() {
                    self.end_value()
                } else {
                    self.go(State::Literal(rest))
                }
            }
        }
    }

    /// Moves to `state` on a character of the value.
    fn go(&mut self, state: State) -> Scan {
        self.state = state;
        Scan::Char
    }

    fn value(&mut self, c: char, array_start: bool) -> Scan {
        match c {
            _ if is_space(c) => Scan::Space,
            '{' => self.open(Frame::Object),
            '[' => self.open(Frame::Array),
            ']' if array_start => self.close(Frame::Array),
            '"' => self.go(State::Str {
                key: false,
                escape: Escape::None,
            }),
            't' => self.go(State::Literal("rue")),
            'f' => self.go(State::Literal("alse")),
            'n' => self.go(State::Literal("ull")),
            _ => match Number::Minus.next(c) {
                Some(number) => self.go(State::Number(number)),
                None if c == '-' => self.go(State::Number(Number::Minus)),
                None => Scan::Invalid,
            },
        }
    }

    fn after(&mut self, c: char) -> Scan {
        match (c, self.stack.last()) {
            _ if is_space(c) => Scan::Space,
            (',', Some(Frame::Object)) => self.go(State::Key {
                object_start: false,
            }),
            (',', Some(Frame::Array)) => self.go(State::Value { array_start: false }),
            ('}', Some(Frame::Object)) => self.close(Frame::Object),
            (']', Some(Frame::Array)) => self.close(Frame::Array),
            _ => Scan::Invalid,
        }
    }

    fn string(&mut self, c: char, key: bool, escape: Escape) -> Scan {
        let next = match escape {
            Escape::None => match c {
                '"' if key => return self.go(State::Colon),
                '"' => return self.end_value(),
                '\\' => Escape::Backslash,
                _ if (c as u32) < 0x20 => return Scan::Invalid,
                _ => Escape::None,
            },
            Escape::Backslash => match c {
                '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => Escape::None,
                'u' => Escape::Hex {
                    read: 0,
                    value: 0,
                    low: false,
                },
                _ => return Scan::Invalid,
            },
            Escape::Hex { read, value, low } => {
                let Some(digit) = c.to_digit(16) else {
                    return Scan::Invalid;
                };
                // Four hex digits fit a u16.
                let value = value.wrapping_mul(16).wrapping_add(digit as u16);
                match (read, low, value) {
                    (0..=2, _, _) => Escape::Hex {
                        read: read + 1,
                        value,
                        low,
                    },
                    (_, false, 0xD800..=0xDBFF) => Escape::LowBackslash,
                    (_, false, 0xDC00..=0xDFFF) | (_, true, 0..=0xDBFF | 0xE000..) => {
                        return Scan::Invalid
                    }
                    _ => Escape::None,
                }
            }
            Escape::LowBackslash if c == '\\' => Escape::LowU,
            Escape::LowU if c == 'u' => Escape::Hex {
                read: 0,
                value: 0,
                low: true,
            },
            Escape::LowBackslash | Escape::LowU => return Scan::Invalid,
        };
        self.go(State::Str { key, escape: next })
    }

    fn open(&mut self, frame: Frame) -> Scan {
        if self.stack.len() >= MAX_DEPTH {
            return Scan::Invalid;
        }
        self.stack.push(frame);
        self.go(match frame {
            Frame::Object => State::Key { object_start: true },
            Frame::Array => State::Value { array_start: true },
        })
    }

    fn close(&mut self, frame: Frame) -> Scan {
        if self.stack.pop() != Some(frame) {
            return Scan::Invalid;
        }
        self.end_value()
    }

    /// After a value's last character: the end of the whole value, or back in its container.
    fn end_value(&mut self) -> Scan {
        if self.stack.is_empty() {
            self.state = State::Done;
            Scan::Done
        } else {
            self.go(State::After)
        }
    }
}

/// JSON's whitespace.
pub(super) fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

//! DeepSeek V3's calls: after `<｜tool▁calls▁begin｜>` (or a bare
//! `<｜tool▁call▁begin｜>`), each call is `<｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME`, a
//! line break, the arguments in a ```` ```json ```` fence (which may be missing), and
//! `<｜tool▁call▁end｜>`; `<｜tool▁calls▁end｜>` closes them (the output may end without it).

use super::format::{
    DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALLS_END, DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALL_END, DEEPSEEK_SEP,
};
use super::json::{is_space, JsonScanner, Scan};
use super::literal::{Literals, Match};
use super::region::{is_name_char, Flow, Found, Region};

/// The fence before the arguments.
const FENCE_OPEN: &str = "```json";
/// The fence after them.
const FENCE_CLOSE: &str = "```";

#[derive(Clone, Debug)]
enum Part {
    /// A literal to read, then `next`.
    Expect(Literals, Box<Part>),
    /// The call's type (`function`), up to `<｜tool▁sep｜>`.
    Type,
    Name,
    /// Spaces after the name, up to its line break.
    NameEnd,
    /// Before the fence or the arguments.
    BeforeArgs {
        fenced: bool,
    },
    Args(JsonScanner),
    /// After the arguments: the closing fence or the call's end.
    AfterArgs,
    /// After a call: whitespace (this many bytes), then another call or the calls' end.
    Between(usize, Option<Literals>),
}

/// Reads DeepSeek V3 calls, from after the marker that opened them.
#[derive(Clone, Debug)]
pub(super) struct DeepSeekCalls {
    part: Part,
    name: String,
}

impl DeepSeekCalls {
    /// A reader after `marker`: `<｜tool▁calls▁begin｜>` is followed by a call's begin
    /// marker, `<｜tool▁call▁begin｜>` by the call's type.
    pub(super) fn new(marker: &str) -> DeepSeekCalls {
        let part = match marker {
            DEEPSEEK_CALLS_BEGIN => {
                Part::Expect(Literals::new(&[DEEPSEEK_CALL_BEGIN]), Box::new(Part::Type))
            }
            _ => Part::Type,
        };
        DeepSeekCalls {
            part,
            name: String::new(),
        }
    }

    fn go(&mut self, part: Part) -> Flow {
        self.part = part;
        Flow::More
    }

    fn expect(&mut self, literal: &'static [&'static str], c: char, next: Part) -> Flow {
        let mut literals = Literals::new(literal);
        match literals.feed(c) {
            Match::Partial => self.go(Part::Expect(literals, Box::new(next))),
            Match::Full(_) => self.go(next),
            Match::Miss(_) => Flow::Fail,
        }
    }
}

impl Region for DeepSeekCalls {
    fn feed(&mut self, c: char, found: &mut Vec<Found>) -> Flow {
        match &mut self.part {
            Part::Expect(literals, next) => match literals.feed(c) {
                Match::Partial => Flow::More,
                Match::Full(_) => {
                    let next = std::mem::replace(next.as_mut(), Part::Type);
                    self.go(next)
                }
                Match::Miss(_) => Flow::Fail,
            },
            Part::Type if c.is_ascii_alphabetic() || c == '_' => Flow::More,
            Part::Type => self.expect(&[DEEPSEEK_SEP], c, Part::Name),
            Part::Name if is_name_char(c) => {
                self.name.push(c);
                Flow::More
            }
            Part::Name | Part::NameEnd if self.name.is_empty() => Flow::Fail,
            Part::Name | Part::NameEnd if c == ' ' || c == '\t' => self.go(Part::NameEnd),
            Part::Name | Part::NameEnd if c == '\n' => self.go(Part::BeforeArgs { fenced: false }),
            Part::Name | Part::NameEnd => Flow::Fail,
            Part::BeforeArgs { .. } if is_space(c) => Flow::More,
            Part::BeforeArgs { fenced: false } if c == '`' => {
                self.expect(&[FENCE_OPEN], c, Part::BeforeArgs { fenced: true })
            }
            Part::BeforeArgs { .. } if c == '{' => {
                let mut scanner = JsonScanner::new();
                scanner.feed(c);
                found.push(Found::Start(std::mem::take(&mut self.name)));
                found.push(Found::Args(c.to_string()));
                self.go(Part::Args(scanner))
            }
            Part::BeforeArgs { .. } => Flow::Fail,
            Part::Args(scanner) => match scanner.feed(c) {
                Scan::Space => Flow::More,
                Scan::Char => {
                    found.push(Found::Args(c.to_string()));
                    Flow::More
                }
                Scan::Done => {
                    found.push(Found::Args(c.to_string()));
                    found.push(Found::CallDone);
                    self.go(Part::AfterArgs)
                }
                Scan::DoneBefore | Scan::Invalid => Flow::Fail,
            },
            Part::AfterArgs if is_space(c) => Flow::More,
            Part::AfterArgs if c == '`' => self.expect(
                &[FENCE_CLOSE],
                c,
                Part::Expect(
                    Literals::new(&[DEEPSEEK_CALL_END]),
                    Box::new(Part::Between(0, None)),
                ),
            ),
            Part::AfterArgs => self.expect(&[DEEPSEEK_CALL_END], c, Part::Between(0, None)),
            Part::Between(spaces, None) if is_space(c) => {
                *spaces += c.len_utf8();
                Flow::More
            }
            Part::Between(spaces, literals) => {
                let literals = literals.get_or_insert_with(|| {
                    Literals::new(&[DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALLS_END])
                });
                match literals.feed(c) {
                    Match::Partial => Flow::More,
                    Match::Full(0) => self.go(Part::Type),
                    Match::Full(_) => Flow::End { unused: 0 },
                    Match::Miss(read) => Flow::End {
                        unused: *spaces + read,
                    },
                }
            }
        }
    }

    fn finish(&mut self, _found: &mut Vec<Found>) -> Flow {
        match self.part {
            Part::Between(..) => Flow::End { unused: 0 },
            _ => Flow::Fail,
        }
    }
}

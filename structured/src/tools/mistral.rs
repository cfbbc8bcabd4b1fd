//! The Mistral format's calls after `[TOOL_CALLS]`: a JSON list of call objects (v0.3),
//! or one call written `name[ARGS]{...}` (v11 and later; also `name{...}`, and
//! `name[CALL_ID]id[ARGS]{...}`).

use super::call_list::CallList;
use super::call_object::ObjectFlow;
use super::format::MISTRAL_ARGS;
use super::json::{is_space, JsonScanner, Scan};
use super::literal::{Literals, Match};
use super::region::{is_name_char, Flow, Found, Region};

/// `[CALL_ID]`: between a call's name and its id in some Mistral tokenizers.
const CALL_ID: &str = "[CALL_ID]";

#[derive(Clone, Debug)]
enum Part {
    Start,
    List(CallList),
    Name,
    /// `[ARGS]` or `[CALL_ID]` after the name.
    Tag(Literals),
    CallId,
    BeforeArgs,
    Args(JsonScanner),
}

/// Reads the calls after one `[TOOL_CALLS]`.
#[derive(Clone, Debug)]
pub(super) struct MistralCalls {
    part: Part,
    name: String,
}

impl MistralCalls {
    /// A reader just past `[TOOL_CALLS]`.
    pub(super) fn new() -> MistralCalls {
        MistralCalls {
            part: Part::Start,
            name: String::new(),
        }
    }

    fn go(&mut self, part: Part) -> Flow {
        self.part = part;
        Flow::More
    }

    /// The arguments' first character: the call begins.
    fn start_args(&mut self, c: char, found: &mut Vec<Found>) -> Flow {
        if c != '{' {
            return Flow::Fail;
        }
        let mut scanner = JsonScanner::new();
        scanner.feed(c);
        found.push(Found::Start(std::mem::take(&mut self.name)));
        found.push(Found::Args(c.to_string()));
        self.go(Part::Args(scanner))
    }
}

impl Region for MistralCalls {
    fn feed(&mut self, c: char, found: &mut Vec<Found>) -> Flow {
        match &mut self.part {
            Part::Start if is_space(c) => Flow::More,
            Part::Start if c == '[' => self.go(Part::List(CallList::new())),
            Part::Start | Part::Name if is_name_char(c) => {
                self.name.push(c);
                self.go(Part::Name)
            }
            Part::Start => Flow::Fail,
            Part::List(list) => match list.feed(c, found) {
                ObjectFlow::More => Flow::More,
                ObjectFlow::Closed => Flow::End { unused: 0 },
                ObjectFlow::Fail => Flow::Fail,
            },
            Part::Name if c == '[' => {
                let mut tag = Literals::new(&[MISTRAL_ARGS, CALL_ID]);
                tag.feed(c);
                self.go(Part::Tag(tag))
            }
            Part::Name => self.start_args(c, found),
            Part::Tag(tag) => match tag.feed(c) {
                Match::Partial => Flow::More,
                Match::Full(0) => self.go(Part::BeforeArgs),
                Match::Full(_) => self.go(Part::CallId),
                Match::Miss(_) => Flow::Fail,
            },
            Part::CallId if c.is_ascii_alphanumeric() => Flow::More,
            Part::CallId if c == '[' => {
                let mut tag = Literals::new(&[MISTRAL_ARGS]);
                tag.feed(c);
                self.go(Part::Tag(tag))
            }
            Part::CallId => Flow::Fail,
            Part::BeforeArgs if is_space(c) => Flow::More,
            Part::BeforeArgs => self.start_args(c, found),
            Part::Args(scanner) => match scanner.feed(c) {
                Scan::Space => Flow::More,
                Scan::Char => {
                    found.push(Found::Args(c.to_string()));
                    Flow::More
                }
                Scan::Done => {
                    found.push(Found::Args(c.to_string()));
                    found.push(Found::CallDone);
                    Flow::End { unused: 0 }
                }
                Scan::DoneBefore | Scan::Invalid => Flow::Fail,
            },
        }
    }

    fn finish(&mut self, _found: &mut Vec<Found>) -> Flow {
        Flow::Fail
    }
}

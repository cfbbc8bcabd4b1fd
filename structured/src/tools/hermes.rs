//! The Hermes format's blocks: after `<tool_call>`, one call object or a list of them,
//! then `</tool_call>` (which the output may end without).

use super::call_list::CallList;
use super::call_object::{CallObject, ObjectFlow};
use super::format::HERMES_CLOSE;
use super::json::is_space;
use super::literal::{Literals, Match};
use super::region::{Flow, Found, Region};

#[derive(Clone, Debug)]
enum Part {
    Body,
    Object(CallObject),
    List(CallList),
    /// After the calls: whitespace (this many bytes), then `</tool_call>`.
    Close(usize, Literals),
}

/// Reads one Hermes block, from after its `<tool_call>`.
#[derive(Clone, Debug)]
pub(super) struct HermesBlock {
    part: Part,
}

impl HermesBlock {
    /// A reader just past `<tool_call>`.
    pub(super) fn new() -> HermesBlock {
        HermesBlock { part: Part::Body }
    }

    fn body(&mut self, flow: ObjectFlow) -> Flow {
        match flow {
            ObjectFlow::More => Flow::More,
            ObjectFlow::Closed => {
                self.part = Part::Close(0, Literals::new(&[HERMES_CLOSE]));
                Flow::More
            }
            ObjectFlow::Fail => Flow::Fail,
        }
    }
}

impl Region for HermesBlock {
    fn feed(&mut self, c: char, found: &mut Vec<Found>) -> Flow {
        match &mut self.part {
            Part::Body if is_space(c) => Flow::More,
            Part::Body if c == '[' => {
                self.part = Part::List(CallList::new());
                Flow::More
            }
            Part::Body => {
                let mut object = CallObject::new();
                let flow = object.feed(c, found);
                self.part = Part::Object(object);
                self.body(flow)
            }
            Part::Object(object) => {
                let flow = object.feed(c, found);
                self.body(flow)
            }
            Part::List(list) => {
                let flow = list.feed(c, found);
                self.body(flow)
            }
            Part::Close(spaces, close) if close.read_len() == 0 && is_space(c) => {
                *spaces += c.len_utf8();
                Flow::More
            }
            Part::Close(spaces, close) => match close.feed(c) {
                Match::Partial => Flow::More,
                Match::Full(_) => Flow::End { unused: 0 },
                Match::Miss(read) => Flow::End {
                    unused: *spaces + read,
                },
            },
        }
    }

    fn finish(&mut self, _found: &mut Vec<Found>) -> Flow {
        match self.part {
            Part::Close(..) => Flow::End { unused: 0 },
            _ => Flow::Fail,
        }
    }
}

//! A JSON list of call objects, `[{"name": ...}, {"name": ...}]`, as SmolLM2 writes in one
//! Hermes block and older Mistral models after `[TOOL_CALLS]`.

use super::call_object::{CallObject, ObjectFlow};
use super::json::is_space;
use super::region::Found;

#[derive(Clone, Debug)]
enum Part {
    /// After `[`: a call or `]`.
    First,
    Call(CallObject),
    /// After a call: `,` or `]`.
    After,
    /// After `,`: a call.
    Next,
}

/// Reads a list of call objects, from after its `[`.
#[derive(Clone, Debug)]
pub(super) struct CallList {
    part: Part,
}

impl CallList {
    /// A reader just past the list's `[`.
    pub(super) fn new() -> CallList {
        CallList { part: Part::First }
    }

    /// Reads `c`; [`ObjectFlow::Closed`] on the list's `]`.
    pub(super) fn feed(&mut self, c: char, found: &mut Vec<Found>) -> ObjectFlow {
        match &mut self.part {
            Part::First | Part::Next | Part::After if is_space(c) => ObjectFlow::More,
            Part::First | Part::After if c == ']' => ObjectFlow::Closed,
            Part::After if c == ',' => {
                self.part = Part::Next;
                ObjectFlow::More
            }
            Part::After => ObjectFlow::Fail,
            Part::First | Part::Next => {
                self.part = Part::Call(CallObject::new());
                self.feed(c, found)
            }
            Part::Call(call) => match call.feed(c, found) {
                ObjectFlow::Closed => {
                    self.part = Part::After;
                    ObjectFlow::More
                }
                flow => flow,
            },
        }
    }
}

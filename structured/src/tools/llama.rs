//! The Llama 3 JSON format's calls: one call object per region, opened by
//! `<|python_tag|>`, by the `{` that starts the output, or by the `;` after a call.

use super::call_object::{CallObject, ObjectFlow};
use super::region::{Flow, Found, Region};

/// Reads one Llama 3 call object.
#[derive(Clone, Debug)]
pub(super) struct LlamaCall {
    object: CallObject,
}

impl LlamaCall {
    /// A reader after `marker`: `{` begins the object itself; after `<|python_tag|>` or
    /// `;` the object's `{` is still to come.
    pub(super) fn new(marker: &str) -> LlamaCall {
        let mut object = CallObject::new();
        if marker == "{" {
            object.feed('{', &mut Vec::new());
        }
        LlamaCall { object }
    }
}

impl Region for LlamaCall {
    fn feed(&mut self, c: char, found: &mut Vec<Found>) -> Flow {
        match self.object.feed(c, found) {
            ObjectFlow::More => Flow::More,
            ObjectFlow::Closed => Flow::End { unused: 0 },
            ObjectFlow::Fail => Flow::Fail,
        }
    }

    fn finish(&mut self, _found: &mut Vec<Found>) -> Flow {
        Flow::Fail
    }
}

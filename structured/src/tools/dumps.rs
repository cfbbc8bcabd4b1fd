//! JSON written as Python's `json.dumps` writes it (`", "` and `": "` between items and
//! after keys, no other whitespace, non-ASCII text as it is): the spelling chat templates
//! and their training data use.

use std::io;

use serde::Serialize;
use serde_json::ser::{Formatter, Serializer};

/// The separators of `json.dumps`.
struct PythonStyle;

impl Formatter for PythonStyle {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

/// `value` as `json.dumps(value, ensure_ascii=False)` writes it.
pub(super) fn dumps(value: &impl Serialize) -> String {
    let mut out = Vec::new();
    let mut serializer = Serializer::with_formatter(&mut out, PythonStyle);
    // Writing a `serde_json::Value` (or plain data) into memory cannot fail.
    if value.serialize(&mut serializer).is_err() {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}

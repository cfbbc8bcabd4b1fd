//! The live configuration with its secrets hidden, for `GET /admin/config` and for logs.

use super::ServeConfig;
use serde_json::{Map, Value};
use std::fmt;

impl ServeConfig {
    /// Every field as JSON, with API keys and the admin token replaced by `"***"` (the list
    /// keeps its length; an unset token stays null).
    pub fn masked_json(&self) -> Value {
        let fields = self.fields().into_iter().map(|f| {
            let value = if f.secret { mask(f.value) } else { f.value };
            (f.name.to_string(), value)
        });
        Value::Object(fields.collect::<Map<_, _>>())
    }
}

impl fmt::Debug for ServeConfig {
    /// The masked view, so that logging a configuration cannot leak a key.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ServeConfig {}", self.masked_json())
    }
}

/// `value` with every string in it replaced by `"***"`.
fn mask(value: Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.into_iter().map(mask).collect()),
        Value::Null => Value::Null,
        _ => Value::from("***"),
    }
}

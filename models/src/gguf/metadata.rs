//! Typed access to GGUF metadata; errors name the key and the type found.

use anyhow::{anyhow, Result};

use super::reader::GgufFile;
use super::value::Value;

impl GgufFile {
    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata().get(key)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        convert: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => convert(v)
                .map(Some)
                .ok_or_else(|| anyhow!("GGUF key '{key}' is {}, expected {expected}", describe(v))),
        }
    }

    /// A non-negative integer.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    /// A number (float or integer).
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a number", Value::as_f64)
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", Value::as_bool)
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a string", Value::as_str)
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        self.typed(key, "an array of strings", |v| {
            v.as_array()?.iter().map(Value::as_str).collect()
        })
    }

    /// An array of integers.
    pub fn get_int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        self.typed(key, "an array of integers", |v| {
            v.as_array()?.iter().map(Value::as_i64).collect()
        })
    }

    /// A non-negative integer that must be present.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?
            .ok_or_else(|| anyhow!("GGUF key '{key}' is missing"))
    }

    /// A string that must be present.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?
            .ok_or_else(|| anyhow!("GGUF key '{key}' is missing"))
    }
}

/// A short description of a value: arrays by length, scalars with their value.
fn describe(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("an array of {} elements", items.len()),
        other => format!("a {} ({other:?})", other.type_name()),
    }
}

//! What a JSON schema asks that its grammar cannot enforce, found before it is compiled.
//!
//! A grammar writes an object's named `properties` once each, in order, but keys matched
//! by `patternProperties` or allowed by `additionalProperties` are free text: nothing
//! keeps two of them from being the same key, and a parser keeps the last of duplicate
//! keys. So `minProperties` counted over free keys can be met by the text and broken by
//! the parsed object; such a schema is refused rather than served unenforced.

use serde_json::{Map, Value};

use crate::schema_walk::find;

/// Why `schema` cannot be enforced, naming the path of the object at fault; `None` when
/// nothing in it is unenforceable.
pub fn unenforceable(schema: &Value) -> Option<String> {
    find(schema, &mut free_key_count)
}

/// `minProperties` that only free keys can reach.
fn free_key_count(fields: &Map<String, Value>, path: &str) -> Option<String> {
    let min = fields.get("minProperties")?.as_u64()?;
    let required = fields
        .get("required")
        .and_then(Value::as_array)
        .map_or(0, Vec::len) as u64;
    if min <= required {
        return None;
    }
    let has_patterns = fields
        .get("patternProperties")
        .and_then(Value::as_object)
        .is_some_and(|patterns| !patterns.is_empty());
    let closed = fields.get("additionalProperties") == Some(&Value::Bool(false));
    if !has_patterns && closed {
        return None;
    }
    Some(format!(
        "`minProperties` {min} at {path} counts keys beyond the {required} required ones, \
         which the output's grammar cannot keep distinct (a repeated key would meet it in \
         the text and break it in the parsed object); list enough keys in `required`, or \
         close the object with `additionalProperties: false` and no `patternProperties`"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn free_keys_counted_by_min_properties_are_refused_wherever_they_sit() {
        let bad = json!({"type": "object", "minProperties": 2,
            "patternProperties": {"^k": {"type": "integer"}}});
        assert!(unenforceable(&bad).unwrap().contains("at #"));
        let nested = json!({"type": "object", "properties": {"a": {"anyOf": [
            {"type": "null"}, {"type": "object", "minProperties": 1}]}}});
        let why = unenforceable(&nested).unwrap();
        assert!(why.contains("#/properties/a/anyOf/1"), "{why}");
        let in_defs = json!({"$defs": {"x": {"minProperties": 3,
            "additionalProperties": {"type": "string"}}}, "$ref": "#/$defs/x"});
        assert!(unenforceable(&in_defs).is_some());
    }

    #[test]
    fn counts_the_grammar_enforces_pass() {
        for schema in [
            json!({"type": "object", "minProperties": 1, "required": ["a"],
                "properties": {"a": {}}}),
            json!({"type": "object", "minProperties": 2, "additionalProperties": false,
                "properties": {"a": {}, "b": {}}}),
            json!({"type": "object", "patternProperties": {"^k": {}}}),
            json!({"type": "object", "properties": {"minProperties": {"const": 5}}}),
            json!(true),
            json!({"type": "array", "items": {"type": "object"}}),
        ] {
            assert_eq!(unenforceable(&schema), None, "{schema}");
        }
    }
}

//! `format` as JSON Schema defines it: the formats the specification names are asserted
//! where llguidance writes them (and refused by llguidance where it does not), while a
//! format the specification does not name (`"url"`, `"positiveInteger"`, a project's own
//! names) is an annotation only, which validators ignore: it is dropped before compiling
//! rather than refusing the schema.

use serde_json::Value;

use crate::schema_walk::each_mut;

/// The formats of JSON Schema 2020-12's format vocabulary.
const SPECIFIED: [&str; 19] = [
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// `schema` without the `format`s the specification does not name.
pub fn without_unknown_formats(mut schema: Value) -> Value {
    each_mut(&mut schema, &mut |fields| {
        let unknown = fields
            .get("format")
            .and_then(Value::as_str)
            .is_some_and(|format| !SPECIFIED.contains(&format));
        if unknown {
            fields.remove("format");
        }
    });
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_unspecified_formats_are_dropped() {
        let schema = json!({"type": "object", "properties": {
            "site": {"type": "string", "format": "url"},
            "when": {"type": "string", "format": "date-time"},
            "format": {"type": "string", "format": "uri-reference"},
            "list": {"type": "array", "items": {"format": "positiveInteger"}}}});
        let kept = without_unknown_formats(schema);
        assert_eq!(kept["properties"]["site"], json!({"type": "string"}));
        assert_eq!(kept["properties"]["when"]["format"], "date-time");
        assert_eq!(kept["properties"]["format"]["format"], "uri-reference");
        assert_eq!(kept["properties"]["list"]["items"], json!({}));
    }
}

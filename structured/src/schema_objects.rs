//! Objects that list their properties are written with those properties only, where the
//! schema does not say whether others may follow (`additionalProperties` absent): every
//! such output is valid (the keys left out were optional), and a small model can no longer
//! run away adding keys until it reaches `max_tokens`, as JSONSchemaBench showed it does
//! (XGrammar, vLLM's default backend, and llama.cpp close such objects too). A schema that
//! sets `additionalProperties` keeps what it says. Nothing is closed in a schema that
//! composes objects with `allOf`, where closing one part would forbid the keys another
//! part adds; nor an object without listed properties (`{"type": "object"}`: any object),
//! nor one whose `required` names a key it does not list (closing it would leave no valid
//! output).

use serde_json::Value;

use crate::schema_walk::{each_mut, find};

/// `schema` with its open objects that list properties closed.
pub fn closed_objects(mut schema: Value) -> Value {
    if find(&schema, &mut |fields, _| {
        fields.contains_key("allOf").then_some(())
    })
    .is_some()
    {
        return schema;
    }
    each_mut(&mut schema, &mut |fields| {
        let Some(listed) = fields.get("properties").and_then(Value::as_object) else {
            return;
        };
        let requires_only_listed =
            fields
                .get("required")
                .and_then(Value::as_array)
                .is_none_or(|required| {
                    required
                        .iter()
                        .all(|key| key.as_str().is_some_and(|key| listed.contains_key(key)))
                });
        let says = [
            "additionalProperties",
            "patternProperties",
            "unevaluatedProperties",
            "$ref",
        ]
        .iter()
        .any(|key| fields.contains_key(*key));
        if !listed.is_empty() && requires_only_listed && !says {
            fields.insert("additionalProperties".into(), Value::Bool(false));
        }
    });
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn listed_open_objects_are_closed_and_the_rest_kept() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"x": {}}},
            "b": {"type": "object", "properties": {"y": {}}, "additionalProperties": true},
            "c": {"type": "object"},
            "d": {"type": "object", "properties": {"z": {}},
                "patternProperties": {"^k": {}}},
            "e": {"type": "object", "properties": {"v": {}}, "required": ["w"]}}});
        let closed = closed_objects(schema);
        assert_eq!(closed["additionalProperties"], false);
        let inner = &closed["properties"];
        assert_eq!(inner["a"]["additionalProperties"], false);
        assert_eq!(inner["b"]["additionalProperties"], true);
        assert_eq!(inner["c"].get("additionalProperties"), None);
        assert_eq!(inner["d"].get("additionalProperties"), None);
        assert_eq!(inner["e"].get("additionalProperties"), None);
    }

    #[test]
    fn composed_schemas_are_left_alone() {
        let schema = json!({"$defs": {"base": {"properties": {"a": {}}}},
            "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {}}}]});
        assert_eq!(closed_objects(schema.clone()), schema);
    }
}

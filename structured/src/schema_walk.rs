//! Every subschema of a JSON schema, reached through the keywords whose values are
//! schemas (`properties`, `items`, `anyOf`, `$defs`, ...), never through keywords whose
//! values are data (`enum`, `const`, `default`, `examples`): so a property that happens to
//! be named `format` or `minProperties` is not mistaken for the keyword.

use serde_json::{Map, Value};

/// The keywords whose values are schemas, one each.
const SCHEMA_KEYWORDS: [&str; 10] = [
    "additionalProperties",
    "items",
    "additionalItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
];

/// The keywords whose values are lists of schemas.
const LIST_KEYWORDS: [&str; 4] = ["anyOf", "allOf", "oneOf", "prefixItems"];

/// The keywords whose values map names to schemas.
const MAP_KEYWORDS: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Calls `visit` with each subschema object of `schema` and its JSON-pointer path (from
/// `#`), the schema itself first; stops at the first `Some` it returns.
pub fn find<T>(
    schema: &Value,
    visit: &mut impl FnMut(&Map<String, Value>, &str) -> Option<T>,
) -> Option<T> {
    find_at(schema, "#", visit)
}

fn find_at<T>(
    schema: &Value,
    path: &str,
    visit: &mut impl FnMut(&Map<String, Value>, &str) -> Option<T>,
) -> Option<T> {
    let fields = schema.as_object()?;
    if let Some(found) = visit(fields, path) {
        return Some(found);
    }
    for keyword in SCHEMA_KEYWORDS {
        if let Some(inner) = fields.get(keyword) {
            let found = match inner {
                // Draft 4's `items` may be a list of schemas.
                Value::Array(items) => items.iter().enumerate().find_map(|(at, inner)| {
                    find_at(inner, &format!("{path}/{keyword}/{at}"), visit)
                }),
                inner => find_at(inner, &format!("{path}/{keyword}"), visit),
            };
            if found.is_some() {
                return found;
            }
        }
    }
    for keyword in LIST_KEYWORDS {
        for (at, inner) in fields
            .get(keyword)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(found) = find_at(inner, &format!("{path}/{keyword}/{at}"), visit) {
                return Some(found);
            }
        }
    }
    for keyword in MAP_KEYWORDS {
        for (name, inner) in fields
            .get(keyword)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if let Some(found) = find_at(inner, &format!("{path}/{keyword}/{name}"), visit) {
                return Some(found);
            }
        }
    }
    None
}

/// Calls `visit` with each subschema object of `schema`, which it may change.
pub fn each_mut(schema: &mut Value, visit: &mut impl FnMut(&mut Map<String, Value>)) {
    let Some(fields) = schema.as_object_mut() else {
        return;
    };
    visit(fields);
    for keyword in SCHEMA_KEYWORDS {
        match fields.get_mut(keyword) {
            Some(Value::Array(items)) => items.iter_mut().for_each(|inner| each_mut(inner, visit)),
            Some(inner) => each_mut(inner, visit),
            None => {}
        }
    }
    for keyword in LIST_KEYWORDS {
        if let Some(Value::Array(items)) = fields.get_mut(keyword) {
            items.iter_mut().for_each(|inner| each_mut(inner, visit));
        }
    }
    for keyword in MAP_KEYWORDS {
        if let Some(Value::Object(map)) = fields.get_mut(keyword) {
            map.values_mut().for_each(|inner| each_mut(inner, visit));
        }
    }
}

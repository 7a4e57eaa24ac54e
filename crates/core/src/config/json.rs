//! JSON as Knative's Go reads it from an environment variable.

/// Decodes a JSON object into `T`. Unlike serde's derive, which also takes
/// an array of field values, only an object is accepted, as in Go.
pub fn from_json_object<T: serde::de::DeserializeOwned>(
    json: &str,
) -> Result<T, serde_json::Error> {
    let value: serde_json::Value = serde_json::from_str(json)?;
    object(value)
}

fn object<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, serde_json::Error> {
    if value.is_object() {
        serde_json::from_value(value)
    } else {
        Err(serde::de::Error::custom(format!(
            "expected a JSON object, found {}",
            json_kind(&value)
        )))
    }
}

/// Decodes a JSON array of objects.
pub fn from_json_objects<T: serde::de::DeserializeOwned>(
    json: &str,
) -> Result<Vec<T>, serde_json::Error> {
    match serde_json::from_str(json)? {
        serde_json::Value::Array(items) => items.into_iter().map(object).collect(),
        other => Err(serde::de::Error::custom(format!(
            "expected a JSON array, found {}",
            json_kind(&other)
        ))),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

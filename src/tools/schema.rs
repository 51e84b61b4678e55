//! The schema gate: tool inputs are checked against the tool's JSON Schema before anything
//! runs, and every violation is named by its JSON path and the rule that failed.

use jsonschema::Validator;
use serde_json::Value;

/// Compile a tool's schema; `None` for the empty schema `{}` which takes anything.
pub(crate) fn compile(schema: &Value) -> Result<Option<Validator>, String> {
    if schema.as_object().is_some_and(|o| o.is_empty()) {
        return Ok(None);
    }
    jsonschema::validator_for(schema)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Check `input`; the error lists each violation as `at PATH: MESSAGE (rule KEYWORD)`.
pub(crate) fn check(validator: &Validator, input: &Value) -> Result<(), String> {
    let problems: Vec<String> = validator
        .iter_errors(input)
        .map(|e| {
            let path = e.instance_path().as_str();
            let path = if path.is_empty() { "/" } else { path };
            format!("at {path}: {e} (rule `{}`)", e.kind().keyword())
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_path_and_rule() {
        let v = compile(&json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"]
        }))
        .unwrap()
        .unwrap();
        let e = check(&v, &json!({"days": 0})).unwrap_err();
        assert!(e.contains("rule `required`"), "{e}");
        assert!(e.contains("at /days"), "{e}");
        assert!(e.contains("rule `minimum`"), "{e}");
        assert!(check(&v, &json!({"city": "Oslo"})).is_ok());
    }
}

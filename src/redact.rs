//! Redaction, the second wall around secrets: every secret value `sup` knows (the provider
//! key in use, values passed to tools with `env_pass`) is replaced by `[redacted]` in
//! everything written or printed — trace, `--json`, transcripts, record files, store rows,
//! error messages, kept outputs — and in everything that goes into a model request. The list
//! is process-wide: a secret is known from the moment `sup` reads it.

use std::borrow::Cow;
use std::path::Path;
use std::sync::RwLock;

use serde_json::Value;

/// What a secret becomes.
pub(crate) const MARK: &str = "[redacted]";
/// Shorter values are not redacted: they would match ordinary text.
pub(crate) const MIN_LEN: usize = 8;
/// Files larger than this are not rewritten (kept outputs are capped well below it).
const MAX_FILE: u64 = 256 * 1024 * 1024;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Know `value` as a secret from now on. Values shorter than 8 characters are ignored.
pub(crate) fn add(value: &str) {
    let value = value.trim();
    if value.chars().count() < MIN_LEN {
        return;
    }
    if let Ok(mut secrets) = SECRETS.write()
        && !secrets.iter().any(|s| s == value)
    {
        secrets.push(value.to_string());
        // Longest first, so a secret that contains another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// Whether any secret is known.
pub(crate) fn active() -> bool {
    SECRETS.read().is_ok_and(|s| !s.is_empty())
}

/// `text` with every known secret replaced.
pub(crate) fn text(text: &str) -> Cow<'_, str> {
    let Ok(secrets) = SECRETS.read() else {
        return Cow::Borrowed(text);
    };
    let mut out = Cow::Borrowed(text);
    for s in secrets.iter() {
        if out.contains(s.as_str()) {
            out = Cow::Owned(out.replace(s.as_str(), MARK));
        }
    }
    out
}

/// Redact a string in place.
pub(crate) fn string(s: &mut String) {
    if let Cow::Owned(r) = text(s) {
        *s = r;
    }
}

/// Redact every string (and object key) in a JSON value.
pub(crate) fn value(v: &mut Value) {
    match v {
        Value::String(s) => string(s),
        Value::Array(items) => items.iter_mut().for_each(value),
        Value::Object(map) => {
            let renamed: Vec<(String, String)> = map
                .keys()
                .filter_map(|k| match text(k) {
                    Cow::Owned(r) => Some((k.clone(), r)),
                    Cow::Borrowed(_) => None,
                })
                .collect();
            for (old, new) in renamed {
                if let Some(x) = map.remove(&old) {
                    map.insert(new, x);
                }
            }
            map.values_mut().for_each(value);
        }
        _ => {}
    }
}

/// Any serializable thing with its secrets redacted, through its JSON form. `None` when
/// nothing needed redacting (or no secret is known), so callers keep the original.
pub(crate) fn serde<T: serde::Serialize + serde::de::DeserializeOwned>(thing: &T) -> Option<T> {
    if !active() {
        return None;
    }
    // JSON escapes a string character by character, so a string holding a secret holds its
    // escaped form in the JSON text: text without any is clean, told in one pass (most
    // events; the tree below is built only for the rest).
    let json = serde_json::to_string(thing).ok()?;
    let held = SECRETS.read().ok()?.iter().any(|s| {
        let quoted = serde_json::to_string(s).unwrap_or_default();
        let escaped = quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .unwrap_or(&quoted);
        json.contains(escaped)
    });
    if !held {
        return None;
    }
    let mut v = serde_json::to_value(thing).ok()?;
    let before = v.clone();
    value(&mut v);
    if v == before {
        return None;
    }
    serde_json::from_value(v).ok()
}

/// Rewrite a file with its secrets redacted (a no-op when it holds none).
pub(crate) fn file(path: &Path) -> std::io::Result<()> {
    if !active() || std::fs::metadata(path)?.len() > MAX_FILE {
        return Ok(());
    }
    let bytes = std::fs::read(path)?;
    let Ok(content) = std::str::from_utf8(&bytes) else {
        // Binary output: replace the raw bytes of each secret.
        let secrets = SECRETS.read().map(|s| s.clone()).unwrap_or_default();
        let mut out = bytes.clone();
        for s in &secrets {
            out = replace_bytes(&out, s.as_bytes(), MARK.as_bytes());
        }
        if out != bytes {
            std::fs::write(path, out)?;
        }
        return Ok(());
    };
    if let Cow::Owned(r) = text(content) {
        std::fs::write(path, r)?;
    }
    Ok(())
}

/// Redact every regular file under `dir` (recursively) except the ones `skip` names.
pub(crate) fn tree(dir: &Path, skip: &[&str]) {
    if !active() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            tree(&path, skip);
        } else if kind.is_file()
            && !skip
                .iter()
                .any(|s| path.file_name().is_some_and(|n| n == *s))
            && let Err(e) = file(&path)
        {
            tracing::warn!("cannot redact {}: {e}", path.display());
        }
    }
}

fn replace_bytes(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    if needle.is_empty() {
        return hay.to_vec();
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

/// A writer that redacts what passes through it, for the log on stderr.
pub(crate) struct Writer<W: std::io::Write>(pub(crate) W);

impl<W: std::io::Write> std::io::Write for Writer<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(s) => self.0.write_all(text(s).as_bytes())?,
            Err(_) => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_are_replaced_everywhere() {
        add("short");
        add("sk-unit-test-secret-0001");
        add("sk-unit-test-secret-0001-longer");
        assert_eq!(text("short stays"), "short stays");
        assert_eq!(
            text("a sk-unit-test-secret-0001-longer b sk-unit-test-secret-0001"),
            "a [redacted] b [redacted]"
        );
        // Through JSON: a secret JSON escapes is still found; clean things come back `None`.
        add("sk-unit-\"quoted\\-secret");
        let held = vec!["a sk-unit-\"quoted\\-secret b".to_string()];
        assert_eq!(serde(&held), Some(vec!["a [redacted] b".to_string()]));
        assert_eq!(serde(&vec!["clean".to_string()]), None);
        let mut v =
            serde_json::json!({"k": ["x sk-unit-test-secret-0001"], "sk-unit-test-secret-0001": 1});
        value(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"k": ["x [redacted]"], "[redacted]": 1})
        );
        assert_eq!(
            replace_bytes(
                b"\xffsk-unit-test-secret-0001\xff",
                b"sk-unit-test-secret-0001",
                b"R"
            ),
            b"\xffR\xff"
        );
    }
}

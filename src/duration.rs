//! The duration parsers every flag, goal file, user config and `[[notify]]` table uses
//! (`30s`, `5m`, `1h 30m`, `0`), and their serde field readers. A leaf: it uses nothing of
//! the crate, so config and notify both use it without using each other.

use std::time::Duration;

use serde::Deserialize;

/// `30s`, `5m`, `1h 30m`, `0`: every duration of flags and files.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("`{s}` is not a duration ({e}); write e.g. `30s`, `5m`, `1h`"))
}

/// A timeout: a duration that is not zero (a zero timeout would end everything at once).
pub(crate) fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "`{s}` is a zero timeout, which would stop everything at once; give a positive \
             duration such as `30s`"
        ));
    }
    Ok(d)
}

/// A timeout field of a file, through `parse_timeout`.
pub(crate) fn timeout<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    field(d, parse_timeout)
}

/// A duration field of a file, through `parse_duration`.
pub(crate) fn duration<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    field(d, parse_duration)
}

/// An optional field of a file, its text through `parse`.
fn field<'de, D: serde::Deserializer<'de>>(
    d: D,
    parse: fn(&str) -> Result<Duration, String>,
) -> Result<Option<Duration>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| parse(&s).map_err(serde::de::Error::custom))
        .transpose()
}

//! The parsers of single setting values, for flags (`value_parser`) and goal files
//! (`deserialize_with`): counts, shares, costs, sizes, zones, globs, names. Each says what
//! to write instead when a value does not parse.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::McpServer;

/// The most attempts `parallel` runs at once.
pub(crate) const MAX_PARALLEL: u32 = 16;

/// `--parallel N`: 1 to 16.
pub(super) fn parse_parallel(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_PARALLEL).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{s}` attempts: parallel takes 1 to {MAX_PARALLEL} attempts at once"
        )),
    }
}

/// A file's value, written as an `R`, through the flag's parser: both take and refuse the
/// same, in the same words.
fn through<'de, D, R, T>(d: D, parse: fn(&str) -> Result<T, String>) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    R: Deserialize<'de> + ToString,
{
    Option::<R>::deserialize(d)?
        .map(|v| parse(&v.to_string()).map_err(serde::de::Error::custom))
        .transpose()
}

/// A flag's value that passes `check` (`--protect GLOB`, `--env-pass NAME`).
pub(super) fn checked(
    check: fn(&str) -> Result<(), String>,
) -> impl Fn(&str) -> Result<String, String> + Clone + Send + Sync + 'static {
    move |s| check(s).map(|()| s.to_string())
}

/// A file's list of names, each passing `check` (as the flag's values do).
fn each<'de, D: serde::Deserializer<'de>>(
    d: D,
    check: fn(&str) -> Result<(), String>,
) -> Result<Vec<String>, D::Error> {
    let list = Vec::<String>::deserialize(d)?;
    for s in &list {
        check(s).map_err(serde::de::Error::custom)?;
    }
    Ok(list)
}

/// `parallel = N` in a file: 1 to 16.
pub(super) fn parallel<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    through::<D, i64, _>(d, parse_parallel)
}

/// `--compact-at`: a share strictly between 0 and 1.
pub(super) fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a share of the window: write a number between 0 and 1, e.g. 0.85"
        )),
    }
}

/// `compact_at` in a file, through `parse_fraction`.
pub(super) fn fraction<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    through::<D, f64, _>(d, parse_fraction)
}

/// `--max-cost`: US dollars, 0 or more.
pub(super) fn parse_cost(s: &str) -> Result<f64, String> {
    match s.trim().trim_start_matches('$').parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!(
            "`{s}` is not a cost: write US dollars, 0 or more, e.g. 0.50"
        )),
    }
}

/// A cost in a file, through `parse_cost`.
pub(super) fn cost<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    through::<D, f64, _>(d, parse_cost)
}

/// `[prices]`: each price checked where it is written.
pub(super) fn prices<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, crate::model::prices::Price>, D::Error> {
    let prices = BTreeMap::<String, crate::model::prices::Price>::deserialize(d)?;
    crate::model::prices::Prices::new(prices.clone())
        .map_err(|e| serde::de::Error::custom(e.to_string()))?;
    Ok(prices)
}

/// `--param NAME=VALUE`.
pub(super) fn param(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("`{s}`: write NAME=VALUE")),
    }
}

/// `[params]`: strings, numbers and booleans, as text.
pub(super) fn params<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<(String, String)>, D::Error> {
    BTreeMap::<String, toml::Value>::deserialize(d)?
        .into_iter()
        .map(|(k, v)| match v {
            toml::Value::String(s) => Ok((k, s)),
            v @ (toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_)) => {
                Ok((k, v.to_string()))
            }
            _ => Err(serde::de::Error::custom(format!(
                "`params.{k}`: a parameter is a string, a number or a boolean"
            ))),
        })
        .collect()
}

/// The machine's zone: `TZ` if it names one, else the system's, else UTC.
pub(crate) fn local_zone() -> chrono_tz::Tz {
    std::env::var("TZ")
        .ok()
        .and_then(|z| z.trim_start_matches(':').parse::<chrono_tz::Tz>().ok())
        .or_else(|| {
            iana_time_zone::get_timezone()
                .ok()
                .and_then(|z| z.parse::<chrono_tz::Tz>().ok())
        })
        .unwrap_or(chrono_tz::Tz::UTC)
}

/// A `timezone` setting: an IANA zone name.
pub(crate) fn parse_zone(name: &str) -> Result<chrono_tz::Tz, String> {
    name.parse::<chrono_tz::Tz>().map_err(|_| {
        format!("`{name}` is not an IANA time zone; write e.g. `Europe/Berlin`, `Asia/Shanghai` or `UTC`")
    })
}

/// A count of at least 1 (`keep_runs = 0` would delete each run as it ends).
pub(crate) fn at_least_one<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u32>, D::Error> {
    let n = Option::<u32>::deserialize(d)?;
    if n == Some(0) {
        return Err(serde::de::Error::custom(
            "must be at least 1 (0 would delete each run as soon as it ends)",
        ));
    }
    Ok(n)
}

/// A memory size of a file: a number of bytes, or a string such as `512M`, `4G`, `1.5G`.
pub(crate) fn memory_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bytes(u64),
        Text(String),
    }
    Option::<Raw>::deserialize(d)?
        .map(|r| match r {
            Raw::Bytes(b) => Ok(b),
            Raw::Text(t) => crate::tools::sandbox::parse_size(&t).map_err(serde::de::Error::custom),
        })
        .transpose()
}

/// An enum value from a flag or the environment, by its serde name.
pub(crate) fn parse_enum<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s))
        .map_err(|e| format!("`{s}`: {e}"))
}

pub(super) fn mcp_server(s: &str) -> Result<McpServer, String> {
    let usage = || format!("`{s}`: write NAME=COMMAND, e.g. git=uvx mcp-server-git");
    let (name, command) = s.split_once('=').ok_or_else(usage)?;
    let command: Vec<String> = command.split_whitespace().map(str::to_string).collect();
    if name.trim().is_empty() || command.is_empty() {
        return Err(usage());
    }
    Ok(McpServer {
        name: name.trim().to_string(),
        command,
        url: None,
        headers: Default::default(),
        args: Vec::new(),
        env: Default::default(),
        trust_annotations: false,
        sandbox: None,
        env_pass: Vec::new(),
    })
}

/// `protect = [...]`: each a glob that parses and leaves part of the workspace to the agent.
pub(super) fn protect_globs<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<String>, D::Error> {
    each(d, crate::tools::Protected::check_glob)
}

/// `env_pass = [...]`: each entry a variable name.
pub(crate) fn env_pass_names<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<String>, D::Error> {
    each(d, crate::tools::sandbox::check_env_pass)
}

/// `watch = [...]`: each a gitignore-style glob that parses and watches something.
pub(super) fn watch_globs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let globs = Vec::<String>::deserialize(d)?;
    crate::globs::Globs::new(std::path::Path::new("/"), &globs)
        .map_err(serde::de::Error::custom)?;
    Ok(globs)
}

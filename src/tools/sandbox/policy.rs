//! The sandbox settings of a goal file and of flags: the policy (`sandbox = ...`), the keys
//! as written (`SandboxSettings`) and resolved against the goal file's folder (`Sandbox`).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

pub use super::proxy::HostPattern;

/// What commands may write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Write in the workspace, the run's temp folder and `writable`; read anywhere.
    #[default]
    WorkspaceWrite,
    /// Write only in the run's temp folder.
    ReadOnly,
    /// No sandbox.
    Off,
}

impl Policy {
    pub(crate) fn parse(s: &str) -> Result<Policy, String> {
        match s {
            "workspace-write" => Ok(Policy::WorkspaceWrite),
            "read-only" => Ok(Policy::ReadOnly),
            "off" => Ok(Policy::Off),
            _ => Err(format!(
                "`{s}` is not a sandbox policy: use workspace-write, read-only or off"
            )),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Policy::WorkspaceWrite => "workspace-write",
            Policy::ReadOnly => "read-only",
            Policy::Off => "off",
        }
    }
}

/// `network = true | false | ["host", "*.domain", "host:port"]`: TCP wherever, none, or only
/// through sup's proxy to the listed hosts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Network {
    #[default]
    On,
    Off,
    Allow(Vec<HostPattern>),
}

/// `network` in a file: a boolean or a list of host patterns, each checked.
pub(crate) fn network<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Network>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Switch(bool),
        List(Vec<String>),
        Other(serde::de::IgnoredAny),
    }
    let Some(raw) = Option::<Raw>::deserialize(d)? else {
        return Ok(None);
    };
    let list = match raw {
        Raw::Switch(true) => return Ok(Some(Network::On)),
        Raw::Switch(false) => return Ok(Some(Network::Off)),
        Raw::List(l) => l,
        Raw::Other(_) => {
            return Err(serde::de::Error::custom(
                "network is true, false or a list of hosts ([\"registry.npmjs.org\", \
                 \"*.crates.io\", \"localhost:8080\"])",
            ));
        }
    };
    list.iter()
        .map(|p| HostPattern::parse(p))
        .collect::<Result<Vec<_>, _>>()
        .map(|l| Some(Network::Allow(l)))
        .map_err(serde::de::Error::custom)
}

/// The sandbox keys of a goal file, as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SandboxSettings {
    pub(crate) sandbox: Option<Policy>,
    #[serde(default, deserialize_with = "network")]
    pub(crate) network: Option<Network>,
    #[serde(default)]
    pub(crate) writable: Vec<Spanned<String>>,
    pub(crate) sandbox_required: Option<bool>,
    pub(crate) keep_background: Option<bool>,
    #[serde(default)]
    pub(crate) env_pass: Vec<Spanned<String>>,
}

/// Sandbox settings with paths resolved: from a goal file, from flags, or both merged.
#[derive(Clone, Debug, Default)]
pub struct Sandbox {
    pub policy: Option<Policy>,
    pub network: Option<Network>,
    /// Canonical folders writable besides the workspace.
    pub writable: Vec<PathBuf>,
    pub required: bool,
    pub keep_background: bool,
    pub env_pass: Vec<String>,
    /// Files never writable by the agent (the goal file, the user config).
    pub protect: Vec<PathBuf>,
    /// The daemon's goals folder, when a daemon starts the run: never writable by it.
    pub goals: Option<PathBuf>,
    /// Whether `socket(AF_UNIX)` is allowed (`unix_sockets = true`).
    pub unix_sockets: bool,
    /// Paths hidden besides the credential stores (`hidden`), and shown again (`readable`):
    /// absolute, or `~/…`.
    pub hidden: Vec<PathBuf>,
    pub readable: Vec<PathBuf>,
    /// Processes and bytes of memory a run's jail may use (default 1024, half the machine).
    pub max_processes: Option<u64>,
    pub max_memory: Option<u64>,
}

/// A path of a goal file's `hidden` or `readable`: `~/…` and absolute ones as written, the
/// rest relative to the goal file's folder.
pub(crate) fn goal_path(dir: &Path, given: &str) -> String {
    if given.starts_with("~/") || given == "~" {
        given.to_string()
    } else {
        dir.join(given).display().to_string()
    }
}

/// `4G`, `512M`, `64k`, `1.5G`, `1000000` (bytes): a size in bytes, at least 1 MB.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or((t, ""), |i| t.split_at(i));
    let mult: u64 = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches(['B', 'I'])
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => 0,
    };
    let n: f64 = num.parse().unwrap_or(-1.0);
    if mult == 0 || n.is_nan() || n < 0.0 || num.is_empty() {
        return Err(format!(
            "`{s}` is not a memory size: write bytes or a number with K, M, G or T, e.g. \"4G\""
        ));
    }
    let bytes = (n * mult as f64) as u64;
    if bytes < 1 << 20 {
        return Err(format!("`{s}` is less than 1M: no program starts in that"));
    }
    Ok(bytes)
}

/// A name a variable can have: a letter or `_`, then letters, digits or `_`.
pub(crate) fn is_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(crate) fn check_env_pass(name: &str) -> Result<(), String> {
    if is_var_name(name) {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a variable name (letters, digits and `_`, not starting with a digit)"
        ))
    }
}

impl SandboxSettings {
    /// Resolve against the goal file's folder. A bad value gives its byte offset in the file
    /// and what is wrong.
    pub(crate) fn resolve(&self, dir: &Path) -> Result<Sandbox, (usize, String)> {
        let mut writable = Vec::new();
        for w in &self.writable {
            let given = w.get_ref();
            let path = match given.strip_prefix("~/") {
                Some(rest) => std::env::var_os("HOME")
                    .map(|h| PathBuf::from(h).join(rest))
                    .unwrap_or_else(|| PathBuf::from(given)),
                None => dir.join(given),
            };
            let full = std::fs::canonicalize(&path)
                .ok()
                .filter(|p| p.is_dir())
                .ok_or_else(|| {
                    (
                        w.span().start,
                        format!(
                            "key `writable`: {} is not an existing folder; create it or \
                             remove it from the list",
                            path.display()
                        ),
                    )
                })?;
            writable.push(full);
        }
        let mut env_pass = Vec::new();
        for e in &self.env_pass {
            check_env_pass(e.get_ref())
                .map_err(|m| (e.span().start, format!("key `env_pass`: {m}")))?;
            env_pass.push(e.get_ref().clone());
        }
        Ok(Sandbox {
            policy: self.sandbox,
            network: self.network.clone(),
            writable,
            required: self.sandbox_required.unwrap_or(false),
            keep_background: self.keep_background.unwrap_or(false),
            env_pass,
            protect: Vec::new(),
            goals: None,
            ..Default::default()
        })
    }
}

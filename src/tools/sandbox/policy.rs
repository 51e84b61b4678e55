//! The sandbox settings of a goal file and of flags: the policy (`sandbox = ...`), the keys
//! as written (`SandboxSettings`) and resolved against the goal file's folder (`Sandbox`).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

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

/// The sandbox keys of a goal file, as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SandboxSettings {
    pub(crate) sandbox: Option<Policy>,
    pub(crate) network: Option<bool>,
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
    pub network: Option<bool>,
    /// Canonical folders writable besides the workspace.
    pub writable: Vec<PathBuf>,
    pub required: bool,
    pub keep_background: bool,
    pub env_pass: Vec<String>,
    /// Files never writable by the agent (the goal file, the user config).
    pub protect: Vec<PathBuf>,
    /// The daemon's goals folder, when a daemon starts the run: never writable by it.
    pub goals: Option<PathBuf>,
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
            network: self.network,
            writable,
            required: self.sandbox_required.unwrap_or(false),
            keep_background: self.keep_background.unwrap_or(false),
            env_pass,
            protect: Vec::new(),
            goals: None,
        })
    }
}

//! Tools the model can call: the `Tool` trait, risks, the registry with its schema gate, the
//! built-in workspace tools, command tools from goal files, and the process runner they share.

pub mod builtin;
pub(crate) mod command;
pub(crate) mod git_env;
pub(crate) mod mcp;
pub(crate) mod page;
pub(crate) mod paths;
pub mod process;
pub mod sandbox;
mod schema;
mod walk;

pub use mcp::Servers;
pub use paths::{Protected, Root};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::model::ToolSpec;

/// What a call can do to the world; the approval policy and the scheduler of parallel calls
/// both go by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    Read,
    Write,
    #[default]
    Exec,
}

/// What a tool call runs with.
#[derive(Clone, Debug)]
pub struct ToolContext {
    pub(crate) workspace: PathBuf,
    /// The workspace opened once for the whole loop, with its outside ignore rules.
    pub(crate) root: Arc<Root>,
    pub(crate) cancel: CancellationToken,
    pub(crate) timeout: Duration,
    /// Where whole outputs are kept when the result is cut.
    pub(crate) output_dir: PathBuf,
    /// Byte cap of a result; tools that produce output streams cap each at half of it.
    pub(crate) output_cap: usize,
    /// A name for this call's saved outputs, unique in the run (models may reuse call ids).
    pub(crate) output_name: String,
    /// Files the agent may not change (the check scripts), as canonical paths.
    pub(crate) protected: Arc<Vec<PathBuf>>,
    /// What the goal protects (`protect` globs, `.git`): file tools create and change none.
    pub(crate) guarded: Arc<Protected>,
    /// Extra environment for processes (`SUP_WORKSPACE`, …).
    pub(crate) env: Arc<Vec<(String, String)>>,
    /// The run's approval rules: file tools write under `.git/` or to hard-linked files, and
    /// list what a rule denies to read, only as they say.
    pub(crate) rules: Arc<crate::rules::Rules>,
    /// The sandbox every process of the run starts in.
    pub(crate) jail: Arc<sandbox::Jail>,
    /// What a file tool changed, as `unified_diff` makes it: the trace shows it.
    pub(crate) diff: std::sync::OnceLock<String>,
}

/// The most of a diff a trace event holds; the rest is cut at a line.
const DIFF_CAP: usize = 32 * 1024;

/// `old` → `new` of `path` as a unified diff with three lines of context.
pub(crate) fn unified_diff(path: &str, old: &str, new: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(path, path)
        .to_string()
}

/// What a file tool changed, for the trace: `unified_diff`, cut after `DIFF_CAP` bytes (at a
/// line, saying so).
pub(crate) fn traced_diff(path: &str, old: &str, new: &str) -> String {
    let mut diff = unified_diff(path, old, new);
    if diff.len() > DIFF_CAP {
        let mut end = DIFF_CAP;
        while !diff.is_char_boundary(end) {
            end -= 1;
        }
        let end = diff[..end].rfind('\n').map_or(0, |i| i + 1);
        diff.truncate(end);
        diff.push_str("… (the diff is cut here)\n");
    }
    diff
}

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The input makes no sense for the tool; says what to change.
    #[error("{0}")]
    Invalid(String),
    /// The tool ran and failed; says how.
    #[error("{0}")]
    Failed(String),
    #[error("timed out after {0:?}; the process group was killed")]
    Timeout(Duration),
    #[error("cancelled")]
    Cancelled,
}

/// What every tool is besides what it does: what the model is told of it, and what its calls
/// risk.
#[derive(Clone, Debug)]
pub struct About {
    pub spec: ToolSpec,
    pub risk: Risk,
}

#[async_trait]
pub trait Tool: Send + Sync {
    fn about(&self) -> &About;
    /// What approval rules match of a call (`run_command(cargo test*)` matches the command
    /// line): by default the compact JSON input; built-in tools name their main argument.
    fn approval_subject(&self, input: &Value, _workspace: &std::path::Path) -> String {
        input.to_string()
    }
    /// Run the call. `Ok` text is the result; `Err` becomes an error result.
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError>;
}

/// The approval subject of a tool whose main argument is a workspace path: where the `path`
/// input really leads, symlinks in the workspace resolved, in one spelling (`./a/../b//c` →
/// `b/c`; none → `.`), so a pattern judges the file that would really be touched.
pub(crate) fn path_subject(input: &Value, workspace: &std::path::Path) -> String {
    let path = input.get("path").and_then(Value::as_str).unwrap_or(".");
    paths::rule_path(workspace, path)
}

/// A tool that passed the gate with its parsed input.
pub(crate) struct Prepared {
    pub(crate) tool: Arc<dyn Tool>,
    pub(crate) input: Value,
    /// The tool's own timeout, when it has one (a goal file's `[[tool]] timeout`).
    pub(crate) timeout: Option<Duration>,
}

/// The tools of a run, by name, each with its compiled input schema.
#[derive(Default)]
pub struct Registry {
    tools: Vec<Arc<dyn Tool>>,
    by_name: HashMap<String, (usize, Option<jsonschema::Validator>)>,
    timeouts: Vec<Option<Duration>>,
    specs: Vec<ToolSpec>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("two tools are named `{0}`; tool names must be unique")]
    Duplicate(String),
    #[error("tool `{name}` has an input_schema that is not a valid JSON Schema: {reason}")]
    BadSchema { name: String, reason: String },
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        self.add_with_timeout(tool, None)
    }

    /// Add a tool whose calls get `timeout` instead of the run's tool timeout.
    pub(crate) fn add_with_timeout(
        &mut self,
        tool: Arc<dyn Tool>,
        timeout: Option<Duration>,
    ) -> Result<(), RegistryError> {
        let spec = tool.about().spec.clone();
        if self.by_name.contains_key(&spec.name) {
            return Err(RegistryError::Duplicate(spec.name));
        }
        let validator =
            schema::compile(&spec.input_schema).map_err(|reason| RegistryError::BadSchema {
                name: spec.name.clone(),
                reason,
            })?;
        self.by_name
            .insert(spec.name.clone(), (self.tools.len(), validator));
        self.tools.push(tool);
        self.timeouts.push(timeout);
        self.specs.push(spec);
        Ok(())
    }

    pub(crate) fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// The gate every call passes before it runs: a known tool, arguments that parse as
    /// JSON (empty means `{}`), and input that satisfies the tool's schema. The error is
    /// what the model is told.
    pub(crate) fn prepare(&self, name: &str, arguments: &str) -> Result<Prepared, String> {
        let Some((index, validator)) = self.by_name.get(name) else {
            let mut names: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
            names.sort_unstable();
            return Err(format!(
                "unknown tool `{name}`; the tools are: {}",
                names.join(", ")
            ));
        };
        let input: Value = if arguments.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(arguments).map_err(|e| {
                format!("the arguments of `{name}` are not valid JSON ({e}); send a JSON object")
            })?
        };
        if let Some(validator) = validator {
            schema::check(validator, &input).map_err(|problems| {
                format!("the input of `{name}` does not match its schema: {problems}")
            })?;
        }
        Ok(Prepared {
            tool: self.tools[*index].clone(),
            input,
            timeout: self.timeouts.get(*index).copied().flatten(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_diff_is_cut_at_a_line_and_says_so() {
        let old: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        let diff = traced_diff("a.txt", &old, "");
        assert!(diff.len() <= DIFF_CAP + 64, "{}", diff.len());
        let body = diff
            .strip_suffix("… (the diff is cut here)\n")
            .expect("says it is cut");
        assert!(body.lines().skip(3).all(|l| l.starts_with("-line ")));
        assert_eq!(
            traced_diff("a.txt", "a\n", "b\n"),
            unified_diff("a.txt", "a\n", "b\n")
        );
    }
}

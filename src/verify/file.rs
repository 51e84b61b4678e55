//! Goal files (`goals/NAME.toml`), parsed strictly: an unknown key, a wrong type or a bad
//! value is an error that names the file, the key and the line. Paths in a goal file are
//! relative to the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::check::{Check, DEFAULT_TIMEOUT};
use crate::tools::Risk;
use crate::tools::sandbox::{self, Policy, Sandbox, SandboxSettings};

#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct GoalFileError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: Option<String>,
    prompt: Option<String>,
    system: Option<String>,
    model: Option<String>,
    workspace: Option<String>,
    tries: Option<u32>,
    max_steps: Option<u32>,
    token_budget: Option<u64>,
    fresh: Option<bool>,
    tool_timeout: Option<Spanned<String>>,
    schedule: Option<Spanned<String>>,
    timezone: Option<Spanned<String>>,
    overlap: Option<Spanned<String>>,
    catch_up: Option<Spanned<String>>,
    jitter: Option<Spanned<String>>,
    keep_runs: Option<u32>,
    approval: Option<Spanned<String>>,
    approval_timeout: Option<Spanned<String>>,
    #[serde(default)]
    check: Vec<Spanned<RawCheck>>,
    #[serde(default)]
    tool: Vec<Spanned<RawTool>>,
    #[serde(default)]
    mcp: Vec<Spanned<RawMcp>>,
    approval_rules: Option<RawRules>,
    // The keys of `SandboxSettings` (serde cannot flatten into a struct that denies unknown
    // keys and keeps spans).
    sandbox: Option<Policy>,
    network: Option<bool>,
    #[serde(default)]
    writable: Vec<Spanned<String>>,
    sandbox_required: Option<bool>,
    keep_background: Option<bool>,
    #[serde(default)]
    env_pass: Vec<Spanned<String>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    script: Option<String>,
    run: Option<String>,
    human: Option<String>,
    timeout: Option<Spanned<String>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: String,
    description: Option<String>,
    script: Option<String>,
    command: Option<Vec<String>>,
    input_schema: Option<toml::Value>,
    risk: Option<Risk>,
    timeout: Option<Spanned<String>>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawMcp {
    pub name: String,
    pub command: Vec<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// `"off"` runs this server outside the sandbox.
    pub sandbox: Option<Policy>,
    /// Secret-named variables this server gets.
    #[serde(default)]
    pub env_pass: Vec<String>,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct RawRules {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub ask: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// A command tool declared in a goal file.
#[derive(Clone, Debug)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub program: String,
    pub args: Vec<String>,
    pub input_schema: serde_json::Value,
    pub risk: Risk,
    pub timeout: Option<Duration>,
}

/// A value with the line it came from, for errors found later (cron, time zone).
#[derive(Clone, Debug)]
pub struct Located<T> {
    pub value: T,
    pub line: usize,
}

/// A goal file, checked and with its paths resolved.
#[derive(Clone, Debug)]
pub struct GoalFile {
    pub path: PathBuf,
    pub name: String,
    pub prompt: Option<String>,
    pub system: Option<String>,
    pub model: Option<String>,
    pub workspace: Option<PathBuf>,
    pub tries: Option<u32>,
    pub max_steps: Option<u32>,
    pub token_budget: Option<u64>,
    pub fresh: Option<bool>,
    pub tool_timeout: Option<Duration>,
    pub schedule: Option<Located<String>>,
    pub timezone: Option<Located<String>>,
    pub overlap: Option<Located<String>>,
    pub catch_up: Option<Duration>,
    pub jitter: Option<Duration>,
    pub keep_runs: Option<u32>,
    pub approval: Option<Located<String>>,
    pub approval_timeout: Option<Duration>,
    pub checks: Vec<Check>,
    pub tools: Vec<ToolDef>,
    pub mcp: Vec<RawMcp>,
    pub approval_rules: RawRules,
    pub sandbox: Sandbox,
}

fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl GoalFile {
    pub fn load(path: &Path) -> Result<GoalFile, GoalFileError> {
        let text = std::fs::read_to_string(path).map_err(|e| GoalFileError {
            file: path.display().to_string(),
            line: 0,
            message: format!("cannot read the goal file: {e}"),
        })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<GoalFile, GoalFileError> {
        let file = path.display().to_string();
        let err = |line: usize, message: String| GoalFileError {
            file: file.clone(),
            line,
            message,
        };
        let raw: Raw = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| line_at(text, s.start));
            let key = text
                .lines()
                .nth(line.saturating_sub(1))
                .and_then(|l| l.split_once('='))
                .map(|(k, _)| k.trim().trim_matches('"').to_string())
                .filter(|k| !k.is_empty() && !k.starts_with('['));
            let message = e.message().trim().to_string();
            match key {
                Some(k) if !message.contains(&format!("`{k}`")) => {
                    err(line, format!("key `{k}`: {message}"))
                }
                _ => err(line, message),
            }
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let located = |s: Spanned<String>| Located {
            line: line_at(text, s.span().start),
            value: s.into_inner(),
        };
        let duration =
            |key: &str, s: Option<Spanned<String>>| -> Result<Option<Duration>, GoalFileError> {
                s.map(|s| {
                    let line = line_at(text, s.span().start);
                    parse_duration(s.get_ref()).map_err(|m| err(line, format!("key `{key}`: {m}")))
                })
                .transpose()
            };
        let name = raw.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map_or_else(|| "goal".into(), |s| s.to_string_lossy().into_owned())
        });
        let mut checks = Vec::new();
        for c in raw.check {
            let line = line_at(text, c.span().start);
            let c = c.into_inner();
            let timeout = duration("check.timeout", c.timeout)?.unwrap_or(DEFAULT_TIMEOUT);
            match (c.script, c.run, c.human) {
                (Some(script), None, None) => {
                    let full = dir.join(&script);
                    let full = std::fs::canonicalize(&full).map_err(|e| {
                        err(line, format!("key `check.script`: {}: {e}", full.display()))
                    })?;
                    checks.push(Check::script(script, full, timeout));
                }
                (None, Some(run), None) => checks.push(Check::command(run, timeout)),
                (None, None, Some(question)) => checks.push(Check::human(question, timeout)),
                _ => {
                    return Err(err(
                        line,
                        "a [[check]] takes exactly one of `script`, `run` or `human`".into(),
                    ));
                }
            }
        }
        let mut tools = Vec::new();
        for t in raw.tool {
            let line = line_at(text, t.span().start);
            let t = t.into_inner();
            let (program, args) = match (t.script, t.command) {
                (Some(script), None) => {
                    let full = dir.join(&script);
                    let full = std::fs::canonicalize(&full)
                        .ok()
                        .filter(|p| p.is_file())
                        .ok_or_else(|| {
                            err(
                                line,
                                format!("key `tool.script`: {} does not exist", full.display()),
                            )
                        })?;
                    crate::tools::process::script_command(&full)
                }
                (None, Some(argv)) => {
                    let mut it = argv.into_iter();
                    let Some(program) = it.next() else {
                        return Err(err(
                            line,
                            "key `tool.command`: the argv list is empty".into(),
                        ));
                    };
                    (program, it.collect())
                }
                _ => {
                    return Err(err(
                        line,
                        format!(
                            "tool `{}` takes exactly one of `script` or `command`",
                            t.name
                        ),
                    ));
                }
            };
            let input_schema = match t.input_schema {
                Some(v) => serde_json::to_value(v)
                    .map_err(|e| err(line, format!("key `tool.input_schema`: {e}")))?,
                None => serde_json::json!({"type": "object"}),
            };
            tools.push(ToolDef {
                description: t
                    .description
                    .unwrap_or_else(|| format!("The `{}` tool", t.name)),
                name: t.name,
                program,
                args,
                input_schema,
                risk: t.risk.unwrap_or_default(),
                timeout: duration("tool.timeout", t.timeout)?,
            });
        }
        let mut mcp = Vec::new();
        for m in raw.mcp {
            let line = line_at(text, m.span().start);
            let m = m.into_inner();
            if m.command.is_empty() {
                return Err(err(
                    line,
                    format!("mcp `{}`: key `command` is an empty list", m.name),
                ));
            }
            for name in &m.env_pass {
                sandbox::check_env_pass(name)
                    .map_err(|e| err(line, format!("mcp `{}`: key `env_pass`: {e}", m.name)))?;
            }
            mcp.push(m);
        }
        let sandbox = SandboxSettings {
            sandbox: raw.sandbox,
            network: raw.network,
            writable: raw.writable,
            sandbox_required: raw.sandbox_required,
            keep_background: raw.keep_background,
            env_pass: raw.env_pass,
        }
        .resolve(dir)
        .map_err(|(at, message)| err(line_at(text, at), message))?;
        if let Some(o) = &raw.overlap
            && !["skip", "queue", "replace", "allow"].contains(&o.get_ref().as_str())
        {
            return Err(err(
                line_at(text, o.span().start),
                format!(
                    "key `overlap`: `{}` is not a policy; use skip, queue, replace or allow",
                    o.get_ref()
                ),
            ));
        }
        if let Some(a) = &raw.approval
            && !["ask", "queue", "auto", "never"].contains(&a.get_ref().as_str())
        {
            return Err(err(
                line_at(text, a.span().start),
                format!(
                    "key `approval`: `{}` is not a mode; use ask, queue, auto or never",
                    a.get_ref()
                ),
            ));
        }
        Ok(GoalFile {
            path: path.to_path_buf(),
            name,
            prompt: raw.prompt,
            system: raw.system,
            model: raw.model,
            workspace: raw.workspace.map(|w| dir.join(w)),
            tries: raw.tries,
            max_steps: raw.max_steps,
            token_budget: raw.token_budget,
            fresh: raw.fresh,
            tool_timeout: duration("tool_timeout", raw.tool_timeout)?,
            schedule: raw.schedule.map(located),
            timezone: raw.timezone.map(located),
            overlap: raw.overlap.map(located),
            catch_up: duration("catch_up", raw.catch_up)?,
            jitter: duration("jitter", raw.jitter)?,
            keep_runs: raw.keep_runs,
            approval: raw.approval.map(located),
            approval_timeout: duration("approval_timeout", raw.approval_timeout)?,
            checks,
            tools,
            mcp,
            approval_rules: raw.approval_rules.unwrap_or_default(),
            sandbox,
        })
    }
}

/// `30s`, `5m`, `1h 30m`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("`{s}` is not a duration ({e}); write e.g. `30s`, `5m`, `1h`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<GoalFile, GoalFileError> {
        GoalFile::parse(Path::new("goals/x.toml"), text)
    }

    #[test]
    fn unknown_key_names_file_key_and_line() {
        let e = parse("prompt = \"hi\"\ntrys = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("goals/x.toml:2:"), "{e}");
        assert!(e.contains("trys"), "{e}");
    }

    #[test]
    fn wrong_type_names_key() {
        let e = parse("prompt = \"hi\"\n\ntries = \"three\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("goals/x.toml:3:"), "{e}");
        assert!(e.contains("tries"), "{e}");
    }

    #[test]
    fn bad_duration_names_key_and_line() {
        let e = parse("prompt = \"hi\"\n[[check]]\nrun = \"true\"\ntimeout = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("goals/x.toml:4:"), "{e}");
        assert!(e.contains("check.timeout"), "{e}");
    }

    #[test]
    fn a_good_file() {
        let g = parse(
            "prompt = \"p\"\ntries = 2\n[[check]]\nrun = \"true\"\ntimeout = \"5s\"\n\
             [[tool]]\nname = \"t\"\ncommand = [\"cat\"]\ninput_schema = { type = \"object\" }\nrisk = \"read\"\n",
        )
        .unwrap();
        assert_eq!(g.name, "x");
        assert_eq!(g.checks[0].timeout, Duration::from_secs(5));
        assert_eq!(g.tools[0].risk, Risk::Read);
    }
}

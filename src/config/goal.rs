//! Goal files (`goals/NAME.toml`), parsed strictly into `Settings` plus the goal's checks and
//! tools: an unknown key, a wrong type or a bad value is an error that names the file, the
//! line and the key (`check.timeout` inside a `[[check]]`). Paths in a goal file are relative
//! to the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::Settings;
use crate::tools::Risk;
use crate::verify::Check;

#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct GoalFileError {
    pub(crate) file: String,
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// A `[[check]]` table as written.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawCheck {
    script: Option<String>,
    run: Option<String>,
    human: Option<String>,
    /// Criteria a model judges (`crate::verify::judge`).
    judge: Option<String>,
    /// A judge's own model, `PROVIDER:MODEL`.
    model: Option<String>,
    #[serde(default, deserialize_with = "super::timeout")]
    timeout: Option<Duration>,
}

/// A `[[tool]]` table as written.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawTool {
    name: String,
    description: Option<String>,
    script: Option<String>,
    command: Option<Vec<String>>,
    input_schema: Option<toml::Value>,
    risk: Option<Risk>,
    #[serde(default, deserialize_with = "super::timeout")]
    timeout: Option<Duration>,
}

/// An MCP server: over stdio (`command`; `--mcp NAME=COMMAND` on the command line) or over
/// streamable HTTP (`url`, with `headers` whose `${VAR}` come from the environment).
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    pub(crate) name: String,
    /// Empty for a server over HTTP.
    #[serde(default, deserialize_with = "argv")]
    pub(crate) command: Vec<String>,
    pub(crate) url: Option<String>,
    #[serde(default)]
    pub(crate) headers: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) args: Vec<String>,
    #[serde(default)]
    pub(crate) env: BTreeMap<String, String>,
    /// Whether the server's tool annotations are believed (`readOnlyHint` makes a tool
    /// `read`); otherwise every tool of it is `exec`.
    #[serde(default)]
    pub(crate) trust_annotations: bool,
    /// `"off"` runs this server outside the sandbox.
    pub(crate) sandbox: Option<crate::tools::sandbox::Policy>,
    /// Secret-named variables this server gets.
    #[serde(default, deserialize_with = "super::env_pass_names")]
    pub(crate) env_pass: Vec<String>,
}

/// `[webhook]`: a signed `POST /hooks/NAME` on the console starts the goal.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// The environment variable holding the HMAC-SHA256 key deliveries are signed with.
    pub(crate) secret_env: String,
}

impl super::Show for Webhook {
    fn show(&self) -> String {
        format!("secret_env {}", self.secret_env)
    }
}

fn argv<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    if v.is_empty() {
        return Err(serde::de::Error::custom(
            "the argv list is empty; write e.g. [\"uvx\", \"mcp-server-git\"]",
        ));
    }
    Ok(v)
}

/// A command tool declared in a goal file.
#[derive(Clone, Debug)]
pub struct ToolDef {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    pub(crate) input_schema: serde_json::Value,
    pub(crate) risk: Risk,
    /// Its own timeout; the run's `tool_timeout` otherwise.
    pub(crate) timeout: Option<Duration>,
}

/// A check with the timeout it set itself, if any (the run's `check_timeout` otherwise).
#[derive(Clone, Debug)]
pub struct CheckDef {
    pub(crate) check: Check,
    pub(crate) timeout: Option<Duration>,
}

/// A goal file, checked, with its paths resolved against its folder.
#[derive(Clone, Debug)]
pub struct GoalFile {
    pub(crate) path: PathBuf,
    pub(crate) name: String,
    /// The file's settings (its `[[check]]` and `[[tool]]` tables taken out).
    pub(crate) settings: Settings,
    pub(crate) checks: Vec<CheckDef>,
    pub(crate) tools: Vec<ToolDef>,
    /// The lines of keys checked later (`schedule`, `timezone`), for their errors.
    pub(crate) lines: BTreeMap<&'static str, usize>,
}

fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The key an error on `line` is about, with its table: `check.timeout`.
fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line.checked_sub(1)?)?;
    let key = here.split_once('=')?.0.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') {
        return None;
    }
    let table = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim());
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_string(),
    })
}

/// A file's text; an error names the file and says what it is (`what`: `goal file`).
pub(super) fn read(path: &Path, what: &str) -> Result<String, GoalFileError> {
    std::fs::read_to_string(path).map_err(|e| GoalFileError {
        file: path.display().to_string(),
        line: 0,
        message: format!("cannot read the {what}: {e}"),
    })
}

/// The settings of a goal file or the user config, parsed strictly and checked where
/// parsing cannot (`[[notify]]`, `[approval_rules]`, `[[mcp]]`, `writable`).
pub(super) fn settings(path: &Path, text: &str) -> Result<Settings, GoalFileError> {
    let mut settings: Settings = from_toml(path, text)?;
    check_notify(path, text, &settings.notify)?;
    check_rules(path, text)?;
    check_mcp(path, text)?;
    settings.writable = writable(path, text)?;
    Ok(settings)
}

/// Parse a TOML file of settings strictly; errors name the file, the line and the key.
fn from_toml<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, GoalFileError> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| line_at(text, s.start));
        let message = e.message().trim().to_string();
        let message = match key_at(text, line) {
            Some(k) if !message.contains(&format!("`{k}`")) => {
                format!("key `{k}`: {message}")
            }
            _ => message,
        };
        GoalFileError {
            file: path.display().to_string(),
            line,
            message,
        }
    })
}

/// Check `[[notify]]` tables; an error names the file and the table's line.
fn check_notify(
    path: &Path,
    text: &str,
    tables: &[toml::Spanned<crate::notify::RawNotify>],
) -> Result<(), GoalFileError> {
    for t in tables {
        crate::notify::Notify::parse(t.get_ref().clone()).map_err(|e| GoalFileError {
            file: path.display().to_string(),
            line: line_at(text, t.span().start),
            message: e.to_string(),
        })?;
    }
    Ok(())
}

/// Check `[[mcp]]` tables: a server is a `command` or a `url`, and a header that carries a
/// credential takes it from the environment (`${VAR}`), never from the file.
fn check_mcp(path: &Path, text: &str) -> Result<(), GoalFileError> {
    #[derive(Deserialize)]
    struct Tables {
        #[serde(default)]
        mcp: Vec<toml::Spanned<toml::Table>>,
    }
    let Ok(tables) = toml::from_str::<Tables>(text) else {
        return Ok(());
    };
    for t in &tables.mcp {
        let err = |message: String| GoalFileError {
            file: path.display().to_string(),
            line: line_at(text, t.span().start),
            message,
        };
        let table = t.get_ref();
        match (table.get("command"), table.get("url")) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "an [[mcp]] server has `command` (stdio) or `url` (streamable HTTP), not \
                     both"
                        .into(),
                ));
            }
            (None, None) => {
                return Err(err(
                    "an [[mcp]] server needs `command = [\"argv\", …]` (stdio) or `url = \
                     \"https://…/mcp\"` (streamable HTTP)"
                        .into(),
                ));
            }
            (None, Some(url)) => {
                let url = url.as_str().unwrap_or("");
                if !reqwest::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https")) {
                    return Err(err(format!(
                        "key `mcp.url`: `{url}` is not an http:// or https:// URL"
                    )));
                }
            }
            (Some(_), None) => {
                if table.contains_key("headers") {
                    return Err(err(
                        "key `mcp.headers`: headers are for a server over HTTP (`url`)".into(),
                    ));
                }
            }
        }
        let headers = table.get("headers").and_then(|h| h.as_table());
        for (name, value) in headers.into_iter().flatten() {
            let value = value.as_str().unwrap_or("");
            if crate::tools::sandbox::is_secret_name(name) && !value.contains("${") {
                return Err(err(format!(
                    "key `mcp.headers.{name}`: a credential is never written in the goal file: \
                     write e.g. `{name} = \"Bearer ${{MCP_TOKEN}}\"` and set MCP_TOKEN in \
                     the environment"
                )));
            }
        }
    }
    Ok(())
}

/// `[approval_rules]` as written, each rule with where it is, so that a bad one names its line.
#[derive(Deserialize, Default)]
struct SpannedRules {
    #[serde(default)]
    allow: Vec<toml::Spanned<String>>,
    #[serde(default)]
    ask: Vec<toml::Spanned<String>>,
    #[serde(default)]
    deny: Vec<toml::Spanned<String>>,
}

/// Check every rule of `[approval_rules]`; a bad one names the file and its line.
fn check_rules(path: &Path, text: &str) -> Result<(), GoalFileError> {
    #[derive(Deserialize)]
    struct Only {
        #[serde(default)]
        approval_rules: SpannedRules,
    }
    // Most files have no rules: they are not parsed again for them.
    if !text.contains("approval_rules") {
        return Ok(());
    }
    let Ok(only) = toml::from_str::<Only>(text) else {
        return Ok(());
    };
    let rules = only.approval_rules;
    for (key, list) in [
        ("allow", rules.allow),
        ("ask", rules.ask),
        ("deny", rules.deny),
    ] {
        for r in list {
            crate::approval::Rule::parse(r.get_ref()).map_err(|e| GoalFileError {
                file: path.display().to_string(),
                line: line_at(text, r.span().start),
                message: format!("key `approval_rules.{key}`: {e}"),
            })?;
        }
    }
    Ok(())
}

/// `writable = [...]`, each folder resolved against the folder of the file that names it (a
/// goal file or the user config; or `~/`) and checked to exist; a bad one names the file and
/// its line.
fn writable(path: &Path, text: &str) -> Result<Vec<String>, GoalFileError> {
    #[derive(Deserialize)]
    struct Only {
        #[serde(default)]
        writable: Vec<toml::Spanned<String>>,
    }
    // Most files have no `writable`: they are not parsed again for it.
    let only = if text.contains("writable") {
        let Ok(only) = toml::from_str::<Only>(text) else {
            return Ok(Vec::new());
        };
        only.writable
    } else {
        Vec::new()
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let resolved = crate::tools::sandbox::SandboxSettings {
        writable: only,
        ..Default::default()
    }
    .resolve(dir)
    .map_err(|(at, message)| GoalFileError {
        file: path.display().to_string(),
        line: line_at(text, at),
        message,
    })?;
    Ok(resolved
        .writable
        .iter()
        .map(|p| p.display().to_string())
        .collect())
}

/// The line where a top-level string key's text begins (a multi-line string's first
/// newline is not part of it): where a template's line 1 is.
fn text_line(text: &str, key: &str) -> Option<usize> {
    for (i, line) in text.lines().enumerate() {
        let l = line.trim_start();
        if l.starts_with('[') {
            return None;
        }
        let Some(rest) = l.strip_prefix(key) else {
            continue;
        };
        let Some(value) = rest.trim_start().strip_prefix('=') else {
            continue;
        };
        let v = value.trim();
        let multi = (v == "\"\"\"" || v == "'''") as usize;
        return Some(i + 1 + multi);
    }
    None
}

impl GoalFile {
    pub(crate) fn load(path: &Path) -> Result<GoalFile, GoalFileError> {
        Self::parse(path, &read(path, "goal file")?)
    }

    pub fn parse(path: &Path, text: &str) -> Result<GoalFile, GoalFileError> {
        let file = path.display().to_string();
        let err = |line: usize, message: String| GoalFileError {
            file: file.clone(),
            line,
            message,
        };
        let mut settings = settings(path, text)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        settings.workspace = settings.workspace.map(|w| dir.join(w));
        for paths in [&mut settings.hidden, &mut settings.readable] {
            *paths = paths
                .iter()
                .map(|h| crate::tools::sandbox::goal_path(dir, h))
                .collect();
        }
        let name = settings.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map_or_else(|| "goal".into(), |s| s.to_string_lossy().into_owned())
        });
        let mut checks = Vec::new();
        for c in std::mem::take(&mut settings.check) {
            let line = line_at(text, c.span().start);
            let c = c.into_inner();
            if c.model.is_some() && c.judge.is_none() {
                return Err(err(
                    line,
                    "key `check.model`: only a judge check (`judge = \"…\"`) has a model".into(),
                ));
            }
            let check = match (c.script, c.run, c.human, c.judge) {
                (None, None, None, Some(criteria)) => {
                    if criteria.trim().is_empty() {
                        return Err(err(
                            line,
                            "key `check.judge`: the criteria are empty; say what the judge \
                             should find, e.g. judge = \"README.md explains how to install\""
                                .into(),
                        ));
                    }
                    if let Some(m) = c.model.as_deref().filter(|m| !m.contains(':')) {
                        return Err(err(
                            line,
                            format!(
                                "key `check.model`: `{m}` is not PROVIDER:MODEL, e.g. openai:gpt-4o-mini"
                            ),
                        ));
                    }
                    Check::judge(criteria, c.model, Duration::ZERO)
                }
                (Some(script), None, None, None) => {
                    let full = dir.join(&script);
                    let full = std::fs::canonicalize(&full).map_err(|e| {
                        err(line, format!("key `check.script`: {}: {e}", full.display()))
                    })?;
                    Check::script(script, full, Duration::ZERO)
                }
                (None, Some(run), None, None) => Check::command(run, Duration::ZERO),
                (None, None, Some(question), None) => Check::human(question, Duration::ZERO),
                _ => {
                    return Err(err(
                        line,
                        "a [[check]] takes exactly one of `script`, `run`, `human` or `judge`"
                            .into(),
                    ));
                }
            };
            checks.push(CheckDef {
                check,
                timeout: c.timeout,
            });
        }
        if let Some(w) = &settings.webhook {
            let name = &w.get_ref().secret_env;
            let ok = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                let start = w.span().start.min(text.len());
                let at = text[start..]
                    .find("secret_env")
                    .map_or(start, |i| start + i);
                return Err(err(
                    line_at(text, at),
                    format!(
                        "key `webhook.secret_env`: `{name}` is not an environment variable's \
                         name; write e.g. secret_env = \"GITHUB_WEBHOOK_SECRET\""
                    ),
                ));
            }
        }
        let mut tools = Vec::new();
        for t in std::mem::take(&mut settings.tool) {
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
                timeout: t.timeout,
            });
        }
        let mut lines = BTreeMap::new();
        for key in ["prompt", "system"] {
            if let Some(line) = text_line(text, key) {
                lines.insert(key, line);
            }
        }
        for (key, value) in [
            ("schedule", &settings.schedule),
            ("timezone", &settings.timezone),
        ] {
            if let Some(v) = value {
                lines.insert(key, line_at(text, v.span().start));
            }
        }
        Ok(GoalFile {
            path: path.to_path_buf(),
            name,
            settings,
            checks,
            tools,
            lines,
        })
    }

    /// The folder the file's relative paths start at.
    pub(crate) fn dir(&self) -> PathBuf {
        self.path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<GoalFile, GoalFileError> {
        GoalFile::parse(Path::new("goals/x.toml"), text)
    }

    /// `text`'s error starts with the file and `line`, and names each of `words`.
    fn fails_at(text: &str, line: usize, words: &[&str]) {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.starts_with(&format!("goals/x.toml:{line}:")), "{e}");
        for w in words {
            assert!(e.contains(w), "{e}");
        }
    }

    #[test]
    fn a_bad_rule_names_file_and_line() {
        fails_at(
            "prompt = \"hi\"\n[approval_rules]\nallow = [\"ok\",\n  \"run_command(x\"]\n",
            4,
            &["approval_rules.allow"],
        );
    }

    #[test]
    fn unknown_key_names_file_key_and_line() {
        fails_at("prompt = \"hi\"\ntrys = 3\n", 2, &["trys"]);
    }

    #[test]
    fn wrong_type_names_key() {
        fails_at("prompt = \"hi\"\n\ntries = \"three\"\n", 3, &["tries"]);
    }

    #[test]
    fn bad_duration_names_key_and_line() {
        fails_at(
            "prompt = \"hi\"\n[[check]]\nrun = \"true\"\ntimeout = \"soon\"\n",
            4,
            &["check.timeout"],
        );
    }

    #[test]
    fn an_empty_mcp_command_names_its_line() {
        fails_at(
            "prompt = \"hi\"\n[[mcp]]\nname = \"m\"\ncommand = []\n",
            4,
            &["mcp.command", "empty"],
        );
    }

    #[test]
    fn a_good_file() {
        let g = parse(
            "prompt = \"p\"\ntries = 2\noutput_cap = 4096\ncheck_timeout = \"9s\"\n\
             [[check]]\nrun = \"true\"\ntimeout = \"5s\"\n\
             [[tool]]\nname = \"t\"\ncommand = [\"cat\"]\ninput_schema = { type = \"object\" }\nrisk = \"read\"\ntimeout = \"3s\"\n",
        )
        .unwrap();
        assert_eq!(g.name, "x");
        assert_eq!(g.checks[0].timeout, Some(Duration::from_secs(5)));
        assert_eq!(g.settings.check_timeout, Some(Duration::from_secs(9)));
        assert_eq!(g.settings.output_cap, Some(4096));
        assert_eq!(g.tools[0].risk, Risk::Read);
        assert_eq!(g.tools[0].timeout, Some(Duration::from_secs(3)));
    }
}

//! Command tools: `[[tool]]` entries of a goal file. The JSON input goes to the process on
//! stdin and its stdout is the result (JSON if it parses, text otherwise); a non-zero exit or
//! a timeout is an error result that carries stderr. Also which program an MCP server or a
//! command tool is: a name found outside the workspace (version-manager shims resolved away
//! from it), and package launchers (`npx` and `npm exec`, `uvx`, `bunx` and `bun x`) that
//! resolve nothing from it, so nothing the agent planted there becomes the program.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde_json::Value;

use super::builtin::run_for_tool;
use super::process::{self, Ending};
use super::{About, Tool, ToolContext, ToolError};

/// How a package launcher is run so that, started for the workspace, it resolves nothing
/// from it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Launch {
    /// Arguments to put first.
    pub(crate) args: Vec<String>,
    /// Variables to add.
    pub(crate) env: Vec<(String, String)>,
    /// The working folder instead of the workspace.
    pub(crate) cwd: Option<PathBuf>,
}

/// How a package launcher run for the workspace (`program` with `args`) resolves nothing
/// from it: `npx` and `npm exec` (`npm x`) get an empty `--prefix` of sup's (no local
/// `node_modules/.bin`, no workspace `.npmrc`); `uvx`/`uv` read no `uv.toml` or
/// `pyproject.toml` (`UV_NO_CONFIG`); `bunx` and `bun x`, which have no flag for either and
/// read a `bunfig.toml`, a `.env` and a local `node_modules/.bin` from their working folder
/// and those above it, start in `empty` instead of the workspace (the program they run finds
/// the workspace in `SUP_WORKSPACE`). `pipx` resolves in its own folders already. `empty`
/// is a folder the agent cannot write.
pub(crate) fn launch_outside(program: &str, args: &[String], empty: &Path) -> Launch {
    let name = crate::rules::basename(program);
    let first = args.first().map(String::as_str);
    match (name, first) {
        ("npx", _) | ("npm", Some("exec" | "x")) => {
            let _ = std::fs::create_dir_all(empty);
            Launch {
                args: vec!["--prefix".into(), empty.display().to_string()],
                ..Launch::default()
            }
        }
        ("uvx" | "uv", _) => Launch {
            env: vec![("UV_NO_CONFIG".into(), "1".into())],
            ..Launch::default()
        },
        ("bunx", _) | ("bun", Some("x")) => {
            let _ = std::fs::create_dir_all(empty);
            Launch {
                cwd: Some(empty.to_path_buf()),
                ..Launch::default()
            }
        }
        _ => Launch::default(),
    }
}

/// The program a bare name runs, found on PATH outside `workspace` and, when it is a version
/// manager's shim (pyenv, rbenv, nodenv, asdf, mise), resolved through the manager away from
/// the workspace, so no `.python-version`, `.tool-versions`, `.nvmrc` or `.node-version` the
/// agent wrote there chooses it; with the variable that pins the manager's version (for the
/// other programs it shims), if it has one.
pub(crate) fn resolve_program(
    name: &str,
    workspace: &Path,
) -> Option<(PathBuf, Option<(String, String)>)> {
    if name.contains('/') {
        return None;
    }
    let path = std::env::var_os("PATH")?;
    let found = std::env::split_paths(&path)
        .filter(|d| d.is_absolute() && !d.starts_with(workspace))
        .map(|d| d.join(name))
        .find(|p| is_executable(p))?;
    let Some(manager) = shim_manager(&found) else {
        return Some((found, None));
    };
    // Where the manager looks for version files: the home folder (the person's own choice)
    // unless the workspace holds it, else the root.
    let away = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute() && !h.starts_with(workspace) && h.is_dir())
        .unwrap_or_else(|| PathBuf::from("/"));
    let real = manager_which(&manager, name, &away)?;
    (!real.starts_with(workspace)).then(|| (real, manager_pin(&manager, &away)))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The version manager whose shim `program` is: its name and its root folder.
fn shim_manager(program: &Path) -> Option<(&'static str, PathBuf)> {
    let dir = program.parent()?;
    let root = dir.parent()?;
    if dir.file_name()? != "shims" {
        return None;
    }
    let root_name = root.file_name()?.to_string_lossy().to_ascii_lowercase();
    ["pyenv", "rbenv", "nodenv", "asdf", "mise", "rtx"]
        .into_iter()
        .find(|m| root_name.contains(m) || root.ancestors().any(|a| a.ends_with(m)))
        .map(|m| (if m == "rtx" { "mise" } else { m }, root.to_path_buf()))
}

/// The manager's command: in its root's `bin` or `libexec`, else by name on PATH.
fn manager_command(manager: &(&str, PathBuf)) -> PathBuf {
    let (name, root) = manager;
    [root.join("bin").join(name), root.join("libexec").join(name)]
        .into_iter()
        .find(|p| is_executable(p))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Ask a version manager, in `dir`, which program `name` is now.
fn manager_which(manager: &(&str, PathBuf), name: &str, dir: &Path) -> Option<PathBuf> {
    let out = std::process::Command::new(manager_command(manager))
        .args(["which", name])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let p = PathBuf::from(text.trim());
    (out.status.success() && p.is_absolute() && is_executable(&p)).then_some(p)
}

/// The variable that pins a manager's version for every program it shims (a check's
/// `pytest` as well as its `python3`), with the version it picks in `dir` now.
fn manager_pin(manager: &(&str, PathBuf), dir: &Path) -> Option<(String, String)> {
    let var = match manager.0 {
        "pyenv" => "PYENV_VERSION",
        "rbenv" => "RBENV_VERSION",
        "nodenv" => "NODENV_VERSION",
        _ => return None,
    };
    let out = std::process::Command::new(manager_command(manager))
        .arg("version-name")
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !v.is_empty() && !v.contains('\n')).then(|| (var.to_string(), v))
}

pub(crate) struct CommandTool {
    about: About,
    program: String,
    args: Vec<String>,
}

impl CommandTool {
    /// `argv` is the program and its arguments (a script already turned into its interpreter
    /// line by the caller).
    pub(crate) fn new(about: About, program: String, args: Vec<String>) -> Self {
        CommandTool {
            about,
            program,
            args,
        }
    }
}

#[async_trait]
impl Tool for CommandTool {
    fn about(&self) -> &About {
        &self.about
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let empty = ctx.output_dir.with_file_name("launch");
        let launch = launch_outside(&self.program, &self.args, &empty);
        let mut args = launch.args;
        args.extend(self.args.iter().cloned());
        let mut env = ctx.env.as_ref().clone();
        env.extend(launch.env);
        let (program, pin) = match resolve_program(&self.program, &ctx.workspace) {
            Some((real, pin)) => (real.display().to_string(), pin),
            None => (self.program.clone(), None),
        };
        env.extend(pin);
        let spec = process::Spec {
            program,
            args,
            cwd: launch.cwd.unwrap_or_else(|| ctx.workspace.clone()),
            env,
            stdin: Some(input.to_string().into_bytes()),
            timeout: ctx.timeout,
            stdout: PathBuf::new(),
            stderr: PathBuf::new(),
            jail: ctx.jail.clone(),
        };
        let (ending, stdout, stderr) = run_for_tool(spec, ctx).await?;
        match ending {
            Ending::Exited(0) => Ok(match serde_json::from_str::<Value>(stdout.trim()) {
                Ok(json) => json.to_string(),
                Err(_) => stdout,
            }),
            Ending::Cancelled => Err(ToolError::Cancelled),
            other => {
                let mut text = format!(
                    "`{}` failed: {}",
                    self.about.spec.name,
                    other.describe(ctx.timeout)
                );
                if !stderr.trim().is_empty() {
                    text.push_str("\n--- stderr ---\n");
                    text.push_str(&stderr);
                }
                if !stdout.trim().is_empty() {
                    text.push_str("\n--- stdout ---\n");
                    text.push_str(&stdout);
                }
                Err(ToolError::Failed(text))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_launchers_resolve_nothing_from_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("launch");
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let prefix = ["--prefix".to_string(), empty.display().to_string()];
        for (program, rest) in [
            ("/usr/bin/npx", args(&["-y", "pkg"])),
            ("npm", args(&["exec", "pkg"])),
            ("npm", args(&["x", "pkg"])),
        ] {
            let l = launch_outside(program, &rest, &empty);
            assert_eq!(l.args, prefix, "{program} {rest:?}");
            assert_eq!(l.cwd, None);
        }
        assert_eq!(
            launch_outside("uvx", &[], &empty).env,
            [("UV_NO_CONFIG".to_string(), "1".to_string())]
        );
        for (bunx, rest) in [
            ("bunx", args(&["eslint"])),
            ("/home/me/.bun/bin/bunx", vec![]),
            ("bun", args(&["x", "eslint"])),
        ] {
            let l = launch_outside(bunx, &rest, &empty);
            assert_eq!(l.cwd.as_deref(), Some(empty.as_path()), "{bunx}");
            assert!(l.args.is_empty() && l.env.is_empty());
        }
        assert!(empty.is_dir());
        // Not launchers: a script bun runs, npm's other commands.
        assert_eq!(
            launch_outside("bun", &args(&["run", "x"]), &empty),
            Launch::default()
        );
        assert_eq!(
            launch_outside("npm", &args(&["test"]), &empty),
            Launch::default()
        );
        assert_eq!(launch_outside("python3", &[], &empty), Launch::default());
    }
}

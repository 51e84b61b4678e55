//! Command tools: `[[tool]]` entries of a goal file. The JSON input goes to the process on
//! stdin and its stdout is the result (JSON if it parses, text otherwise); a non-zero exit or
//! a timeout is an error result that carries stderr. Also how package launchers (`npx`,
//! `uvx`, `pipx`, `bunx`) are started for MCP servers and command tools: resolving outside the
//! workspace, so nothing the agent planted there becomes the program.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde_json::Value;

use super::builtin::run_for_tool;
use super::process::{self, Ending};
use super::{Risk, Tool, ToolContext, ToolError};
use crate::model::ToolSpec;

/// The arguments to put first and the environment to add so that a package launcher run
/// with the workspace as its working directory resolves nothing from it: `npx` gets an empty
/// `--prefix` of sup's (no local `node_modules/.bin`, no workspace `.npmrc`); `uvx`/`uv` read
/// no `uv.toml` or `pyproject.toml` (`UV_NO_CONFIG`). `pipx` resolves in its own folders
/// already. `empty` is a folder the agent cannot write.
pub(crate) fn launch_outside(program: &str, empty: &Path) -> (Vec<String>, Vec<(String, String)>) {
    match program.rsplit('/').next().unwrap_or(program) {
        "npx" => {
            let _ = std::fs::create_dir_all(empty);
            (
                vec!["--prefix".into(), empty.display().to_string()],
                Vec::new(),
            )
        }
        "uvx" | "uv" => (Vec::new(), vec![("UV_NO_CONFIG".into(), "1".into())]),
        _ => (Vec::new(), Vec::new()),
    }
}

pub(crate) struct CommandTool {
    spec: ToolSpec,
    risk: Risk,
    program: String,
    args: Vec<String>,
}

impl CommandTool {
    /// `argv` is the program and its arguments (a script already turned into its interpreter
    /// line by the caller).
    pub(crate) fn new(spec: ToolSpec, risk: Risk, program: String, args: Vec<String>) -> Self {
        CommandTool {
            spec,
            risk,
            program,
            args,
        }
    }
}

#[async_trait]
impl Tool for CommandTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn risk(&self) -> Risk {
        self.risk
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let empty = ctx.output_dir.with_file_name("launch");
        let (mut args, launch_env) = launch_outside(&self.program, &empty);
        args.extend(self.args.iter().cloned());
        let mut env = ctx.env.as_ref().clone();
        env.extend(launch_env);
        let spec = process::Spec {
            program: self.program.clone(),
            args,
            cwd: ctx.workspace.clone(),
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
                    self.spec.name,
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

//! Command tools: `[[tool]]` entries of a goal file. The JSON input goes to the process on
//! stdin and its stdout is the result (JSON if it parses, text otherwise); a non-zero exit or
//! a timeout is an error result that carries stderr.

use std::path::PathBuf;

use async_trait::async_trait;
use serde_json::Value;

use super::builtin::run_for_tool;
use super::process::{self, Ending};
use super::{Risk, Tool, ToolContext, ToolError};
use crate::model::ToolSpec;

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
        let spec = process::Spec {
            program: self.program.clone(),
            args: self.args.clone(),
            cwd: ctx.workspace.clone(),
            env: ctx.env.as_ref().clone(),
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

//! MCP tools: the servers a goal names, started over stdio, or reached over streamable HTTP
//! (`url`, with `headers` whose `${VAR}` come from the environment), with the official SDK
//! (`rmcp`),
//! initialized, their tools listed (every page) and offered to the model as `SERVER__TOOL`
//! through the same schema gate as every tool; calls with a timeout and cancellation; risk
//! `exec`, or from annotations (`readOnlyHint` → read) when the server is trusted with
//! `trust_annotations`, since the MCP specification calls them untrusted hints; stderr into
//! the run's folder; every server started by the run ended before each try's checks (its
//! process group, and with the agent's jail all it started) and started again, with the same
//! tools, for the next try; and every server's process group shut down when the run ends,
//! whatever ends it. Servers start in the run's sandbox with the scrubbed environment unless
//! `[[mcp]] sandbox = "off"`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService, ServiceExt};
use rmcp::transport::TokioChildProcess;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use super::{About, Risk, Tool, ToolContext, ToolError};
use crate::model::ToolSpec;

/// How long a server gets to start and answer `initialize` and `tools/list`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A server to start: `[[mcp]]` in a goal file, or `--mcp NAME=COMMAND`.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    pub(crate) name: String,
    /// The program and its first arguments (empty for a server over HTTP).
    pub(crate) command: Vec<String>,
    /// A server over streamable HTTP instead of a program.
    pub(crate) url: Option<String>,
    /// Headers sent to a server over HTTP, `${VAR}` taken from the environment.
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) args: Vec<String>,
    pub(crate) env: BTreeMap<String, String>,
    /// Believe the server's annotations: `readOnlyHint` makes a tool `read`.
    pub(crate) trust_annotations: bool,
    /// `Some(Policy::Off)` runs this server outside the sandbox.
    pub(crate) sandbox: Option<super::sandbox::Policy>,
    /// Secret-named variables this server gets.
    pub(crate) env_pass: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("MCP server `{name}`: cannot start `{command}`: {reason}")]
    Spawn {
        name: String,
        command: String,
        reason: String,
    },
    #[error("MCP server `{name}` at {url}: {reason}")]
    Http {
        name: String,
        url: String,
        reason: String,
    },
    #[error("MCP server `{name}` did not initialize: {reason}{stderr}")]
    Init {
        name: String,
        reason: String,
        stderr: String,
    },
    #[error(
        "MCP server `{name}` was started again for the next try but offers other tools \
         ({now}) than at the start ({before})"
    )]
    Changed {
        name: String,
        before: String,
        now: String,
    },
}

/// Process groups of live servers, so that even a hard exit can end them.
static LIVE_GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Kill every server process group still alive (used on a hard exit).
pub(crate) fn kill_all() {
    if let Ok(groups) = LIVE_GROUPS.lock() {
        for g in groups.iter() {
            let _ = killpg(Pid::from_raw(*g), Signal::SIGKILL);
        }
    }
}

type Client = RunningService<RoleClient, ()>;

/// One server of the run, started again after each try's checks.
pub(crate) struct Server {
    spec: ServerSpec,
    /// The names of the tools it offered at the start: a server started again must offer
    /// the same.
    tools: Vec<String>,
    /// The running server; `None` while it is ended (a try's checks).
    live: tokio::sync::RwLock<Option<Live>>,
    log: PathBuf,
}

/// A server while it runs.
struct Live {
    client: Client,
    peer: rmcp::service::Peer<RoleClient>,
    group: Option<i32>,
    /// Left alone by the sweep while the server lives (the reaper's registry).
    _held: Option<crate::tools::sandbox::Held>,
}

impl Live {
    /// Close the transport, then end the whole process group.
    async fn stop(self, name: &str, log: &Path) {
        let _ = tokio::time::timeout(Duration::from_secs(3), self.client.cancel()).await;
        if let Some(g) = self.group {
            let _ = killpg(Pid::from_raw(g), Signal::SIGTERM);
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
            if let Ok(mut live) = LIVE_GROUPS.lock() {
                live.retain(|x| *x != g);
            }
        }
        tracing::debug!(
            "MCP server `{name}` shut down; its stderr is in {}",
            log.display()
        );
    }
}

/// The servers of a run: ended before each try's checks (`end`), started again for the next
/// try (`restart`), shut down with `shutdown` when the run ends.
#[derive(Default)]
pub struct Servers {
    servers: Vec<Arc<Server>>,
    workspace: PathBuf,
    log_dir: PathBuf,
    run_id: String,
}

fn tail_of(path: &Path) -> String {
    match crate::tools::process::read_tail(path, 2000) {
        Ok((t, _)) if !t.trim().is_empty() => format!(
            "\n--- its stderr ({}) ---\n{}",
            path.display(),
            t.trim_end()
        ),
        _ => String::new(),
    }
}

/// A tool name every provider accepts: letters, digits, `_` and `-`, at most 64.
fn wire_name(server: &str, tool: &str) -> String {
    use crate::tools::process::safe_name;
    let mut name = format!("{}__{}", safe_name(server), safe_name(tool));
    name.truncate(64);
    name
}

impl Servers {
    /// Start every server and list its tools; the first failure stops everything.
    pub(crate) async fn start(
        specs: &[ServerSpec],
        workspace: &Path,
        log_dir: &Path,
        jail: &super::sandbox::Jail,
        run_id: &str,
    ) -> Result<(Servers, Vec<Arc<dyn Tool>>), McpError> {
        let mut servers = Servers {
            servers: Vec::new(),
            workspace: workspace.to_path_buf(),
            log_dir: log_dir.to_path_buf(),
            run_id: run_id.to_string(),
        };
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        for spec in specs {
            match start_one(spec, workspace, log_dir, jail, run_id).await {
                Ok((live, log, list)) => {
                    let server = Arc::new(Server {
                        spec: spec.clone(),
                        tools: list.iter().map(|t| t.name.to_string()).collect(),
                        live: tokio::sync::RwLock::new(Some(live)),
                        log,
                    });
                    for t in list {
                        let read_only = t.annotations.as_ref().and_then(|a| a.read_only_hint);
                        let risk = match read_only {
                            Some(true) if spec.trust_annotations => Risk::Read,
                            _ => Risk::Exec,
                        };
                        tools.push(Arc::new(McpTool {
                            about: About {
                                spec: ToolSpec {
                                    name: wire_name(&spec.name, &t.name),
                                    description: t
                                        .description
                                        .as_deref()
                                        .map(str::to_string)
                                        .unwrap_or_else(|| {
                                            format!(
                                                "`{}` from the MCP server `{}`",
                                                t.name, spec.name
                                            )
                                        }),
                                    input_schema: Value::Object((*t.input_schema).clone()),
                                },
                                risk,
                            },
                            tool: t.name.to_string(),
                            server: server.clone(),
                        }));
                    }
                    servers.servers.push(server);
                }
                Err(e) => {
                    servers.shutdown().await;
                    return Err(e);
                }
            }
        }
        Ok((servers, tools))
    }

    /// End every server the run started (not those reached over HTTP), before a try's
    /// checks: its process group here, and, in the jail, with all the jail holds when it
    /// is renewed.
    pub(crate) async fn end(&self) {
        for s in self.servers.iter().filter(|s| s.spec.url.is_none()) {
            let live = s.live.write().await.take();
            if let Some(live) = live {
                live.stop(&s.spec.name, &s.log).await;
            }
        }
    }

    /// Start the ended servers again, as they were started at first, for the next try; one
    /// that cannot start, or offers other tools than at the start, is an error.
    pub(crate) async fn restart(&self, jail: &super::sandbox::Jail) -> Result<(), McpError> {
        for s in &self.servers {
            let mut slot = s.live.write().await;
            if slot.is_some() {
                continue;
            }
            let (live, _, list) =
                start_one(&s.spec, &self.workspace, &self.log_dir, jail, &self.run_id).await?;
            let now: Vec<String> = list.iter().map(|t| t.name.to_string()).collect();
            if now != s.tools {
                live.stop(&s.spec.name, &s.log).await;
                return Err(McpError::Changed {
                    name: s.spec.name.clone(),
                    before: s.tools.join(", "),
                    now: now.join(", "),
                });
            }
            *slot = Some(live);
        }
        Ok(())
    }

    /// Close every server: the transport first, then the whole process group.
    pub(crate) async fn shutdown(&mut self) {
        for s in self.servers.drain(..) {
            let live = s.live.write().await.take();
            if let Some(live) = live {
                live.stop(&s.spec.name, &s.log).await;
            }
        }
    }
}

async fn start_one(
    spec: &ServerSpec,
    workspace: &Path,
    log_dir: &Path,
    jail: &super::sandbox::Jail,
    run_id: &str,
) -> Result<(Live, PathBuf, Vec<rmcp::model::Tool>), McpError> {
    if let Some(url) = &spec.url {
        return start_http(spec, url, log_dir).await;
    }
    let shown = spec
        .command
        .iter()
        .chain(&spec.args)
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    let spawn_err = |reason: String| McpError::Spawn {
        name: spec.name.clone(),
        command: shown.clone(),
        reason,
    };
    let Some((program, first)) = spec.command.split_first() else {
        return Err(spawn_err("the command is empty".into()));
    };
    if !crate::tools::process::program_exists(program) {
        return Err(spawn_err(format!(
            "`{program}` is not found (not a file, not on PATH)"
        )));
    }
    // The program as found outside the workspace (version-manager shims resolved).
    let (real, pin) = match super::command::resolve_program(program, workspace) {
        Some((real, pin)) => (real.into_os_string(), pin),
        None => (program.into(), None),
    };
    let mut cmd = tokio::process::Command::new(real);
    let launch = super::command::launch_outside(program, first, &log_dir.join("launch"));
    cmd.args(&launch.args)
        .args(first)
        .args(&spec.args)
        .current_dir(launch.cwd.as_deref().unwrap_or(workspace));
    // The scrubbed environment, then the secrets passed by name, then `env` as written.
    let mut extra: Vec<(String, String)> = vec![
        ("SUP_WORKSPACE".into(), workspace.display().to_string()),
        ("SUP_RUN_ID".into(), run_id.to_string()),
    ];
    for name in &spec.env_pass {
        if let Some(v) = crate::startup::var(name) {
            crate::redact::add(&v);
            extra.push((name.clone(), v));
        }
    }
    extra.extend(launch.env);
    extra.extend(pin);
    extra.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let armed = jail
        .apply(&mut cmd, &extra, spec.sandbox)
        .map_err(|e| spawn_err(e.to_string()))?;
    // Known as a live server before any sweep can see it.
    let (transport, stderr, group, held) = {
        let _spawning = crate::tools::sandbox::spawning();
        let (transport, stderr) = TokioChildProcess::builder(cmd)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| spawn_err(e.to_string()))?;
        let group = transport.id().and_then(|id| i32::try_from(id).ok());
        if let (Some(g), Ok(mut live)) = (group, LIVE_GROUPS.lock()) {
            live.push(g);
        }
        let held = group.map(crate::tools::sandbox::Held::new);
        (transport, stderr, group, held)
    };
    drop(armed);
    if let Some(g) = group {
        jail.record(g);
    }
    let _ = std::fs::create_dir_all(log_dir);
    let log = log_dir.join(format!(
        "mcp-{}.stderr.log",
        crate::tools::process::safe_name(&spec.name)
    ));
    if let Some(mut stderr) = stderr {
        let path = log.clone();
        tokio::spawn(async move {
            if let Ok(mut file) = tokio::fs::File::create(&path).await {
                let _ = tokio::io::copy(&mut stderr, &mut file).await;
                let _ = file.flush().await;
            }
        });
    }
    let fail = |reason: String| McpError::Init {
        name: spec.name.clone(),
        reason,
        stderr: String::new(),
    };
    let started = initialize(transport, &fail, |e| e.to_string()).await;
    match started {
        Ok((client, tools)) => {
            let live = Live {
                peer: client.peer().clone(),
                client,
                group,
                _held: held,
            };
            Ok((live, log, tools))
        }
        Err(e) => {
            if let Some(g) = group {
                let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
            }
            // Give the stderr copier a moment to write what the server said.
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err(match e {
                McpError::Init { name, reason, .. } => McpError::Init {
                    name,
                    reason,
                    stderr: tail_of(&log),
                },
                other => other,
            })
        }
    }
}

/// Initialize a server over `transport` and list its tools (every page), within the start
/// timeout; an initialize error is said by `said`, every failure made by `fail`.
async fn initialize<T, E, A>(
    transport: T,
    fail: &impl Fn(String) -> McpError,
    said: impl Fn(&rmcp::service::ClientInitializeError) -> String,
) -> Result<(Client, Vec<rmcp::model::Tool>), McpError>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::time::timeout(START_TIMEOUT, async {
        let client = ().serve(transport).await.map_err(|e| fail(said(&e)))?;
        let tools = client
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| fail(format!("tools/list failed: {e}")))?;
        Ok((client, tools))
    })
    .await
    .unwrap_or_else(|_| {
        Err(fail(format!(
            "no answer within {}s",
            START_TIMEOUT.as_secs()
        )))
    })
}

/// `${NAME}` in `value`, each from the environment `sup` started with (secrets included);
/// what was taken is redacted from then on.
fn expand(value: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start + 2..].find('}') else {
            return Err(format!("`{value}` has a `${{` without its `}}`"));
        };
        let name = &rest[start + 2..start + 2 + len];
        let Some(v) = crate::startup::var(name) else {
            return Err(format!(
                "its header needs the environment variable {name}, which is not set"
            ));
        };
        crate::redact::add(&v);
        out.push_str(&v);
        rest = &rest[start + 3 + len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// What a failed start over HTTP says: the status where the server gave one.
fn http_reason(error: &str) -> String {
    if error.contains("Auth required") {
        "the server answered 401 Unauthorized: check this server's `headers` (e.g. \
         `Authorization = \"Bearer ${MCP_TOKEN}\"`) and that the variable holds a valid token"
            .to_string()
    } else if error.contains("Insufficient scope") {
        "the server answered 403 Forbidden: the token lacks the scope it needs".to_string()
    } else if error.contains("error sending request") || error.contains("Connection refused") {
        format!("cannot reach the server (is it running, and is the URL right?): {error}")
    } else {
        format!("it did not initialize: {error}")
    }
}

/// Reach a server over streamable HTTP, initialize it and list its tools.
async fn start_http(
    spec: &ServerSpec,
    url: &str,
    log_dir: &Path,
) -> Result<(Live, PathBuf, Vec<rmcp::model::Tool>), McpError> {
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let fail = |reason: String| McpError::Http {
        name: spec.name.clone(),
        url: url.to_string(),
        reason,
    };
    let mut headers = std::collections::HashMap::new();
    for (name, value) in &spec.headers {
        let value = expand(value).map_err(fail)?;
        let header = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| fail(format!("header `{name}`: {e}")))?;
        let mut value = reqwest::header::HeaderValue::from_str(&value)
            .map_err(|e| fail(format!("header `{name}`: {e}")))?;
        value.set_sensitive(true);
        headers.insert(header, value);
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    let transport = StreamableHttpClientTransport::from_config(config);
    let (client, tools) = initialize(transport, &fail, |e| http_reason(&format!("{e:#}"))).await?;
    let live = Live {
        peer: client.peer().clone(),
        client,
        group: None,
        _held: None,
    };
    let log = log_dir.join(format!(
        "mcp-{}.log",
        crate::tools::process::safe_name(&spec.name)
    ));
    Ok((live, log, tools))
}

/// One tool of one server.
struct McpTool {
    about: About,
    tool: String,
    server: Arc<Server>,
}

/// Text content as it is; other kinds described.
fn render(content: &[Value]) -> String {
    let mut parts = Vec::new();
    for c in content {
        let kind = c["type"].as_str().unwrap_or("unknown");
        parts.push(match kind {
            "text" => c["text"].as_str().unwrap_or("").to_string(),
            "image" | "audio" => format!(
                "[{kind} content: {}, {} bytes of base64]",
                c["mimeType"].as_str().unwrap_or("unknown type"),
                c["data"].as_str().map_or(0, str::len)
            ),
            "resource" => {
                let r = &c["resource"];
                match r["text"].as_str() {
                    Some(text) => format!("[resource {}]\n{text}", r["uri"].as_str().unwrap_or("")),
                    None => format!(
                        "[resource {}: {}, binary]",
                        r["uri"].as_str().unwrap_or(""),
                        r["mimeType"].as_str().unwrap_or("unknown type")
                    ),
                }
            }
            "resource_link" => format!(
                "[resource link {}: {}]",
                c["uri"].as_str().unwrap_or(""),
                c["name"].as_str().unwrap_or("")
            ),
            other => format!("[{other} content]"),
        });
    }
    parts.join("\n")
}

#[async_trait]
impl Tool for McpTool {
    fn about(&self) -> &About {
        &self.about
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let mut params = CallToolRequestParams::new(self.tool.clone());
        params.arguments = input.as_object().cloned();
        let peer = self
            .server
            .live
            .read()
            .await
            .as_ref()
            .map(|l| l.peer.clone());
        let Some(peer) = peer else {
            return Err(ToolError::Failed(format!(
                "the MCP server `{}` is not running",
                self.server.spec.name
            )));
        };
        // Dropping the request (timeout, cancel) sends the server a cancellation.
        let call = peer.call_tool(params);
        let result = tokio::select! {
            r = tokio::time::timeout(ctx.timeout, call) => r,
            _ = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        };
        let result = match result {
            Err(_) => return Err(ToolError::Timeout(ctx.timeout)),
            Ok(Err(e)) => {
                return Err(ToolError::Failed(format!(
                    "the MCP server `{}` did not answer: {e} (its stderr: {})",
                    self.server.spec.name,
                    self.server.log.display()
                )));
            }
            Ok(Ok(r)) => r,
        };
        let json = serde_json::to_value(&result).unwrap_or(Value::Null);
        let mut text = render(json["content"].as_array().map_or(&[][..], Vec::as_slice));
        if text.is_empty()
            && let Some(s) = json.get("structuredContent")
        {
            text = s.to_string();
        }
        if result.is_error == Some(true) {
            Err(ToolError::Failed(text))
        } else {
            Ok(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wire_names_are_safe() {
        assert_eq!(wire_name("fs", "read_file"), "fs__read_file");
        assert_eq!(wire_name("my server", "a.b/c"), "my_server__a_b_c");
        assert_eq!(wire_name("x", &"y".repeat(100)).len(), 64);
    }

    #[test]
    fn content_kinds_are_rendered_or_described() {
        let text = render(&[
            json!({"type": "text", "text": "hello"}),
            json!({"type": "image", "mimeType": "image/png", "data": "AAAA"}),
            json!({"type": "resource", "resource": {"uri": "file:///a", "text": "body"}}),
            json!({"type": "resource_link", "uri": "file:///b", "name": "b"}),
        ]);
        assert_eq!(
            text,
            "hello\n[image content: image/png, 4 bytes of base64]\n[resource file:///a]\nbody\n[resource link file:///b: b]"
        );
    }
}

//! MCP over streamable HTTP through the binary: `@modelcontextprotocol/server-everything` in
//! its streamable HTTP mode (from npm, in `tests/mcp`), with a header taken from the
//! environment; a server that answers 401 or is down is exit 2 naming the URL and the status;
//! a table with both `url` and `command`, or a credential written in the file, is exit 2.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::common::fake_server::{FakeServer, Reply};
use crate::common::{Env, Run, eventually};

/// `server-everything streamableHttp` on a free port, killed when dropped.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start() -> Self {
        let port = free_port();
        let bin = crate::mcp::bin("mcp-server-everything");
        let child = Command::new(bin)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        eventually(Duration::from_secs(30), "the MCP server to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        HttpServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn goal(env: &Env, table: &str) -> PathBuf {
    let path = env.home.path().join("http.toml");
    std::fs::write(
        &path,
        format!("prompt = \"use the tools\"\n\n[[mcp]]\n{table}"),
    )
    .unwrap();
    path
}

fn sup_goal(env: &Env, goal: &PathBuf, turns: serde_json::Value, vars: &[(&str, &str)]) -> Run {
    let script = env.script(turns);
    let mut cmd = env.sup();
    cmd.args(["goal", "--json", "--file"])
        .arg(goal)
        .arg("--model")
        .arg(format!("script:{}", script.display()));
    for (k, v) in vars {
        cmd.env(k, v);
    }
    Run::new(cmd.output().unwrap())
}

#[test]
fn a_server_over_streamable_http_lists_and_runs_its_tools() {
    let server = HttpServer::start();
    let env = Env::new();
    let goal = goal(
        &env,
        &format!(
            "name = \"everything\"\nurl = \"{}\"\nheaders = {{ Authorization = \"Bearer ${{MCP_TOKEN}}\" }}\n",
            server.url
        ),
    );
    let run = sup_goal(
        &env,
        &goal,
        json!([
            {"tool_calls": [
                {"id": "echo", "name": "everything__echo", "input": {"message": "over HTTP"}},
                {"id": "add", "name": "everything__get-sum", "input": {"a": 2, "b": 40}}
            ]},
            {"text": "done"}
        ]),
        &[("MCP_TOKEN", "tok-3141592653")],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.tool_result("echo")["content"], "Echo: over HTTP");
    assert!(
        run.tool_result("add")["content"]
            .as_str()
            .unwrap()
            .contains("42")
    );
}

#[test]
fn the_header_comes_from_the_environment_and_a_401_is_exit_2_naming_url_and_status() {
    let fake = FakeServer::start(vec![
        Reply::json(401, json!({"error": "unauthorized"}))
            .header("www-authenticate", "Bearer realm=\"mcp\""),
    ]);
    let env = Env::new();
    let url = format!("{}/mcp", fake.url);
    let goal = goal(
        &env,
        &format!(
            "name = \"remote\"\nurl = \"{url}\"\nheaders = {{ Authorization = \"Bearer ${{MCP_TOKEN}}\" }}\n"
        ),
    );
    let run = sup_goal(
        &env,
        &goal,
        json!([{"text": "never asked"}]),
        &[("MCP_TOKEN", "tok-2718281828")],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains(&url), "{}", run.stderr);
    assert!(run.stderr.contains("401"), "{}", run.stderr);
    assert!(!run.stderr.contains("tok-2718281828"), "{}", run.stderr);
    let sent = fake.requests();
    assert_eq!(
        sent[0].header("authorization"),
        Some("Bearer tok-2718281828"),
        "the header's ${{MCP_TOKEN}} came from the environment"
    );
}

#[test]
fn a_server_that_is_down_or_a_missing_variable_is_exit_2_naming_the_url() {
    let env = Env::new();
    let url = format!("http://127.0.0.1:{}/mcp", free_port());
    let goal = goal(&env, &format!("name = \"down\"\nurl = \"{url}\"\n"));
    let run = sup_goal(&env, &goal, json!([{"text": "never asked"}]), &[]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains(&url), "{}", run.stderr);

    let goal2 = env.home.path().join("var.toml");
    std::fs::write(
        &goal2,
        format!(
            "prompt = \"p\"\n[[mcp]]\nname = \"v\"\nurl = \"{url}\"\nheaders = {{ X-Api-Key = \"${{NOT_SET_ANYWHERE_42}}\" }}\n"
        ),
    )
    .unwrap();
    let run = sup_goal(&env, &goal2, json!([{"text": "never asked"}]), &[]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("NOT_SET_ANYWHERE_42"), "{}", run.stderr);
}

#[test]
fn url_and_command_together_or_a_credential_in_the_file_is_exit_2_with_file_and_line() {
    let env = Env::new();
    for (table, says) in [
        (
            "name = \"both\"\nurl = \"http://127.0.0.1:9/mcp\"\ncommand = [\"node\"]\n",
            "not both",
        ),
        ("name = \"neither\"\nargs = []\n", "needs `command"),
        ("name = \"u\"\nurl = \"ftp://x/mcp\"\n", "mcp.url"),
        (
            "name = \"lit\"\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = { Authorization = \"Bearer abc\" }\n",
            "never written in the goal file",
        ),
    ] {
        let path = goal(&env, table);
        let run = sup_goal(&env, &path, json!([{"text": "never asked"}]), &[]);
        assert_eq!(run.code, 2, "{table}: {}", run.stderr);
        assert!(
            run.stderr.contains(&format!("{}:3:", path.display())),
            "{table}: {}",
            run.stderr
        );
        assert!(run.stderr.contains(says), "{table}: {}", run.stderr);
    }
}

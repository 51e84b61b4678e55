//! MCP servers nobody here wrote — `@modelcontextprotocol/server-everything` and
//! `@modelcontextprotocol/server-filesystem`, installed from npm into `tests/mcp` — driven
//! through the binary with the scripted model (and once with a fake OpenAI server, to see the
//! tools offered). After every test no server process remains.

use crate::common::SpawnKilled;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::fake_server::{FakeServer, Indexing, Turn, openai_stream};
use crate::common::{Env, Run, eventually};
use serde_json::{Value, json};

/// The npm-installed servers of `tests/mcp`; a test that needs them fails, naming the
/// command that installs them, when they are missing (nothing is downloaded behind the
/// back of `cargo test`).
pub fn bin(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/node_modules/.bin");
    assert!(
        dir.join("mcp-server-everything").exists(),
        "the MCP test servers are missing: run `npm ci --no-audit --no-fund` in tests/mcp \
         (or `bash .ci/run`, which installs them)"
    );
    dir.join(name)
}

/// Processes whose environment carries `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(env) = std::fs::read(entry.path().join("environ"))
            && String::from_utf8_lossy(&env).contains(marker)
        {
            pids.push(pid);
        }
    }
    pids
}

struct Mcp {
    env: Env,
    marker: String,
}

impl Mcp {
    fn new() -> Self {
        Mcp {
            env: Env::new(),
            marker: format!("SUP_MCP_TEST_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// A goal file with the given servers (name, argv), each marked in its environment.
    fn goal(&self, servers: &[(&str, Vec<String>)], extra: &str) -> PathBuf {
        let mut text = format!("prompt = \"use the tools\"\n{extra}\n");
        for (name, argv) in servers {
            text.push_str(&format!(
                "[[mcp]]\nname = \"{name}\"\ncommand = {}\nenv = {{ {} = \"1\" }}\n",
                serde_json::to_string(argv).unwrap(),
                self.marker
            ));
        }
        let path = self.env.home.path().join("mcp.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn everything(&self) -> (&'static str, Vec<String>) {
        (
            "everything",
            vec![bin("mcp-server-everything").display().to_string()],
        )
    }

    fn filesystem(&self) -> (&'static str, Vec<String>) {
        (
            "fs",
            vec![
                bin("mcp-server-filesystem").display().to_string(),
                self.env.ws().display().to_string(),
            ],
        )
    }

    fn run(&self, goal: &Path, turns: Value, args: &[&str]) -> Run {
        let script = self.env.script(turns);
        let out = self
            .env
            .sup()
            .args(["goal", "--json", "--workspace"])
            .arg(self.env.ws.path())
            .arg("--file")
            .arg(goal)
            .arg("--model")
            .arg(format!("script:{}", script.display()))
            .args(args)
            .output()
            .unwrap();
        Run::new(out)
    }

    fn assert_no_server_left(&self) {
        eventually(Duration::from_secs(5), "no server process left", || {
            processes_with(&self.marker).is_empty().then_some(())
        });
    }
}

#[test]
fn everything_server_tools_are_listed_and_called() {
    let m = Mcp::new();
    let goal = m.goal(&[m.everything()], "");
    let run = m.run(
        &goal,
        json!([
            {"tool_calls": [
                {"id": "echo", "name": "everything__echo", "input": {"message": "hello over MCP"}},
                {"id": "add", "name": "everything__get-sum", "input": {"a": 2, "b": 40}},
                {"id": "img", "name": "everything__get-tiny-image", "input": {}},
                {"id": "schema", "name": "everything__get-sum", "input": {"a": "two"}}
            ]},
            {"text": "done"}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.tool_result("echo")["content"], "Echo: hello over MCP");
    assert!(
        run.tool_result("add")["content"]
            .as_str()
            .unwrap()
            .contains("42")
    );
    let img = run.tool_result("img")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(img.contains("[image content: image/png"), "{img}");
    let schema = run.tool_result("schema")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        schema.contains("rule `type`") || schema.contains("rule `required`"),
        "the schema gate: {schema}"
    );
    m.assert_no_server_left();
}

#[test]
fn a_tool_error_comes_back_as_an_error_result() {
    let m = Mcp::new();
    let goal = m.goal(&[m.everything()], "");
    let run = m.run(
        &goal,
        json!([
            {"tool_calls": [{"id": "bad", "name": "everything__gzip-file-as-resource",
                "input": {"name": "x.gz", "data": "http://127.0.0.1:1/nothing"}}]},
            {"text": "it failed"}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let r = run.tool_result("bad");
    assert_eq!(r["is_error"], true);
    assert!(
        r["content"].as_str().unwrap().contains("fetch failed"),
        "{r}"
    );
    m.assert_no_server_left();
}

#[test]
fn the_tools_are_offered_to_the_model_with_their_schemas() {
    let m = Mcp::new();
    let goal = m.goal(&[m.everything()], "");
    let server = FakeServer::start(vec![openai_stream(&Turn::text("seen"), Indexing::Standard)]);
    let out = m
        .env
        .sup()
        .args(["goal", "--json", "--model", "openai:gpt-test", "--file"])
        .arg(&goal)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", "sk-test")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tools = server.requests()[0].body["tools"]
        .as_array()
        .unwrap()
        .clone();
    let echo = tools
        .iter()
        .find(|t| t["function"]["name"] == "everything__echo")
        .expect("echo offered");
    assert_eq!(
        echo["function"]["parameters"]["properties"]["message"]["type"],
        "string"
    );
    assert!(
        tools
            .iter()
            .any(|t| t["function"]["name"] == "everything__get-sum")
    );
    assert!(
        tools.iter().any(|t| t["function"]["name"] == "read_file"),
        "built-ins stay"
    );
    m.assert_no_server_left();
}

#[test]
fn a_long_running_tool_is_cancelled_with_the_run() {
    let m = Mcp::new();
    let goal = m.goal(&[m.everything()], "");
    let script = m.env.script(json!([
        {"tool_calls": [{"id": "long", "name": "everything__trigger-long-running-operation",
            "input": {"duration": 60, "steps": 5}}]},
        {"text": "never"}
    ]));
    let child = m
        .env
        .sup()
        .args(["goal", "--json", "--file"])
        .arg(&goal)
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_killed();
    // Wait until the call is on its way, then interrupt.
    eventually(Duration::from_secs(30), "the call to start", || {
        let t = m.env.run_dirs().pop().map(|d| d.join("transcript.jsonl"));
        t.as_ref()
            .is_some_and(|t| {
                std::fs::read_to_string(t)
                    .unwrap_or_default()
                    .contains("\"type\":\"tool_call\"")
            })
            .then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let run = Run::new(child.wait_with_output().unwrap());
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(run.code, 130, "{}", run.stderr);
    let r = run.tool_result("long");
    assert!(r["content"].as_str().unwrap().contains("cancelled"), "{r}");
    m.assert_no_server_left();
}

#[test]
fn a_call_that_outlives_the_tool_timeout_is_an_error_and_the_run_goes_on() {
    let m = Mcp::new();
    let goal = m.goal(&[m.everything()], "");
    let run = m.run(
        &goal,
        json!([
            {"tool_calls": [{"id": "long", "name": "everything__trigger-long-running-operation",
                "input": {"duration": 30, "steps": 3}}]},
            {"text": "gave up"}
        ]),
        &["--tool-timeout", "1s"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let r = run.tool_result("long");
    assert_eq!(r["is_error"], true);
    assert!(r["content"].as_str().unwrap().contains("timed out"), "{r}");
    m.assert_no_server_left();
}

#[test]
fn the_filesystem_servers_write_tool_is_held_back_by_the_approval_policy() {
    let m = Mcp::new();
    m.env.write("notes.txt", "from the workspace");
    let goal = m.goal(&[m.filesystem()], "approval = \"never\"");
    // Its read tools are `read` only because this server's annotations are trusted.
    let text = std::fs::read_to_string(&goal).unwrap();
    std::fs::write(&goal, format!("{text}trust_annotations = true\n")).unwrap();
    let ws = m.env.ws();
    let script = m.env.script(json!([
        {"tool_calls": [
            {"id": "read", "name": "fs__read_text_file", "input": {"path": ws.join("notes.txt")}},
            {"id": "write", "name": "fs__write_file", "input": {"path": ws.join("made.txt"), "content": "x"}},
            {"id": "outside", "name": "fs__read_text_file", "input": {"path": "/etc/hostname"}}
        ]},
        {"text": "done"}
    ]));
    let out = m
        .env
        .sup()
        .env_remove("SUP_APPROVAL")
        .args(["goal", "--json", "--file"])
        .arg(&goal)
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.tool_result("read")["content"], "from the workspace");
    let w = run.tool_result("write");
    assert_eq!(w["is_error"], true);
    assert!(w["content"].as_str().unwrap().starts_with("Denied"), "{w}");
    assert!(!ws.join("made.txt").exists(), "the write never ran");
    let outside = run.tool_result("outside");
    assert_eq!(
        outside["is_error"], true,
        "the server's own error: {outside}"
    );
    m.assert_no_server_left();
}

#[test]
fn a_server_command_that_does_not_exist_is_exit_2_before_any_model_call() {
    let m = Mcp::new();
    let goal = m.goal(&[("ghost", vec!["sup-no-such-mcp-server".into()])], "");
    let run = m.run(&goal, json!([{"tool_calls": [{"name": "write_file", "input": {"path": "touched.txt", "content": "x"}}]}]), &[]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("MCP server `ghost`") && run.stderr.contains("sup-no-such-mcp-server"),
        "{}",
        run.stderr
    );
    assert!(!m.env.ws.path().join("touched.txt").exists());
    // The same from the command line.
    let out = m
        .env
        .sup()
        .args([
            "run",
            "x",
            "--model",
            "script:/nope",
            "--mcp",
            "ghost=sup-no-such-mcp-server --flag",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_server_that_fails_to_initialize_is_exit_2_with_its_own_error() {
    let m = Mcp::new();
    let goal = m.goal(
        &[(
            "broken",
            vec![
                "bash".into(),
                "-c".into(),
                "echo 'config file missing: /etc/broken.yml' >&2; exit 3".into(),
            ],
        )],
        "",
    );
    let run = m.run(&goal, json!([{"text": "never"}]), &[]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("MCP server `broken` did not initialize"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("config file missing: /etc/broken.yml"),
        "the server's own words: {}",
        run.stderr
    );
    m.assert_no_server_left();
}

#[test]
fn a_server_killed_mid_run_turns_its_calls_into_errors_and_the_run_finishes() {
    let m = Mcp::new();
    let goal = m.goal(&[m.everything()], "");
    let marker = m.marker.clone();
    let kill = format!(
        "for p in /proc/[0-9]*; do grep -qa {marker} $p/environ 2>/dev/null && kill -9 ${{p#/proc/}}; done; true"
    );
    let run = m.run(
        &goal,
        json!([
            {"tool_calls": [{"id": "before", "name": "everything__echo", "input": {"message": "alive"}}]},
            {"tool_calls": [{"id": "kill", "name": "run_command", "input": {"command": kill}}]},
            {"tool_calls": [{"id": "after", "name": "everything__echo", "input": {"message": "anyone?"}}]},
            {"text": "the server died"}
        ]),
        // Sandboxed commands cannot signal processes outside their own domain (Landlock
        // ABI 6), the server included; this test needs one that can.
        &["--sandbox", "off"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.tool_result("before")["content"], "Echo: alive");
    let after = run.tool_result("after");
    assert_eq!(after["is_error"], true);
    assert!(
        after["content"]
            .as_str()
            .unwrap()
            .contains("MCP server `everything`"),
        "{after}"
    );
    assert_eq!(run.result()["answer"], "the server died");
    m.assert_no_server_left();
}

#[test]
fn a_server_runs_in_the_runs_sandbox_unless_its_table_says_sandbox_off() {
    let m = Mcp::new();
    let out = tempfile::tempdir().unwrap();
    let outside = std::fs::canonicalize(out.path()).unwrap();
    let ws = m.env.ws();
    for (key, written) in [("", false), ("sandbox = \"off\"\n", true)] {
        let goal = m.env.home.path().join("mcp.toml");
        std::fs::write(
            &goal,
            format!(
                "prompt = \"use the tools\"\n[[mcp]]\nname = \"fs\"\ncommand = {}\n\
                 env = {{ {} = \"1\" }}\n{key}",
                serde_json::to_string(&[
                    bin("mcp-server-filesystem").display().to_string(),
                    ws.display().to_string(),
                    outside.display().to_string(),
                ])
                .unwrap(),
                m.marker
            ),
        )
        .unwrap();
        let target = outside.join("x.txt");
        let run = m.run(
            &goal,
            json!([
                {"tool_calls": [
                    {"id": "in", "name": "fs__write_file", "input": {"path": ws.join("in.txt"), "content": "x"}},
                    {"id": "out", "name": "fs__write_file", "input": {"path": target, "content": "x"}}
                ]},
                {"text": "done"}
            ]),
            &[],
        );
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert_eq!(run.tool_result("in")["is_error"], false, "{key}");
        assert_eq!(
            run.tool_result("out")["is_error"],
            !written,
            "{key}: {}",
            run.tool_result("out")
        );
        assert_eq!(target.exists(), written, "{key}");
        m.assert_no_server_left();
    }
}

//! Helpers for end-to-end tests: a temporary SUP_HOME and workspace, scripted models, and
//! the binary run against them.
#![allow(dead_code)]

pub mod fake_server;
pub mod terminal;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// Poll `probe` until it gives a value, and return it; fail the test, saying `what` was
/// awaited, when `timeout` passes first.
pub fn eventually<T>(timeout: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each test once as the user the tests run as, and, when that is root, once more as 65534.
pub fn both(test: impl Fn(bool)) {
    test(false);
    if nix::unistd::getuid().is_root() {
        test(true);
    }
}

/// `eventually` for a condition: poll `f` until it holds; fail the test, saying `what` was
/// awaited, after `secs` seconds.
pub fn until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    eventually(Duration::from_secs(secs), what, || f().then_some(()));
}

/// `eventually` for async tests: polls without blocking the runtime.
pub async fn eventually_async<T>(
    timeout: Duration,
    what: &str,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub struct Env {
    pub home: TempDir,
    pub ws: TempDir,
}

impl Env {
    pub fn new() -> Self {
        Env {
            home: tempfile::tempdir().unwrap(),
            ws: tempfile::tempdir().unwrap(),
        }
    }

    pub fn ws(&self) -> PathBuf {
        std::fs::canonicalize(self.ws.path()).unwrap()
    }

    /// Write a script of turns (outside the workspace) and return its path.
    pub fn script(&self, turns: Value) -> PathBuf {
        let n = std::fs::read_dir(self.home.path()).unwrap().count();
        let path = self.home.path().join(format!("script-{n}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&turns).unwrap()).unwrap();
        path
    }

    pub fn write(&self, rel: &str, content: &str) -> PathBuf {
        let path = self.ws.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        path
    }

    /// The binary, with SUP_HOME set, the workspace as current directory, no SUP_MODEL, no
    /// user config, and approval mode `auto` (approval tests set their own).
    pub fn sup(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sup"));
        cmd.env("SUP_HOME", self.home.path())
            .env("SUP_APPROVAL", "auto")
            .env("SUP_CONFIG", self.home.path().join("no-config.toml"))
            .env_remove("SUP_MODEL")
            .env_remove("RUST_LOG")
            .current_dir(self.ws.path())
            .stdin(std::process::Stdio::null());
        cmd
    }

    /// `sup goal --file FILE --json --model script:…` with `body` written to `file` (relative
    /// to the workspace), as 65534 when `nobody` (see `sup_as_nobody`).
    pub fn goal_as(&self, nobody: bool, file: &str, body: &str, turns: Value) -> Run {
        Run::new(self.goal_cmd(nobody, file, body, turns).output().unwrap())
    }

    /// The command `goal_as` runs, for a test to add to.
    pub fn goal_cmd(&self, nobody: bool, file: &str, body: &str, turns: Value) -> Command {
        let goal = self.write(file, body);
        let script = self.script(turns);
        let mut c = self.sup_as(nobody);
        c.args([
            "goal",
            "--file",
            goal.to_str().unwrap(),
            "--json",
            "--model",
        ])
        .arg(format!("script:{}", script.display()));
        c
    }

    /// `sup_as_nobody()` when `nobody`, else `sup()`.
    pub fn sup_as(&self, nobody: bool) -> Command {
        if nobody {
            self.sup_as_nobody()
        } else {
            self.sup()
        }
    }

    /// The binary as `sup()` sets it up, but run as the unprivileged user 65534 (through
    /// `setpriv`, with SUP_HOME and the workspace given to that user) when the tests run as
    /// root, whose processes can read any other's memory; as `sup()` otherwise.
    pub fn sup_as_nobody(&self) -> Command {
        if !nix::unistd::getuid().is_root() {
            return self.sup();
        }
        for dir in [self.home.path(), self.ws.path()] {
            let status = Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(dir)
                .status()
                .unwrap();
            assert!(status.success());
        }
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            env!("CARGO_BIN_EXE_sup"),
        ])
        .env("SUP_HOME", self.home.path())
        .env("SUP_APPROVAL", "auto")
        .env("SUP_CONFIG", self.home.path().join("no-config.toml"))
        .env("HOME", self.home.path())
        .env_remove("SUP_MODEL")
        .env_remove("RUST_LOG")
        .current_dir(self.ws.path())
        .stdin(std::process::Stdio::null());
        cmd
    }

    /// `sup run PROMPT --model script:… --json ARGS…`.
    pub fn run_json(&self, turns: Value, args: &[&str]) -> Run {
        self.json(&["run", "do the work"], turns, args)
    }

    /// `sup COMMAND… --model script:… --json ARGS…`, the turns scripted.
    pub fn json(&self, command: &[&str], turns: Value, args: &[&str]) -> Run {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        self.human(command, turns, &all)
    }

    /// `sup COMMAND… --model script:… ARGS…`: the human trace on stderr.
    pub fn human(&self, command: &[&str], turns: Value, args: &[&str]) -> Run {
        let script = self.script(turns);
        let out = self
            .sup()
            .args(command)
            .arg("--model")
            .arg(format!("script:{}", script.display()))
            .args(args)
            .output()
            .unwrap();
        Run::new(out)
    }

    /// The queued approval requests (`sup approvals --json`), once there are `n` at least.
    pub fn pending(&self, n: usize) -> Vec<Value> {
        pending_with(|| self.sup(), n)
    }

    /// Every run folder under SUP_HOME/runs.
    pub fn run_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(self.home.path().join("runs"))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        dirs.sort();
        dirs
    }

    /// The transcript of the only (or latest) run.
    pub fn transcript(&self) -> Vec<Value> {
        let dir = self.run_dirs().pop().expect("a run folder");
        read_jsonl(&dir.join("transcript.jsonl"))
    }
}

/// Every file below `dir`, at any depth.
pub fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The queued approval requests as `sup()` lists them (`approvals --json`), once there are
/// `n` at least; fails the test after 30 s.
pub fn pending_with(sup: impl Fn() -> Command, n: usize) -> Vec<Value> {
    eventually(
        Duration::from_secs(30),
        &format!("{n} pending approval(s)"),
        || {
            let out = sup().args(["approvals", "--json"]).output().unwrap();
            let v: Value = serde_json::from_slice(&out.stdout).ok()?;
            let rows = v.as_array()?.clone();
            (rows.len() >= n).then_some(rows)
        },
    )
}

pub fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub events: Vec<Value>,
}

impl Run {
    pub fn new(out: Output) -> Self {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let events = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            events,
        }
    }

    pub fn of_type(&self, t: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["type"] == t).collect()
    }

    pub fn result(&self) -> &Value {
        let r = self.events.last().expect("events");
        assert_eq!(r["type"], "result", "last event is the result: {r}");
        r
    }

    /// The result of call `id`.
    pub fn tool_result(&self, id: &str) -> &Value {
        self.of_type("tool_result")
            .into_iter()
            .find(|e| e["id"] == id)
            .unwrap_or_else(|| panic!("no result for {id}: {}", self.stdout))
    }
}

/// The tool-result messages the model was sent, from a transcript.
pub fn tool_messages(transcript: &[Value]) -> Vec<Value> {
    transcript
        .iter()
        .filter(|e| e["type"] == "message" && e["message"]["role"] == "tool")
        .map(|e| e["message"].clone())
        .collect()
}

/// The user messages the model was sent, from a transcript.
pub fn user_messages(transcript: &[Value]) -> Vec<String> {
    transcript
        .iter()
        .filter(|e| e["type"] == "message" && e["message"]["role"] == "user")
        .map(|e| e["message"]["content"].as_str().unwrap().to_string())
        .collect()
}

/// A child process (a `sup daemon`, a `sup serve`, a run in the background) that is killed
/// and reaped when dropped: when its test ends, however it ends (a failed assertion or a
/// timeout unwinds through it). Used as the `Child` it holds.
pub struct Killed(Option<std::process::Child>);

impl Killed {
    /// Start `cmd`, guarded.
    pub fn spawn(cmd: &mut Command) -> Killed {
        Killed(Some(cmd.spawn().expect("start the process")))
    }

    /// Wait for it to end on its own and take what it printed (it is still killed if the
    /// test ends while waiting).
    pub fn wait_with_output(mut self) -> std::io::Result<Output> {
        let child = self.0.take().expect("a child");
        child.wait_with_output()
    }
}

impl std::ops::Deref for Killed {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("a child")
    }
}

impl std::ops::DerefMut for Killed {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("a child")
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Stop a `sup daemon` (or any child) as a service manager does, with SIGTERM, and give its
/// exit code (-1 when a signal ended it).
pub fn stop(mut child: Killed) -> i32 {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    child.wait().unwrap().code().unwrap_or(-1)
}

/// `cmd.spawn_killed()`: `Killed::spawn(cmd)` at the end of a builder chain.
pub trait SpawnKilled {
    fn spawn_killed(&mut self) -> Killed;
}

impl SpawnKilled for Command {
    fn spawn_killed(&mut self) -> Killed {
        Killed::spawn(self)
    }
}

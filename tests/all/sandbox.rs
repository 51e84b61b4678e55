//! The sandbox of everything `sup` starts for the agent, tried as a hostile model would:
//! commands that write outside the workspace, into `.git`, SUP_HOME or the user config; a
//! background job that swaps the check; a module that shadows a Python check's imports; the
//! agent rewriting its own goal file; a background `sup approve` loop; `setsid` escapes; the
//! network; and secrets in the environment of commands, command tools, checks, MCP servers and
//! `sup` itself.

use crate::common;
use crate::common::SpawnKilled;

use std::path::Path;

use common::{Env, Run};
use serde_json::{Value, json};

fn cmd(id: &str, command: &str) -> Value {
    json!({"tool_calls": [{"id": id, "name": "run_command", "input": {"command": command}}]})
}

fn say(text: &str) -> Value {
    json!({"text": text})
}

fn text(v: &Value) -> String {
    v["content"].as_str().unwrap_or_default().to_string()
}

/// A folder outside both the workspace and SUP_HOME.
fn outside() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// The trace line that describes the sandbox.
fn sandbox_line(run: &Run) -> String {
    run.of_type("notice")
        .into_iter()
        .map(|n| n["text"].as_str().unwrap_or_default().to_string())
        .find(|t| t.starts_with("sandbox: "))
        .unwrap_or_else(|| panic!("no sandbox notice: {}", run.stdout))
}

#[test]
fn the_first_notice_names_the_policy_and_this_kernel_misses_nothing() {
    let env = Env::new();
    let run = env.run_json(json!([say("done")]), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let first = run.of_type("notice")[0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(first.starts_with("sandbox: workspace-write"), "{first}");
    // The kernel these tests run on has Landlock ABI 6 or later; where it lacks a right,
    // the line must name it.
    let abi = landlock_abi();
    if abi >= 6 {
        assert!(!first.contains("MISSING"), "{first}");
    } else {
        assert!(first.contains("MISSING PROTECTION"), "{first}");
    }
}

#[test]
fn commands_cannot_write_outside_the_workspace_into_git_sup_home_or_the_user_config() {
    let env = Env::new();
    let out = outside();
    std::fs::create_dir(env.ws().join(".git")).unwrap();
    env.write(".git/config", "[core]\n");
    let config = env.home.path().join("config.toml");
    let o = out.path().display().to_string();
    let home = env.home.path().display().to_string();
    let run = env
        .sup()
        .env("SUP_CONFIG", &config)
        .args(["run", "work", "--json", "--model"])
        .arg(format!(
            "script:{}",
            env.script(json!([
                cmd("out", &format!("echo x > {o}/escaped")),
                cmd("git", "echo '[core] fsmonitor = evil' >> .git/config"),
                cmd("hook", "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit"),
                cmd("home", &format!("echo x > {home}/planted")),
                cmd("cfg", "printf '[approval_rules]\\nallow = [\"run_command\"]\\n' > x.toml && cat x.toml > $SUP_CONFIG"),
                cmd("ok", "echo fine > inside.txt && echo tmp > $TMPDIR/t && cat $TMPDIR/t"),
                say("done"),
            ]))
            .display()
        ))
        .output()
        .unwrap();
    let run = Run::new(run);
    assert!(!out.path().join("escaped").exists());
    assert_eq!(
        std::fs::read_to_string(env.ws().join(".git/config")).unwrap(),
        "[core]\n"
    );
    assert!(!env.ws().join(".git/hooks/pre-commit").exists());
    assert!(!env.home.path().join("planted").exists());
    assert!(!config.exists(), "the user config was written");
    for id in ["out", "git", "hook", "home", "cfg"] {
        let r = run.tool_result(id);
        assert_eq!(r["is_error"], true, "{id}: {r}");
        assert!(text(r).contains("[sandbox workspace-write]"), "{id}: {r}");
    }
    assert!(text(run.tool_result("git")).contains("`.git` is read-only"));
    assert!(text(run.tool_result("out")).contains(&format!("{o}/escaped")));
    let ok = run.tool_result("ok");
    assert_eq!(ok["is_error"], false, "{ok}");
    assert!(text(ok).contains("tmp"));
    assert_eq!(
        std::fs::read_to_string(env.ws().join("inside.txt")).unwrap(),
        "fine\n"
    );
}

#[test]
fn read_only_lets_commands_write_only_their_temp_folder() {
    let env = Env::new();
    let run = env.run_json(
        json!([
            cmd("ws", "echo x > inside.txt"),
            cmd("tmp", "echo x > $TMPDIR/t"),
            say("done")
        ]),
        &["--sandbox", "read-only"],
    );
    assert!(!env.ws().join("inside.txt").exists());
    assert!(text(run.tool_result("ws")).contains("policy read-only"));
    assert_eq!(run.tool_result("tmp")["is_error"], false);
}

#[test]
fn writable_adds_a_folder_and_git_when_asked() {
    let env = Env::new();
    let extra = tempfile::tempdir_in(env.ws().parent().unwrap()).unwrap();
    std::fs::create_dir(env.ws().join(".git")).unwrap();
    let name = extra
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let goal = env.write(
        "goal.toml",
        &format!("prompt = \"work\"\nworkspace = \".\"\nwritable = [\"../{name}\", \".git\"]\n"),
    );
    let x = extra.path().display().to_string();
    let run = env.json(
        &["goal", "--file", goal.to_str().unwrap()],
        json!([
            cmd("extra", &format!("echo x > {x}/f")),
            cmd("git", "echo x > .git/f"),
            say("done")
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(extra.path().join("f").exists());
    assert!(env.ws().join(".git/f").exists());
}

#[test]
fn sandbox_off_restores_the_old_behaviour_and_says_so() {
    let env = Env::new();
    let out = outside();
    let o = out.path().display().to_string();
    let run = env.run_json(
        json!([cmd("out", &format!("echo x > {o}/escaped")), say("done")]),
        &["--sandbox", "off"],
    );
    assert_eq!(run.tool_result("out")["is_error"], false);
    assert!(out.path().join("escaped").exists());
    assert!(sandbox_line(&run).starts_with("sandbox: off"));
    assert!(sandbox_line(&run).contains("MISSING PROTECTION: sandbox off"));
    // And SUP_SANDBOX picks the same.
    let out2 = outside();
    let o2 = out2.path().display().to_string();
    let script = env.script(json!([
        cmd("out", &format!("echo x > {o2}/e")),
        say("done")
    ]));
    let status = env
        .sup()
        .env("SUP_SANDBOX", "off")
        .args(["run", "w", "--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0));
    assert!(out2.path().join("e").exists());
}

#[test]
fn sandbox_required_refuses_a_run_without_the_sandbox() {
    let env = Env::new();
    let run = env.run_json(
        json!([say("done")]),
        &["--sandbox", "off", "--sandbox-required"],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("sandbox is required"), "{}", run.stderr);
    let run = env.run_json(json!([say("done")]), &["--sandbox-required"]);
    if landlock_abi() >= 6 {
        assert_eq!(run.code, 0, "{}", run.stderr);
    } else {
        assert_eq!(run.code, 2, "{}", run.stderr);
    }
}

#[test]
fn network_false_stops_a_tcp_connect_to_a_loopback_listener() {
    let env = Env::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    let goal = env.write("g/goal.toml", "prompt = \"work\"\nnetwork = false\n");
    let run = env.json(
        &["goal", "--file", goal.to_str().unwrap(), "--workspace", "."],
        json!([cmd("net", &connect), say("done")]),
        &[],
    );
    let r = run.tool_result("net");
    assert_eq!(r["is_error"], true, "{r}");
    assert!(!text(r).contains("connected"));
    assert!(text(r).contains("network = false"), "{r}");
    assert!(listener.accept().is_err(), "a connection got through");
    // With the network on, the same command connects.
    let run = env.run_json(json!([cmd("net", &connect), say("done")]), &[]);
    assert!(text(run.tool_result("net")).contains("connected"));
    assert!(listener.accept().is_ok());
}

#[test]
fn a_background_job_cannot_swap_the_check() {
    let env = Env::new();
    env.write("check.js", "process.exit(1)\n");
    let home = env.home.path().display().to_string();
    // Waits for the try's answer, swaps the check for a pass, puts it back.
    let job = format!(
        "nohup bash -c 'for i in $(seq 400); do ls {home}/runs/*/try-1/answer.txt >/dev/null 2>&1 \
         && break; sleep 0.02; done; cp check.js $TMPDIR/orig; echo \"process.exit(0)\" > check.js; \
         sleep 2; cp $TMPDIR/orig check.js' >/dev/null 2>&1 &"
    );
    let run = env.json(
        &["goal", "do it", "--check", "check.js", "--tries", "1"],
        json!([cmd("job", &job), say("done")]),
        &[],
    );
    assert_eq!(run.result()["status"], "failed", "{}", run.stdout);
    // The witness that no swap can come later: the job (its command line names this test's
    // SUP_HOME) is gone.
    common::until("the background job to be gone", 10, || {
        std::fs::read_dir("/proc").unwrap().flatten().all(|e| {
            !String::from_utf8_lossy(&std::fs::read(e.path().join("cmdline")).unwrap_or_default())
                .contains(&format!("{home}/runs/"))
        })
    });
    assert_eq!(
        std::fs::read_to_string(env.ws().join("check.js")).unwrap(),
        "process.exit(1)\n"
    );
}

#[test]
fn a_json_py_in_the_workspace_does_not_shadow_a_python_checks_import() {
    let env = Env::new();
    env.write(
        "check.py",
        "import json, sys, os\nsys.exit(0 if json.loads('{\"a\": 1}')['a'] == 2 else 1)\n",
    );
    let run = env.json(
        &["goal", "do it", "--check", "check.py", "--tries", "1"],
        json!([
            {"tool_calls": [{"id": "w", "name": "write_file",
              "input": {"path": "json.py", "content": "def loads(s):\n    return {'a': 2}\n"}}]},
            say("done")
        ]),
        &[],
    );
    assert!(env.ws().join("json.py").exists());
    assert_eq!(run.result()["status"], "failed", "{}", run.stdout);
}

#[test]
fn a_frozen_check_knows_its_original_folder() {
    let env = Env::new();
    env.write("checks/data.txt", "expected\n");
    env.write(
        "checks/check.sh",
        "set -e\ngrep -q expected \"$SUP_CHECK_DIR/data.txt\"\ncase \"$0\" in */runs/*) ;; *) exit 3;; esac\n",
    );
    let run = env.json(
        &[
            "goal",
            "do it",
            "--check",
            "checks/check.sh",
            "--tries",
            "1",
        ],
        json!([say("done")]),
        &[],
    );
    assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
}

#[test]
fn the_agent_cannot_rewrite_its_own_goal_file() {
    let env = Env::new();
    let original = "prompt = \"work\"\nworkspace = \".\"\napproval = \"never\"\n\
                    [approval_rules]\nallow = [\"write_file\", \"run_command\"]\n";
    let goal = env.write("goal.toml", original);
    let rewritten = original.replace("never", "auto");
    let run = env.json(
        &["goal", "--file", goal.to_str().unwrap()],
        json!([
            {"tool_calls": [{"id": "w", "name": "write_file",
              "input": {"path": "goal.toml", "content": rewritten}}]},
            cmd("sed", "sed -i 's/never/auto/' goal.toml"),
            cmd("mv", "cp goal.toml g2 && sed -i 's/never/auto/' g2 && mv g2 goal.toml"),
            say("done")
        ]),
        &[],
    );
    assert_eq!(run.tool_result("w")["is_error"], true);
    assert_eq!(run.tool_result("sed")["is_error"], true);
    assert_eq!(run.tool_result("mv")["is_error"], true);
    assert_eq!(std::fs::read_to_string(&goal).unwrap(), original);
}

#[test]
fn a_background_loop_cannot_answer_the_runs_own_approvals() {
    let env = Env::new();
    let sup = env!("CARGO_BIN_EXE_sup");
    let loop_ = format!(
        "nohup bash -c 'for i in $(seq 100); do for id in $({sup} approvals | grep -v \"^ \" \
         | grep -v \"^no \" | cut -d\" \" -f1); do {sup} approve $id; done; sleep 0.05; done' \
         >/dev/null 2>&1 &"
    );
    let run = env.run_json(
        json!([
            cmd("loop", &loop_),
            {"tool_calls": [{"id": "w", "name": "write_file",
              "input": {"path": "forbidden.txt", "content": "x"}}]},
            say("done")
        ]),
        &[
            // The loop runs (auto allows what no rule denies, and no allow rule could allow a
            // line with `&`); the write waits in the queue for a person.
            "--approval",
            "auto",
            "--ask",
            "write_file",
            "--approval-timeout",
            "3s",
        ],
    );
    assert!(!env.ws().join("forbidden.txt").exists(), "{}", run.stdout);
    assert_eq!(run.tool_result("w")["is_error"], true);
}

#[test]
fn approvals_record_the_os_user_not_dollar_user() {
    let env = Env::new();
    let sup = env!("CARGO_BIN_EXE_sup");
    let home = env.home.path().to_path_buf();
    let child = std::thread::spawn({
        let home = home.clone();
        move || {
            for _ in 0..300 {
                let out = std::process::Command::new(sup)
                    .env("SUP_HOME", &home)
                    .arg("approvals")
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                if let Some(id) = text
                    .lines()
                    .find(|l| !l.starts_with(' ') && !l.starts_with("no "))
                    .and_then(|l| l.split(' ').next())
                {
                    std::process::Command::new(sup)
                        .env("SUP_HOME", &home)
                        .env("USER", "mallory")
                        .args(["approve", id])
                        .output()
                        .unwrap();
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    });
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "w", "name": "write_file",
              "input": {"path": "ok.txt", "content": "x"}}]},
            say("done")
        ]),
        &["--approval", "queue", "--approval-timeout", "20s"],
    );
    child.join().unwrap();
    assert!(env.ws().join("ok.txt").exists(), "{}", run.stdout);
    let db = home.join("sup.db");
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select decided_by from approvals').fetchone()[0])",
        ])
        .arg(&db)
        .output()
        .unwrap();
    let by = String::from_utf8_lossy(&out.stdout).to_string();
    let me = nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .unwrap()
        .name;
    assert!(
        by.starts_with(&me),
        "{by} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!by.contains("mallory"), "{by}");
}

/// Host pids of the processes whose command line holds `tag` (a jailed process knows only
/// its pid in the run's PID namespace, so witnesses are found by name).
pub(crate) fn tagged(tag: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            (String::from_utf8_lossy(&cmdline).contains(tag) && alive(pid)).then_some(pid)
        })
        .collect()
}

/// A tag no other test uses.
pub(crate) fn new_tag() -> String {
    format!("supwitness{}", uuid_like())
}

fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{n:x}{}", std::process::id())
}

#[test]
fn setsid_and_background_jobs_are_gone_before_the_check_runs() {
    let env = Env::new();
    let tag = new_tag();
    let spawn = format!(
        "setsid bash -c 'echo $$ > s.pid; exec -a {tag}s sleep 300' >/dev/null 2>&1 < /dev/null & \
         (exec -a {tag}b sleep 300 & echo $! > b.pid) ; \
         for i in $(seq 100); do [ -s s.pid ] && [ -s b.pid ] && break; sleep 0.02; done"
    );
    let check = "for f in s.pid b.pid; do test -e /proc/$(cat $f) && { echo alive $f; exit 1; }; done; exit 0";
    let run = env.json(
        &["goal", "do it", "--check-cmd", check, "--tries", "1"],
        json!([cmd("spawn", &spawn), say("done")]),
        &[],
    );
    assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
    assert!(tagged(&tag).is_empty(), "alive after the run");
}

#[test]
fn keep_background_leaves_them_running_for_the_checks_but_not_after_the_run() {
    let env = Env::new();
    let tag = new_tag();
    let goal = env.write(
        "g/goal.toml",
        "prompt = \"work\"\nkeep_background = true\n[[check]]\nrun = \"test -e /proc/$(cat s.pid)\"\n",
    );
    let spawn = format!(
        "setsid bash -c 'echo $$ > s.pid; exec -a {tag} sleep 300' >/dev/null 2>&1 < /dev/null & \
         for i in $(seq 100); do [ -s s.pid ] && break; sleep 0.02; done"
    );
    let run = env.json(
        &[
            "goal",
            "--file",
            goal.to_str().unwrap(),
            "--workspace",
            ".",
            "--tries",
            "1",
        ],
        json!([cmd("spawn", &spawn), say("done")]),
        &[],
    );
    assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
    assert!(tagged(&tag).is_empty(), "alive after the run");
}

const KEY: &str = "sk-test-very-secret-4242";

fn with_keys(mut c: std::process::Command) -> std::process::Command {
    c.env("OPENAI_API_KEY", KEY)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("my_db_password", KEY)
        .env("GITHUB_TOKEN", "ghp-passed-on-purpose");
    c
}

#[test]
fn no_key_reaches_a_command_a_command_tool_a_check_or_an_mcp_server() {
    let env = Env::new();
    let everything = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp/node_modules/.bin/mcp-server-everything");
    assert!(
        everything.exists(),
        "run `npm ci` in tests/mcp first (see PREAMBLE)"
    );
    let goal = env.write(
        "g/goal.toml",
        &format!(
            "prompt = \"work\"\nenv_pass = [\"GITHUB_TOKEN\"]\n\
             [[tool]]\nname = \"printenv\"\ncommand = [\"bash\", \"-c\", \"env\"]\n\
             [[check]]\nrun = \"env; exit 1\"\n\
             [[mcp]]\nname = \"everything\"\ncommand = [\"{}\"]\n",
            everything.display()
        ),
    );
    let script = env.script(json!([
        cmd("env", "env | grep -i -E 'KEY|PASSWORD|TOKEN'; env"),
        {"tool_calls": [
            {"id": "tool", "name": "printenv", "input": {}},
            {"id": "mcp", "name": "everything__get-env", "input": {}}
        ]},
        say("done")
    ]));
    let mut c = with_keys(env.sup());
    c.args(["goal", "--file", goal.to_str().unwrap(), "--workspace", "."])
        .args(["--tries", "1", "--json", "--model"])
        .arg(format!("script:{}", script.display()));
    let run = Run::new(c.output().unwrap());
    for id in ["env", "tool", "mcp"] {
        let r = text(run.tool_result(id));
        assert!(!r.contains(KEY), "{id} saw the key: {r}");
        assert!(r.contains("PATH"), "{id}: {r}");
        // Passed by name, and its value, like every passed value, is redacted in what the
        // model sees.
        assert!(
            (r.contains("GITHUB_TOKEN=[redacted]")
                || r.contains("\"GITHUB_TOKEN\": \"[redacted]\""))
                && !r.contains("ghp-passed-on-purpose"),
            "{id} lacks env_pass, or shows its value: {r}"
        );
    }
    let check = &run.result()["checks"][0][0];
    assert!(check["output_tail"].as_str().unwrap().contains("PATH"));
    assert!(!check.to_string().contains(KEY), "{check}");
    let line = sandbox_line(&run);
    let withheld = line
        .split("withheld from tools: ")
        .nth(1)
        .unwrap_or_default();
    for name in ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "my_db_password"] {
        assert!(withheld.split(", ").any(|n| n == name), "{name}: {line}");
    }
    assert!(!withheld.contains("GITHUB_TOKEN"), "{line}");
    assert!(!line.contains(KEY));
    assert!(!run.stdout.contains(KEY));
}

/// A goal file of `body` is refused before anything runs: exit 2, naming the file's `line`
/// and `key`.
pub(crate) fn refused_at(env: &Env, body: &str, line: usize, key: &str) {
    let goal = env.write("g/goal.toml", body);
    let run = env.json(
        &["goal", "--file", goal.to_str().unwrap()],
        json!([say("x")]),
        &[],
    );
    assert_eq!(run.code, 2, "{body}: {}", run.stderr);
    assert!(
        run.stderr.contains(&format!("{}:{line}", goal.display())) && run.stderr.contains(key),
        "{body}: {}",
        run.stderr
    );
}

#[test]
fn an_env_pass_that_is_not_a_variable_name_is_exit_2_with_file_and_line() {
    let env = Env::new();
    refused_at(
        &env,
        "prompt = \"work\"\n\nenv_pass = [\"NOT A NAME\"]\n",
        3,
        "env_pass",
    );
    let run = env.run_json(json!([say("x")]), &["--env-pass", "1BAD"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    // A variable name is accepted, in the file and as a flag.
    let goal = env.write(
        "g/goal.toml",
        "prompt = \"work\"\nenv_pass = [\"GOOD_NAME\"]\n",
    );
    let run = env.json(
        &["goal", "--file", goal.to_str().unwrap()],
        json!([say("x")]),
        &["--env-pass", "OTHER_1"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn bad_sandbox_keys_are_exit_2_with_file_and_line() {
    let env = Env::new();
    for (body, key) in [
        ("sandbox = \"jail\"\n", "sandbox"),
        ("network = \"yes\"\n", "network"),
        ("writable = [\"../no-such-folder\"]\n", "writable"),
    ] {
        refused_at(&env, &format!("prompt = \"work\"\n{body}"), 2, key);
    }
    // The same keys with good values are accepted.
    let goal = env.write(
        "g/goal.toml",
        "prompt = \"work\"\nsandbox = \"read-only\"\nnetwork = false\nwritable = [\".\"]\n",
    );
    let run = env.json(
        &["goal", "--file", goal.to_str().unwrap()],
        json!([say("x")]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(sandbox_line(&run).starts_with("sandbox: read-only, network off"));
}

/// `sup ARGS` as an unprivileged user (root reads any process's memory), with the keys.
fn sup_as_nobody(env: &Env, args: &[&str]) -> std::process::Command {
    let mut c = env.sup_as_nobody();
    c.args(args);
    with_keys(c)
}

/// A command that prints the key variables of its parent's environment, reversed (so the
/// redaction of results cannot hide a key that was read), then `peeked`.
const PEEK: &str = "tr '\\0' '\\n' < /proc/$PPID/environ | grep KEY | rev; echo ppid=$PPID peeked";

fn assert_no_key(result: &str) {
    let reversed: String = KEY.chars().rev().collect();
    assert!(result.contains("peeked"), "{result}");
    assert!(
        !result.contains(&reversed) && !result.contains(KEY) && !result.contains("YEK_IPA"),
        "the key was read from sup: {result}"
    );
}

#[test]
fn a_command_cannot_read_keys_from_sups_own_environment() {
    // Sandbox off: sup's being non-dumpable is all that stands in the way; by default the
    // sandbox's ptrace scoping stands there too.
    for sandbox in ["off", "workspace-write"] {
        let env = Env::new();
        let script = env.script(json!([cmd("peek", PEEK), say("done")]));
        let model = format!("script:{}", script.display());
        let mut c = sup_as_nobody(
            &env,
            &[
                "run",
                "peek",
                "--json",
                "--sandbox",
                sandbox,
                "--model",
                &model,
            ],
        );
        let run = Run::new(c.output().unwrap());
        assert_eq!(run.code, 0, "{sandbox}: {}", run.stderr);
        assert_no_key(&text(run.tool_result("peek")));
    }
}

#[test]
fn a_goals_command_cannot_read_keys_from_the_daemons_environment() {
    let env = Env::new();
    let goals = env.home.path().join("goals");
    std::fs::create_dir_all(goals.join("work")).unwrap();
    std::fs::write(
        goals.join("peek.json"),
        json!([cmd("peek", PEEK), say("done")]).to_string(),
    )
    .unwrap();
    std::fs::write(
        goals.join("peek.toml"),
        "prompt = \"peek\"\nmodel = \"script:peek.json\"\nworkspace = \"work\"\n\
         schedule = \"* * * * * *\"\ntimezone = \"UTC\"\ntries = 1\nsandbox = \"off\"\n",
    )
    .unwrap();
    let mut daemon = sup_as_nobody(&env, &["daemon", "--goals", goals.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn_killed();
    let result = common::eventually(
        std::time::Duration::from_secs(30),
        "a run of the goal answered its command",
        || {
            env.run_dirs().into_iter().find_map(|dir| {
                let t = std::fs::read_to_string(dir.join("transcript.jsonl")).ok()?;
                let events: Vec<Value> = t
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect();
                common::tool_messages(&events)
                    .into_iter()
                    .map(|m| m.to_string())
                    .find(|c| c.contains("peeked"))
            })
        },
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    daemon.wait().unwrap();
    assert!(
        result.contains(&format!("ppid={} ", daemon.id())),
        "the command's parent is the daemon: {result}"
    );
    assert_no_key(&result);
}

#[test]
fn a_blocked_command_says_which_path_and_which_rule() {
    let env = Env::new();
    let home = env.home.path().display().to_string();
    let run = env.run_json(
        json!([cmd("x", &format!("touch {home}/x")), say("done")]),
        &[],
    );
    let r = text(run.tool_result("x"));
    assert!(
        r.contains(&format!("the sandbox stopped writing {home}/x"))
            && r.contains("policy workspace-write: only"),
        "{r}"
    );
}

/// The Landlock ABI of this kernel; 0 without Landlock.
fn landlock_abi() -> i64 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attribute only queries the version.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    }
    .max(0)
}

/// Whether `pid` runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn after_kill_9_of_sup_the_next_start_ends_what_its_run_left_running() {
    let env = Env::new();
    let tag = new_tag();
    let spawn = format!(
        "setsid bash -c 'exec -a {tag}s sleep 300' >/dev/null 2>&1 < /dev/null & \
         (exec -a {tag}b sleep 300 &); exec -a {tag}l sleep 300"
    );
    let script = env.script(json!([cmd("spawn", &spawn), say("done")]));
    let mut first = env
        .sup()
        .args(["run", "w", "--json", "--tool-timeout", "600s", "--model"])
        .arg(format!("script:{}", script.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn_killed();
    common::until("the three to start", 5, || tagged(&tag).len() == 3);
    first.kill().unwrap();
    first.wait().unwrap();
    // The jail's init dies with sup, and the kernel ends every process of the jail: the
    // tool's leader, what left its group and its session too.
    common::until("the jail's processes to end with sup", 5, || {
        tagged(&tag).is_empty()
    });
    // The killed run says it is running, under a pid that is always alive.
    let db = env.home.path().join("sup.db");
    let sql = |q: &str| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); r=c.execute(sys.argv[2]).fetchall(); c.commit(); print(r)"])
            .arg(&db)
            .arg(q)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    sql("update runs set pid = 1");
    let run = env.run_json(json!([say("done")]), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let out = env.sup().args(["runs", "--json"]).output().unwrap();
    assert!(out.status.success());
    let statuses = sql("select status from runs order by started_at");
    assert!(statuses.contains("interrupted"), "{statuses}");
    assert!(!statuses.contains("running"), "{statuses}");
}

// ------------------------------------------------------------- no key anywhere, per protocol

const OPENAI_KEY: &str = "sk-openai-key-in-use-7d1e";
const ANTHROPIC_KEY: &str = "sk-ant-key-in-use-93c2";

/// Every file under `dir` that holds `secret`.
fn files_holding(dir: &Path, secret: &str) -> Vec<String> {
    let files = common::all_files(dir);
    files
        .into_iter()
        .filter(|f| String::from_utf8_lossy(&std::fs::read(f).unwrap()).contains(secret))
        .map(|f| f.display().to_string())
        .collect()
}

fn everything_server() -> String {
    let everything = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp/node_modules/.bin/mcp-server-everything");
    assert!(
        everything.exists(),
        "run `npm ci` in tests/mcp first (see PREAMBLE)"
    );
    everything.display().to_string()
}

/// A goal whose command, command tool, check and MCP server print their environment, with
/// both provider keys set; the provider serves the calls, then answers the second try with a
/// 401 that echoes the key it was sent. Neither key may be in stdout, the debug log on
/// stderr, `sup show`, `sup runs --json` or any file under SUP_HOME.
fn no_key_anywhere(anthropic: bool) {
    use common::fake_server::{FakeServer, Indexing, Reply, Turn, anthropic_stream, openai_stream};
    let env = Env::new();
    let goal = env.write(
        "g/goal.toml",
        &format!(
            "prompt = \"work\"\n\
             [[tool]]\nname = \"printenv\"\ncommand = [\"bash\", \"-c\", \"env\"]\n\
             [[check]]\nrun = \"env; exit 1\"\n\
             [[mcp]]\nname = \"everything\"\ncommand = [\"{}\"]\n",
            everything_server()
        ),
    );
    let calls = Turn::default()
        .call("env", "run_command", r#"{"command":"env"}"#)
        .call("tool", "printenv", "{}")
        .call("mcp", "everything__get-env", "{}");
    let done = Turn::text("done");
    let (model, base_var, key, stream): (&str, &str, &str, fn(&Turn) -> Reply) = if anthropic {
        (
            "anthropic:claude-test",
            "ANTHROPIC_BASE_URL",
            ANTHROPIC_KEY,
            anthropic_stream,
        )
    } else {
        ("openai:gpt-test", "OPENAI_BASE_URL", OPENAI_KEY, |t| {
            openai_stream(t, Indexing::Standard)
        })
    };
    let unauthorized = if anthropic {
        json!({"type": "error", "error": {"type": "authentication_error",
            "message": format!("invalid x-api-key: {key}")}})
    } else {
        json!({"error": {"message": format!("Incorrect API key provided: {key}."),
            "type": "invalid_request_error", "code": "invalid_api_key"}})
    };
    let server = FakeServer::start(vec![
        stream(&calls),
        stream(&done),
        Reply::json(401, unauthorized),
    ]);
    let base = if anthropic {
        server.url.clone()
    } else {
        format!("{}/v1", server.url)
    };
    let out = env
        .sup()
        .env(base_var, base)
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .env("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        .env("RUST_LOG", "debug")
        .args(["goal", "--file", goal.to_str().unwrap(), "--workspace", "."])
        .args(["--tries", "2", "--json", "--model", model])
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 4, "{model}: {}", run.stderr);
    assert_eq!(server.requests().len(), 3, "{model}: {}", run.stderr);
    // The tools ran and printed an environment, and the check did.
    for id in ["env", "tool", "mcp"] {
        assert!(
            text(run.tool_result(id)).contains("PATH"),
            "{model} {id}: {}",
            run.stdout
        );
    }
    assert!(!run.of_type("check").is_empty(), "{model}: {}", run.stdout);
    assert!(
        run.stdout.contains("[redacted]"),
        "{model}: the 401 left no trace"
    );
    let runs = env.sup().args(["runs", "--json"]).output().unwrap();
    let listed: Value = serde_json::from_slice(&runs.stdout).unwrap();
    let id = listed[0]["run_id"].as_str().unwrap().to_string();
    let show = env.sup().args(["show", &id]).output().unwrap();
    let shown = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(shown.contains("PATH"), "{model}: {shown}");
    for secret in [OPENAI_KEY, ANTHROPIC_KEY] {
        for (what, text) in [
            ("stdout", &run.stdout),
            ("stderr", &run.stderr),
            ("sup show", &shown),
            (
                "sup runs --json",
                &String::from_utf8_lossy(&runs.stdout).into_owned(),
            ),
        ] {
            assert!(
                !text.contains(secret),
                "{model}: {secret} in {what}: {text}"
            );
        }
        let files = files_holding(env.home.path(), secret);
        assert!(files.is_empty(), "{model}: {secret} in {files:?}");
    }
}

#[test]
fn no_key_anywhere_with_openai() {
    no_key_anywhere(false);
}

#[test]
fn no_key_anywhere_with_anthropic() {
    no_key_anywhere(true);
}

const PASSED: &str = "passed-value-5f0c1a";

#[test]
fn env_pass_on_the_command_line_passes_the_variable_redacted_and_never_to_disk() {
    let env = Env::new();
    let turns = json!([cmd("echo", "echo \"got=$PASSED_TOKEN\""), say("done")]);
    let mut c = env.sup();
    c.env("PASSED_TOKEN", PASSED);
    let script = env.script(turns.clone());
    let out = c
        .args([
            "run",
            "work",
            "--json",
            "--env-pass",
            "PASSED_TOKEN",
            "--model",
        ])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        text(run.tool_result("echo")).contains("got=[redacted]"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains(PASSED) && !run.stderr.contains(PASSED));
    // Without the flag, the variable is withheld.
    let mut c = env.sup();
    c.env("PASSED_TOKEN", PASSED);
    let script = env.script(turns);
    let out = c
        .args(["run", "work", "--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    let echoed = text(run.tool_result("echo"));
    assert!(echoed.trim_end().ends_with("\ngot="), "{echoed}");
    let files = files_holding(env.home.path(), PASSED);
    assert!(files.is_empty(), "{files:?}");
}

#[test]
fn mcp_env_pass_passes_the_variable_to_the_server_and_never_to_disk() {
    let env = Env::new();
    let goal = env.write(
        "g/goal.toml",
        &format!(
            "prompt = \"work\"\n[[mcp]]\nname = \"everything\"\ncommand = [\"{}\"]\n\
             env_pass = [\"MCP_TOKEN\"]\n",
            everything_server()
        ),
    );
    let script = env.script(json!([
        {"tool_calls": [{"id": "mcp", "name": "everything__get-env", "input": {}}]},
        say("done")
    ]));
    let out = env
        .sup()
        .env("MCP_TOKEN", PASSED)
        .env("OTHER_TOKEN", "not-passed-value-77a1")
        .args(["goal", "--file", goal.to_str().unwrap(), "--workspace", "."])
        .args(["--tries", "1", "--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let r = text(run.tool_result("mcp"));
    assert!(r.contains("\"MCP_TOKEN\": \"[redacted]\""), "{r}");
    assert!(!r.contains("OTHER_TOKEN") && !r.contains(PASSED), "{r}");
    assert!(!run.stdout.contains(PASSED));
    let files = files_holding(env.home.path(), PASSED);
    assert!(files.is_empty(), "{files:?}");
    // A name that is not a variable name: exit 2 at its line.
    refused_at(
        &env,
        "prompt = \"work\"\n[[mcp]]\nname = \"x\"\ncommand = [\"true\"]\nenv_pass = [\"NOT A NAME\"]\n",
        5,
        "env_pass",
    );
}

#[test]
fn the_service_manager_inherits_no_store_password_and_no_key() {
    let env = Env::new();
    let bin = env.home.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let dump = env.home.path().join("systemctl.env");
    let fake = bin.join("systemctl");
    std::fs::write(&fake, format!("#!/bin/sh\nenv >> '{}'\n", dump.display())).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let goals = env.home.path().join("goals");
    std::fs::create_dir_all(&goals).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = with_keys(env.sup())
        .env("PATH", path)
        .env("XDG_CONFIG_HOME", env.home.path().join("xdg"))
        .env(
            "SUP_STORE",
            "postgres://sup:s3cret-store-pass@127.0.0.1:5432/fleet",
        )
        .args(["service", "install", "--user", "--goals"])
        .arg(&goals)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = std::fs::read_to_string(&dump).unwrap();
    assert!(seen.contains("PATH="), "systemctl ran: {seen}");
    assert!(!seen.contains("s3cret-store-pass"), "{seen}");
    assert!(!seen.contains(KEY), "{seen}");
}

/// Run `sup` under a seccomp filter that makes `prctl(PR_SET_DUMPABLE, …)` fail with EPERM
/// (x86_64 only: the filter names the syscall by its number there).
const NO_DUMPABLE: &str = r#"
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def op(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)
LD, JEQ, RET = 0x20, 0x15, 0x06
ALLOW, EPERM = 0x7FFF0000, 0x00050000 | 1
prog = b"".join([
    op(LD, 0, 0, 4),               # seccomp_data.arch
    op(JEQ, 1, 0, 0xC000003E),     # AUDIT_ARCH_X86_64
    op(RET, 0, 0, ALLOW),
    op(LD, 0, 0, 0),               # seccomp_data.nr
    op(JEQ, 0, 3, 157),            # SYS_prctl
    op(LD, 0, 0, 16),              # args[0], low half
    op(JEQ, 0, 1, 4),              # PR_SET_DUMPABLE
    op(RET, 0, 0, EPERM),
    op(RET, 0, 0, ALLOW),
])
buf = ctypes.create_string_buffer(prog, len(prog))
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
prctl = libc.prctl
prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
if prctl(38, 1, None, 0, 0) != 0 or prctl(22, 2, ctypes.addressof(fprog), 0, 0) != 0:
    sys.exit("seccomp: " + os.strerror(ctypes.get_errno()))
if prctl(4, 0, None, 0, 0) == 0:
    sys.exit("the filter let PR_SET_DUMPABLE through")
os.execv(sys.argv[1], sys.argv[1:])
"#;

#[test]
fn a_prctl_failure_is_the_first_notice_and_the_run_goes_on() {
    if std::env::consts::ARCH != "x86_64" {
        eprintln!("skipped: the seccomp filter names prctl by its x86_64 number");
        return;
    }
    let env = Env::new();
    let wrapper = env.home.path().join("no-dumpable.py");
    std::fs::write(&wrapper, NO_DUMPABLE).unwrap();
    let script = env.script(json!([cmd("c", "echo still-works"), say("done")]));
    let sup = env.sup();
    let mut c = std::process::Command::new("python3");
    c.arg(&wrapper).arg(env!("CARGO_BIN_EXE_sup"));
    for (k, v) in sup.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.current_dir(env.ws.path())
        .args(["run", "w", "--json", "--model"])
        .arg(format!("script:{}", script.display()));
    let run = Run::new(c.output().unwrap());
    assert_eq!(run.code, 0, "the run goes on: {}", run.stderr);
    assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
    assert!(text(run.tool_result("c")).contains("still-works"));
    let first = run.of_type("notice")[0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        first.contains("MISSING PROTECTION")
            && first.contains("sup could not make itself non-dumpable (Operation not permitted"),
        "{first}"
    );
}

#[test]
fn moving_a_parent_folder_does_not_carry_a_protected_file_away() {
    let env = Env::new();
    let original = "prompt = \"work\"\nworkspace = \"../..\"\n";
    let goal = env.write("goals/deep/g.toml", original);
    let config = env.write(".config/sup/config.toml", "# mine\n");
    let swap_goal = "mv goals goals.old && mkdir -p goals/deep && \
                     sed 's/work/evil/' goals.old/deep/g.toml > goals/deep/g.toml";
    let swap_deep = "mv goals/deep goals/deep.old && mkdir goals/deep && \
                     sed 's/work/evil/' goals/deep.old/g.toml > goals/deep/g.toml";
    let swap_config = "mv .config .config.old && mkdir -p .config/sup && \
                       echo 'allow = [\"run_command\"]' > .config/sup/config.toml";
    let script = env.script(json!([
        cmd("goal", swap_goal),
        cmd("deep", swap_deep),
        cmd("config", swap_config),
        cmd("rm", "rm -rf goals/deep .config/sup"),
        say("done")
    ]));
    let out = env
        .sup()
        .env("SUP_CONFIG", &config)
        .args(["goal", "--json", "--file"])
        .arg(&goal)
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    for id in ["goal", "deep", "config", "rm"] {
        assert_eq!(run.tool_result(id)["is_error"], true, "{id}");
    }
    assert!(
        text(run.tool_result("goal")).contains("cannot be moved or removed"),
        "{}",
        run.tool_result("goal")
    );
    assert_eq!(std::fs::read_to_string(&goal).unwrap(), original);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), "# mine\n");
    assert!(!env.ws().join("goals.old").exists());
    assert!(!env.ws().join(".config.old").exists());
}

#[test]
fn a_user_config_that_does_not_exist_yet_cannot_be_created_by_the_agent() {
    for rel in ["cfg/sup/config.toml", "config.toml"] {
        let env = Env::new();
        let config = env.ws().join(rel);
        let evil = "printf '[approval_rules]\\nallow = [\"run_command\"]\\n'";
        let script = env.script(json!([
            cmd("cmd", &format!("mkdir -p $(dirname $SUP_CONFIG); {evil} > $SUP_CONFIG")),
            cmd("swap", &format!("rm -f $SUP_CONFIG; mv $SUP_CONFIG x; {evil} > $SUP_CONFIG")),
            {"tool_calls": [{"id": "w", "name": "write_file",
              "input": {"path": rel, "content": "[approval_rules]\nallow = [\"run_command\"]\n"}}]},
            say("done")
        ]));
        let out = env
            .sup()
            .env("SUP_CONFIG", &config)
            .args(["run", "work", "--json", "--model"])
            .arg(format!("script:{}", script.display()))
            .output()
            .unwrap();
        let run = Run::new(out);
        assert_eq!(run.code, 0, "{rel}: {}", run.stderr);
        for id in ["cmd", "swap", "w"] {
            assert_eq!(run.tool_result(id)["is_error"], true, "{rel} {id}");
        }
        let now = std::fs::read_to_string(&config).unwrap_or_default();
        assert!(!now.contains("run_command"), "{rel}: the agent wrote {now}");
    }
}

#[test]
fn sup_home_inside_the_workspace_stays_read_only_and_tmpdir_writable() {
    let env = Env::new();
    let home = env.ws().join("sup-home");
    std::fs::create_dir(&home).unwrap();
    let h = home.display().to_string();
    let script = env.script(json!([
        cmd("tmp", "echo tmp > $TMPDIR/t && cat $TMPDIR/t"),
        cmd("home", &format!("echo x > {h}/planted")),
        cmd("move", "mv sup-home sup-home.old"),
        say("done")
    ]));
    let out = env
        .sup()
        .env("SUP_HOME", &home)
        .args(["run", "work", "--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let tmp = run.tool_result("tmp");
    assert_eq!(tmp["is_error"], false, "{tmp}");
    assert!(text(tmp).contains("tmp"));
    assert_eq!(run.tool_result("home")["is_error"], true);
    assert_eq!(run.tool_result("move")["is_error"], true);
    assert!(!home.join("planted").exists());
    assert!(home.exists());
}

/// Whether a process whose command line contains `marker` runs; kills any it finds.
pub(crate) fn left_with(marker: &str) -> Vec<String> {
    let out = std::process::Command::new("pgrep")
        .args(["-f", marker])
        .output()
        .unwrap();
    let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    for p in &pids {
        if let Ok(pid) = p.parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    pids
}

#[test]
fn an_orphan_with_a_spoofed_run_id_and_token_is_gone_before_the_check_and_after_the_run() {
    let env = Env::new();
    let marker = format!("sup-spoof-{}", uuid::Uuid::new_v4().simple());
    let spawn = format!(
        "SUP_RUN_ID=x SUP_RUN_TOKEN=forged setsid bash -c 'echo $$ > s.pid; exec -a {marker} sleep 999' \
         >/dev/null 2>&1 < /dev/null & \
         for i in $(seq 100); do [ -s s.pid ] && break; sleep 0.02; done"
    );
    let check = "test -e /proc/$(cat s.pid) && { echo alive; exit 1; }; exit 0";
    let run = env.json(
        &["goal", "do it", "--check-cmd", check, "--tries", "1"],
        json!([cmd("spawn", &spawn), say("done")]),
        &[],
    );
    let left = left_with(&marker);
    assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
    assert!(left.is_empty(), "left running: {left:?}");
}

#[test]
fn sup_itself_under_a_tokio_runtime_name_is_no_exemption_from_the_sweep() {
    let env = Env::new();
    let marker = format!("sup-fake-worker-{}", uuid::Uuid::new_v4().simple());
    let sup = env!("CARGO_BIN_EXE_sup");
    let spawn = format!(
        "ln -s {sup} $TMPDIR/tokio-runtime-w; mkdir -p $TMPDIR/{marker}; \
         SUP_HOME=$TMPDIR/h setsid bash -c 'echo $$ > s.pid; \
         exec $TMPDIR/tokio-runtime-w daemon --goals $TMPDIR/{marker}' \
         >/dev/null 2>&1 < /dev/null & \
         for i in $(seq 100); do [ -s s.pid ] && break; sleep 0.02; done; sleep 0.3; \
         cat /proc/$(cat s.pid)/comm"
    );
    let check = "test -e /proc/$(cat s.pid) && { echo alive; exit 1; }; exit 0";
    let run = env.json(
        &["goal", "do it", "--check-cmd", check, "--tries", "1"],
        json!([cmd("spawn", &spawn), say("done")]),
        &[],
    );
    let left = left_with(&marker);
    // The fake worker ran, under the exempted name.
    assert!(
        text(run.tool_result("spawn")).contains("tokio-runtime-w"),
        "{}",
        run.tool_result("spawn")
    );
    assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
    assert!(left.is_empty(), "left running: {left:?}");
}

#[test]
fn the_goal_key_sandbox_is_between_the_flag_and_sup_sandbox() {
    let env = Env::new();
    let out = outside();
    let o = out.path().display().to_string();
    let goal = env.write("g/goal.toml", "prompt = \"work\"\nsandbox = \"off\"\n");
    let go = |extra: &[&str], sandbox_env: &str| {
        let script = env.script(json!([cmd("out", &format!("echo x > {o}/e")), say("done")]));
        let mut c = env.sup();
        c.env("SUP_SANDBOX", sandbox_env)
            .args(["goal", "--json", "--workspace", ".", "--file"])
            .arg(&goal)
            .args(extra)
            .arg("--model")
            .arg(format!("script:{}", script.display()));
        Run::new(c.output().unwrap())
    };
    // The goal key wins over SUP_SANDBOX.
    let run = go(&[], "read-only");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(sandbox_line(&run).starts_with("sandbox: off"));
    assert_eq!(run.tool_result("out")["is_error"], false);
    assert!(out.path().join("e").exists());
    std::fs::remove_file(out.path().join("e")).unwrap();
    // The flag wins over the goal key.
    let run = go(&["--sandbox", "workspace-write"], "off");
    assert!(sandbox_line(&run).starts_with("sandbox: workspace-write"));
    assert_eq!(run.tool_result("out")["is_error"], true);
    assert!(!out.path().join("e").exists());
}

#[test]
fn the_goal_key_sandbox_required_refuses_a_goal_without_the_sandbox() {
    let env = Env::new();
    let goal = env.write(
        "g/goal.toml",
        "prompt = \"work\"\nsandbox = \"off\"\nsandbox_required = true\n",
    );
    let run = env.json(
        &["goal", "--file", goal.to_str().unwrap()],
        json!([say("done")]),
        &[],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("sandbox is required"), "{}", run.stderr);
    // SUP_SANDBOX=off is refused the same way.
    let goal = env.write(
        "g/goal.toml",
        "prompt = \"work\"\nsandbox_required = true\n",
    );
    let script = env.script(json!([say("done")]));
    let out = env
        .sup()
        .env("SUP_SANDBOX", "off")
        .args(["goal", "--json", "--file"])
        .arg(&goal)
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_sandboxed_command_cannot_signal_sup() {
    // sup is outside the run's PID namespace: a command cannot name it, by $PPID (0 there)
    // or by the pid it has on the machine, which the test hands it.
    let env = Env::new();
    let script = env.script(json!([
        cmd(
            "sig",
            "for i in $(seq 200); do [ -s sup.pid ] && break; sleep 0.02; done; p=$(cat sup.pid); \
             kill -STOP $p; s=$?; kill -CONT $p; kill -TERM $p; t=$?; kill -0 $PPID; z=$?; \
             echo stop=$s term=$t ppid=$PPID; test $s -ne 0 && test $t -ne 0"
        ),
        say("done")
    ]));
    let child = env
        .sup()
        .args(["run", "w", "--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(env.ws().join("sup.pid"), child.id().to_string()).unwrap();
    let run = Run::new(child.wait_with_output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let r = run.tool_result("sig");
    assert!(text(r).contains("stop=1 term=1 ppid=0"), "{r}");
    assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
}

#[test]
fn python_checks_ignore_pythonpath() {
    let env = Env::new();
    let shadow = outside();
    std::fs::write(
        shadow.path().join("json.py"),
        "def loads(s):\n    return {'a': 2}\n",
    )
    .unwrap();
    env.write(
        "check.py",
        "import json, sys\nsys.exit(0 if json.loads('{\"a\": 1}')['a'] == 2 else 1)\n",
    );
    let script = env.script(json!([say("done")]));
    let out = env
        .sup()
        .env("PYTHONPATH", shadow.path())
        .args([
            "goal", "do it", "--check", "check.py", "--tries", "1", "--json", "--model",
        ])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.result()["status"], "failed", "{}", run.stdout);
}

#[test]
fn a_bad_mcp_sandbox_is_exit_2_with_file_and_line() {
    let env = Env::new();
    refused_at(
        &env,
        "prompt = \"work\"\n[[mcp]]\nname = \"x\"\ncommand = [\"true\"]\nsandbox = \"jail\"\n",
        5,
        "sandbox",
    );
}

#[test]
fn a_command_has_no_capabilities_to_reach_a_protected_file_by_its_handle() {
    // As root, open_by_handle_at reaches the goal file through the workspace's own mount,
    // around its read-only bind mount; a device node made with mknod would too.
    let env = Env::new();
    let original = "prompt = \"work\"\nworkspace = \".\"\napproval = \"auto\"\n";
    let goal = env.write("goal.toml", original);
    env.write(
        "handle.py",
        "import ctypes, os, struct\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         buf = ctypes.create_string_buffer(8 + 128)\n\
         struct.pack_into('I', buf, 0, 128)\n\
         mnt = ctypes.c_int()\n\
         print('name', libc.name_to_handle_at(-100, b'goal.toml', buf, ctypes.byref(mnt), 0))\n\
         fd = libc.open_by_handle_at(os.open('.', os.O_RDONLY), buf, os.O_WRONLY | os.O_APPEND)\n\
         print('open', fd, os.strerror(ctypes.get_errno()))\n\
         if fd >= 0:\n    os.write(fd, b'approval = \"never\"\\n')\n",
    );
    let run = env.json(
        &["goal", "--file", goal.to_str().unwrap()],
        json!([
            cmd("caps", "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status"),
            cmd("handle", "python3 handle.py"),
            cmd("node", "mknod disk b 8 0 && ls -l disk"),
            say("done")
        ]),
        &[],
    );
    let caps = text(run.tool_result("caps"));
    let lines: Vec<&str> = caps.lines().filter(|l| l.starts_with("Cap")).collect();
    assert_eq!(lines.len(), 4, "{caps}");
    for line in lines {
        assert!(line.ends_with("0000000000000000"), "{caps}");
    }
    assert!(
        text(run.tool_result("handle")).contains("open -1"),
        "{}",
        text(run.tool_result("handle"))
    );
    assert_eq!(run.tool_result("node")["is_error"], true);
    assert_eq!(std::fs::read_to_string(&goal).unwrap(), original);
}

#[test]
fn as_an_ordinary_user_the_sandbox_misses_nothing_and_the_goal_file_stays_read_only() {
    // sup is non-dumpable: a copy of it between fork and exec could not write its own
    // `/proc/self/uid_map`, so the user namespace of the read-only mounts was never made for
    // an ordinary user, and the goal file inside the workspace stayed writable.
    let env = Env::new();
    let original = "prompt = \"work\"\nworkspace = \".\"\napproval = \"auto\"\n";
    let run = env.goal_as(
        true,
        "goal.toml",
        original,
        json!([
            cmd("append", "echo 'approval = \"never\"' >> goal.toml"),
            cmd(
                "caps",
                "grep -E '^Cap(Eff|Prm|Amb)' /proc/self/status; ls /dev/pts"
            ),
            say("done")
        ]),
    );
    let goal = env.ws().join("goal.toml");
    let line = sandbox_line(&run);
    assert!(
        line.starts_with("sandbox: workspace-write") && !line.contains("MISSING"),
        "{line}"
    );
    assert_eq!(
        run.tool_result("append")["is_error"],
        true,
        "{}",
        run.stdout
    );
    let caps = text(run.tool_result("caps"));
    assert_eq!(caps.matches("0000000000000000").count(), 3, "{caps}");
    assert_eq!(std::fs::read_to_string(&goal).unwrap(), original);
}

#[test]
fn with_sup_home_in_the_workspace_the_file_tools_cannot_rewrite_the_frozen_check() {
    // The check runs from its copy under SUP_HOME/runs/RUN_ID/checks; SUP_HOME inside the
    // workspace put that copy in reach of write_file (through a symlink, or by its path).
    let env = Env::new();
    let home = env.ws().join("sup-home");
    std::fs::create_dir(&home).unwrap();
    let checks = outside();
    let check = checks.path().join("check.sh");
    std::fs::write(&check, "exit 1\n").unwrap();
    let script = env.script(json!([
        cmd("ln", "ln -s sup-home/runs/$SUP_RUN_ID/checks c && ls c"),
        {"tool_calls": [{"id": "w", "name": "write_file",
          "input": {"path": "c/1-check.sh", "content": "exit 0\n"}}]},
        {"tool_calls": [{"id": "e", "name": "edit_file",
          "input": {"path": "c/1-check.sh", "old_string": "exit 1", "new_string": "exit 0"}}]},
        say("done")
    ]));
    let out = env
        .sup()
        .env("SUP_HOME", &home)
        .args(["goal", "work", "--json", "--check"])
        .arg(&check)
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert!(
        text(run.tool_result("ln")).contains("1-check.sh"),
        "{}",
        run.stdout
    );
    assert_eq!(run.tool_result("w")["is_error"], true, "{}", run.stdout);
    assert_eq!(run.tool_result("e")["is_error"], true, "{}", run.stdout);
    assert_ne!(run.result()["status"], "achieved", "{}", run.stdout);
}

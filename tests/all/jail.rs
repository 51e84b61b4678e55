//! The jail of a run, tried as a hostile model would, as root and as uid 65534: the seccomp
//! filter (no unix sockets to a service of the user, no io_uring, ptrace or namespaces), the
//! hidden credential files, the limits on processes and memory.

use crate::common;

use common::{Env, Run, SpawnKilled, both};
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

fn root() -> bool {
    nix::unistd::getuid().is_root()
}

/// The trace line that describes the sandbox.
fn sandbox_line(run: &Run) -> String {
    run.of_type("notice")
        .into_iter()
        .map(|n| n["text"].as_str().unwrap_or_default().to_string())
        .find(|t| t.starts_with("sandbox: "))
        .unwrap_or_else(|| panic!("no sandbox notice: {}", run.stdout))
}

/// A program the test needs, or a panic that says how to install it.
fn need(program: &str, package: &str) {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "this test needs `{program}`: install it with `apt-get install -y {package}`"
    );
}

/// `command` as 65534 when `nobody` (through setpriv), else as is.
fn as_user(nobody: bool, program: &str) -> std::process::Command {
    if nobody {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", program]);
        c
    } else {
        std::process::Command::new(program)
    }
}

const GOAL: &str = "prompt = \"work\"\nworkspace = \".\"\napproval = \"auto\"\n";

#[test]
fn a_command_cannot_have_a_service_of_the_user_run_code_outside_the_sandbox() {
    // The person's tmux: its server listens on a pathname socket, and `run-shell` runs what
    // it is given outside the sandbox (`send-keys` would type into the approval prompt).
    need("tmux", "tmux");
    both(|nobody| {
        let env = Env::new();
        let sock_dir = tempfile::tempdir().unwrap();
        let witness = sock_dir.path().join("escaped");
        if nobody {
            std::process::Command::new("chown")
                .arg("65534:65534")
                .arg(sock_dir.path())
                .status()
                .unwrap();
        }
        let sock = sock_dir.path().join("default");
        let started = as_user(nobody, "tmux")
            .arg("-S")
            .arg(&sock)
            .args(["new-session", "-d"])
            .status()
            .unwrap();
        assert!(started.success(), "tmux did not start");
        let run = env.goal_as(
            nobody,
            "goal.toml",
            GOAL,
            json!([
                cmd(
                    "tmux",
                    &format!(
                        "tmux -S {} run-shell 'touch {}'",
                        sock.display(),
                        witness.display()
                    )
                ),
                say("done")
            ]),
        );
        let _ = as_user(nobody, "tmux")
            .arg("-S")
            .arg(&sock)
            .arg("kill-server")
            .status();
        let said = text(run.tool_result("tmux"));
        assert!(!witness.exists(), "tmux ran code outside: {said}");
        assert!(said.contains("Operation not permitted"), "{said}");
        assert!(
            sandbox_line(&run).contains("seccomp denies socket(AF_UNIX)"),
            "{}",
            sandbox_line(&run)
        );
    });
}

/// Tries each refused call and prints `NAME RESULT` per line.
#[cfg(target_arch = "x86_64")]
const CALLS: &str = r#"
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def t(name, f):
    try:
        f()
        print(name, 'allowed')
    except OSError as e:
        print(name, os.strerror(e.errno))
def sc(nr, *a):
    if libc.syscall(nr, *a) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
buf = ctypes.create_string_buffer(256)
t('unix', lambda: socket.socket(socket.AF_UNIX))
t('pair', lambda: socket.socketpair())
t('io_uring', lambda: sc(425, 4, buf))
t('ptrace', lambda: sc(101, 0, 0, 0, 0))
t('vm_writev', lambda: sc(311, os.getppid(), buf, 1, buf, 1, 0))
t('bpf', lambda: sc(321, 0, buf, 64))
t('perf', lambda: sc(298, buf, 0, -1, -1, 0))
t('keyctl', lambda: sc(250, 0, 0, 0, 0))
t('add_key', lambda: sc(248, b'user', b'k', b'v', 1, -2))
t('unshare', lambda: sc(272, 0x20000))
t('mount', lambda: sc(165, b'none', b'/tmp', b'tmpfs', 0, 0))
"#;

#[cfg(target_arch = "x86_64")]
#[test]
fn jailed_processes_get_eperm_for_unix_sockets_io_uring_ptrace_keys_and_namespaces() {
    both(|nobody| {
        let env = Env::new();
        env.write("calls.py", CALLS);
        let run = env.goal_as(
            nobody,
            "goal.toml",
            GOAL,
            json!([cmd("calls", "python3 calls.py"), say("done")]),
        );
        let out = text(run.tool_result("calls"));
        for name in [
            "unix",
            "io_uring",
            "ptrace",
            "vm_writev",
            "bpf",
            "perf",
            "keyctl",
            "add_key",
            "unshare",
            "mount",
        ] {
            assert!(
                out.contains(&format!("{name} Operation not permitted")),
                "{name}: {out}"
            );
        }
        assert!(out.contains("pair allowed"), "{out}");
        let line = sandbox_line(&run);
        for word in ["io_uring", "ptrace", "bpf", "keyctl", "new namespaces"] {
            assert!(line.contains(word), "{line}");
        }
        // The goal key lifts the denial of unix sockets, and only that.
        let env = Env::new();
        env.write("calls.py", CALLS);
        let run = env.goal_as(
            nobody,
            "goal.toml",
            &format!("{GOAL}unix_sockets = true\n"),
            json!([cmd("calls", "python3 calls.py"), say("done")]),
        );
        let out = text(run.tool_result("calls"));
        assert!(out.contains("unix allowed"), "{out}");
        assert!(out.contains("ptrace Operation not permitted"), "{out}");
        assert!(!sandbox_line(&run).contains("socket(AF_UNIX)"));
    });
}

/// The goal file `body` is refused with exit 2, naming its line and `key`.
fn refused_at(body: &str, line: usize, key: &str) {
    let env = Env::new();
    let run = env.goal_as(false, "goal.toml", body, json!([say("x")]));
    let path = env.ws().join("goal.toml");
    assert_eq!(run.code, 2, "{body}: {}", run.stderr);
    assert!(
        run.stderr.contains(&format!("{}:{line}", path.display())) && run.stderr.contains(key),
        "{body}: {}",
        run.stderr
    );
}

#[test]
fn bad_jail_keys_are_exit_2_with_file_and_line() {
    refused_at(
        &format!("{GOAL}unix_sockets = \"maybe\"\n"),
        4,
        "unix_sockets",
    );
    refused_at(&format!("{GOAL}max_memory = \"lots\"\n"), 4, "max_memory");
    refused_at(&format!("{GOAL}max_processes = -1\n"), 4, "max_processes");
}

/// As `goal`, with `vars` set in sup's environment.
fn goal_env(env: &Env, nobody: bool, body: &str, turns: Value, vars: &[(&str, &str)]) -> Run {
    let mut c = env.goal_cmd(nobody, "goal.toml", body, turns);
    Run::new(c.envs(vars.iter().copied()).output().unwrap())
}

#[test]
fn the_key_file_credential_stores_hidden_paths_and_other_runs_are_mounted_over() {
    both(|nobody| {
        let env = Env::new();
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        let put = |rel: &str, content: &str| {
            let p = h.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, content).unwrap();
        };
        put(".config/sup/env", "OPENAI_API_KEY=sk-in-the-key-file\n");
        put(".ssh/id_ed25519", "PRIVATE KEY\n");
        put(".aws/config", "aws-shown-again\n");
        env.write("secret.txt", "top secret\n");
        if nobody {
            std::process::Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(h)
                .status()
                .unwrap();
        }
        let vars = [("HOME", h.to_str().unwrap())];
        // Another run first: its folder is under SUP_HOME too.
        let first = goal_env(&env, nobody, GOAL, json!([say("done")]), &vars);
        assert_eq!(first.code, 0, "{}", first.stderr);
        let run = goal_env(
            &env,
            nobody,
            &format!("{GOAL}hidden = [\"secret.txt\"]\nreadable = [\"~/.aws\"]\n"),
            json!([
                cmd(
                    "read",
                    "base64 -w0 ~/.config/sup/env; echo; base64 -w0 ~/.ssh/id_ed25519; echo; \
                     cat secret.txt; cat ~/.aws/config; echo runs=$(ls $SUP_HOME/runs | wc -l)"
                ),
                say("done")
            ]),
            &vars,
        );
        let out = text(run.tool_result("read"));
        // base64 of "OPENAI_API_KEY=sk-in-the-key-file\n" and of "PRIVATE KEY\n".
        assert!(
            !out.contains("T1BFTkFJX0FQSV9LRVk9c2staW4tdGhlLWtleS1maWxlCg"),
            "{out}"
        );
        assert!(!out.contains("UFJJVkFURSBLRVkK"), "{out}");
        assert!(!out.contains("top secret"), "{out}");
        assert!(out.contains("aws-shown-again"), "{out}");
        assert!(out.contains("runs=1"), "{out}");
        let line = sandbox_line(&run);
        assert!(
            line.contains("hidden: ") && line.contains(".config/sup/env"),
            "{line}"
        );
        assert!(!line.contains("MISSING"), "{line}");
        assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
    });
}

/// Forks up to 2,000 children that wait, and says how many it got.
const BOMB: &str = r#"
import os, sys
n = 0
for i in range(2000):
    try:
        pid = os.fork()
    except OSError as e:
        print('refused after', n, os.strerror(e.errno))
        break
    if pid == 0:
        os.pause()
        os._exit(0)
    n += 1
print('forked', n)
"#;

/// The cgroup folders the sandbox line names (`(cgroup vN, DIR, DIR)`), none without one.
fn cgroup_dirs(line: &str) -> Vec<std::path::PathBuf> {
    line.split_once("(cgroup v")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(inside, _)| {
            inside
                .split(", ")
                .skip(1)
                .map(std::path::PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_fork_bomb_is_contained_and_the_run_goes_on() {
    both(|nobody| {
        let env = Env::new();
        env.write("bomb.py", BOMB);
        let run = env.goal_as(
            nobody,
            "goal.toml",
            &format!("{GOAL}max_processes = 64\n"),
            json!([
                cmd("bomb", "python3 bomb.py"),
                cmd("after", "echo still here"),
                say("done")
            ]),
        );
        let out = text(run.tool_result("bomb"));
        let forked: usize = out
            .lines()
            .find_map(|l| l.strip_prefix("forked "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{out}"));
        // Capped by max_processes itself: the jail's own few (its init, the command's relay,
        // python) count too.
        assert!((48..64).contains(&forked), "{out}");
        assert!(out.contains("refused after"), "{out}");
        assert!(text(run.tool_result("after")).contains("still here"));
        assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
        let line = sandbox_line(&run);
        assert!(line.contains("limits: 64 processes"), "{line}");
        if nobody {
            assert!(
                line.contains("(cgroup v") || line.contains("(rlimit: RLIMIT_NPROC"),
                "{line}"
            );
        } else {
            // RLIMIT_NPROC does not bind root: only a cgroup holds a fork bomb of root's.
            let dirs = cgroup_dirs(&line);
            assert!(!dirs.is_empty(), "root's limits are a cgroup: {line}");
            for d in dirs {
                assert!(!d.exists(), "{} outlived its run", d.display());
            }
        }
    });
}

/// `sup-NAME` beside the cgroups of a first run (`dirs`), made empty; with its folder's time
/// an hour back when `old`.
fn left_over(dirs: &[std::path::PathBuf], name: &str, old: bool) -> Vec<std::path::PathBuf> {
    dirs.iter()
        .map(|d| {
            let made = d.parent().unwrap().join(format!("sup-{name}"));
            std::fs::create_dir(&made).unwrap();
            if old {
                let touched = std::process::Command::new("touch")
                    .args(["-d", "1 hour ago"])
                    .arg(&made)
                    .status()
                    .unwrap();
                assert!(touched.success());
            }
            made
        })
        .collect()
}

#[test]
fn a_start_removes_the_empty_cgroups_of_dead_runs_and_no_others() {
    if !root() {
        eprintln!("skipped: only root makes cgroups here");
        return;
    }
    let env = Env::new();
    let first = env.goal_as(false, "goal.toml", GOAL, json!([say("done")]));
    let dirs = cgroup_dirs(&sandbox_line(&first));
    if dirs.is_empty() {
        eprintln!("skipped: no cgroup: {}", sandbox_line(&first));
        return;
    }
    let tag = format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
    // A run of this SUP_HOME that is over (its lock held by nobody), one of another SUP_HOME
    // long gone, and one being made right now by a run elsewhere.
    let dead = format!("dead{tag}");
    let run_dir = env.home.path().join("runs").join(&dead);
    std::fs::create_dir_all(&run_dir).unwrap();
    std::fs::write(run_dir.join("lock"), "").unwrap();
    let dead_dirs = left_over(&dirs, &dead, false);
    let gone_dirs = left_over(&dirs, &format!("gone{tag}"), true);
    let young_dirs = left_over(&dirs, &format!("young{tag}"), false);
    let run = env.goal_as(false, "goal.toml", GOAL, json!([say("done")]));
    assert_eq!(run.code, 0, "{}", run.stderr);
    let kept: Vec<bool> = young_dirs.iter().map(|d| d.exists()).collect();
    for d in &young_dirs {
        let _ = std::fs::remove_dir(d);
    }
    for d in dead_dirs.iter().chain(&gone_dirs) {
        assert!(!d.exists(), "{} is left", d.display());
    }
    assert!(kept.iter().all(|k| *k), "a young cgroup was removed");
}

#[test]
fn a_4_gb_allocation_is_killed_with_a_result_that_says_so() {
    both(|nobody| {
        let env = Env::new();
        let run = env.goal_as(
            nobody,
            "goal.toml",
            &format!("{GOAL}max_memory = \"512M\"\n"),
            json!([
                cmd(
                    "alloc",
                    "python3 -c 'b = b\"x\" * (4 * 1024 ** 3); print(len(b))'"
                ),
                cmd("after", "echo still here"),
                say("done")
            ]),
        );
        let out = text(run.tool_result("alloc"));
        assert!(!out.contains("4294967296"), "{out}");
        assert!(
            out.contains("killed for memory") && out.contains("max_memory = 512M"),
            "{out}"
        );
        assert!(text(run.tool_result("after")).contains("still here"));
        assert!(sandbox_line(&run).contains("512M of memory"));
    });
}

/// `sup` as `env.sup()` (or `env.sup_as_nobody()`) sets it up, but from `program`.
fn sup_from(env: &Env, program: &std::path::Path, nobody: bool) -> std::process::Command {
    let mut c = if nobody {
        // Gives SUP_HOME and the workspace to 65534.
        drop(env.sup_as_nobody());
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(program)
            .env("HOME", env.home.path());
        c
    } else {
        std::process::Command::new(program)
    };
    c.env("SUP_HOME", env.home.path())
        .env("SUP_APPROVAL", "auto")
        .env("SUP_CONFIG", env.home.path().join("no-config.toml"))
        .env_remove("SUP_MODEL")
        .env_remove("RUST_LOG")
        .current_dir(env.ws())
        .stdin(std::process::Stdio::null());
    c
}

#[test]
fn a_byte_identical_copy_of_the_binary_cannot_approve_through_the_console() {
    use crate::web::{attack_loop, console, goals_dir, run_beside_a_loop};
    both(|nobody| {
        let env = Env::new();
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("helper");
        std::fs::copy(env!("CARGO_BIN_EXE_sup"), &copy).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut serve = env.sup_as(nobody);
        serve
            .args(["serve", "--listen", "127.0.0.1:0", "--goals"])
            .arg(goals_dir(&env));
        let c = console(serve);
        env.write("loop.sh", &attack_loop(&c.addr));
        let run = run_beside_a_loop(&env, sup_from(&env, &copy, nobody));
        let codes = std::fs::read_to_string(env.ws().join("codes")).unwrap_or_default();
        assert!(!env.ws().join("forbidden.txt").exists(), "{codes}");
        assert_eq!(run.tool_result("w")["is_error"], true, "{}", run.stdout);
        assert!(codes.contains("signin 403"), "{codes}");
        assert!(
            codes.lines().all(|l| l.ends_with(" 403")),
            "only refusals: {codes}"
        );
        let said = std::fs::read_to_string(env.ws().join("signin.out")).unwrap();
        assert!(said.contains("jail"), "{said}");
    });
}

/// A minimal MCP server over stdio with one tool, `run`, that starts a shell command in the
/// background as its own child (as many MCP servers' command tools do).
const RUNNER: &str = r#"
import json, subprocess, sys
for line in sys.stdin:
    m = json.loads(line)
    if 'id' not in m:
        continue
    meth = m.get('method')
    if meth == 'initialize':
        r = {"protocolVersion": m['params'].get('protocolVersion', '2024-11-05'),
             "capabilities": {"tools": {}}, "serverInfo": {"name": "runner", "version": "1"}}
    elif meth == 'tools/list':
        r = {"tools": [{"name": "run", "description": "run a command in the background",
             "inputSchema": {"type": "object", "properties": {"command": {"type": "string"}},
                             "required": ["command"]}}]}
    elif meth == 'tools/call':
        subprocess.Popen(m['params']['arguments']['command'], shell=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        r = {"content": [{"type": "text", "text": "started"}]}
    else:
        r = {}
    print(json.dumps({"jsonrpc": "2.0", "id": m['id'], "result": r}), flush=True)
"#;

#[test]
fn a_job_an_mcp_tool_started_is_gone_before_the_check() {
    both(|nobody| {
        let env = Env::new();
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let server = dir.path().join("runner.py");
        std::fs::write(&server, RUNNER).unwrap();
        let tag = format!("mcpjob{}{}", std::process::id(), nobody as u8);
        env.write(
            "job.sh",
            "while :; do echo 42 > answer.txt; sleep 0.05; done\n",
        );
        let body = format!(
            "{GOAL}tries = 1\n[[mcp]]\nname = \"runner\"\ncommand = [\"python3\", \"{}\"]\n\
             [[check]]\nrun = \"echo 41 > answer.txt; sleep 0.3; grep -qx 41 answer.txt\"\n",
            server.display()
        );
        let run = env.goal_as(
            nobody,
            "goal.toml",
            &body,
            json!([
                {"tool_calls": [{"id": "j", "name": "runner__run",
                  "input": {"command": format!("bash job.sh {tag}")}}]},
                cmd(
                    "wait",
                    "for i in $(seq 200); do grep -qx 42 answer.txt 2>/dev/null && break; \
                     sleep 0.02; done; cat answer.txt"
                ),
                say("done")
            ]),
        );
        assert!(
            text(run.tool_result("wait")).contains("42"),
            "{}",
            run.stdout
        );
        assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
    });
}

/// A minimal MCP server over stdio that shows whether it is alive: from its start until it
/// ends, a thread of its own appends a line to `beat` in its working folder (the
/// workspace). It counts its starts in `starts`; with the argument `once` it refuses a
/// second one. Its tools: `run` starts a shell command in the background as its own child;
/// `hello` answers which start of the server it is.
const BEATING: &str = r#"
import json, os, subprocess, sys, threading, time
with open('starts', 'a') as f:
    f.write('start\n')
n = len(open('starts').read().splitlines())
if 'once' in sys.argv[1:] and n > 1:
    sys.exit(3)
def beat():
    while True:
        with open('beat', 'a') as f:
            f.write('server %d\n' % n)
        time.sleep(0.02)
threading.Thread(target=beat, daemon=True).start()
for line in sys.stdin:
    m = json.loads(line)
    if 'id' not in m:
        continue
    meth = m.get('method')
    if meth == 'initialize':
        r = {"protocolVersion": m['params'].get('protocolVersion', '2024-11-05'),
             "capabilities": {"tools": {}}, "serverInfo": {"name": "beating", "version": "1"}}
    elif meth == 'tools/list':
        obj = {"type": "object", "properties": {"command": {"type": "string"}}}
        r = {"tools": [{"name": "run", "description": "run a command in the background",
                        "inputSchema": obj},
                       {"name": "hello", "description": "say which start this is",
                        "inputSchema": {"type": "object"}}]}
    elif meth == 'tools/call' and m['params']['name'] == 'run':
        subprocess.Popen(m['params']['arguments']['command'], shell=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        r = {"content": [{"type": "text", "text": "started"}]}
    elif meth == 'tools/call':
        r = {"content": [{"type": "text", "text": "hello from start %d" % n}]}
    else:
        r = {}
    print(json.dumps({"jsonrpc": "2.0", "id": m['id'], "result": r}), flush=True)
"#;

/// The check of the beating server's tests: nothing may add to `beat` while it looks (no
/// MCP server, no job of one), and `hello.txt` must say the server's second start.
const STILL: &str = "a=$(wc -l < beat); sleep 0.3; b=$(wc -l < beat); \
                     if [ \\\"$a\\\" != \\\"$b\\\" ]; then echo ALIVE; tail -n 3 beat; exit 1; fi; \
                     grep -q 'from start 2' hello.txt";

/// The goal of the beating server's tests: two tries, the server (with `args`), the check.
fn beating_goal(args: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = dir.path().join("beating.py");
    std::fs::write(&server, BEATING).unwrap();
    let body = format!(
        "{GOAL}tries = 2\n[[mcp]]\nname = \"beating\"\ncommand = [\"python3\", \"{}\"{args}]\n\
         [[check]]\nrun = \"{STILL}\"\n",
        server.display()
    );
    (dir, body)
}

#[test]
fn mcp_servers_and_their_jobs_are_ended_before_the_checks_and_started_again_for_the_next_try() {
    both(|nobody| {
        let env = Env::new();
        let (_dir, body) = beating_goal("");
        // A job of the server's, in a session of its own: no process group holds it.
        env.write("job.sh", "while :; do echo job >> beat; sleep 0.02; done\n");
        let run = env.goal_as(
            nobody,
            "goal.toml",
            &body,
            json!([
                {"tool_calls": [{"id": "j", "name": "beating__run",
                  "input": {"command": "setsid bash job.sh"}}]},
                cmd(
                    "wait",
                    "for i in $(seq 200); do grep -q job beat 2>/dev/null && break; \
                     sleep 0.02; done; grep -c job beat"
                ),
                say("done"),
                {"tool_calls": [{"id": "h", "name": "beating__hello", "input": {}}]},
                cmd("w", "echo 'hello from start 2' > hello.txt"),
                say("done again")
            ]),
        );
        assert_ne!(text(run.tool_result("wait")).trim(), "0", "{}", run.stdout);
        let checks = run.result()["checks"].as_array().unwrap().clone();
        assert_eq!(checks.len(), 2, "{}", run.stdout);
        let first = checks[0][0]["output_tail"].as_str().unwrap_or_default();
        assert!(!first.contains("ALIVE"), "try 1: {first}");
        assert_eq!(checks[0][0]["passed"], false, "{}", run.stdout);
        // Started again, the server's tools work in the second try.
        assert_eq!(
            text(run.tool_result("h")),
            "hello from start 2",
            "{}",
            run.stdout
        );
        assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
        let starts = std::fs::read_to_string(env.ws().join("starts")).unwrap();
        assert_eq!(starts.lines().count(), 2, "{starts}");
        // And nothing beats once the run is over.
        let before = std::fs::read_to_string(env.ws().join("beat")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let after = std::fs::read_to_string(env.ws().join("beat")).unwrap();
        assert_eq!(before, after);
        let line = sandbox_line(&run);
        assert!(
            line.contains("MCP servers included, and the checks run in a fresh one"),
            "{line}"
        );
    });
}

#[test]
fn an_mcp_server_that_cannot_start_again_for_the_next_try_is_an_error_result() {
    both(|nobody| {
        let env = Env::new();
        let (_dir, body) = beating_goal(", \"once\"");
        let run = env.goal_as(
            nobody,
            "goal.toml",
            &body,
            json!([say("done"), say("done again")]),
        );
        let result = run.result();
        assert_eq!(result["status"], "error", "{}", run.stdout);
        let error = result["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("try 2") && error.contains("MCP server `beating`"),
            "{error}"
        );
        assert_eq!(result["checks"].as_array().map(Vec::len), Some(1));
    });
}

#[test]
fn checks_run_in_a_jail_of_their_own_after_the_agents_has_ended() {
    both(|nobody| {
        let env = Env::new();
        let check = "mine=$(readlink /proc/self/ns/pid); \
                     if [ \\\"$mine\\\" = \\\"$(cat agent.ns)\\\" ]; then echo SAME; exit 1; fi; \
                     if cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\\\0' ' ' | grep -q 'sleep 314[1]'; \
                     then echo SEEN; exit 1; fi; echo \\\"$mine\\\" > check.ns";
        let body = format!("{GOAL}tries = 1\n[[check]]\nrun = \"{check}\"\n");
        let run = env.goal_as(
            nobody,
            "goal.toml",
            &body,
            json!([
                cmd(
                    "a",
                    "readlink /proc/self/ns/pid > agent.ns; \
                     setsid nohup sleep 3141 >/dev/null 2>&1 & \
                     for i in $(seq 100); do cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' \
                     | grep -q 'sleep 314[1]' && break; sleep 0.02; done; cat agent.ns"
                ),
                say("done")
            ]),
        );
        assert!(
            text(run.tool_result("a")).contains("pid:["),
            "{}",
            run.stdout
        );
        let tail = run.result()["checks"][0][0]["output_tail"].clone();
        assert_eq!(run.result()["status"], "achieved", "{tail} {}", run.stdout);
        let agent = std::fs::read_to_string(env.ws().join("agent.ns")).unwrap();
        let check = std::fs::read_to_string(env.ws().join("check.ns")).unwrap();
        assert_ne!(agent, check);
    });
}

/// Runs `PROGRAM ARGS…` under a seccomp filter that fails the system calls it is given, as
/// a kernel without them would: `without.py RULES PROGRAM ARGS…`, RULES a JSON list of
/// `[number, first argument or null, errno]` (x86_64 numbers).
const WITHOUT: &str = r#"
import ctypes, json, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def op(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)
LD, JEQ, RET = 0x20, 0x15, 0x06
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
prog = [op(LD, 0, 0, 4), op(JEQ, 1, 0, 0xC000003E), op(RET, 0, 0, ALLOW)]
for nr, arg, errno in json.loads(sys.argv[1]):
    prog.append(op(LD, 0, 0, 0))
    prog.append(op(JEQ, 0, 1 if arg is None else 3, nr))
    if arg is not None:
        prog.append(op(LD, 0, 0, 16))
        prog.append(op(JEQ, 0, 1, arg))
    prog.append(op(RET, 0, 0, ERRNO | errno))
prog.append(op(RET, 0, 0, ALLOW))
prog = b"".join(prog)
buf = ctypes.create_string_buffer(prog, len(prog))
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
prctl = libc.prctl
prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
if prctl(38, 1, None, 0, 0) != 0 or prctl(22, 2, ctypes.addressof(fprog), 0, 0) != 0:
    sys.exit("seccomp: " + os.strerror(ctypes.get_errno()))
os.execv(sys.argv[2], sys.argv[2:])
"#;

/// `sup goal --file goal.toml --json --model script:…` (as 65534 when `nobody`) on a kernel
/// without the system calls `rules` (see `WITHOUT`).
fn goal_without(env: &Env, nobody: bool, rules: &str, body: &str, turns: Value) -> Run {
    let goal = env.write("goal.toml", body);
    let script = env.script(turns);
    let sup = env.sup_as(nobody);
    let wrapper = env.home.path().join("without.py");
    std::fs::write(&wrapper, WITHOUT).unwrap();
    let mut c = if nobody {
        let mut c = std::process::Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
        ]);
        c
    } else {
        std::process::Command::new("/usr/bin/python3")
    };
    c.arg(&wrapper).arg(rules).arg(env!("CARGO_BIN_EXE_sup"));
    for (k, v) in sup.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.current_dir(env.ws())
        .stdin(std::process::Stdio::null())
        .args([
            "goal",
            "--file",
            goal.to_str().unwrap(),
            "--json",
            "--model",
        ])
        .arg(format!("script:{}", script.display()));
    Run::new(c.output().unwrap())
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_kernel_without_a_part_of_the_jail_says_missing_and_sandbox_required_refuses() {
    const ENOSYS: i32 = 38;
    const EPERM: i32 = 1;
    const EINVAL: i32 = 22;
    let kernels = [
        (
            format!("[[444, null, {ENOSYS}], [445, null, {ENOSYS}], [446, null, {ENOSYS}]]"),
            "this kernel has no Landlock",
        ),
        (
            // unshare: as with user.max_user_namespaces = 0 (and, for root, no PID namespace).
            format!("[[272, null, {EPERM}]]"),
            "no PID namespace for the run",
        ),
        (
            // seccomp(2), and prctl(PR_SET_SECCOMP, …).
            format!("[[317, null, {ENOSYS}], [157, 22, {EINVAL}]]"),
            "this kernel has no seccomp filters",
        ),
    ];
    both(|nobody| {
        for (rules, missing) in &kernels {
            let env = Env::new();
            let run = goal_without(
                &env,
                nobody,
                rules,
                GOAL,
                json!([cmd("c", "echo still-works"), say("done")]),
            );
            assert_eq!(run.code, 0, "{missing}, 65534: {nobody}: {}", run.stderr);
            assert!(text(run.tool_result("c")).contains("still-works"));
            let line = sandbox_line(&run);
            assert!(
                line.contains("MISSING PROTECTION") && line.contains(missing),
                "{missing}: {line}"
            );
            let env = Env::new();
            let run = goal_without(
                &env,
                nobody,
                rules,
                &format!("{GOAL}sandbox_required = true\n"),
                json!([cmd("c", "echo ran"), say("done")]),
            );
            assert_eq!(run.code, 2, "{missing}: {}", run.stdout);
            assert!(
                run.stderr.contains("sandbox is required") && run.stderr.contains(missing),
                "{missing}: {}",
                run.stderr
            );
            assert!(!run.stdout.contains("ran"), "{}", run.stdout);
        }
    });
}

#[test]
fn a_forged_identity_keeps_nothing_alive_through_the_check() {
    both(|nobody| {
        let env = Env::new();
        // A run before: the job claims to be that run's, by its id in the environment and in
        // a jail record of its own.
        let first = env.goal_as(nobody, "goal.toml", GOAL, json!([say("done")]));
        assert_eq!(first.code, 0, "{}", first.stderr);
        let other = first.of_type("run_started")[0]["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        let marker = format!("sup-forged-{}", uuid::Uuid::new_v4().simple());
        env.write(
            "job.sh",
            "while :; do echo 42 > answer.txt; sleep 0.05; done\n",
        );
        let spawn = format!(
            "cat $SUP_HOME/runs/{other}/jail > jail 2>/dev/null; \
             cp jail $SUP_HOME/runs/$SUP_RUN_ID/jail 2>/dev/null; \
             SUP_RUN_ID={other} SUP_RUN_TOKEN=forged setsid bash -c 'exec -a {marker} bash job.sh' \
             >/dev/null 2>&1 < /dev/null & \
             for i in $(seq 200); do grep -qx 42 answer.txt 2>/dev/null && break; sleep 0.02; done; \
             cat answer.txt"
        );
        let body = format!(
            "{GOAL}tries = 1\n[[check]]\nrun = \"echo 41 > answer.txt; sleep 0.3; grep -qx 41 answer.txt\"\n"
        );
        let run = env.goal_as(
            nobody,
            "goal.toml",
            &body,
            json!([cmd("spawn", &spawn), say("done")]),
        );
        let left = crate::sandbox::left_with(&marker);
        assert!(
            text(run.tool_result("spawn")).contains("42"),
            "{}",
            run.stdout
        );
        assert_eq!(run.result()["status"], "achieved", "{}", run.stdout);
        assert!(left.is_empty(), "left running: {left:?}");
    });
}

#[test]
fn after_kill_9_of_sup_nothing_of_its_run_lives_and_the_next_start_says_interrupted() {
    both(|nobody| {
        let env = Env::new();
        let tag = crate::sandbox::new_tag();
        let spawn = format!(
            "setsid bash -c 'exec -a {tag}s sleep 300' >/dev/null 2>&1 < /dev/null & \
             (exec -a {tag}b sleep 300 &); exec -a {tag}l sleep 300"
        );
        let goal_file = env.write("goal.toml", GOAL);
        let script = env.script(json!([cmd("spawn", &spawn), say("done")]));
        let mut c = env.sup_as(nobody);
        let mut first = c
            .args(["goal", "--file", goal_file.to_str().unwrap(), "--json"])
            .args(["--tool-timeout", "600s", "--model"])
            .arg(format!("script:{}", script.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn_killed();
        common::eventually(
            std::time::Duration::from_secs(10),
            "the three to start",
            || (crate::sandbox::tagged(&tag).len() == 3).then_some(()),
        );
        first.kill().unwrap();
        first.wait().unwrap();
        common::eventually(
            std::time::Duration::from_secs(10),
            "the jail to end with sup",
            || crate::sandbox::tagged(&tag).is_empty().then_some(()),
        );
        // The killed run says it is running, under a pid that is always alive.
        let db = env.home.path().join("sup.db");
        let sql = |q: &str| {
            let out = as_user(nobody, "/usr/bin/python3")
                .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); r=c.execute(sys.argv[2]).fetchall(); c.commit(); print(r)"])
                .arg(&db)
                .arg(q)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        sql("update runs set pid = 1");
        let run = env.goal_as(nobody, "goal.toml", GOAL, json!([say("done")]));
        assert_eq!(run.code, 0, "{}", run.stderr);
        let mut runs = env.sup_as(nobody);
        assert!(
            runs.args(["runs", "--json"])
                .output()
                .unwrap()
                .status
                .success()
        );
        let statuses = sql("select status from runs order by started_at");
        assert!(statuses.contains("interrupted"), "{statuses}");
        assert!(!statuses.contains("running"), "{statuses}");
    });
}

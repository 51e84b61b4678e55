//! What a new user meets, through the binary: tool results under the trace and in `sup
//! show`, check outputs found where they are kept (console links, `previous.failed_checks`),
//! `sup trigger`'s approval, `--print-config` as it applies, help for every option, the
//! console's Goals page without a folder and its bound on half-open connections, a full disk
//! at a run's end, a store deleted under a daemon, and the papercuts.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::terminal::{on_a_terminal, run_args};
use crate::common::{self, Env, Killed, Run, SpawnKilled, eventually};
use crate::web::{console, get};

/// `sup ARGS…` in the environment, its output.
fn sup(env: &Env, args: &[&str]) -> Run {
    Run::new(env.sup().args(args).output().unwrap())
}

/// The id of the run a `--json` run reported.
fn run_id(run: &Run) -> String {
    run.result()["run_id"].as_str().unwrap().to_string()
}

/// `sup serve` on a free port of loopback, showing the goals of `goals`.
fn serve(env: &Env, goals: &Path) -> crate::web::Console {
    let mut cmd = env.sup();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--goals"])
        .arg(goals);
    console(cmd)
}

#[test]
fn the_trace_shows_the_first_lines_of_each_tool_result_and_quiet_hides_them() {
    let env = Env::new();
    let turns = json!([
        {"tool_calls": [{"id": "c", "name": "run_command", "input": {"command": "for i in $(seq 1 9); do echo out-line-$i; done"}}]},
        {"text": "done"}
    ]);
    let run = env.human(&["run", "list"], turns.clone(), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // Five lines of the result (`exit 0`, `--- stdout ---`, three of output), and how many
    // more there are.
    for i in 1..=3 {
        assert!(
            run.stderr.contains(&format!("\n    out-line-{i}\n")),
            "line {i} under the result: {}",
            run.stderr
        );
    }
    assert!(!run.stderr.contains("out-line-4"), "{}", run.stderr);
    assert!(run.stderr.contains("… 6 more lines"), "{}", run.stderr);
    let quiet = env.human(&["run", "list"], turns, &["--quiet"]);
    assert_eq!(quiet.code, 0, "{}", quiet.stderr);
    assert!(!quiet.stderr.contains("    out-line-2"), "{}", quiet.stderr);
    assert!(quiet.stderr.contains("✓ run_command"), "{}", quiet.stderr);
}

#[test]
fn sup_show_shows_every_result_and_full_the_whole_kept_outputs() {
    let env = Env::new();
    let turns = json!([
        {"tool_calls": [{"id": "denied", "name": "run_command", "input": {"command": "echo sandbox-says-no >&2; exit 1"}}]},
        {"tool_calls": [{"id": "big", "name": "run_command", "input": {"command": "seq -f 'big-%g' 1 400"}}]},
        {"text": "done"}
    ]);
    let run = env.run_json(turns, &["--output-cap", "600"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = run_id(&run);
    let shown = sup(&env, &["show", &id]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    // Every result, not only its first line: the error of the first call, the last line of
    // the second as the model saw it.
    assert!(shown.stdout.contains("sandbox-says-no"), "{}", shown.stdout);
    assert!(shown.stdout.contains("    big-400"), "{}", shown.stdout);
    // The middle was cut for the model: only the kept output has it.
    assert!(!shown.stdout.contains("big-200\n"), "{}", shown.stdout);
    let full = sup(&env, &["show", &id, "--full"]);
    assert_eq!(full.code, 0, "{}", full.stderr);
    assert!(full.stdout.contains("kept outputs:"), "{}", full.stdout);
    assert!(full.stdout.contains("    big-200\n"), "{}", full.stdout);
    // One try, in words.
    assert!(shown.stdout.contains(" · 1 try · "), "{}", shown.stdout);
    assert!(!shown.stdout.contains("1 tries"), "{}", shown.stdout);
}

/// A goal file in `dir` whose check (a script, so that its name says nothing of its output)
/// prints a marker on stdout and another on stderr, and fails.
fn failing_goal(env: &Env, dir: &Path, prompt: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("check.sh"),
        "echo stdout-marker-7\necho stderr-marker-9 >&2\nexit 1\n",
    )
    .unwrap();
    let script = env.script(json!([{"text": "done"}]));
    let file = dir.join("judged.toml");
    std::fs::write(
        &file,
        format!(
            "prompt = \"{prompt}\"\nmodel = \"script:{}\"\nworkspace = \"{}\"\ntries = 1\n\
             [[check]]\nscript = \"check.sh\"\n",
            script.display(),
            env.ws().display()
        ),
    )
    .unwrap();
    file
}

#[test]
fn the_console_links_both_kept_outputs_of_a_check_and_serves_them() {
    let env = Env::new();
    let goals = env.home.path().join("goals");
    let file = failing_goal(&env, &goals, "work");
    let run = Run::new(
        env.sup()
            .args(["goal", "--json", "--file"])
            .arg(&file)
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let id = run_id(&run);
    let c = serve(&env, &goals);
    let page = get(&c.addr, &format!("/runs/{id}"), None);
    assert_eq!(page.status, 200);
    let links: Vec<String> = page
        .body
        .split(&format!("href=\"/runs/{id}/files/"))
        .skip(1)
        .map(|s| s.split('"').next().unwrap().to_string())
        .filter(|f| f.contains("try-"))
        .collect();
    assert_eq!(links.len(), 2, "stdout and stderr linked: {links:?}");
    let bodies: Vec<String> = links
        .iter()
        .map(|f| {
            let r = get(&c.addr, &format!("/runs/{id}/files/{f}"), None);
            assert_eq!(r.status, 200, "{f}: {}", r.body);
            r.body
        })
        .collect();
    assert!(
        bodies.iter().any(|b| b.contains("stdout-marker-7")),
        "{bodies:?}"
    );
    assert!(
        bodies.iter().any(|b| b.contains("stderr-marker-9")),
        "{bodies:?}"
    );
}

#[test]
fn previous_failed_checks_carries_the_checks_output() {
    let env = Env::new();
    let dir = env.home.path().join("goals");
    let file = failing_goal(&env, &dir, "before: {{ previous.failed_checks }}");
    let mut last = String::new();
    for _ in 0..2 {
        let run = Run::new(
            env.sup()
                .args(["goal", "--json", "--file"])
                .arg(&file)
                .output()
                .unwrap(),
        );
        assert_eq!(run.code, 1, "{}", run.stderr);
        last = run_id(&run);
    }
    // The second run's (two runs of one second sort either way by folder name).
    let transcript = common::read_jsonl(
        &env.home
            .path()
            .join("runs")
            .join(&last)
            .join("transcript.jsonl"),
    );
    let prompt = common::user_messages(&transcript)[0].clone();
    assert!(prompt.contains("check.sh"), "{prompt}");
    assert!(prompt.contains("stdout-marker-7"), "{prompt}");
    assert!(prompt.contains("stderr-marker-9"), "{prompt}");
}

/// A goals folder with goal `cmd`, whose one call runs a command that writes `ran.txt`.
fn command_goal(env: &Env) -> PathBuf {
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    let script = env.script(json!([
        {"tool_calls": [{"id": "c", "name": "run_command", "input": {"command": "echo yes > ran.txt"}}]},
        {"text": "done"}
    ]));
    std::fs::write(
        dir.join("cmd.toml"),
        format!(
            "prompt = \"p\"\nmodel = \"script:{}\"\nworkspace = \"{}\"\n",
            script.display(),
            env.ws().display()
        ),
    )
    .unwrap();
    dir
}

#[test]
fn sup_trigger_takes_approval_and_without_a_terminal_queues_rather_than_denying() {
    let env = Env::new();
    let dir = command_goal(&env);
    let goals = dir.to_str().unwrap();
    let auto = Run::new(
        env.sup()
            .env_remove("SUP_APPROVAL")
            .args([
                "trigger",
                "cmd",
                "--json",
                "--approval",
                "auto",
                "--goals",
                goals,
            ])
            .output()
            .unwrap(),
    );
    assert_eq!(auto.code, 0, "{}", auto.stderr);
    assert_eq!(auto.tool_result("c")["is_error"], false, "{}", auto.stdout);
    std::fs::remove_file(env.ws().join("ran.txt")).unwrap();
    // No flag, no terminal: the call waits for a person, who approves it.
    let mut waiting = env
        .sup()
        .env_remove("SUP_APPROVAL")
        .args(["trigger", "cmd", "--json", "--goals", goals])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_killed();
    let id = eventually(Duration::from_secs(20), "a queued request", || {
        let out = sup(&env, &["approvals", "--json"]);
        let rows: Value = serde_json::from_str(out.stdout.trim()).ok()?;
        rows.as_array()?.first()?["id"].as_str().map(str::to_string)
    });
    assert_eq!(sup(&env, &["approve", &id]).code, 0);
    assert_eq!(waiting.wait().unwrap().code(), Some(0));
    assert!(env.ws().join("ran.txt").exists());
}

#[test]
fn print_config_shows_checks_tools_and_the_approval_and_sandbox_that_apply() {
    let env = Env::new();
    let file = env.home.path().join("cfg.toml");
    std::fs::write(
        &file,
        "prompt = \"p\"\nmodel = \"script:none.json\"\noverlap = \"skip\"\n\
         [approval_rules]\nallow = [\"read_file\"]\n\
         [[check]]\nrun = \"test -f done.txt\"\n\
         [[tool]]\nname = \"deploy\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let printed = |extra: &[&str]| {
        let o = env
            .sup()
            .env_remove("SUP_APPROVAL")
            .env_remove("SUP_SANDBOX")
            .args(["goal", "--print-config"])
            .args(extra)
            .arg("--file")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let line = |text: &str, key: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no {key} in {text}"))
            .to_string()
    };
    let text = printed(&[]);
    assert!(
        line(&text, "check").contains("run test -f done.txt"),
        "{text}"
    );
    assert!(line(&text, "check").contains("goal file"), "{text}");
    assert!(line(&text, "tool").contains("deploy"), "{text}");
    assert!(line(&text, "tool").contains("goal file"), "{text}");
    assert!(line(&text, "approval").contains("never"), "{text}");
    assert!(line(&text, "approval").contains("no terminal"), "{text}");
    assert!(line(&text, "sandbox").contains("workspace-write"), "{text}");
    assert!(line(&text, "overlap").contains("skip"), "{text}");
    assert!(
        line(&text, "approval_rules").contains("allow read_file"),
        "{text}"
    );
    // `--check-cmd` checks instead of the file's.
    let flagged = printed(&["--check-cmd", "echo extra"]);
    assert!(
        line(&flagged, "check").contains("run echo extra"),
        "{flagged}"
    );
    assert!(line(&flagged, "check").contains("flag"), "{flagged}");
    for debug in ["RuleLists", "Skip", "Some(", "RawCheck", "{ "] {
        assert!(!text.contains(debug), "{debug} in {text}");
    }
}

/// The entries of one `--help` (options and arguments) that have no text of their own.
fn undescribed(help: &str) -> Vec<String> {
    let mut missing = Vec::new();
    let lines: Vec<&str> = help.lines().collect();
    let mut section = false;
    for (i, l) in lines.iter().enumerate() {
        if l.ends_with(':') && !l.starts_with(' ') {
            section = *l == "Options:" || *l == "Arguments:";
            continue;
        }
        let entry = l
            .strip_prefix("  ")
            .filter(|r| r.starts_with('-') || r.starts_with('<'));
        let (true, Some(entry)) = (section, entry) else {
            continue;
        };
        // Its text is on the same line after two spaces, or on the lines below, indented.
        let same = entry.split_once("  ").map(|(_, t)| t.trim()).unwrap_or("");
        let below = lines
            .get(i + 1)
            .filter(|n| n.starts_with("          "))
            .map(|n| n.trim())
            .unwrap_or("");
        let text = if same.is_empty() { below } else { same };
        if text.is_empty() || text.starts_with('[') {
            missing.push(entry.split_whitespace().next().unwrap_or("").to_string());
        }
    }
    missing
}

#[test]
fn every_option_and_argument_has_help_and_sup_help_lists_the_environment() {
    let env = Env::new();
    let commands: &[&[&str]] = &[
        &["run"],
        &["goal"],
        &["daemon"],
        &["daemons"],
        &["serve"],
        &["goals"],
        &["runs"],
        &["show"],
        &["trigger"],
        &["pause"],
        &["resume"],
        &["approvals"],
        &["approve"],
        &["deny"],
        &["status"],
        &["service", "install"],
        &["service", "uninstall"],
    ];
    let mut missing = Vec::new();
    for c in commands {
        for help in ["-h", "--help"] {
            let args: Vec<&str> = c.iter().copied().chain([help]).collect();
            let out = sup(&env, &args);
            assert_eq!(out.code, 0, "{c:?}: {}", out.stderr);
            for m in undescribed(&out.stdout) {
                missing.push(format!("{} {m}", c.join(" ")));
            }
        }
    }
    missing.dedup();
    assert!(missing.is_empty(), "without help: {missing:?}");
    let goal = sup(&env, &["goal", "--help"]);
    assert!(goal.stdout.contains("--check human"), "{}", goal.stdout);
    let top = sup(&env, &["--help"]);
    for var in [
        "SUP_HOME",
        "SUP_MODEL",
        "SUP_APPROVAL",
        "SUP_STORE",
        "SUP_SERVE_TOKEN",
        "OPENAI_BASE_URL",
        "RUST_LOG",
    ] {
        assert!(
            top.stdout.contains(var),
            "{var} in sup --help: {}",
            top.stdout
        );
    }
}

#[test]
fn the_goals_page_without_a_goals_folder_says_so() {
    let env = Env::new();
    let c = serve(&env, &env.home.path().join("no-such-folder"));
    let page = get(&c.addr, "/goals", None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("no goals folder"), "{}", page.body);
}

#[test]
fn half_open_connections_are_dropped_and_the_console_still_answers() {
    let env = Env::new();
    let c = serve(&env, &env.home.path().join("goals"));
    // More than the console serves at once, each sending half a request and no more.
    let mut held: Vec<TcpStream> = (0..160)
        .map(|_| {
            let mut s = TcpStream::connect(&c.addr).unwrap();
            s.write_all(b"GET /runs HTTP/1.1\r\nHost: localh").unwrap();
            s
        })
        .collect();
    for s in &held {
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    }
    // Every one is closed by the console: those past the bound at once, the others when
    // the time to send headers is out.
    let mut open: Vec<bool> = vec![true; held.len()];
    eventually(
        Duration::from_secs(60),
        "every half-open connection closed",
        || {
            for (s, o) in held.iter_mut().zip(open.iter_mut()) {
                if *o {
                    let mut buf = [0u8; 512];
                    match s.read(&mut buf) {
                        Ok(_) => *o = false,
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(_) => *o = false,
                    }
                }
            }
            open.iter().all(|o| !o).then_some(())
        },
    );
    assert_eq!(get(&c.addr, "/runs", None).status, 200);
}

#[test]
fn a_reason_typed_on_the_line_after_no_reaches_the_model() {
    let env = Env::new();
    let script = env.script(json!([
        {"tool_calls": [{"id": "no", "name": "run_command", "input": {"command": "touch nope.txt"}}]},
        {"text": "done"}
    ]));
    let args = run_args(&script);
    let (child, mut term, seen) = on_a_terminal(&env, &args);
    seen.wait_for("Allow?", 1);
    term.write_all(b"n\n").unwrap();
    seen.wait_for("reason (", 1);
    term.write_all(b"not in this folder, please\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", seen.text());
    let tool = common::tool_messages(&env.transcript());
    assert!(
        tool[0].to_string().contains("not in this folder, please"),
        "{tool:?}"
    );
    assert!(!env.ws().join("nope.txt").exists());
}

#[test]
fn a_command_notification_takes_a_format() {
    let env = Env::new();
    let out_file = env.home.path().join("notice.txt");
    let script = env.script(json!([{"text": "done"}]));
    let file = env.home.path().join("n.toml");
    std::fs::write(
        &file,
        format!(
            "prompt = \"p\"\nmodel = \"script:{}\"\ntries = 1\n[[check]]\nrun = \"false\"\n\
             [[notify]]\non = [\"failed\"]\nformat = \"text\"\ncommand = [\"sh\", \"-c\", \"cat > {}\"]\n",
            script.display(),
            out_file.display()
        ),
    )
    .unwrap();
    let out = env
        .sup()
        .arg("goal")
        .arg("--file")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert!(
        text.starts_with("sup · goal n"),
        "plain text, not JSON: {text}"
    );
}

#[test]
fn an_error_says_its_cause_once() {
    let env = Env::new();
    let out = sup(&env, &["goal", "--file", "no-such-goal.toml"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_eq!(
        out.stderr.matches("No such file or directory").count(),
        1,
        "{}",
        out.stderr
    );
    // A provider that is not there: said once, whatever the retries.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = Run::new(
        env.sup()
            .env("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
            .env("OPENAI_API_KEY", "sk-test")
            .args([
                "run",
                "hi",
                "--model",
                "openai:gpt-4o-mini",
                "--retries",
                "3",
            ])
            .output()
            .unwrap(),
    );
    assert_eq!(dead.code, 4, "{}", dead.stderr);
    assert_eq!(
        dead.stderr.matches("Connection refused").count(),
        1,
        "{}",
        dead.stderr
    );
}

#[test]
fn cargos_own_variables_are_not_withheld_as_secrets() {
    let env = Env::new();
    let run = Run::new(
        env.sup()
            .env("CARGO_PKG_AUTHORS", "Ada <ada@example.org>")
            .env("SOME_API_KEY", "sk-hidden")
            .args(["run", "work", "--model"])
            .arg(format!(
                "script:{}",
                env.script(json!([
                    {"tool_calls": [{"id": "e", "name": "run_command", "input": {"command": "echo \"[$CARGO_PKG_AUTHORS]\""}}]},
                    {"text": "done"}
                ]))
                .display()
            ))
            .arg("--json")
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let notices: String = run
        .of_type("notice")
        .iter()
        .map(|n| n["text"].to_string())
        .collect();
    assert!(notices.contains("SOME_API_KEY"), "{notices}");
    assert!(!notices.contains("CARGO_PKG_AUTHORS"), "{notices}");
    assert!(
        run.tool_result("e")["content"]
            .as_str()
            .unwrap()
            .contains("[Ada <ada@example.org>]"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_guarded_sup_is_killed_when_its_test_fails() {
    let env = Env::new();
    std::fs::create_dir_all(env.home.path().join("goals")).unwrap();
    let mut pid = 0;
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let d: Killed = env
            .sup()
            .args(["daemon", "--goals"])
            .arg(env.home.path().join("goals"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn_killed();
        pid = d.id();
        panic!("the test fails while the daemon runs");
    }));
    assert!(failed.is_err());
    // Reaped, so no such process remains (not even a zombie).
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "daemon {pid} still there"
    );
}

/// A tmpfs of `size` mounted on a new folder, unmounted when dropped. Needs root: a test
/// that needs it fails (never passes) without.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn new(size: &str) -> SmallDisk {
        assert!(
            nix::unistd::getuid().is_root(),
            "this test mounts a small tmpfs to fill: run it as root (as `bash .ci/run` does)"
        );
        let dir = tempfile::tempdir().unwrap().keep();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount a tmpfs on {}", dir.display());
        SmallDisk(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_run_that_fills_the_disk_stays_achieved_and_its_kept_output_goes_with_a_note() {
    let env = Env::new();
    let disk = SmallDisk::new("3m");
    let script = env.script(json!([
        {"tool_calls": [{"id": "big", "name": "run_command", "input": {"command": "head -c 8000000 /dev/zero | tr '\\0' x; echo"}}]},
        {"text": "done"}
    ]));
    let out = env
        .sup()
        .env("SUP_HOME", &disk.0)
        .args(["run", "fill it", "--model"])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("the disk is full"), "a note: {stderr}");
    let runs = Run::new(
        env.sup()
            .env("SUP_HOME", &disk.0)
            .args(["runs", "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(runs.code, 0, "{}", runs.stderr);
    let rows: Value = serde_json::from_str(runs.stdout.trim()).unwrap();
    assert_eq!(rows[0]["status"], "achieved", "{rows}");
    assert_eq!(rows[0]["steps"], 2, "{rows}");
}

#[test]
fn a_store_deleted_under_a_daemon_is_made_again_and_its_kept_outcomes_recorded() {
    let env = Env::new();
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("t.json"), r#"[{"text": "tick", "delay_ms": 300}]"#).unwrap();
    std::fs::write(
        dir.join("tick.toml"),
        format!(
            "prompt = \"tick\"\nmodel = \"script:t.json\"\nworkspace = \"{}\"\n\
             schedule = \"* * * * * *\"\ntimezone = \"UTC\"\ntries = 1\noverlap = \"skip\"\n",
            env.ws().display()
        ),
    )
    .unwrap();
    let db = env.home.path().join("sup.db");
    let achieved = || {
        let out = sup(
            &env,
            &["runs", "--goal", "tick", "--json", "--limit", "1000"],
        );
        let rows: Value = serde_json::from_str(out.stdout.trim()).unwrap_or(json!([]));
        rows.as_array()
            .map(|r| r.iter().filter(|r| r["status"] == "achieved").count())
            .unwrap_or(0)
    };
    let mut d = env
        .sup()
        .args(["daemon", "--goals"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_killed();
    eventually(Duration::from_secs(30), "a run recorded", || {
        (achieved() >= 1).then_some(())
    });
    // The store goes while runs go on.
    for f in ["sup.db", "sup.db-wal", "sup.db-shm"] {
        let _ = std::fs::remove_file(env.home.path().join(f));
    }
    // Made again by the daemon itself (nothing else opens it meanwhile), its runs in it.
    eventually(Duration::from_secs(30), "the store made again", || {
        db.exists().then_some(())
    });
    eventually(Duration::from_secs(30), "new runs recorded in it", || {
        (achieved() >= 2).then_some(())
    });
    fleet_stop(&mut d);
    // No outcome waits in a file unrecorded.
    let left: Vec<PathBuf> = env
        .run_dirs()
        .into_iter()
        .filter(|d| d.join("outcome.json").exists())
        .collect();
    let _ = sup(&env, &["runs"]);
    let still: Vec<&PathBuf> = left
        .iter()
        .filter(|d| d.join("outcome.json").exists())
        .collect();
    assert!(still.is_empty(), "outcomes left on disk: {still:?}");
}

fn fleet_stop(d: &mut Killed) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = d.wait();
}

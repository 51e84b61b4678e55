//! Human approval through the binary: modes against risks, rule precedence, compound
//! commands, no terminal, the prompt on a pseudo-terminal, the queue answered from other
//! processes, and a person as a check. Wherever the answer was not yes, nothing ran.

use crate::common::{Killed, SpawnKilled};
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::terminal::{on_a_terminal, run_args};
use crate::common::{Env, Run, eventually, tool_messages, user_messages};
use serde_json::{Value, json};

fn three_risks() -> Value {
    json!([
        {"tool_calls": [
            {"id": "r", "name": "read_file", "input": {"path": "in.txt"}},
            {"id": "w", "name": "write_file", "input": {"path": "written.txt", "content": "x"}},
            {"id": "x", "name": "run_command", "input": {"command": "touch executed.txt"}}
        ]},
        {"text": "done"}
    ])
}

fn exists(env: &Env, f: &str) -> bool {
    env.ws.path().join(f).exists()
}

fn run_mode(env: &Env, mode: &str, extra: &[&str]) -> Run {
    let script = env.script(three_risks());
    let out = env
        .sup()
        .args(["run", "work", "--json", "--approval", mode, "--model"])
        .arg(format!("script:{}", script.display()))
        .args(extra)
        .output()
        .unwrap();
    Run::new(out)
}

#[test]
fn never_denies_write_and_exec_and_allows_reads() {
    let env = Env::new();
    env.write("in.txt", "input");
    let run = run_mode(&env, "never", &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.tool_result("r")["content"], "input");
    for id in ["w", "x"] {
        let r = run.tool_result(id);
        assert_eq!(r["is_error"], true);
        let c = r["content"].as_str().unwrap();
        assert!(
            c.starts_with("Denied:") && c.contains("never") && c.contains("Do not repeat"),
            "{c}"
        );
    }
    assert!(!exists(&env, "written.txt") && !exists(&env, "executed.txt"));
    let decisions: Vec<(String, String)> = run
        .of_type("approval")
        .iter()
        .map(|e| {
            (
                e["tool"].as_str().unwrap().into(),
                e["decision"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(
        decisions.contains(&("write_file".into(), "denied".into())),
        "{decisions:?}"
    );
}

#[test]
fn auto_allows_every_risk() {
    let env = Env::new();
    env.write("in.txt", "input");
    let run = run_mode(&env, "auto", &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(exists(&env, "written.txt") && exists(&env, "executed.txt"));
    let by: Vec<&str> = run
        .of_type("approval")
        .iter()
        .map(|e| e["by"].as_str().unwrap())
        .collect();
    assert_eq!(by, ["approval mode auto", "approval mode auto"]);
}

#[test]
fn with_no_terminal_and_no_mode_it_denies_instead_of_waiting() {
    let env = Env::new();
    env.write("in.txt", "input");
    let script = env.script(three_risks());
    let started = Instant::now();
    let out = env
        .sup()
        .env_remove("SUP_APPROVAL")
        .args(["run", "work", "--model"])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("no terminal, so mode never"),
        "{}",
        run.stderr
    );
    assert!(!exists(&env, "written.txt") && !exists(&env, "executed.txt"));
}

#[test]
fn deny_beats_ask_beats_allow() {
    let env = Env::new();
    let run = env.json(
        &["run", "work"],
        json!([
        {"tool_calls": [
            {"id": "allowed", "name": "run_command", "input": {"command": "touch a.txt"}},
            {"id": "asked", "name": "run_command", "input": {"command": "touch git.txt && git --version"}},
            {"id": "denied", "name": "run_command", "input": {"command": "touch r.txt; rm -f r.txt"}}
        ]},
        {"text": "done"}
    ]),
        &["--approval", "never", "--allow", "run_command", "--ask", "run_command(git *)", "--deny", "run_command(rm *)"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let by = |id: &str| {
        run.of_type("approval")
            .into_iter()
            .find(|e| e["id"] == id)
            .unwrap()["by"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(by("allowed"), "rule allow `run_command`");
    assert_eq!(
        by("asked"),
        "approval mode never",
        "the ask rule wins over allow; never answers it"
    );
    assert_eq!(by("denied"), "rule deny `run_command(rm *)`");
    assert!(exists(&env, "a.txt"));
    assert!(!exists(&env, "git.txt") && !exists(&env, "r.txt"));
    let denied = run.tool_result("denied")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(denied.contains("rm *"), "{denied}");
}

#[test]
fn an_allow_rule_never_lets_a_compound_command_through() {
    let env = Env::new();
    let run = env.json(
        &["run", "work"],
        json!([
            {"tool_calls": [
                {"id": "plain", "name": "run_command", "input": {"command": "echo ok"}},
                {"id": "redirect", "name": "run_command", "input": {"command": "echo ok > ok.txt"}},
                {"id": "and", "name": "run_command", "input": {"command": "echo ok && touch p1"}},
                {"id": "subst", "name": "run_command", "input": {"command": "echo $(touch p2)"}},
                {"id": "tick", "name": "run_command", "input": {"command": "echo `touch p3`"}},
                {"id": "pipe", "name": "run_command", "input": {"command": "echo ok | tee p4"}},
                {"id": "newline", "name": "run_command", "input": {"command": "echo ok\ntouch p5"}}
            ]},
            {"text": "done"}
        ]),
        &["--approval", "never", "--allow", "run_command(echo *)"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.tool_result("plain")["is_error"], false);
    // A redirection is never allowed by a rule (issue 11): the mode, never, denies it.
    for (id, f) in [
        ("redirect", "ok.txt"),
        ("and", "p1"),
        ("subst", "p2"),
        ("tick", "p3"),
        ("pipe", "p4"),
        ("newline", "p5"),
    ] {
        assert_eq!(run.tool_result(id)["is_error"], true, "{id}");
        assert!(!exists(&env, f), "{id} ran");
    }
}

#[test]
fn rules_come_from_the_goal_file_and_the_user_config() {
    let env = Env::new();
    let script = env.script(json!([
        {"tool_calls": [
            {"id": "file", "name": "write_file", "input": {"path": "from-goal.txt", "content": "x"}},
            {"id": "user", "name": "run_command", "input": {"command": "touch from-user.txt"}},
            {"id": "other", "name": "run_command", "input": {"command": "touch other.txt"}}
        ]},
        {"text": "done"}
    ]));
    let goal = env.home.path().join("g.toml");
    std::fs::write(&goal, format!(
        "prompt = \"p\"\nmodel = \"script:{}\"\napproval = \"never\"\n[approval_rules]\nallow = [\"write_file(from-goal.txt)\"]\n",
        script.display()
    )).unwrap();
    let config = env.home.path().join("config.toml");
    std::fs::write(
        &config,
        "[approval_rules]\nallow = [\"run_command(touch from-user.txt)\"]\n",
    )
    .unwrap();
    let out = env
        .sup()
        .env_remove("SUP_APPROVAL")
        .env("SUP_CONFIG", &config)
        .args(["goal", "--json", "--workspace"])
        .arg(env.ws.path())
        .arg("--file")
        .arg(&goal)
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(exists(&env, "from-goal.txt") && exists(&env, "from-user.txt"));
    assert!(!exists(&env, "other.txt"));
    // A bad rule is a usage error that says how to write one.
    let out = env
        .sup()
        .args([
            "run",
            "x",
            "--model",
            "script:/x",
            "--allow",
            "run_command(oops",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tool(pattern)"));
}

fn spawn_queued(env: &Env, turns: Value, args: &[&str]) -> Killed {
    let script = env.script(turns);
    env.sup()
        .args(["goal", "work", "--json", "--approval", "queue", "--model"])
        .arg(format!("script:{}", script.display()))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_killed()
}

fn answer(env: &Env, args: &[&str]) -> (i32, String) {
    let out = env.sup().args(args).output().unwrap();
    (
        out.status.code().unwrap(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A read call (never queued) and a write call (queued) in one step.
fn write_turn(path: &str) -> Value {
    json!([
        {"tool_calls": [
            {"id": "r", "name": "list_files", "input": {}},
            {"id": "w", "name": "write_file", "input": {"path": path, "content": "x"}}
        ]},
        {"text": "done"}
    ])
}

#[test]
fn a_queued_call_is_approved_from_another_process() {
    let env = Env::new();
    let child = spawn_queued(&env, write_turn("approved.txt"), &[]);
    let rows = env.pending(1);
    assert_eq!(rows.len(), 1, "the read call is not queued: {rows:?}");
    assert_eq!(rows[0]["tool"], "write_file");
    assert!(rows[0]["input"].as_str().unwrap().contains("approved.txt"));
    assert!(!exists(&env, "approved.txt"), "nothing runs before the yes");
    let id = rows[0]["id"].as_str().unwrap();
    let (code, text) = answer(&env, &["approve", id]);
    assert_eq!(code, 0, "{text}");
    // The one yes ends the run: a queued read call would hold it (and be listed).
    let mut child = child;
    eventually(
        Duration::from_secs(20),
        "the run to end after one yes",
        || child.try_wait().unwrap().map(|_| ()),
    );
    let run = Run::new(child.wait_with_output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(exists(&env, "approved.txt"));
    let decisions = run.of_type("approval");
    assert_eq!(
        decisions.len(),
        1,
        "only the write was asked: {decisions:?}"
    );
    assert_eq!(decisions[0]["decision"], "approved");
    // Answering twice says what became of it.
    let (code, text) = answer(&env, &["deny", id, "--reason", "late"]);
    assert_eq!(code, 2);
    assert!(
        text.contains("no longer waiting") && text.contains("approved"),
        "{text}"
    );
}

#[test]
fn a_queued_call_denied_with_a_reason_does_not_run_and_the_model_hears_why() {
    let env = Env::new();
    let child = spawn_queued(&env, write_turn("denied.txt"), &[]);
    let rows = env.pending(1);
    let (code, _) = answer(
        &env,
        &[
            "deny",
            rows[0]["id"].as_str().unwrap(),
            "--reason",
            "not on a Friday",
        ],
    );
    assert_eq!(code, 0);
    let run = Run::new(child.wait_with_output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!exists(&env, "denied.txt"));
    let result = run.tool_result("w")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        result.contains("not on a Friday") && result.contains("Do not repeat"),
        "{result}"
    );
}

#[test]
fn a_queued_call_nobody_answers_times_out_as_a_denial() {
    let env = Env::new();
    let started = Instant::now();
    let child = spawn_queued(&env, write_turn("late.txt"), &["--approval-timeout", "1s"]);
    let run = Run::new(child.wait_with_output().unwrap());
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!exists(&env, "late.txt"));
    let decision = &run.of_type("approval")[0];
    assert_eq!(decision["decision"], "timed_out");
    assert!(
        run.tool_result("w")["content"]
            .as_str()
            .unwrap()
            .contains("nobody answered")
    );
}

#[test]
fn parallel_calls_wait_independently() {
    let env = Env::new();
    let child = spawn_queued(
        &env,
        json!([
            {"tool_calls": [
                {"id": "one", "name": "write_file", "input": {"path": "one.txt", "content": "1"}},
                {"id": "two", "name": "run_command", "input": {"command": "touch two.txt"}}
            ]},
            {"text": "done"}
        ]),
        &[],
    );
    let rows = env.pending(2);
    assert_eq!(rows.len(), 2, "both wait at once");
    let id_of = |tool: &str| {
        rows.iter().find(|r| r["tool"] == tool).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // Answer the second first: each waits on its own.
    answer(&env, &["deny", &id_of("run_command"), "--reason", "no"]);
    answer(&env, &["approve", &id_of("write_file")]);
    let run = Run::new(child.wait_with_output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(exists(&env, "one.txt"));
    assert!(!exists(&env, "two.txt"));
}

#[test]
fn approve_always_covers_the_same_call_for_the_rest_of_the_run() {
    let env = Env::new();
    let call = json!({"tool_calls": [{"name": "run_command", "input": {"command": "echo again >> log.txt"}}]});
    let child = spawn_queued(&env, json!([call, call, {"text": "done"}]), &[]);
    let rows = env.pending(1);
    answer(
        &env,
        &["approve", rows[0]["id"].as_str().unwrap(), "--always"],
    );
    let run = Run::new(child.wait_with_output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(env.ws.path().join("log.txt")).unwrap(),
        "again\nagain\n"
    );
    assert_eq!(run.of_type("approval_requested").len(), 1, "asked once");
}

#[test]
fn a_person_as_a_check_accepts_or_rejects_with_a_reason() {
    let env = Env::new();
    let child = spawn_queued(
        &env,
        json!([{"text": "first draft"}, {"text": "second draft"}]),
        &["--check", "human", "--tries", "2"],
    );
    let rows = env.pending(1);
    assert_eq!(rows[0]["kind"], "check");
    answer(
        &env,
        &[
            "deny",
            rows[0]["id"].as_str().unwrap(),
            "--reason",
            "too short, add the numbers",
        ],
    );
    // Try 2 asks again, with a new request.
    let first = rows[0]["id"].clone();
    let second = eventually(Duration::from_secs(20), "try 2 to ask", || {
        env.pending(1).into_iter().find(|r| r["id"] != first)
    });
    answer(&env, &["approve", second["id"].as_str().unwrap()]);
    let run = Run::new(child.wait_with_output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["tries"], 2);
    let checks = &run.result()["checks"];
    assert_eq!(checks[0][0]["passed"], false);
    assert_eq!(checks[0][0]["outcome"], "rejected");
    assert_eq!(checks[1][0]["outcome"], "accepted");
    let users = user_messages(&env.transcript());
    assert!(
        users[1].contains("too short, add the numbers"),
        "{}",
        users[1]
    );
}

#[test]
fn the_prompt_on_a_terminal_takes_yes_always_and_no_with_a_reason() {
    let env = Env::new();
    env.write("old.txt", "one\ntwo\n");
    let script = env.script(json!([
        {"tool_calls": [{"name": "run_command", "input": {"command": "touch yes.txt"}}]},
        {"tool_calls": [{"name": "run_command", "input": {"command": "echo a >> always.txt"}}]},
        {"tool_calls": [{"name": "run_command", "input": {"command": "echo a >> always.txt"}}]},
        {"tool_calls": [{"id": "no", "name": "write_file", "input": {"path": "old.txt", "content": "one\nTWO\n"}}]},
        {"text": "done"}
    ]));
    let args = run_args(&script);
    let (child, mut term, seen) = on_a_terminal(&env, &args);
    seen.wait_for("Allow?", 1);
    assert!(seen.text().contains("touch yes.txt"));
    term.write_all(b"y\n").unwrap();
    seen.wait_for("Allow?", 2);
    term.write_all(b"a\n").unwrap();
    // The same call again is not asked; the next prompt is the file write, with its diff.
    seen.wait_for("Allow?", 3);
    let text = seen.text();
    assert!(
        text.contains("-two") && text.contains("+TWO"),
        "a diff of the write: {text}"
    );
    term.write_all(b"n the second line stays lowercase\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", seen.text());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    assert!(exists(&env, "yes.txt"));
    assert_eq!(
        std::fs::read_to_string(env.ws.path().join("always.txt")).unwrap(),
        "a\na\n"
    );
    assert_eq!(
        std::fs::read_to_string(env.ws.path().join("old.txt")).unwrap(),
        "one\ntwo\n"
    );
    let msgs = tool_messages(&env.transcript());
    let denied = msgs[3]["results"][0]["content"].as_str().unwrap();
    assert!(
        denied.contains("the second line stays lowercase"),
        "{denied}"
    );
    assert_eq!(seen.text().matches("Allow?").count(), 3);
}

#[test]
fn quit_at_the_prompt_cancels_the_run() {
    let env = Env::new();
    let script = env.script(json!([
        {"tool_calls": [{"name": "run_command", "input": {"command": "touch never.txt"}}]},
        {"text": "done"}
    ]));
    let args = run_args(&script);
    let (child, mut term, seen) = on_a_terminal(&env, &args);
    seen.wait_for("Allow?", 1);
    term.write_all(b"q\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    assert!(!exists(&env, "never.txt"));
}

#[test]
fn a_command_cannot_type_an_answer_into_the_prompt() {
    // An approved command pushes `y` and Enter into the terminal's input (TIOCSTI on
    // /dev/tty), to answer the next prompt, for a command the person never saw approved.
    let env = Env::new();
    env.write(
        "inj.py",
        "import fcntl, os, termios\n\
         try:\n    fd = os.open('/dev/tty', os.O_RDWR)\n    \
         for c in b'y\\n':\n        fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))\n    \
         print('injected')\n\
         except OSError as e:\n    print('refused:', e)\n",
    );
    let script = env.script(json!([
        {"tool_calls": [{"id": "inj", "name": "run_command", "input": {"command": "python3 inj.py"}}]},
        {"tool_calls": [{"id": "x", "name": "run_command", "input": {"command": "touch pwned"}}]},
        {"text": "done"}
    ]));
    let args = run_args(&script);
    let (child, mut term, seen) = on_a_terminal(&env, &args);
    seen.wait_for("Allow?", 1);
    term.write_all(b"y\n").unwrap();
    // The second prompt waits for the person, who says no.
    eventually(
        Duration::from_secs(20),
        "the second prompt or the end",
        || {
            let text = seen.text();
            (text.matches("Allow?").count() >= 2 || text.contains("Done")).then_some(())
        },
    );
    let _ = term.write_all(b"n\n\n"); // no, and no reason
    let out = child.wait_with_output().unwrap();
    let text = seen.text();
    assert_eq!(out.status.code(), Some(0), "{text}");
    let results = serde_json::to_string(&tool_messages(&env.transcript())).unwrap();
    assert!(results.contains("refused:"), "{results}");
    assert!(!exists(&env, "pwned"), "an injected answer ran it: {text}");
}

#[test]
fn a_command_cannot_draw_on_the_persons_terminal_but_has_terminals_of_its_own() {
    // The prompt's terminal is a /dev/pts/N of the same user: a background job could open it
    // and draw another command over the question. The marker is spelled apart in the command
    // line, so only a write of the command itself can put it on the screen.
    let env = Env::new();
    let script = env.script(json!([
        {"tool_calls": [{"id": "draw", "name": "run_command", "input": {"command":
            "for p in /dev/pts/*; do printf '\\r%s%s\\n' SPO OFED > $p; done; \
             python3 -c 'import os, pty; m, s = pty.openpty(); os.write(s, b\"x\"); print(\"own\", os.read(m, 1))'"}}]},
        {"text": "done"}
    ]));
    let args: Vec<String> = vec![
        "run".into(),
        "work".into(),
        "--approval".into(),
        "auto".into(),
        "--model".into(),
        format!("script:{}", script.display()),
    ];
    let (child, _term, seen) = on_a_terminal(&env, &args);
    let out = child.wait_with_output().unwrap();
    let text = seen.text();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("SPOOFED"), "{text}");
    let results = serde_json::to_string(&tool_messages(&env.transcript())).unwrap();
    assert!(results.contains("own b'x'"), "{results}");
}

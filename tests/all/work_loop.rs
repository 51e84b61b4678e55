//! The work loop through the binary, with the scripted model.

use crate::common::SpawnKilled;
use std::time::{Duration, Instant};

use crate::common::{Env, Run, eventually, tool_messages};
use serde_json::json;

#[test]
fn no_tool_calls_is_a_final_answer_at_step_one() {
    let env = Env::new();
    let run = env.human(
        &["run", "what is it?"],
        json!([{"text": "The answer is 42."}]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout, "The answer is 42.\n");
    assert!(run.stderr.contains("◆ Done · 1 step"), "{}", run.stderr);
    let t = env.transcript();
    assert!(
        t.iter()
            .any(|e| e["type"] == "result" && e["status"] == "achieved")
    );
}

#[test]
fn one_call_then_final() {
    let env = Env::new();
    env.write("notes.txt", "alpha\nbeta\n");
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "r1", "name": "read_file", "input": {"path": "notes.txt"}}]},
            {"text": "It says alpha and beta."}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.tool_result("r1")["content"], "alpha\nbeta\n");
    let r = run.result();
    assert_eq!(r["status"], "achieved");
    assert_eq!(r["stop_reason"], "final");
    assert_eq!(r["steps"], 2);
    assert_eq!(r["tries"], 1);
    assert_eq!(r["answer"], "It says alpha and beta.");
    assert!(r["run_id"].as_str().is_some());
    assert!(r["usage"]["input_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn a_chain_asks_the_model_three_times_and_runs_two_tools() {
    let env = Env::new();
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "a", "name": "write_file", "input": {"path": "a.txt", "content": "from A"}}]},
            {"tool_calls": [{"id": "b", "name": "read_file", "input": {"path": "a.txt"}}]},
            {"text": "done"}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.of_type("step_started").len(), 3);
    assert_eq!(run.of_type("tool_result").len(), 2);
    assert_eq!(run.tool_result("b")["content"], "from A");
}

fn goal_with_tools(env: &Env, tools: &str) -> std::path::PathBuf {
    let path = env.home.path().join("tools.toml");
    std::fs::write(&path, format!("prompt = \"work\"\n{tools}")).unwrap();
    path
}

fn interval(run: &Run, id: &str) -> (f64, f64) {
    let r = run.tool_result(id);
    (
        r["started_ms"].as_f64().unwrap(),
        r["finished_ms"].as_f64().unwrap(),
    )
}

#[test]
fn read_only_calls_run_together_and_exec_calls_one_at_a_time() {
    let env = Env::new();
    let file = goal_with_tools(
        &env,
        r#"
[[tool]]
name = "slow_read"
command = ["bash", "-c", "sleep 0.4; echo read"]
risk = "read"

[[tool]]
name = "slow_exec"
command = ["bash", "-c", "sleep 0.2; echo exec"]
risk = "exec"
"#,
    );
    let script = env.script(json!([
        {"tool_calls": [
            {"id": "r1", "name": "slow_read", "input": {}},
            {"id": "r2", "name": "slow_read", "input": {}},
            {"id": "x1", "name": "slow_exec", "input": {}},
            {"id": "x2", "name": "slow_exec", "input": {}}
        ]},
        {"text": "done"}
    ]));
    let out = env
        .sup()
        .arg("goal")
        .arg("--file")
        .arg(&file)
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .arg("--json")
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let (a0, a1) = interval(&run, "r1");
    let (b0, b1) = interval(&run, "r2");
    assert!(
        a0 < b1 && b0 < a1,
        "read calls overlap: {a0}-{a1} {b0}-{b1}"
    );
    let (x0, x1) = interval(&run, "x1");
    let (y0, y1) = interval(&run, "x2");
    assert!(
        x1 <= y0,
        "exec calls run one after the other: {x0}-{x1} {y0}-{y1}"
    );
    assert!(a1.max(b1) <= x0, "exec waits for the reads before it");
    // Results go back paired by id, in call order.
    let msgs = tool_messages(&env.transcript());
    let ids: Vec<&str> = msgs[0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["r1", "r2", "x1", "x2"]);
}

#[test]
fn every_bad_call_gets_an_error_result_with_the_reason_and_the_run_goes_on() {
    let env = Env::new();
    let run = env.run_json(
        json!([
            {"tool_calls": [
                {"id": "fail", "name": "run_command", "input": {"command": "echo boom >&2; exit 7"}},
                {"id": "unknown", "name": "teleport", "input": {}},
                {"id": "badjson", "name": "read_file", "arguments": "{\"path\": "},
                {"id": "empty", "name": "list_files", "arguments": ""},
                {"id": "emptyreq", "name": "read_file", "arguments": ""},
                {"id": "schema", "name": "write_file", "input": {"path": "x.txt", "content": 5}}
            ]},
            {"text": "I saw the errors."}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let fail = run.tool_result("fail");
    assert_eq!(fail["is_error"], true);
    assert!(fail["content"].as_str().unwrap().starts_with("exit 7"));
    assert!(fail["content"].as_str().unwrap().contains("boom"));
    let unknown = run.tool_result("unknown")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(unknown.contains("unknown tool `teleport`"), "{unknown}");
    assert!(
        unknown.contains("read_file"),
        "names the tools there are: {unknown}"
    );
    let bad = run.tool_result("badjson")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(bad.contains("not valid JSON"), "{bad}");
    assert_eq!(
        run.tool_result("empty")["is_error"],
        false,
        "empty arguments are {{}}"
    );
    let req = run.tool_result("emptyreq")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        req.contains("rule `required`") && req.contains("path"),
        "{req}"
    );
    let schema = run.tool_result("schema")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        schema.contains("at /content") && schema.contains("rule `type`"),
        "{schema}"
    );
    assert!(
        !env.ws.path().join("x.txt").exists(),
        "nothing ran for the bad input"
    );
    // The model got all six results, in order, each marked as it should be.
    let msgs = tool_messages(&env.transcript());
    let results = msgs[0]["results"].as_array().unwrap();
    let got: Vec<(&str, bool)> = results
        .iter()
        .map(|r| {
            (
                r["call_id"].as_str().unwrap(),
                r["is_error"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("fail", true),
            ("unknown", true),
            ("badjson", true),
            ("empty", false),
            ("emptyreq", true),
            ("schema", true)
        ]
    );
}

#[test]
fn a_model_that_never_stops_is_stopped_at_max_steps_and_reported_unfinished() {
    let env = Env::new();
    let turns: Vec<_> = (0..10)
        .map(|i| json!({"tool_calls": [{"name": "run_command", "input": {"command": format!("echo {i}")}}]}))
        .collect();
    let script = env.script(json!(turns));
    let out = env
        .sup()
        .args(["run", "loop forever", "--max-steps", "4", "--model"])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("Unfinished"), "{}", run.stderr);
    assert!(run.stderr.contains("max_steps"), "{}", run.stderr);
    assert!(run.stderr.contains("not done"), "{}", run.stderr);
    assert_eq!(run.stdout, "", "no answer is printed for unfinished work");
    let t = env.transcript();
    let result = t.iter().find(|e| e["type"] == "result").unwrap();
    assert_eq!(result["status"], "unfinished");
    assert_eq!(result["stop_reason"], "max_steps");
    assert_eq!(result["steps"], 4);
    // The last step's calls were executed and answered.
    assert_eq!(tool_messages(&t).len(), 4);
}

#[test]
fn the_same_call_with_the_same_result_three_times_stops_the_run() {
    let env = Env::new();
    let call = json!({"tool_calls": [{"name": "run_command", "input": {"command": "echo same"}}]});
    let run = env.run_json(
        json!([call, call, call, call, call, {"text": "never"}]),
        &[],
    );
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "repeated_calls");
    assert_eq!(run.result()["status"], "unfinished");
    assert_eq!(run.result()["steps"], 3);
}

#[test]
fn a_changing_result_is_not_a_repeat() {
    let env = Env::new();
    let call = json!({"tool_calls": [{"name": "run_command", "input": {"command": "date +%N"}}]});
    let run = env.run_json(json!([call, call, call, call, {"text": "ok"}]), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn the_token_budget_stops_the_run() {
    let env = Env::new();
    let usage = json!({"input_tokens": 100, "output_tokens": 50});
    let call = |i: u32| json!({"usage": usage, "tool_calls": [{"name": "run_command", "input": {"command": format!("echo {i}")}}]});
    let run = env.run_json(
        json!([call(1), call(2), call(3), call(4), {"text": "done"}]),
        &["--token-budget", "400"],
    );
    assert_eq!(run.code, 3, "{}", run.stderr);
    let r = run.result();
    assert_eq!(r["stop_reason"], "budget");
    assert_eq!(r["steps"], 3);
    assert_eq!(r["usage"]["input_tokens"], 300);
    // The calls of the step that spent the budget are answered, not run.
    let msgs = tool_messages(&env.transcript());
    let last = &msgs.last().unwrap()["results"][0];
    assert!(
        last["content"].as_str().unwrap().contains("budget"),
        "{last}"
    );
    assert_eq!(msgs.len(), 3);
}

#[test]
fn running_out_of_output_tokens_is_a_length_stop() {
    let env = Env::new();
    let run = env.run_json(json!([{"text": "Half an ans", "finish": "length"}]), &[]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "length");
}

#[test]
fn an_exhausted_script_is_a_model_error_not_an_invented_answer() {
    let env = Env::new();
    let run = env.run_json(
        json!([{"tool_calls": [{"name": "list_files", "input": {}}]}]),
        &[],
    );
    assert_eq!(run.code, 4, "{}", run.stderr);
    let r = run.result();
    assert_eq!(r["status"], "error");
    assert!(
        r["error"].as_str().unwrap().contains("all were played"),
        "{r}"
    );
    assert!(r.get("answer").is_none());
}

#[test]
fn no_model_is_exit_2_with_how_to_configure_one() {
    let env = Env::new();
    let out = env.sup().args(["run", "hi"]).output().unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("SUP_MODEL"), "{}", run.stderr);
    assert!(run.stderr.contains("--model"), "{}", run.stderr);
}

#[test]
fn sup_model_is_the_default_model() {
    let env = Env::new();
    let script = env.script(json!([{"text": "from env"}]));
    let out = env
        .sup()
        .env("SUP_MODEL", format!("script:{}", script.display()))
        .args(["run", "hi"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from env\n");
}

#[test]
fn a_bad_script_file_is_exit_2_naming_the_file() {
    let env = Env::new();
    let path = env.home.path().join("bad.jsonl");
    std::fs::write(&path, "{\"text\": \"ok\"}\n{\"txet\": 1}\n").unwrap();
    let out = env
        .sup()
        .args(["run", "hi", "--model"])
        .arg(format!("script:{}", path.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("bad.jsonl") && run.stderr.contains("line 2"),
        "{}",
        run.stderr
    );
}

#[test]
fn paths_outside_the_workspace_are_refused() {
    let env = Env::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(outside.path(), env.ws.path().join("link")).unwrap();
    let run = env.run_json(
        json!([
            {"tool_calls": [
                {"id": "up", "name": "read_file", "input": {"path": "../secret.txt"}},
                {"id": "abs", "name": "read_file", "input": {"path": outside.path().join("secret.txt")}},
                {"id": "sym", "name": "read_file", "input": {"path": "link/secret.txt"}},
                {"id": "symw", "name": "write_file", "input": {"path": "link/new.txt", "content": "x"}},
                {"id": "upw", "name": "write_file", "input": {"path": "../new.txt", "content": "x"}}
            ]},
            {"text": "refused"}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    for id in ["up", "abs", "sym", "symw", "upw"] {
        let r = run.tool_result(id);
        assert_eq!(r["is_error"], true, "{r}");
        assert!(!r["content"].as_str().unwrap().contains("secret\n"), "{r}");
        assert!(r["content"].as_str().unwrap().contains("workspace"), "{r}");
    }
    assert!(!outside.path().join("new.txt").exists());
    assert!(!env.ws.path().parent().unwrap().join("new.txt").exists());
}

#[test]
fn ten_megabytes_of_output_are_capped_and_kept_whole_on_disk() {
    let env = Env::new();
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "big", "name": "run_command",
                "input": {"command": "head -c 10000000 /dev/zero | tr '\\0' 'a'; echo; echo THE-END"}}]},
            {"text": "ok"}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let content = run.tool_result("big")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        content.len() <= 16 * 1024 + 512,
        "capped: {} bytes",
        content.len()
    );
    assert!(content.contains("bytes cut from the middle"), "marker");
    assert!(content.trim_end().ends_with("THE-END"), "tail kept");
    let saved = content
        .split("the whole output is in ")
        .nth(1)
        .and_then(|s| s.split(" …]").next())
        .unwrap();
    let len = std::fs::metadata(saved).unwrap().len();
    assert_eq!(len, 10_000_000 + 1 + 8, "the whole output is kept");
}

#[test]
fn file_tools_do_what_they_say() {
    let env = Env::new();
    env.write(".gitignore", "target/\n");
    env.write("target/junk.txt", "junk");
    env.write("src/a.rs", "fn a() {}\nfn twice() {}\nfn twice() {}\n");
    env.write("src/b.rs", "fn b() { needle }\n");
    let lines: String = (1..=2500).map(|i| format!("line {i}\n")).collect();
    env.write("long.txt", &lines);
    let run = env.run_json(
        json!([
            {"tool_calls": [
                {"id": "ls", "name": "list_files", "input": {"pattern": "**/*.rs"}},
                {"id": "all", "name": "list_files", "input": {}},
                {"id": "grep", "name": "search_files", "input": {"pattern": "needle|fn a"}},
                {"id": "page1", "name": "read_file", "input": {"path": "long.txt"}},
                {"id": "range", "name": "read_file", "input": {"path": "long.txt", "offset": 2499, "limit": 5}}
            ]},
            {"tool_calls": [
                {"id": "none", "name": "edit_file", "input": {"path": "src/a.rs", "old_string": "fn zzz", "new_string": "x"}},
                {"id": "many", "name": "edit_file", "input": {"path": "src/a.rs", "old_string": "fn twice", "new_string": "x"}},
                {"id": "one", "name": "edit_file", "input": {"path": "src/a.rs", "old_string": "fn a()", "new_string": "fn alpha()"}},
                {"id": "deep", "name": "write_file", "input": {"path": "new/deep/file.txt", "content": "made"}}
            ]},
            {"text": "done"}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.tool_result("ls")["content"], "src/a.rs\nsrc/b.rs");
    let all = run.tool_result("all")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        !all.contains("target/junk.txt"),
        ".gitignore is obeyed: {all}"
    );
    assert_eq!(
        run.tool_result("grep")["content"],
        "src/a.rs:1: fn a() {}\nsrc/b.rs:1: fn b() { needle }"
    );
    let page = run.tool_result("page1")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        page.ends_with("[lines 1-2000 of 2500; read on with offset=2001]"),
        "{}",
        &page[page.len() - 80..]
    );
    assert_eq!(
        run.tool_result("range")["content"],
        "line 2499\nline 2500\n[lines 2499-2500 of 2500]"
    );
    let none = run.tool_result("none")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(none.contains("not found"), "{none}");
    let many = run.tool_result("many")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        many.contains("occurs 2 times") && many.contains("lines 2, 3"),
        "{many}"
    );
    assert_eq!(run.tool_result("one")["is_error"], false);
    let a = std::fs::read_to_string(env.ws.path().join("src/a.rs")).unwrap();
    assert!(a.starts_with("fn alpha() {}"));
    assert_eq!(
        std::fs::read_to_string(env.ws.path().join("new/deep/file.txt")).unwrap(),
        "made"
    );
}

/// The walk keeps the folders it read for the run: what changed since (a file written, one
/// removed by a command, a folder made, a `.gitignore` edited in place) shows at the next
/// listing and search all the same.
#[test]
fn a_listing_sees_what_changed_since_the_last_in_the_run() {
    let env = Env::new();
    env.write(".gitignore", "*.log\n");
    env.write("src/a.rs", "fn a() {}\n");
    env.write("src/old.rs", "fn old() {}\n");
    env.write("docs/keep.log", "x\n");
    // Old enough for the first walk to keep what it reads (past a tick of the clock).
    std::thread::sleep(Duration::from_millis(300));
    let list = |id: &str| json!({"id": id, "name": "list_files", "input": {}});
    let grep = |id: &str| json!({"id": id, "name": "search_files", "input": {"pattern": "fn "}});
    let run = env.run_json(
        json!([
            {"tool_calls": [list("ls1"), grep("grep1")]},
            {"tool_calls": [
                {"id": "w", "name": "write_file", "input": {"path": "src/b.rs", "content": "fn b() {}\n"}},
                {"id": "e", "name": "edit_file", "input": {"path": ".gitignore", "old_string": "*.log", "new_string": "*.log\n!keep.log\nsrc/a.rs"}}
            ]},
            {"tool_calls": [{"id": "sh", "name": "run_command", "input": {"command": "rm src/old.rs && mkdir docs/new && echo x > docs/new/n.txt"}}]},
            {"tool_calls": [list("ls2"), grep("grep2")]},
            {"text": "done"}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.tool_result("ls1")["content"],
        ".gitignore\nsrc/a.rs\nsrc/old.rs"
    );
    assert_eq!(
        run.tool_result("grep1")["content"],
        "src/a.rs:1: fn a() {}\nsrc/old.rs:1: fn old() {}"
    );
    assert_eq!(run.tool_result("sh")["is_error"], false);
    assert_eq!(
        run.tool_result("ls2")["content"],
        ".gitignore\ndocs/keep.log\ndocs/new/n.txt\nsrc/b.rs"
    );
    assert_eq!(run.tool_result("grep2")["content"], "src/b.rs:1: fn b() {}");
}

#[test]
fn a_tool_that_runs_too_long_times_out_as_an_error_result() {
    let env = Env::new();
    let started = Instant::now();
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "slow", "name": "run_command", "input": {"command": "echo started; sleep 30"}}]},
            {"text": "ok"}
        ]),
        &["--tool-timeout", "1s"],
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(run.code, 0, "{}", run.stderr);
    let r = run.tool_result("slow");
    assert_eq!(r["is_error"], true);
    let c = r["content"].as_str().unwrap();
    assert!(
        c.contains("timed out after 1s") && c.contains("started"),
        "{c}"
    );
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

#[test]
fn sigint_during_a_long_command_kills_it_and_keeps_the_transcript() {
    let env = Env::new();
    let script = env.script(json!([
        {"tool_calls": [{"id": "long", "name": "run_command",
            "input": {"command": "bash -c 'exec -a supsigintwitness sleep 300' & echo started > sleep.pid; wait"}}]},
        {"text": "never reached"}
    ]));
    let child = env
        .sup()
        .args(["run", "wait", "--model"])
        .arg(format!("script:{}", script.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn_killed();
    let pid_file = env.ws.path().join("sleep.pid");
    // A jailed command knows its pid in the run's PID namespace only: the witness is found
    // by its name.
    let sleep_pid: i32 = eventually(Duration::from_secs(20), "the command to start", || {
        std::fs::read_to_string(&pid_file).ok()?;
        std::fs::read_dir("/proc").ok()?.find_map(|e| {
            let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            cmdline.starts_with(b"supsigintwitness").then_some(pid)
        })
    });
    assert!(alive(sleep_pid));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 130, "{}", run.stderr);
    eventually(
        Duration::from_secs(5),
        "the child process to be gone",
        || (!alive(sleep_pid)).then_some(()),
    );
    let t = env.transcript();
    let result = t.iter().find(|e| e["type"] == "result").unwrap();
    assert_eq!(result["status"], "interrupted");
    assert_eq!(result["stop_reason"], "cancelled");
    let msgs = tool_messages(&t);
    assert_eq!(msgs[0]["results"][0]["call_id"], "long");
    assert!(
        msgs[0]["results"][0]["content"]
            .as_str()
            .unwrap()
            .contains("cancelled")
    );
}

#[test]
fn sigint_while_the_model_thinks_cancels_the_request() {
    let env = Env::new();
    let script = env.script(json!([{"delay_ms": 60000, "text": "too late"}]));
    let child = env
        .sup()
        .args(["run", "think", "--model"])
        .arg(format!("script:{}", script.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn_killed();
    // Wait for the model to be asked (its step has started in the transcript).
    eventually(Duration::from_secs(20), "the model to be asked", || {
        let dir = env.run_dirs().pop()?;
        std::fs::read_to_string(dir.join("transcript.jsonl"))
            .ok()
            .filter(|t| t.contains("step_started"))
            .map(|_| ())
    });
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(130));
    assert!(String::from_utf8_lossy(&out.stdout).is_empty());
}

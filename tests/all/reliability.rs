//! Nothing panics, no outcome is lost, bounds hold, and known secrets are redacted — all
//! through the binary: absurd `Retry-After` values and durations, token counts at the top of
//! u64, a locked or failing store as a run ends, huge files, outputs and answers, SSE
//! keep-alives, validation, and a provider key echoed by a tool or a 401.

use crate::common;
use crate::common::{Killed, SpawnKilled};

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::fake_server::{FakeServer, Indexing, Reply, Turn, openai_json, openai_stream};
use common::{Env, Run, read_jsonl, until};
use serde_json::{Value, json};
use sup::store::db::Db;

const KEY: &str = "sk-test-RELIABILITY-5ecret-key-0003";

fn openai(env: &Env, server: &FakeServer, args: &[&str]) -> Run {
    let out = env
        .sup()
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", KEY)
        .args(["run", "do the work", "--model", "openai:gpt-test", "--json"])
        .args(args)
        .output()
        .unwrap();
    Run::new(out)
}

fn no_panic(run: &Run) {
    assert_ne!(run.code, 101, "sup panicked: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

fn runs_json(env: &Env) -> Vec<Value> {
    let out = env.sup().args(["runs", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    serde_json::from_slice(&out.stdout).unwrap()
}

// ---------------------------------------------------------------- no panic on any input

fn retry_after_past_the_deadline(header: &str, value: &str) {
    let env = Env::new();
    let server = FakeServer::start(vec![
        Reply::json(
            429,
            json!({"error": {"message": "slow down, you are over quota"}}),
        )
        .header(header, value),
    ]);
    let run = openai(&env, &server, &[]);
    no_panic(&run);
    assert_eq!(run.code, 4, "{}", run.stderr);
    let error = run.result()["error"].as_str().unwrap().to_string();
    assert!(error.contains("slow down, you are over quota"), "{error}");
    assert!(error.contains("past the deadline"), "{error}");
    assert_eq!(server.requests().len(), 1, "gave up at once");
    assert_eq!(runs_json(&env)[0]["status"], "error");
}

#[test]
fn retry_after_1e30_gives_up_now_with_the_servers_words() {
    retry_after_past_the_deadline("retry-after", "1e30");
}

#[test]
fn retry_after_ms_1e300_gives_up_now_with_the_servers_words() {
    retry_after_past_the_deadline("retry-after-ms", "1e300");
}

#[test]
fn a_retry_after_longer_than_the_deadline_gives_up_now() {
    retry_after_past_the_deadline("retry-after", "86400");
}

#[test]
fn a_tool_timeout_of_u64_max_seconds_runs_the_tool() {
    let env = Env::new();
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "c1", "name": "run_command", "input": {"command": "echo hi"}}]},
            {"text": "done"}
        ]),
        &["--tool-timeout", "18446744073709551615s"],
    );
    no_panic(&run);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.tool_result("c1")["content"]
            .as_str()
            .unwrap()
            .contains("hi")
    );
}

fn queued_approval_with_timeout(timeout: &str) {
    let env = Env::new();
    let script = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "write_file", "input": {"path": "a.txt", "content": "x"}}]},
        {"text": "done"}
    ]));
    let mut child = env
        .sup()
        .args(["run", "work", "--json", "--approval", "queue"])
        .arg("--approval-timeout")
        .arg(timeout)
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_killed();
    let pending = || -> Vec<Value> {
        let out = env.sup().args(["approvals", "--json"]).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let request = loop {
        if let Some(r) = pending().into_iter().next() {
            break r;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "sup ended ({status}) before asking: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < deadline, "no approval request");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Not denied at once: the deadline is far away (saturated, never wrapped to now).
    let deadline_year: i32 = request["deadline"].as_str().unwrap()[..4].parse().unwrap();
    assert!(deadline_year > 3000, "{request}");
    let id = request["id"].as_str().unwrap();
    let out = env.sup().args(["approve", id]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let out = child.wait_with_output().unwrap();
    let run = Run::new(out);
    no_panic(&run);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.tool_result("c1")["is_error"], false);
}

#[test]
fn an_approval_timeout_of_a_million_years_waits() {
    queued_approval_with_timeout("1000000y");
}

#[test]
fn an_approval_timeout_beyond_what_a_date_holds_waits_instead_of_denying() {
    queued_approval_with_timeout("584000000000y");
}

#[test]
fn token_usage_at_u64_max_saturates_the_budget_stops_and_the_store_records_it() {
    let env = Env::new();
    let huge = u64::MAX;
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "c1", "name": "list_files", "input": {}}],
             "usage": {"input_tokens": huge, "output_tokens": 10}},
            {"tool_calls": [{"id": "c2", "name": "list_files", "input": {}}],
             "usage": {"input_tokens": huge, "output_tokens": 10}},
            {"text": "done"}
        ]),
        &["--token-budget", "1000000"],
    );
    no_panic(&run);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "budget");
    assert_eq!(run.result()["usage"]["input_tokens"], json!(huge));
    let rows = runs_json(&env);
    assert_eq!(rows[0]["status"], "unfinished");
    assert_eq!(rows[0]["usage"]["input_tokens"], json!(i64::MAX as u64));
}

#[test]
fn two_huge_usages_do_not_wrap_below_the_budget() {
    let env = Env::new();
    // 2^63 + 2^63 wraps to 0 in u64: the old counter then never reached the budget.
    let half = 1u64 << 63;
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "c1", "name": "list_files", "input": {}}],
             "usage": {"input_tokens": half, "output_tokens": 0}},
            {"tool_calls": [{"id": "c2", "name": "list_files", "input": {}}],
             "usage": {"input_tokens": half, "output_tokens": 0}},
            {"tool_calls": [{"id": "c3", "name": "list_files", "input": {}}]},
            {"text": "done"}
        ]),
        &["--token-budget", "100"],
    );
    no_panic(&run);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "budget");
}

// ------------------------------------------------------------------- no outcome is lost

/// A run that answers after `delay_ms`, started in the background.
fn slow_run(env: &Env, delay_ms: u64) -> Killed {
    let script = env.script(json!([{"text": "the answer", "delay_ms": delay_ms}]));
    env.sup()
        .args(["run", "work"])
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_killed()
}

fn running_row(env: &Env) -> bool {
    Db::open(env.home.path())
        .ok()
        .and_then(|db| db.runs(None, Some(sup::store::RunStatus::Running), 1).ok())
        .is_some_and(|r| !r.is_empty())
}

#[test]
fn a_store_locked_longer_than_the_busy_timeout_still_records_the_achieved_run() {
    let env = Env::new();
    let log = env.home.path().join("run.log");
    let script = env.script(json!([{"text": "the answer", "delay_ms": 1500}]));
    let child = env
        .sup()
        .args(["run", "work"])
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn_killed();
    until("the run is recorded as running", 20, || running_row(&env));
    // Another process holds the store's write lock past sup's 10 s busy timeout: held until
    // sup says it has waited that out and is retrying.
    let conn = rusqlite::Connection::open(env.home.path().join("sup.db")).unwrap();
    conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
    until("sup to retry the locked store", 30, || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("retrying in"))
    });
    conn.execute_batch("COMMIT").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "the answer");
    assert_eq!(runs_json(&env)[0]["status"], "achieved");
}

#[test]
fn an_outcome_the_store_refuses_is_kept_beside_the_transcript_and_recorded_next_start() {
    let env = Env::new();
    let child = slow_run(&env, 800);
    until("the run is recorded as running", 20, || running_row(&env));
    // The store fails every update of a run (as a full disk would).
    let conn = rusqlite::Connection::open(env.home.path().join("sup.db")).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE UPDATE ON runs BEGIN
             SELECT RAISE(ABORT, 'database or disk is full'); END;",
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the run's real exit code: {stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "the answer");
    assert!(stderr.contains("recording the outcome"), "{stderr}");
    let dir = env.run_dirs().pop().unwrap();
    assert!(dir.join("outcome.json").is_file(), "{stderr}");
    // The transcript's lines are whole.
    let transcript = read_jsonl(&dir.join("transcript.jsonl"));
    assert_eq!(transcript.last().unwrap()["type"], "result");
    conn.execute_batch("DROP TRIGGER refuse").unwrap();
    let rows = runs_json(&env);
    assert_eq!(rows[0]["status"], "achieved", "{rows:?}");
    assert_eq!(rows[0]["stop_reason"], "final");
    assert!(!dir.join("outcome.json").exists());
}

// ------------------------------------------------------------------------------- bounds

fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[test]
fn read_file_on_a_2_gb_sparse_file_reads_only_its_page() {
    let env = Env::new();
    let big = env.ws.path().join("big.txt");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(2 * 1024 * 1024 * 1024).unwrap();
    drop(f);
    // A text file of one short line, then 2 GB of… zeros would be binary: give it lines.
    std::fs::write(env.ws.path().join("lines.txt"), "one\ntwo\nthree\n").unwrap();
    let script = env.script(json!([
        {"tool_calls": [
            {"id": "c1", "name": "read_file", "input": {"path": "big.txt"}},
            {"id": "c2", "name": "read_file", "input": {"path": "lines.txt", "offset": 2, "limit": 1}}
        ]},
        {"text": "done", "delay_ms": 1500}
    ]));
    let mut child = env
        .sup()
        .args(["run", "work", "--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_killed();
    let pid = child.id();
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(peak_kib(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    let run = Run::new(child.wait_with_output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(peak > 0, "memory was measured");
    assert!(peak < 50 * 1024, "peak memory {peak} KiB");
    let c1 = run.tool_result("c1")["content"].as_str().unwrap();
    assert!(c1.contains("binary"), "{c1}");
    let c2 = run.tool_result("c2")["content"].as_str().unwrap();
    assert!(c2.starts_with("two\n[lines 2-2 of 3"), "{c2}");
}

#[test]
fn read_file_on_a_huge_text_file_returns_a_bounded_page() {
    let env = Env::new();
    let path = env.ws.path().join("long.txt");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for i in 0..300_000 {
            writeln!(f, "line {i}").unwrap();
        }
    }
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "c1", "name": "read_file", "input": {"path": "long.txt", "offset": 299999, "limit": 5}}]},
            {"text": "done"}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let c1 = run.tool_result("c1")["content"].as_str().unwrap();
    assert!(
        c1.starts_with("line 299998\nline 299999\n[lines 299999-300000 of 300000]"),
        "{c1}"
    );
}

#[test]
fn a_flood_of_output_keeps_at_most_64_mb_with_a_note() {
    let env = Env::new();
    let run = env.run_json(
        json!([
            {"tool_calls": [{"id": "c1", "name": "run_command",
                "input": {"command": "head -c 100000000 /dev/zero | tr '\\0' y"}}]},
            {"text": "done"}
        ]),
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let files = common::all_files(env.home.path());
    let biggest = files
        .iter()
        .max_by_key(|f| f.metadata().unwrap().len())
        .unwrap();
    let size = biggest.metadata().unwrap().len();
    assert!(
        size <= 64 * 1024 * 1024 + 200,
        "{} is {size} bytes",
        biggest.display()
    );
    assert!(size >= 64 * 1024 * 1024, "{size}");
    let (tail, _) = sup::tools::process::read_tail(biggest, 200).unwrap();
    assert!(tail.contains("output cut at 64 MB"), "{tail}");
    let total: u64 = files.iter().map(|f| f.metadata().unwrap().len()).sum();
    assert!(total < 70 * 1024 * 1024, "SUP_HOME holds {total} bytes");
}

/// A Chat Completions stream whose text is `pieces` pieces of `size` bytes each.
fn big_stream(pieces: usize, size: usize) -> Reply {
    let piece = "y".repeat(size);
    let mut events = vec![];
    for _ in 0..pieces {
        events.push(format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]})
        ));
    }
    events.push(format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    ));
    events.push("data: [DONE]\n\n".into());
    Reply::sse(events)
}

#[test]
fn a_model_turn_past_8_mb_fails_the_run_with_a_clear_error() {
    let env = Env::new();
    let server = FakeServer::start(vec![big_stream(10, 1024 * 1024)]);
    let run = openai(&env, &server, &["--retries", "1"]);
    no_panic(&run);
    assert_eq!(run.code, 4, "{}", run.stderr);
    let error = run.result()["error"].as_str().unwrap();
    assert!(error.contains("larger than 8 MB"), "{error}");
    let transcript = std::fs::metadata(env.run_dirs().pop().unwrap().join("transcript.jsonl"))
        .unwrap()
        .len();
    assert!(
        transcript < 20 * 1024 * 1024,
        "transcript {transcript} bytes"
    );
}

#[test]
fn a_whole_answer_past_the_limit_fails_too() {
    let env = Env::new();
    let server = FakeServer::start(vec![openai_json(&Turn::text(&"z".repeat(20 << 20)))]);
    let run = openai(&env, &server, &["--no-stream", "--retries", "1"]);
    no_panic(&run);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(
        run.result()["error"]
            .as_str()
            .unwrap()
            .contains("larger than 8 MB")
    );
}

#[test]
fn sse_keep_alives_cannot_extend_the_request_deadline() {
    let env = Env::new();
    let mut pieces = vec![(0, ": keep-alive\n\n".to_string())];
    for _ in 0..100 {
        pieces.push((100, ": keep-alive\n\n".to_string()));
    }
    let reply = Reply {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: common::fake_server::Body::Chunks {
            pieces,
            drop: false,
            end_delay: 0,
        },
    };
    let server = FakeServer::start(vec![reply]);
    let started = Instant::now();
    let run = openai(
        &env,
        &server,
        &[
            "--request-timeout",
            "1s",
            "--idle-timeout",
            "5s",
            "--retries",
            "1",
        ],
    );
    assert_eq!(run.code, 4, "{}", run.stderr);
    let error = run.result()["error"].as_str().unwrap();
    assert!(error.contains("did not finish within 1s"), "{error}");
    // The stream would have lasted 10 s; the deadline ended it (not asserted as a time).
    let _ = started;
}

#[test]
fn the_partial_answer_of_a_failed_stream_is_in_the_transcript() {
    let env = Env::new();
    let turn = Turn::text("the first part of a long answer that never ends");
    let server = FakeServer::start(vec![
        openai_stream(&turn, Indexing::Standard).dropped_after(5),
    ]);
    let run = openai(&env, &server, &[]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    let error = run.result()["error"].as_str().unwrap();
    assert!(error.contains("kept in the transcript"), "{error}");
    let transcript = env.transcript();
    let text: String = transcript
        .iter()
        .filter(|e| e["type"] == "partial")
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect();
    assert!(text.starts_with("the first part"), "{transcript:?}");
    let id = runs_json(&env)[0]["run_id"].as_str().unwrap().to_string();
    let out = env.sup().args(["show", &id]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("the first part"));
}

/// A tool that fails on a full disk says so, beside its own words: the workspace is a tiny
/// tmpfs (mounted in a mount namespace of the test's own), filled by the command itself.
#[test]
fn a_command_that_fills_the_disk_is_told_the_disk_is_full() {
    let env = Env::new();
    let script = env.script(json!([
        {"tool_calls": [{"id": "fill", "name": "run_command",
            "input": {"command": "head -c 4000000 /dev/zero > big.bin"}}]},
        {"tool_calls": [{"id": "write", "name": "write_file",
            "input": {"path": "more.txt", "content": "x".repeat(300_000)}}]},
        {"text": "done"}
    ]));
    let sup = env.sup();
    let mut c = std::process::Command::new("unshare");
    if !nix::unistd::getuid().is_root() {
        c.args(["--user", "--map-root-user"]);
    }
    c.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs -o size=256k tmpfs "$PWD" && cd "$PWD" && exec "$@""#)
        .arg("sh")
        .arg(sup.get_program())
        .args(["run", "fill the disk", "--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .current_dir(env.ws.path())
        .stdin(Stdio::null());
    for (k, v) in sup.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let run = Run::new(c.output().unwrap());
    no_panic(&run);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let fill = run.tool_result("fill");
    let content = fill["content"].as_str().unwrap();
    assert_eq!(fill["is_error"], true, "{content}");
    assert!(content.contains("No space left on device"), "{content}");
    assert!(
        content.contains("is full (no space left); free some space"),
        "sup says the disk is full: {content}"
    );
    let write = run.tool_result("write");
    let content = write["content"].as_str().unwrap();
    assert_eq!(write["is_error"], true, "{content}");
    assert!(
        content.contains("is full (no space left)"),
        "a built-in tool says it too: {content}"
    );
    // The workspace behind the tmpfs is untouched: the namespace's mount never leaked out.
    assert!(!env.ws.path().join("big.bin").exists());
}

// --------------------------------------------------------------------------- validation

fn goal_file(env: &Env, body: &str) -> Run {
    let path = env.home.path().join("g.toml");
    std::fs::write(
        &path,
        format!("prompt = \"p\"\nmodel = \"script:none.json\"\n{body}\n"),
    )
    .unwrap();
    Run::new(
        env.sup()
            .args(["goal", "--file"])
            .arg(&path)
            .output()
            .unwrap(),
    )
}

#[test]
fn keep_runs_below_1_is_exit_2() {
    let env = Env::new();
    let run = goal_file(&env, "keep_runs = 0");
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("keep_runs"), "{}", run.stderr);
    assert!(env.run_dirs().is_empty());
}

#[test]
fn a_schedule_that_never_fires_is_exit_2() {
    let env = Env::new();
    let run = goal_file(&env, "schedule = \"0 0 31 2 *\"");
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("schedule"), "{}", run.stderr);
    assert!(run.stderr.contains("five years"), "{}", run.stderr);
}

#[test]
fn a_zero_timeout_is_exit_2() {
    let env = Env::new();
    for body in [
        "tool_timeout = \"0s\"",
        "approval_timeout = \"0s\"",
        "[[check]]\nrun = \"true\"\ntimeout = \"0s\"",
    ] {
        let run = goal_file(&env, body);
        assert_eq!(run.code, 2, "{body}: {}", run.stderr);
        assert!(run.stderr.contains("timeout"), "{}", run.stderr);
    }
    let run = env.run_json(json!([{"text": "x"}]), &["--tool-timeout", "0s"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

#[test]
fn an_unknown_runs_status_is_exit_2_and_lists_the_valid_ones() {
    let env = Env::new();
    let out = env
        .sup()
        .args(["runs", "--status", "bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for s in [
        "achieved",
        "failed",
        "unfinished",
        "error",
        "interrupted",
        "running",
    ] {
        assert!(stderr.contains(s), "{stderr}");
    }
}

// ----------------------------------------------------------------------- small defects

#[test]
fn sup_show_finds_check_output_under_a_sup_home_with_a_space() {
    let env = Env::new();
    let home = env.home.path().join("state with space");
    let script = env.script(json!([{"text": "done"}]));
    let out = env
        .sup()
        .env("SUP_HOME", &home)
        .args(["goal", "work", "--tries", "1", "--json"])
        .args(["--check-cmd", "echo printed-by-the-check; exit 1"])
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let id = run.result()["run_id"].as_str().unwrap().to_string();
    let out = env
        .sup()
        .env("SUP_HOME", &home)
        .args(["show", &id])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("printed-by-the-check"), "{shown}");
    // The kept output is found and shown under its whole path, space included.
    assert!(
        shown.contains(&format!("{}/runs/{id}/", home.display())) && shown.contains(".stdout:"),
        "{shown}"
    );
}

// --------------------------------------------------------------------------- redaction

fn assert_no_key_under(dir: &Path) {
    let files = common::all_files(dir);
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(KEY),
            "the key is in {}",
            f.display()
        );
    }
}

#[test]
fn a_key_a_tool_prints_reaches_the_model_redacted() {
    let env = Env::new();
    // The key where a tool can read it (whatever the environment scrubbing does).
    env.write("leak.txt", &format!("key={KEY}\n"));
    let server = FakeServer::start(vec![
        openai_stream(
            &Turn::default()
                .call("c1", "run_command", r#"{"command":"cat leak.txt"}"#)
                .call("c2", "read_file", r#"{"path":"leak.txt"}"#),
            Indexing::Standard,
        ),
        openai_stream(&Turn::text("done"), Indexing::Standard),
    ]);
    let recording = env.home.path().join("rec.json");
    let run = openai(&env, &server, &["--record", recording.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let second = requests[1].body.to_string();
    assert!(
        !second.contains(KEY),
        "the model was sent the key: {second}"
    );
    assert!(second.contains("key=[redacted]"), "{second}");
    assert!(!run.stdout.contains(KEY) && !run.stderr.contains(KEY));
    assert_no_key_under(env.home.path());
}

#[test]
fn a_401_that_echoes_the_key_leaves_it_nowhere() {
    let env = Env::new();
    let server = FakeServer::start(vec![Reply::json(
        401,
        json!({"error": {"message": format!("Incorrect API key provided: {KEY}.")}}),
    )]);
    let run = openai(&env, &server, &[]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(!run.stdout.contains(KEY), "{}", run.stdout);
    assert!(!run.stderr.contains(KEY), "{}", run.stderr);
    assert!(
        run.result()["error"]
            .as_str()
            .unwrap()
            .contains("[redacted]")
    );
    // The human trace too.
    let out =
        env.sup()
            .env(
                "OPENAI_BASE_URL",
                format!("{}/v1", FakeServer::start(vec![Reply::json(
            401,
            json!({"error": {"message": format!("Incorrect API key provided: {KEY}.")}}),
        )]).url),
            )
            .env("OPENAI_API_KEY", KEY)
            .env("RUST_LOG", "debug")
            .args(["run", "x", "--model", "openai:gpt-test"])
            .output()
            .unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(KEY));
    let runs = env.sup().args(["runs", "--json"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&runs.stdout).contains(KEY));
    assert!(String::from_utf8_lossy(&runs.stdout).contains("[redacted]"));
    let id = runs_json(&env)[0]["run_id"].as_str().unwrap().to_string();
    let show = env.sup().args(["show", &id]).output().unwrap();
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(shown.contains("Incorrect API key"), "{shown}");
    assert!(!shown.contains(KEY), "{shown}");
    assert_no_key_under(env.home.path());
}

#[test]
fn a_key_a_check_prints_reaches_neither_the_model_nor_the_disk() {
    let env = Env::new();
    env.write("leak.txt", &format!("{KEY}\n"));
    let server = FakeServer::start(vec![
        openai_stream(&Turn::text("first try"), Indexing::Standard),
        openai_stream(&Turn::text("second try"), Indexing::Standard),
    ]);
    let out = env
        .sup()
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", KEY)
        .args([
            "goal",
            "work",
            "--model",
            "openai:gpt-test",
            "--json",
            "--tries",
            "2",
        ])
        .args(["--check-cmd", "cat leak.txt; exit 1"])
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let second = server.requests()[1].body.to_string();
    assert!(second.contains("[redacted]"), "{second}");
    assert!(!second.contains(KEY));
    assert!(!run.stdout.contains(KEY));
    assert_no_key_under(env.home.path());
}

// -------------------------------------------------------------------------------- soak

fn pids_of_sleep_300() -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmd == b"sleep\x00300\x00" {
            pids.push(pid);
        }
    }
    pids
}

/// 20 × `kill -9` of the daemon while a run's `sleep 300` tool runs, then a restart: the
/// figures are printed. Run with `cargo test --test all -- reliability::soak --ignored --nocapture`.
#[test]
#[ignore = "a soak of about a minute that prints figures; run it on purpose"]
fn soak_kill_9_of_the_daemon_twenty_times() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let env = Env::new();
    let goals = env.home.path().join("goals");
    std::fs::create_dir_all(&goals).unwrap();
    std::fs::write(
        goals.join("soak.json"),
        json!([
            {"tool_calls": [{"id": "s", "name": "run_command", "input": {"command": "sleep 300"}}]},
            {"text": "done"}
        ])
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        goals.join("soak.toml"),
        "prompt = \"soak\"\nmodel = \"script:soak.json\"\nworkspace = \"work\"\n\
         schedule = \"* * * * * *\"\ntimezone = \"UTC\"\ntries = 1\ntool_timeout = \"600s\"\n",
    )
    .unwrap();
    let before: std::collections::HashSet<i32> = pids_of_sleep_300().into_iter().collect();
    let spawn = || {
        env.sup()
            .args(["daemon", "--goals"])
            .arg(&goals)
            .env("SUP_APPROVAL", "auto")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn_killed()
    };
    let started = Instant::now();
    for round in 0..20 {
        let mut d = spawn();
        let pid = d.id();
        until(&format!("round {round}: a sleep 300 running"), 30, || {
            pids_of_sleep_300().iter().any(|p| !before.contains(p))
                && Db::open(env.home.path())
                    .ok()
                    .and_then(|db| {
                        db.runs(Some("soak"), Some(sup::store::RunStatus::Running), 100)
                            .ok()
                    })
                    .is_some_and(|r| r.iter().any(|r| r.pid == pid))
        });
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
        d.wait().unwrap();
    }
    // The restart: remove the schedule so nothing new starts, and let it settle.
    std::fs::remove_file(goals.join("soak.toml")).unwrap();
    let mut d = spawn();
    until("the restart marks the killed runs interrupted", 30, || {
        Db::open(env.home.path())
            .ok()
            .and_then(|db| {
                db.runs(Some("soak"), Some(sup::store::RunStatus::Running), 1)
                    .ok()
            })
            .is_some_and(|r| r.is_empty())
    });
    kill(Pid::from_raw(d.id() as i32), Signal::SIGTERM).unwrap();
    d.wait().unwrap();
    let left: Vec<i32> = pids_of_sleep_300()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    let db = Db::open(env.home.path()).unwrap();
    let rows = db.runs(Some("soak"), None, 10_000).unwrap();
    let running = rows
        .iter()
        .filter(|r| r.status == sup::store::RunStatus::Running)
        .count();
    let mut at: Vec<String> = rows
        .iter()
        .filter_map(|r| r.scheduled_for.clone())
        .collect();
    let n = at.len();
    at.sort();
    at.dedup();
    let twice = n - at.len();
    let occurrences_running = db
        .occurrences("soak", 10_000)
        .unwrap()
        .iter()
        .filter(|o| o.1 == sup::store::OccurrenceStatus::Running)
        .count();
    println!(
        "soak: 20 kill -9 rounds in {:.1}s; runs {} ({} running after restart); \
         occurrences run twice {twice}; occurrences left running {occurrences_running}; \
         sleep 300 processes left {}",
        started.elapsed().as_secs_f64(),
        rows.len(),
        running,
        left.len()
    );
    for p in &left {
        let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
    }
    assert_eq!(running, 0, "runs left running");
    assert_eq!(twice, 0, "occurrences run twice");
    assert_eq!(left.len(), 0, "processes left over");
    assert_eq!(occurrences_running, 0, "occurrences left running");
}

// ------------------------------------------------------------- the daemon does not stall

#[test]
fn a_daemon_goal_told_to_wait_1e30_seconds_errors_and_runs_again_next_occurrence() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let env = Env::new();
    let replies = (0..20)
        .map(|_| {
            Reply::json(429, json!({"error": {"message": "over quota"}}))
                .header("retry-after", "1e30")
        })
        .collect();
    let server = FakeServer::start(replies);
    let goals = env.home.path().join("goals");
    std::fs::create_dir_all(&goals).unwrap();
    std::fs::write(
        goals.join("g.toml"),
        "prompt = \"p\"\nmodel = \"openai:gpt-test\"\nworkspace = \"work\"\n\
         schedule = \"* * * * * *\"\ntimezone = \"UTC\"\ntries = 1\n",
    )
    .unwrap();
    let mut d = env
        .sup()
        .args(["daemon", "--goals"])
        .arg(&goals)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn_killed();
    let finished = || {
        Db::open(env.home.path())
            .ok()
            .and_then(|db| db.runs(Some("g"), None, 100).ok())
            .map_or(0, |r| {
                r.iter()
                    .filter(|r| r.status == sup::store::RunStatus::Error)
                    .count()
            })
    };
    until("a second run (the goal did not stall)", 20, || {
        finished() >= 2
    });
    kill(Pid::from_raw(d.id() as i32), Signal::SIGTERM).unwrap();
    let code = d.wait().unwrap().code();
    assert_eq!(code, Some(0));
    let db = Db::open(env.home.path()).unwrap();
    let rows = db.runs(Some("g"), None, 100).unwrap();
    assert!(
        rows.iter()
            .all(|r| r.status == sup::store::RunStatus::Error),
        "{rows:?}"
    );
    let occ = db.occurrences("g", 100).unwrap();
    assert!(
        occ.iter()
            .all(|o| o.1 != sup::store::OccurrenceStatus::Running),
        "{occ:?}"
    );
}

// ------------------------------------------------- property tests of the parsers (bounded)

mod props {
    use proptest::prelude::*;
    use reqwest::header::{HeaderMap, HeaderValue};
    use sup::model::http::{Decoder, retry_after};
    use sup::model::sse::SseParser;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Text made mostly of the characters the parsers care about.
    fn wire() -> impl Strategy<Value = String> {
        proptest::string::string_regex(
            r#"(data: |event: |: |\{|\}|\[|\]|"|,|:|\n|\r|[a-z_]{1,12}|[0-9.e+-]{1,8}|\\u0000| )*"#,
        )
        .unwrap()
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn the_sse_parser_takes_any_bytes_in_any_chunks(
            bytes in proptest::collection::vec(any::<u8>(), 0..2048),
            cut in 1usize..64,
        ) {
            let mut p = SseParser::with_max_line(512);
            let mut out = Vec::new();
            for chunk in bytes.chunks(cut) {
                if p.feed(chunk, &mut out).is_err() {
                    break;
                }
            }
            p.finish(&mut out);
        }

        #[test]
        fn both_decoders_take_any_event(name in "[a-z_]{0,20}", data in wire()) {
            let event = sup::model::sse::SseEvent { event: Some(name), data };
            let mut chat = sup::model::openai::ChatDecoder::new();
            let _ = chat.event(&event, &|_| {});
            let _ = chat.size();
            let mut messages = sup::model::anthropic::MessagesDecoder::new();
            let _ = messages.event(&event, &|_| {});
            let _ = messages.size();
        }

        #[test]
        fn both_decoders_take_any_json_body(data in wire()) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&data) {
                let _ = sup::model::openai::ChatDecoder::new().body(v.clone());
                let _ = sup::model::anthropic::MessagesDecoder::new().body(v);
            }
        }

        #[test]
        fn any_retry_after_header_parses_without_panic(
            value in r"[0-9eE.+\-a-zA-Z ,:]{0,40}",
            ms in any::<f64>(),
        ) {
            let mut h = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(&value) {
                h.insert("retry-after", v);
                let _ = retry_after(&h);
            }
            h.insert("retry-after-ms", HeaderValue::from_str(&ms.to_string()).unwrap());
            let _ = retry_after(&h);
        }

        #[test]
        fn the_script_reader_takes_any_text(text in wire()) {
            let _ = sup::model::script::parse(&text);
        }

        #[test]
        fn the_goal_file_parser_takes_any_text(
            text in proptest::string::string_regex(
                r#"((prompt|tries|max_steps|schedule|timezone|keep_runs|tool_timeout|approval_timeout|catch_up|jitter|overlap|\[\[check\]\]|\[\[tool\]\]|timeout|run|name|command) = ("[^"\n]{0,20}"|[0-9]{1,25}|\[\]|true)\n){0,8}"#,
            ).unwrap(),
        ) {
            let _ = sup::config::GoalFile::parse(std::path::Path::new("/nonexistent/g.toml"), &text);
        }
    }
}

// ------------------------------------------------- MCP servers end on every way out

#[test]
fn mcp_servers_are_shut_down_when_the_store_refuses_the_run() {
    let env = Env::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp");
    if !dir.join("node_modules/.bin/mcp-server-everything").exists() {
        let status = std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .status()
            .expect("npm is needed to install the MCP test servers");
        assert!(status.success());
    }
    let server = dir.join("node_modules/.bin/mcp-server-everything");
    let marker = format!("SUP_MCP_TEST_{}", uuid::Uuid::new_v4().simple());
    let goal = env.home.path().join("mcp.toml");
    std::fs::write(
        &goal,
        format!(
            "prompt = \"p\"\n[[mcp]]\nname = \"everything\"\ncommand = [{:?}]\nenv = {{ {marker} = \"1\" }}\n",
            server.display().to_string()
        ),
    )
    .unwrap();
    // The store exists and refuses every new run, after the servers started.
    let db = Db::open(env.home.path()).unwrap();
    db.conn()
        .execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON runs BEGIN
                 SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    let script = env.script(json!([{"text": "done"}]));
    let out = env
        .sup()
        .args(["goal", "--json", "--file"])
        .arg(&goal)
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    // A store that refuses is the machine's failure, not bad usage: exit 4.
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(run.stderr.contains("refused by the test"), "{}", run.stderr);
    let with_marker = || {
        let mut n = 0;
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(environ) = std::fs::read(e.path().join("environ"))
                && String::from_utf8_lossy(&environ).contains(&marker)
            {
                n += 1;
            }
        }
        n
    };
    until("no MCP server outlives the run", 10, || with_marker() == 0);
}

#[test]
fn a_key_in_a_tool_description_reaches_the_model_redacted() {
    let env = Env::new();
    let goal = env.write(
        "g/goal.toml",
        &format!(
            "prompt = \"work\"\n[[tool]]\nname = \"deploy\"\n\
             description = \"Deploys with the key {KEY} already set.\"\ncommand = [\"true\"]\n"
        ),
    );
    let server = FakeServer::start(vec![openai_stream(&Turn::text("done"), Indexing::Standard)]);
    let out = env
        .sup()
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", KEY)
        .args(["goal", "--file", goal.to_str().unwrap(), "--workspace", "."])
        .args(["--tries", "1", "--json", "--model", "openai:gpt-test"])
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let tools = requests[0].body["tools"].to_string();
    assert!(!tools.contains(KEY), "the model was sent the key: {tools}");
    assert!(
        tools.contains("Deploys with the key [redacted] already set."),
        "{tools}"
    );
    assert!(tools.contains("\"deploy\""), "the name is kept: {tools}");
}

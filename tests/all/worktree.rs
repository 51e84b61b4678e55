//! Runs isolated in git worktrees, parallel attempts and `sup continue`, through the binary in
//! real git repositories: the person's tree and `git status` stay as they were, the agent's
//! work is a commit on `sup/GOAL/RUN_ID`, a failed run leaves no branch, three attempts on a
//! fake model that answers by attempt number pick the right winner and leave no process, and
//! a run killed with `kill -9` (of `sup`, or of the daemon) goes on from its transcript.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::common::fake_server::{FakeServer, Turn, openai_json};
use crate::common::{Env, Run, eventually, read_jsonl};
use sup::store::db::Db;

/// `git ARGS` in `dir`; its stdout.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The workspace made a repository with one commit, a change not committed and a file not
/// tracked: what the person has.
fn repo(env: &Env) {
    let ws = env.ws();
    git(&ws, &["init", "-q", "-b", "main"]);
    env.write("tracked.txt", "one\n");
    git(&ws, &["add", "tracked.txt"]);
    git(
        &ws,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "first",
        ],
    );
    env.write("tracked.txt", "one\nchanged by the person\n");
    env.write("mine.txt", "untracked\n");
}

/// A process that is killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_agent_file() -> Value {
    json!([
        {"tool_calls": [{"id": "w", "name": "write_file",
            "input": {"path": "agent.txt", "content": "from the agent\n"}}]},
        {"text": "done"}
    ])
}

fn branches(dir: &Path) -> String {
    git(dir, &["branch", "--list", "sup/*"])
}

#[test]
fn an_achieved_worktree_run_leaves_the_tree_alone_and_its_work_on_a_branch() {
    let env = Env::new();
    repo(&env);
    let ws = env.ws();
    let status_before = git(&ws, &["status", "--porcelain"]);
    let head_before = git(&ws, &["rev-parse", "HEAD"]);
    let run = env.json(
        &[
            "goal",
            "write agent.txt",
            "--check-cmd",
            "test -f agent.txt",
        ],
        write_agent_file(),
        &["--isolation", "worktree"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let r = run.result();
    let id = r["run_id"].as_str().unwrap();
    let branch = format!("sup/goal/{id}");
    assert_eq!(r["branch"], branch, "{r}");
    assert!(
        r["diff_stat"].as_str().unwrap().contains("agent.txt"),
        "{r}"
    );
    // The person's tree, index and HEAD are as they were; the agent's file is not in it.
    assert_eq!(git(&ws, &["status", "--porcelain"]), status_before);
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), head_before);
    assert!(!ws.join("agent.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("tracked.txt")).unwrap(),
        "one\nchanged by the person\n"
    );
    // The work is one commit on the branch, named for the goal, the outcome and the run.
    assert_eq!(
        git(&ws, &["show", &format!("{branch}:agent.txt")]),
        "from the agent\n"
    );
    assert_eq!(git(&ws, &["rev-parse", &branch]).trim(), r["commit"]);
    let message = git(&ws, &["log", "-1", "--format=%s", &branch]);
    assert!(
        message.contains("goal") && message.contains("achieved") && message.contains(id),
        "{message}"
    );
    assert_eq!(
        git(&ws, &["rev-parse", &format!("{branch}~1")]),
        head_before
    );
    // The worktree folder is gone, and git knows of no other worktree; its files go soon
    // after, in a process the run does not wait for.
    assert!(!env.home.path().join("worktrees").join(id).exists());
    assert_eq!(git(&ws, &["worktree", "list"]).lines().count(), 1);
    let aside = env.home.path().join("worktrees/.removed");
    crate::common::until("the folder's files removed", 20, || {
        std::fs::read_dir(&aside).is_ok_and(|mut d| d.next().is_none())
    });
    // `sup show --diff` prints the diff; `sup show` names the branch.
    let out = env.sup().args(["show", id, "--diff"]).output().unwrap();
    assert!(out.status.success());
    let diff = String::from_utf8_lossy(&out.stdout);
    assert!(diff.contains("+from the agent"), "{diff}");
    let out = env.sup().args(["show", id]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains(&format!("branch {branch}")), "{shown}");
    // The console's page of the run shows the branch and the diff.
    let mut cmd = env.sup();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--goals"])
        .arg(env.home.path().join("goals"));
    let console = crate::web::console(cmd);
    let page = crate::web::get(&console.addr, &format!("/runs/{id}"), None);
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains(&branch) && page.body.contains("+from the agent"),
        "{}",
        page.body
    );
}

#[test]
fn a_failed_worktree_run_leaves_no_branch_by_default() {
    let env = Env::new();
    repo(&env);
    let ws = env.ws();
    let run = env.json(
        &[
            "goal",
            "write agent.txt",
            "--check-cmd",
            "false",
            "--tries",
            "1",
        ],
        write_agent_file(),
        &["--isolation", "worktree"],
    );
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let r = run.result();
    assert!(r.get("branch").is_none(), "{r}");
    assert_eq!(branches(&ws), "");
    assert_eq!(git(&ws, &["worktree", "list"]).lines().count(), 1);
    assert!(!ws.join("agent.txt").exists());
}

#[test]
fn worktree_isolation_needs_a_repository_with_a_commit() {
    let env = Env::new();
    let run = env.json(
        &["goal", "x", "--check-cmd", "true"],
        write_agent_file(),
        &["--isolation", "worktree"],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("not inside a git repository"),
        "{}",
        run.stderr
    );
    git(&env.ws(), &["init", "-q"]);
    let run = env.json(
        &["goal", "x", "--check-cmd", "true"],
        write_agent_file(),
        &["--isolation", "worktree"],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("first commit"), "{}", run.stderr);
    assert!(env.run_dirs().is_empty());
}

#[test]
fn parallel_out_of_range_is_refused_with_its_line() {
    let env = Env::new();
    repo(&env);
    for n in ["0", "17"] {
        let path = env.write(
            "g.toml",
            &format!("prompt = \"p\"\nmodel = \"script:x.json\"\n\nparallel = {n}\n"),
        );
        let out = env
            .sup()
            .args(["goal", "--file"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("{}:4:", path.display())) && err.contains("parallel"),
            "{err}"
        );
        let out = env
            .sup()
            .args(["run", "p", "--parallel", n])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
    }
}

/// The attempt a Chat Completions request belongs to, from its first user message.
fn attempt_of(body: &Value) -> u32 {
    let first = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .unwrap_or_default();
    (1..=16)
        .find(|k| first.contains(&format!("attempt {k} of ")))
        .unwrap_or(0)
}

fn last_role(body: &Value) -> String {
    body["messages"].as_array().unwrap().last().unwrap()["role"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `sup goal ARGS…` against the fake server `server` (Chat Completions, whole answers).
fn goal_against(env: &Env, server: &FakeServer, args: &[&str]) -> Command {
    let mut c = env.sup();
    c.env("OPENAI_API_KEY", "sk-test")
        .arg("goal")
        .args(args)
        .args(["--no-stream", "--model", "openai:gpt-4o-mini", "--base-url"])
        .arg(format!("{}/v1", server.url));
    c
}

fn no_process(marker: &str) -> bool {
    let out = Command::new("pgrep").args(["-f", marker]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().is_empty()
}

#[test]
fn three_attempts_the_one_whose_checks_pass_wins_and_the_others_are_cancelled() {
    let env = Env::new();
    repo(&env);
    let ws = env.ws();
    let marker = "sleep 41.731";
    // Attempt 2 writes the right answer once every attempt has asked (else it could win
    // before a slow attempt's first request); attempts 1 and 3 wait in a long command.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let server = FakeServer::routed(move |body| {
        if last_role(body) == "tool" {
            return openai_json(&Turn::text("done"));
        }
        let attempt = attempt_of(body);
        seen.lock().unwrap().insert(attempt);
        match attempt {
            2 => {
                crate::common::until("every attempt's first request", 60, || {
                    seen.lock().unwrap().len() == 3
                });
                openai_json(&Turn::text("").call(
                    "w",
                    "write_file",
                    r#"{"path": "answer.txt", "content": "right\n"}"#,
                ))
            }
            _ => openai_json(&Turn::text("").call(
                "s",
                "run_command",
                &json!({"command": marker}).to_string(),
            )),
        }
    });
    let out = goal_against(
        &env,
        &server,
        &[
            "write answer.txt",
            "--check-cmd",
            "grep -q right answer.txt",
            "--tries",
            "1",
            "--parallel",
            "3",
            "--json",
        ],
    )
    .output()
    .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let r = run.result();
    assert_eq!(r["status"], "achieved");
    assert_eq!(r["attempt"], 2, "{r}");
    let attempts = r["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{r}");
    for a in attempts {
        if a["attempt"] == 2 {
            assert_eq!(a["status"], "achieved", "{a}");
        } else {
            assert_eq!(a["status"], "interrupted", "{a}");
            assert_eq!(a["note"], "cancelled", "{a}");
        }
    }
    // Each attempt was told which it is.
    let told: Vec<u32> = server
        .requests()
        .iter()
        .map(|q| attempt_of(&q.body))
        .collect();
    for k in 1..=3 {
        assert!(told.contains(&k), "{told:?}");
    }
    // The winner's work is on its branch; the cancelled attempts' commands are gone.
    let branch = r["branch"].as_str().unwrap();
    assert_eq!(
        git(&ws, &["show", &format!("{branch}:answer.txt")]),
        "right\n"
    );
    assert_eq!(branches(&ws).lines().count(), 1, "{}", branches(&ws));
    assert!(no_process(marker), "an attempt's command outlived it");
    // `sup show` lists every attempt with its outcome.
    let id = r["run_id"].as_str().unwrap();
    let out = env.sup().args(["show", id]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("attempt 2 ·") && shown.contains("wins"),
        "{shown}"
    );
    assert_eq!(shown.matches("· cancelled").count(), 2, "{shown}");
}

/// A model on loopback for a run that is killed mid-way: it writes `part.txt`, then starts a
/// long command; a request whose last result says the call never ran gets the answer.
fn killable_server(marker: &'static str) -> FakeServer {
    FakeServer::routed(move |body| {
        let msgs = body["messages"].as_array().unwrap();
        let last = msgs.last().unwrap();
        if last["role"] == "user" {
            return openai_json(&Turn::text("").call(
                "w1",
                "write_file",
                r#"{"path": "part.txt", "content": "part one\n"}"#,
            ));
        }
        let text = last["content"].as_str().unwrap_or("");
        if text.contains("interrupted before it ran") {
            return openai_json(&Turn::text("done after all"));
        }
        openai_json(&Turn::text("").call(
            "s1",
            "run_command",
            &json!({"command": marker}).to_string(),
        ))
    })
}

fn transcript_has_call(dir: &Path, id: &str) -> bool {
    let path = dir.join("transcript.jsonl");
    path.exists()
        && read_jsonl(&path)
            .iter()
            .any(|e| e["type"] == "tool_call" && e["id"] == id)
}

#[test]
fn a_run_killed_mid_way_is_continued_from_its_transcript() {
    let env = Env::new();
    repo(&env);
    let ws = env.ws();
    let marker = "sleep 43.219";
    let server = killable_server(marker);
    let child = goal_against(
        &env,
        &server,
        &[
            "write part.txt",
            "--check-cmd",
            "grep -q 'part one' part.txt",
            "--isolation",
            "worktree",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut child = Killed(child);
    let dir = eventually(Duration::from_secs(20), "the long command", || {
        env.run_dirs()
            .into_iter()
            .find(|d| transcript_has_call(d, "s1"))
    });
    kill(Pid::from_raw(child.0.id() as i32), Signal::SIGKILL).unwrap();
    child.0.wait().unwrap();
    let old = dir.file_name().unwrap().to_str().unwrap().to_string();
    let before = server.requests().len();
    let out = env
        .sup()
        .env("OPENAI_API_KEY", "sk-test")
        .args(["continue", &old, "--json"])
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let r = run.result();
    assert_eq!(r["status"], "achieved");
    assert_eq!(r["continued_from"], old.as_str(), "{r}");
    // The first request of the continued run holds the earlier turns, the cut call answered.
    let first = &server.requests()[before].body;
    let msgs = first["messages"].as_array().unwrap();
    assert!(
        msgs.iter()
            .any(|m| m["role"] == "assistant" && m["tool_calls"][0]["id"] == "w1"),
        "{first}"
    );
    assert!(
        msgs.iter().any(|m| m["role"] == "tool"
            && m["content"]
                .as_str()
                .is_some_and(|c| c.contains("interrupted before it ran"))),
        "{first}"
    );
    // On the branch of the run it continued; the killed run's command is gone.
    let branch = format!("sup/goal/{old}");
    assert_eq!(r["branch"], branch.as_str(), "{r}");
    assert_eq!(
        git(&ws, &["show", &format!("{branch}:part.txt")]),
        "part one\n"
    );
    assert!(no_process(marker));
    assert!(!ws.join("part.txt").exists());
    let id = r["run_id"].as_str().unwrap();
    let out = env.sup().args(["show", id]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(&format!("continued from run {old}")),
        "{shown}"
    );
    let out = env.sup().args(["runs", "--json"]).output().unwrap();
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == id)
        .unwrap();
    assert_eq!(row["continued_from"], old.as_str(), "{row}");
    // Once continued, or achieved, a run is not continued again; nor an unknown one.
    for refused in [old.as_str(), id, "no-such-run"] {
        let out = env.sup().args(["continue", refused]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{refused}");
    }
}

#[test]
fn a_run_whose_goal_file_changed_its_checks_is_not_continued() {
    let env = Env::new();
    let goal = env.write("g.toml", "prompt = \"p\"\n[[check]]\nrun = \"true\"\n");
    let script = env.script(json!([{"error": "the provider is down"}]));
    let out = env
        .sup()
        .args(["goal", "--json", "--file"])
        .arg(&goal)
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 4, "{}", run.stderr);
    let id = run.result()["run_id"].as_str().unwrap().to_string();
    std::fs::write(&goal, "prompt = \"p\"\n[[check]]\nrun = \"false\"\n").unwrap();
    let out = env.sup().args(["continue", &id]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("checks changed"), "{err}");
}

#[test]
fn the_daemon_continues_a_run_it_left_interrupted() {
    let env = Env::new();
    repo(&env);
    let marker = "sleep 44.613";
    let server = killable_server(marker);
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    let ws = env.ws();
    let write_goal = |schedule: &str| {
        std::fs::write(
            dir.join("resumable.toml"),
            format!(
                "prompt = \"write part.txt\"\nmodel = \"openai:gpt-4o-mini\"\n\
                 base_url = \"{}/v1\"\nno_stream = true\nworkspace = \"{}\"\n\
                 schedule = \"{schedule}\"\ntimezone = \"UTC\"\ntries = 1\n\
                 isolation = \"worktree\"\non_interrupt = \"continue\"\napproval = \"auto\"\n\
                 [[check]]\nrun = \"grep -q 'part one' part.txt\"\n",
                server.url,
                ws.display()
            ),
        )
        .unwrap();
    };
    write_goal("* * * * * *");
    let daemon = |env: &Env| {
        Killed(
            env.sup()
                .env("OPENAI_API_KEY", "sk-test")
                .args(["daemon", "--goals"])
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut d = daemon(&env);
    let run_dir = eventually(Duration::from_secs(20), "the long command", || {
        env.run_dirs()
            .into_iter()
            .find(|d| transcript_has_call(d, "s1"))
    });
    kill(Pid::from_raw(d.0.id() as i32), Signal::SIGKILL).unwrap();
    d.0.wait().unwrap();
    let old = run_dir.file_name().unwrap().to_str().unwrap().to_string();
    // No new occurrence comes soon: only the continuation runs.
    write_goal("0 0 1 1 *");
    let _d = daemon(&env);
    let new = eventually(Duration::from_secs(30), "the continued run", || {
        let db = Db::open(env.home.path()).ok()?;
        let runs = db.runs(Some("resumable"), None, 10).ok()?;
        runs.into_iter()
            .find(|r| r.id != old && r.status == sup::store::RunStatus::Achieved)
            .map(|r| r.id)
    });
    let out = env.sup().args(["show", &new]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(&format!("continued from run {old}")),
        "{shown}"
    );
    let branch = format!("sup/resumable/{old}");
    assert_eq!(
        git(&ws, &["show", &format!("{branch}:part.txt")]),
        "part one\n"
    );
    assert!(no_process(marker));
}

#[test]
fn the_token_budget_holds_over_all_attempts_together() {
    let env = Env::new();
    repo(&env);
    // Every answer costs 110 tokens; the budget is 150 for the whole run. Alone, each of the
    // two attempts would make two requests (110 < 150 before its second); together they
    // have spent 220 once both first answers are in, so at most one more request is made.
    let server = FakeServer::routed(|_| {
        openai_json(&Turn::text("").call("t", "run_command", r#"{"command": "true"}"#))
    });
    let out = goal_against(
        &env,
        &server,
        &[
            "work",
            "--check-cmd",
            "false",
            "--tries",
            "1",
            "--parallel",
            "2",
            "--token-budget",
            "150",
            "--json",
        ],
    )
    .output()
    .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 3, "{}\n{}", run.stdout, run.stderr);
    let r = run.result();
    assert_eq!(r["status"], "unfinished", "{r}");
    assert_eq!(r["stop_reason"], "budget", "{r}");
    let n = server.requests().len();
    assert!((2..=3).contains(&n), "{n} requests");
    assert_eq!(r["attempts"].as_array().unwrap().len(), 2, "{r}");
}

#[test]
fn the_daemon_runs_a_parallel_goal_as_one_occurrence() {
    let env = Env::new();
    repo(&env);
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("twice.json"),
        serde_json::to_string(&write_agent_file()).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("twice.toml"),
        format!(
            "prompt = \"write agent.txt\"\nmodel = \"script:twice.json\"\nworkspace = \"{}\"\n\
             schedule = \"* * * * * *\"\ntimezone = \"UTC\"\ntries = 1\nparallel = 2\n\
             approval = \"auto\"\n[[check]]\nrun = \"test -f agent.txt\"\n",
            env.ws().display()
        ),
    )
    .unwrap();
    let mut d = Killed(
        env.sup()
            .args(["daemon", "--goals"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let id = eventually(
        Duration::from_secs(30),
        "an occurrence's run achieved",
        || {
            let db = Db::open(env.home.path()).ok()?;
            db.occurrences("twice", 10)
                .ok()?
                .into_iter()
                .filter_map(|(_, _, run)| run)
                .find(|r| {
                    db.run(r)
                        .is_ok_and(|row| row.status == sup::store::RunStatus::Achieved)
                })
        },
    );
    kill(Pid::from_raw(d.0.id() as i32), Signal::SIGTERM).unwrap();
    d.0.wait().unwrap();
    let out = env.sup().args(["show", &id]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("attempt 1 ·") && shown.contains("attempt 2 ·"),
        "{shown}"
    );
    // The attempts are the occurrence's run's, not occurrences of their own.
    let db = Db::open(env.home.path()).unwrap();
    let of_occurrences: Vec<String> = db
        .occurrences("twice", 100)
        .unwrap()
        .into_iter()
        .filter_map(|(_, _, r)| r)
        .collect();
    for line in shown
        .lines()
        .filter(|l| l.trim_start().starts_with("attempt "))
    {
        let attempt_id = line.split(" · ").nth(1).unwrap();
        assert!(!of_occurrences.iter().any(|o| o == attempt_id), "{line}");
    }
}

#[test]
fn an_isolated_agent_cannot_write_the_persons_tree_or_its_git() {
    let env = Env::new();
    repo(&env);
    let ws = env.ws();
    let target = ws.join("tracked.txt");
    let line = format!(
        "echo pwned >> {} ; echo pwned > {}/.git/hooks/post-commit ; git branch evil",
        target.display(),
        ws.display()
    );
    let run = env.json(
        &["goal", "x", "--check-cmd", "true"],
        json!([
            {"tool_calls": [{"id": "c", "name": "run_command", "input": {"command": line}},
                            {"id": "w", "name": "write_file",
                             "input": {"path": ".git", "content": "gitdir: /tmp\n"}}]},
            {"text": "done"}
        ]),
        &["--isolation", "worktree"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.tool_result("w")["is_error"].as_bool().unwrap(),
        "{}",
        run.stdout
    );
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "one\nchanged by the person\n"
    );
    assert!(!ws.join(".git/hooks/post-commit").exists());
    assert!(!git(&ws, &["branch", "--list"]).contains("evil"));
}

#[test]
fn a_parallel_run_is_told_once_as_one_run() {
    let env = Env::new();
    repo(&env);
    let sink = env.home.path().join("notices.jsonl");
    let script = env.script(write_agent_file());
    let goal = env.home.path().join("told.toml");
    std::fs::write(
        &goal,
        format!(
            "prompt = \"write agent.txt\"\nmodel = \"script:{}\"\nworkspace = \"{}\"\n\
             parallel = 2\ntries = 1\n[[check]]\nrun = \"test -f agent.txt\"\n\
             [[notify]]\non = [\"achieved\"]\ncommand = [\"sh\", \"-c\", \"cat >> '{}'; echo >> '{}'\"]\n",
            script.display(),
            env.ws().display(),
            sink.display(),
            sink.display()
        ),
    )
    .unwrap();
    let out = env
        .sup()
        .args(["goal", "--json", "--file"])
        .arg(&goal)
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let id = run.result()["run_id"].as_str().unwrap();
    let text = std::fs::read_to_string(&sink).unwrap();
    let notices: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(notices.len(), 1, "{text}");
    assert_eq!(notices[0]["run_id"], id);
    assert_eq!(notices[0]["event"], "achieved");
}

#[test]
fn a_scripted_run_continues_after_the_turns_it_played() {
    let env = Env::new();
    let marker = "sleep 45.127";
    let script = env.script(json!([
        {"tool_calls": [{"id": "w1", "name": "write_file",
            "input": {"path": "part.txt", "content": "part one\n"}}]},
        {"tool_calls": [{"id": "s1", "name": "run_command", "input": {"command": marker}}]},
        {"text": "done after all"}
    ]));
    let child = env
        .sup()
        .args(["goal", "write part.txt", "--check-cmd", "test -f part.txt"])
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Killed(child);
    let dir = eventually(Duration::from_secs(20), "the long command", || {
        env.run_dirs()
            .into_iter()
            .find(|d| transcript_has_call(d, "s1"))
    });
    kill(Pid::from_raw(child.0.id() as i32), Signal::SIGKILL).unwrap();
    child.0.wait().unwrap();
    let old = dir.file_name().unwrap().to_str().unwrap().to_string();
    let out = env
        .sup()
        .args(["continue", &old, "--json"])
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let r = run.result();
    assert_eq!(r["answer"], "done after all", "{r}");
    assert_eq!(r["continued_from"], old.as_str());
    // The turns played before are not played again.
    assert!(run.of_type("tool_call").is_empty(), "{}", run.stdout);
    assert!(no_process(marker));
}

#[test]
fn the_next_start_removes_the_worktree_of_a_killed_run_and_keeps_its_work() {
    let env = Env::new();
    repo(&env);
    let ws = env.ws();
    let marker = "sleep 47.311";
    let script = env.script(json!([
        {"tool_calls": [{"id": "w1", "name": "write_file",
            "input": {"path": "part.txt", "content": "part one\n"}}]},
        {"tool_calls": [{"id": "s1", "name": "run_command", "input": {"command": marker}}]},
        {"text": "done"}
    ]));
    let child = env
        .sup()
        .args(["goal", "write part.txt", "--check-cmd", "true"])
        .args(["--isolation", "worktree", "--model"])
        .arg(format!("script:{}", script.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Killed(child);
    let dir = eventually(Duration::from_secs(20), "the long command", || {
        env.run_dirs()
            .into_iter()
            .find(|d| transcript_has_call(d, "s1"))
    });
    kill(Pid::from_raw(child.0.id() as i32), Signal::SIGKILL).unwrap();
    child.0.wait().unwrap();
    let old = dir.file_name().unwrap().to_str().unwrap().to_string();
    let folder = std::fs::canonicalize(env.home.path().join("worktrees").join(&old)).unwrap();
    let listed = || git(&ws, &["worktree", "list", "--porcelain"]);
    assert!(
        listed().contains(&folder.display().to_string()),
        "{}",
        listed()
    );
    // The next start, of any run: the dead run's folder goes, its work stays on its branch.
    let run = env.run_json(json!([{"text": "hi"}]), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!folder.exists());
    assert!(
        !listed().contains(&folder.display().to_string()),
        "{}",
        listed()
    );
    let branch = format!("sup/goal/{old}");
    assert!(branches(&ws).contains(&branch), "{}", branches(&ws));
    assert_eq!(
        git(&ws, &["show", &format!("{branch}:part.txt")]),
        "part one\n"
    );
    assert!(no_process(marker));
    // The person's tree is as it was.
    assert!(!ws.join("part.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("tracked.txt")).unwrap(),
        "one\nchanged by the person\n"
    );
}

/// The attack: the worktree's `.git` file names its git folder in the person's repository,
/// and that folder's `commondir` names the repository's own `.git`. Through them the agent
/// writes a hook and an alias into the person's repository (so that their next `git
/// checkout` or `git st` runs its code), points the worktree's HEAD elsewhere, and writes
/// into the person's checkout by a relative path.
#[test]
fn an_isolated_agent_cannot_reach_the_persons_git_through_the_worktrees_pointers() {
    let env = Env::new();
    repo(&env);
    let ws = env.ws();
    let pwned = ws.join("PWNED");
    let config_before = std::fs::read(ws.join(".git/config")).unwrap();
    let status_before = git(&ws, &["status", "--porcelain"]);
    let line = format!(
        "g=$(sed -n 's/^gitdir: //p' .git); c=$g/$(cat $g/commondir); \
         printf '#!/bin/sh\\ntouch {p}\\n' > $c/hooks/post-checkout; \
         chmod +x $c/hooks/post-checkout; \
         printf '[alias]\\n\\tst = !touch {p}\\n' >> $c/config; \
         git config alias.co '!touch {p}'; \
         echo 0000000000000000000000000000000000000000 > $g/HEAD; \
         echo planted > $c/../planted.txt; \
         echo pwned >> $c/../tracked.txt; \
         echo done",
        p = pwned.display()
    );
    let run = env.json(
        &["goal", "x", "--check-cmd", "true"],
        json!([
            {"tool_calls": [{"id": "c", "name": "run_command", "input": {"command": line}},
                            {"id": "w", "name": "write_file",
                             "input": {"path": format!("{}/planted2.txt", ws.display()),
                                       "content": "x"}}]},
            {"text": "done"}
        ]),
        &["--isolation", "worktree"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.tool_result("w")["is_error"].as_bool().unwrap(),
        "{}",
        run.stdout
    );
    assert!(!ws.join(".git/hooks/post-checkout").exists());
    assert_eq!(
        std::fs::read(ws.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!ws.join("planted.txt").exists() && !ws.join("planted2.txt").exists());
    assert_eq!(git(&ws, &["status", "--porcelain"]), status_before);
    // The person's git runs nothing of the agent's.
    git(&ws, &["status"]);
    assert!(!pwned.exists());
    // The run's work was still committed on its branch.
    let branch = run.result()["branch"].as_str().unwrap().to_string();
    assert!(!git(&ws, &["log", "-1", "--format=%s", &branch]).is_empty());
}

/// The attack: parallel attempts, where one writes the answer into its siblings' worktrees
/// (found as `../*/`) and into the shared object store, so that another attempt's checks
/// pass without its own work.
#[test]
fn a_parallel_attempt_cannot_write_into_a_siblings_worktree() {
    let env = Env::new();
    repo(&env);
    let marker = "sleep 2.137";
    let server = FakeServer::routed(move |body| {
        if last_role(body) == "tool" {
            return openai_json(&Turn::text("done"));
        }
        match attempt_of(body) {
            1 => openai_json(&Turn::text("").call(
                "c",
                "run_command",
                &json!({"command":
                    "for i in $(seq 100); do [ $(ls -d ../*/ 2>/dev/null | wc -l) -ge 2 ] && break; \
                     sleep 0.05; done; me=$(pwd -P); \
                     for d in ../*/; do [ \"$(cd $d && pwd -P)\" = \"$me\" ] || \
                     echo right > $d/answer.txt; done; \
                     echo right | git hash-object -w --stdin; ls ../"}).to_string(),
            )),
            _ => openai_json(&Turn::text("").call(
                "s",
                "run_command",
                &json!({"command": marker}).to_string(),
            )),
        }
    });
    let out = goal_against(
        &env,
        &server,
        &[
            "write answer.txt",
            "--check-cmd",
            "grep -q right answer.txt",
            "--tries",
            "1",
            "--parallel",
            "2",
            "--json",
        ],
    )
    .output()
    .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.result()["status"], "failed", "{}", run.stdout);
}

#[test]
fn a_removal_cut_short_is_finished_by_the_next_start() {
    let env = Env::new();
    // What a removal killed with its process left: a folder moved aside, part of it removed.
    let left = env.home.path().join("worktrees/.removed/r-cut-short");
    std::fs::create_dir_all(left.join("src/deep")).unwrap();
    std::fs::write(left.join("src/deep/f.txt"), "left\n").unwrap();
    let run = env.run_json(json!([{"text": "hi"}]), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    crate::common::until("the folder left aside removed", 20, || !left.exists());
}

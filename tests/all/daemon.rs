//! The daemon and the history commands through the binary: real per-second schedules, two
//! daemons on one store, reloads, SIGTERM, kill -9, `sup goals`, `runs`, `show`, `trigger`,
//! `pause` and `resume`.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use crate::common::{Killed, SpawnKilled};
use std::time::{Duration, Instant};

use crate::common::{Env, eventually, stop, until};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sup::store::db::{Db, RunRow};

/// Goals live in `home/goals`; a scripted model that answers after `delay_ms`.
fn goal(env: &Env, name: &str, schedule: &str, delay_ms: u64, extra: &str) -> PathBuf {
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.json")),
        format!(r#"[{{"text": "done", "delay_ms": {delay_ms}}}]"#),
    )
    .unwrap();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "prompt = \"work\"\nmodel = \"script:{name}.json\"\nworkspace = \"work-{name}\"\n\
             schedule = \"{schedule}\"\ntimezone = \"UTC\"\ntries = 1\n{extra}\n[[check]]\nrun = \"true\"\n"
        ),
    )
    .unwrap();
    path
}

fn daemon(env: &Env, args: &[&str]) -> Killed {
    let log = std::fs::File::create(env.home.path().join(format!(
        "daemon-{}.log",
        std::fs::read_dir(env.home.path()).unwrap().count()
    )))
    .unwrap();
    env.sup()
        .arg("daemon")
        .arg("--goals")
        .arg(env.home.path().join("goals"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn_killed()
}

/// What every daemon of this test has logged so far.
fn daemon_log(env: &Env) -> String {
    let mut text = String::new();
    for e in std::fs::read_dir(env.home.path()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("daemon-") && name.ends_with(".log") {
            text.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
    }
    text
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

fn runs(env: &Env, goal: &str) -> Vec<RunRow> {
    Db::open(env.home.path())
        .unwrap()
        .runs(Some(goal), None, 1000)
        .unwrap()
}

fn sup_out(env: &Env, args: &[&str]) -> (i32, String) {
    let out = env.sup().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_per_second_schedule_runs_on_successive_occurrences() {
    let env = Env::new();
    goal(&env, "tick", "* * * * * *", 0, "");
    let d = daemon(&env, &[]);
    until("three runs", 15, || {
        runs(&env, "tick")
            .iter()
            .filter(|r| r.status == sup::store::RunStatus::Achieved)
            .count()
            >= 3
    });
    assert_eq!(stop(d), 0);
    let rows = runs(&env, "tick");
    let mut at: Vec<_> = rows
        .iter()
        .map(|r| r.scheduled_for.clone().unwrap())
        .collect();
    at.sort();
    at.dedup();
    assert_eq!(at.len(), rows.len(), "each occurrence once");
    let (code, text) = sup_out(&env, &["runs", "--goal", "tick"]);
    assert_eq!(code, 0);
    assert!(
        text.lines()
            .filter(|l| l.contains("tick") && l.contains("schedule") && l.contains("achieved"))
            .count()
            >= 3,
        "{text}"
    );
}

#[test]
fn two_daemons_on_one_store_run_each_occurrence_once() {
    let env = Env::new();
    goal(&env, "tick", "* * * * * *", 200, "overlap = \"allow\"");
    let a = daemon(&env, &[]);
    let b = daemon(&env, &[]);
    let daemons = std::collections::BTreeSet::from([a.id(), b.id()]);
    // Six occurrences raced for by both daemons (a positive count, not a pause).
    until("six runs", 20, || runs(&env, "tick").len() >= 6);
    assert_eq!(stop(a), 0);
    assert_eq!(stop(b), 0);
    let rows = runs(&env, "tick");
    let mut at: Vec<_> = rows
        .iter()
        .map(|r| r.scheduled_for.clone().unwrap())
        .collect();
    let n = at.len();
    at.sort();
    at.dedup();
    assert_eq!(at.len(), n, "no occurrence ran twice: {rows:?}");
    // Every run was made by one of the two daemons, none by anyone else.
    let pids: std::collections::BTreeSet<u32> = rows.iter().map(|r| r.pid).collect();
    assert!(
        !pids.is_empty() && pids.is_subset(&daemons),
        "runs by {pids:?}, daemons {daemons:?}"
    );
}

#[test]
fn editing_a_goal_file_changes_its_schedule_and_a_broken_one_keeps_the_old() {
    let env = Env::new();
    let path = goal(&env, "edit", "0 0 1 1 *", 0, "");
    let d = daemon(&env, &[]);
    // The witness that the daemon is up with the yearly schedule: its log says so.
    until("the daemon started with the goal", 10, || {
        daemon_log(&env).contains("daemon started: 1 goal(s) with a schedule or watch")
    });
    assert!(runs(&env, "edit").is_empty());
    goal(&env, "edit", "* * * * * *", 0, "");
    until("the new schedule fires", 10, || {
        !runs(&env, "edit").is_empty()
    });
    // Break the file: the last good version keeps its schedule.
    std::fs::write(
        &path,
        "prompt = \"work\"\nschedule = \"every now and then\"\n",
    )
    .unwrap();
    until("the broken file is refused", 10, || {
        daemon_log(&env).contains("the last good version of this goal keeps its schedule")
    });
    let before = runs(&env, "edit").len();
    until("runs go on", 10, || runs(&env, "edit").len() >= before + 2);
    let (code, text) = sup_out(
        &env,
        &[
            "goals",
            "--goals",
            env.home.path().join("goals").to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0);
    assert!(
        text.contains("edit.toml")
            && text.contains("schedule")
            && text.contains("every now and then"),
        "{text}"
    );
    assert_eq!(stop(d), 0);
}

#[test]
fn sigterm_drains_running_goals_and_records_them() {
    let env = Env::new();
    goal(&env, "slow", "* * * * * *", 1500, "");
    let d = daemon(&env, &[]);
    until("a run going", 10, || {
        runs(&env, "slow")
            .iter()
            .any(|r| r.status == sup::store::RunStatus::Running)
    });
    assert_eq!(stop(d), 0);
    let rows = runs(&env, "slow");
    assert!(!rows.is_empty());
    assert!(
        rows.iter()
            .all(|r| r.status == sup::store::RunStatus::Achieved),
        "drained to the end: {rows:?}"
    );
    for r in &rows {
        assert!(Path::new(&r.dir).join("transcript.jsonl").exists());
    }
}

#[test]
fn after_the_grace_period_running_goals_are_cancelled_and_recorded() {
    let env = Env::new();
    goal(&env, "slower", "* * * * * *", 20_000, "");
    let d = daemon(&env, &["--grace", "300ms"]);
    until("a run going", 10, || {
        runs(&env, "slower")
            .iter()
            .any(|r| r.status == sup::store::RunStatus::Running)
    });
    let started = Instant::now();
    assert_eq!(stop(d), 0);
    assert!(started.elapsed() < Duration::from_secs(15));
    let rows = runs(&env, "slower");
    assert!(
        rows.iter()
            .all(|r| r.status == sup::store::RunStatus::Interrupted),
        "{rows:?}"
    );
}

#[test]
fn a_run_killed_with_its_daemon_reads_interrupted_after_restart() {
    let env = Env::new();
    goal(&env, "victim", "* * * * * *", 30_000, "");
    let mut d = daemon(&env, &[]);
    until("a run going", 10, || {
        runs(&env, "victim")
            .iter()
            .any(|r| r.status == sup::store::RunStatus::Running)
    });
    signal(&d, Signal::SIGKILL);
    d.wait().unwrap();
    let id = runs(&env, "victim")[0].id.clone();
    // Restart: the run left `running` by a daemon that is gone is marked interrupted.
    std::fs::remove_file(env.home.path().join("goals/victim.toml")).unwrap();
    let d = daemon(&env, &[]);
    until("interrupted", 10, || {
        Db::open(env.home.path()).unwrap().run(&id).unwrap().status
            == sup::store::RunStatus::Interrupted
    });
    assert_eq!(stop(d), 0);
    let (code, text) = sup_out(&env, &["show", &id]);
    assert_eq!(code, 0);
    assert!(text.contains("outcome: interrupted"), "{text}");
    assert!(text.contains("gone"), "{text}");
}

#[test]
fn pause_and_resume_from_the_command_line() {
    let env = Env::new();
    goal(&env, "p", "* * * * * *", 0, "");
    let dir = env.home.path().join("goals");
    let dir = dir.to_str().unwrap();
    let (code, _) = sup_out(&env, &["pause", "p", "--goals", dir]);
    assert_eq!(code, 0);
    let d = daemon(&env, &[]);
    // A positive witness: occurrences came and were recorded as paused, and none ran.
    until("two occurrences recorded as paused", 10, || {
        Db::open(env.home.path())
            .unwrap()
            .occurrences("p", 10)
            .unwrap()
            .iter()
            .filter(|o| o.1 == sup::store::OccurrenceStatus::Paused)
            .count()
            >= 2
    });
    assert!(runs(&env, "p").is_empty(), "paused: nothing ran");
    let (_, text) = sup_out(&env, &["goals", "--goals", dir]);
    assert!(text.contains("· paused"), "{text}");
    assert!(text.contains("skipped while paused "), "{text}");
    assert!(!text.contains("skipped while paused 0"), "{text}");
    sup_out(&env, &["resume", "p", "--goals", dir]);
    until("runs after resume", 10, || !runs(&env, "p").is_empty());
    assert_eq!(stop(d), 0);
    let (code, text) = sup_out(&env, &["pause", "nope", "--goals", dir]);
    assert_eq!(code, 2);
    assert!(text.contains("no goal `nope`"), "{text}");
}

#[test]
fn trigger_runs_a_goal_now_recorded_as_manual() {
    let env = Env::new();
    goal(&env, "now", "0 0 1 1 *", 0, "");
    let dir = env.home.path().join("goals");
    let (code, text) = sup_out(&env, &["trigger", "now", "--goals", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("Goal achieved"), "{text}");
    let rows = runs(&env, "now");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].trigger, sup::store::TriggerKind::Manual);
}

#[test]
fn goals_lists_schedules_next_occurrences_last_results_and_errors() {
    let env = Env::new();
    goal(&env, "daily", "30 2 * * *", 0, "");
    let dir = env.home.path().join("goals");
    std::fs::write(
        dir.join("broken.toml"),
        "prompt = \"x\"\nschedule = \"0 9 * *\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("badzone.toml"),
        "prompt = \"x\"\nschedule = \"0 9 * * *\"\ntimezone = \"Moon/Base\"\n",
    )
    .unwrap();
    let (code, text) = sup_out(&env, &["goals", "--goals", dir.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = v.as_array().unwrap();
    let daily = rows.iter().find(|r| r["name"] == "daily").unwrap();
    assert_eq!(daily["schedule"], "30 2 * * *");
    assert_eq!(daily["timezone"], "UTC");
    assert_eq!(daily["next"].as_array().unwrap().len(), 3);
    assert!(daily["next"][0].as_str().unwrap().contains("T02:30:00"));
    assert!(daily["last"].is_null());
    let broken = rows
        .iter()
        .find(|r| r["file"].as_str().unwrap().ends_with("broken.toml"))
        .unwrap();
    let e = broken["error"].as_str().unwrap();
    assert!(
        e.contains("broken.toml:2:") && e.contains("schedule"),
        "{e}"
    );
    let zone = rows
        .iter()
        .find(|r| r["file"].as_str().unwrap().ends_with("badzone.toml"))
        .unwrap();
    let e = zone["error"].as_str().unwrap();
    assert!(
        e.contains("badzone.toml:3:") && e.contains("timezone") && e.contains("Moon/Base"),
        "{e}"
    );
}

#[test]
fn show_renders_each_kind_of_outcome() {
    let env = Env::new();
    let script = |turns: &str| {
        let p = env.home.path().join(format!(
            "s{}.json",
            std::fs::read_dir(env.home.path()).unwrap().count()
        ));
        std::fs::write(&p, turns).unwrap();
        format!("script:{}", p.display())
    };
    let cases: Vec<(Vec<String>, &str, &[&str])> = vec![
        (
            vec![
                "goal".into(),
                "x".into(),
                "--check-cmd".into(),
                "true".into(),
                "--model".into(),
                script(r#"[{"text": "fine"}]"#),
            ],
            "achieved",
            &["Goal achieved", "✓ true"],
        ),
        (
            vec![
                "goal".into(),
                "x".into(),
                "--check-cmd".into(),
                "echo nope-output; exit 3".into(),
                "--tries".into(),
                "1".into(),
                "--model".into(),
                script(r#"[{"text": "fine"}]"#),
            ],
            "failed",
            &["Goal not achieved", "exit 3", "nope-output"],
        ),
        (
            vec![
                "run".into(),
                "x".into(),
                "--max-steps".into(),
                "1".into(),
                "--model".into(),
                script(r#"[{"tool_calls": [{"name": "list_files", "input": {}}]}]"#),
            ],
            "unfinished",
            &["Unfinished", "max_steps", "⚙ list_files"],
        ),
        (
            vec![
                "run".into(),
                "x".into(),
                "--model".into(),
                script(r#"[{"tool_calls": [{"name": "list_files", "input": {}}]}]"#),
            ],
            "error",
            &["all were played", "error:"],
        ),
    ];
    for (args, status, wants) in cases {
        let out = env.sup().args(&args).output().unwrap();
        assert_ne!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run = Db::open(env.home.path())
            .unwrap()
            .runs(None, None, 1)
            .unwrap()
            .remove(0);
        assert_eq!(run.status.as_str(), status);
        let (code, text) = sup_out(&env, &["show", &run.id]);
        assert_eq!(code, 0);
        assert!(text.contains(&format!("outcome: {status}")), "{text}");
        for w in wants {
            assert!(text.contains(w), "{status}: wants {w}: {text}");
        }
    }
    let (code, text) = sup_out(&env, &["show", "no-such-run"]);
    assert_eq!(code, 2);
    assert!(text.contains("no run"), "{text}");
}

#[test]
fn a_scheduled_run_queues_its_approvals_instead_of_prompting() {
    let env = Env::new();
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("w.json"),
        r#"[{"tool_calls": [{"name": "write_file", "input": {"path": "made.txt", "content": "x"}}]}, {"text": "done"}]"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("w.toml"),
        "prompt = \"write\"\nmodel = \"script:w.json\"\nworkspace = \"work-w\"\nschedule = \"* * * * * *\"\n\
         timezone = \"UTC\"\n",
    )
    .unwrap();
    // No SUP_APPROVAL: the daemon's default for scheduled runs applies.
    let log = std::fs::File::create(env.home.path().join("daemon.log")).unwrap();
    let d = env
        .sup()
        .env_remove("SUP_APPROVAL")
        .args(["daemon", "--goals"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn_killed();
    let p = eventually(Duration::from_secs(15), "a queued approval", || {
        let pending = Db::open(env.home.path())
            .unwrap()
            .pending_approvals()
            .unwrap();
        pending.into_iter().next()
    });
    assert_eq!(p.goal, "w");
    assert_eq!(p.tool, "write_file");
    let id = p.id;
    assert!(!dir.join("work-w/made.txt").exists());
    let (code, _) = sup_out(&env, &["approve", &id]);
    assert_eq!(code, 0);
    until("the approved run finishes", 10, || {
        runs(&env, "w")
            .iter()
            .any(|r| r.status == sup::store::RunStatus::Achieved)
    });
    assert!(dir.join("work-w/made.txt").exists());
    assert_eq!(stop(d), 0);
}

#[test]
fn a_daemon_run_cannot_write_the_goals_folder_even_as_its_workspace() {
    let env = Env::new();
    let dir = env.ws().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    let evil =
        "prompt = \"evil\"\nsandbox = \"off\"\napproval = \"auto\"\nschedule = \"* * * * * *\"\n";
    std::fs::write(
        dir.join("a.json"),
        serde_json::json!([
            {"tool_calls": [
                {"id": "w", "name": "write_file", "input": {"path": "evil.toml", "content": evil}},
                {"id": "sed", "name": "run_command", "input": {"command": "sed -i 's/quiet/loud/' b.toml"}},
                {"id": "cmd", "name": "run_command", "input": {"command": format!("printf '{}' > evil2.toml", evil.replace('\n', "\\n"))}}
            ]},
            {"text": "done"}
        ])
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("a.toml"),
        "prompt = \"work\"\nmodel = \"script:a.json\"\nworkspace = \".\"\nschedule = \"* * * * * *\"\n\
         timezone = \"UTC\"\ntries = 1\n",
    )
    .unwrap();
    let sibling = "prompt = \"quiet\"\n";
    std::fs::write(dir.join("b.toml"), sibling).unwrap();
    // A workspace inside the goals folder stays writable, its `.git` read-only.
    std::fs::create_dir_all(dir.join("work-c/.git")).unwrap();
    std::fs::write(
        dir.join("c.json"),
        serde_json::json!([
            {"tool_calls": [
                {"id": "w", "name": "write_file", "input": {"path": "made.txt", "content": "x"}},
                {"id": "cmd", "name": "run_command", "input": {"command": "echo x > made2.txt; echo x > .git/f; echo x > ../evil3.toml"}}
            ]},
            {"text": "done"}
        ])
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("c.toml"),
        "prompt = \"work\"\nmodel = \"script:c.json\"\nworkspace = \"work-c\"\n\
         schedule = \"* * * * * *\"\ntimezone = \"UTC\"\ntries = 1\n",
    )
    .unwrap();
    let log = std::fs::File::create(env.home.path().join("daemon.log")).unwrap();
    let d = env
        .sup()
        .args(["daemon", "--goals"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn_killed();
    until("a run of a and of c finish", 15, || {
        ["a", "c"].iter().all(|g| {
            runs(&env, g)
                .iter()
                .any(|r| r.status != sup::store::RunStatus::Running)
        })
    });
    assert_eq!(stop(d), 0);
    assert!(dir.join("work-c/made.txt").exists());
    assert!(dir.join("work-c/made2.txt").exists());
    assert!(!dir.join("work-c/.git/f").exists());
    assert!(!dir.join("evil3.toml").exists());
    assert!(!dir.join("evil.toml").exists(), "write_file created a goal");
    assert!(
        !dir.join("evil2.toml").exists(),
        "a command created a goal: {}",
        std::fs::read_to_string(env.home.path().join("daemon.log")).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("b.toml")).unwrap(),
        sibling
    );
    // The run's first notice says so.
    let run = runs(&env, "a")
        .into_iter()
        .find(|r| r.status != sup::store::RunStatus::Running)
        .unwrap();
    let first = crate::common::read_jsonl(&Path::new(&run.dir).join("transcript.jsonl"))
        .into_iter()
        .find(|e| e["type"] == "notice")
        .unwrap();
    let first = first["text"].as_str().unwrap();
    assert!(
        first.contains(&format!(
            "the daemon's goals folder {} is never writable",
            std::fs::canonicalize(&dir).unwrap().display()
        )),
        "{first}"
    );
    // The model is told where it can write: not the workspace, which is read-only here.
    let told = crate::common::tool_messages(&crate::common::read_jsonl(
        &Path::new(&run.dir).join("transcript.jsonl"),
    ))
    .iter()
    .map(|m| m.to_string())
    .find(|m| m.contains("evil2.toml"))
    .unwrap();
    assert!(
        told.contains("the workspace is read-only in this run"),
        "{told}"
    );
    assert!(!told.contains("Write inside the workspace"), "{told}");
}

#[test]
fn a_daemon_runs_sweep_leaves_another_runs_background_job_alone() {
    let env = Env::new();
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(dir.join("work-a")).unwrap();
    let marker = format!("sup-keep-{}", uuid::Uuid::new_v4().simple());
    let spawn = format!(
        "setsid bash -c 'echo $$ > a.pid; exec -a {marker} sleep 60' >/dev/null 2>&1 </dev/null & \
         for i in $(seq 100); do [ -s a.pid ] && break; sleep 0.02; done"
    );
    // `a` keeps its job for its checks, and answers only after `b` has run and swept.
    std::fs::write(
        dir.join("a.json"),
        serde_json::json!([
            {"tool_calls": [{"id": "s", "name": "run_command", "input": {"command": spawn}}]},
            {"text": "done", "delay_ms": 2500}
        ])
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("a.toml"),
        "prompt = \"work\"\nmodel = \"script:a.json\"\nworkspace = \"work-a\"\n\
         schedule = \"* * * * * *\"\noverlap = \"skip\"\ntimezone = \"UTC\"\ntries = 1\n\
         keep_background = true\n[[check]]\nrun = \"test -e /proc/$(cat a.pid)\"\n",
    )
    .unwrap();
    goal(&env, "b", "* * * * * *", 0, "");
    let d = daemon(&env, &[]);
    until("a run of a finishes", 20, || {
        runs(&env, "a")
            .iter()
            .any(|r| r.status != sup::store::RunStatus::Running)
    });
    until("b swept meanwhile", 5, || {
        runs(&env, "b")
            .iter()
            .filter(|r| r.status == sup::store::RunStatus::Achieved)
            .count()
            >= 2
    });
    assert_eq!(stop(d), 0);
    let out = std::process::Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    let left = String::from_utf8_lossy(&out.stdout).to_string();
    for pid in left.lines().filter_map(|p| p.parse::<i32>().ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let a = runs(&env, "a");
    let first = a
        .iter()
        .find(|r| r.status != sup::store::RunStatus::Running)
        .unwrap();
    assert_eq!(first.status, sup::store::RunStatus::Achieved, "{:?}", first);
    assert!(left.is_empty(), "left running after the daemon: {left}");
}

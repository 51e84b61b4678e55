//! File triggers through the binary: `watch = [globs]` with `debounce` starts a goal of
//! `sup daemon` once per burst of changes under its workspace, never for its own runs'
//! writes; a bad glob or debounce is a goal file error naming the file and line.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use sup::store::db::{Db, RunRow};
use sup::store::{RunStatus, TriggerKind};

use crate::common::{Env, Killed, SpawnKilled, eventually};

const DEBOUNCE_MS: u64 = 200;

/// A goal in `home/goals` watching `src/**` of the workspace, whose run writes `src/out.txt`
/// (a file its globs match) and answers.
fn watching_goal(env: &Env) -> PathBuf {
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(env.ws().join("src")).unwrap();
    let script = json!([
        {"tool_calls": [
            {"id": "w", "name": "write_file", "input": {"path": "src/out.txt", "content": "made by the run\n"}}
        ]},
        {"text": "done"}
    ]);
    std::fs::write(dir.join("w.json"), script.to_string()).unwrap();
    let path = dir.join("w.toml");
    std::fs::write(
        &path,
        format!(
            "prompt = \"work\"\nmodel = \"script:w.json\"\nworkspace = \"{}\"\n\
             watch = [\"src/**\"]\ndebounce = \"{DEBOUNCE_MS}ms\"\n",
            env.ws().display()
        ),
    )
    .unwrap();
    path
}

fn daemon(env: &Env) -> (Killed, PathBuf) {
    let log = env.home.path().join("daemon.log");
    let child = env
        .sup()
        .env("RUST_LOG", "sup=debug")
        .arg("daemon")
        .arg("--goals")
        .arg(env.home.path().join("goals"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn_killed();
    (child, log)
}

fn runs(env: &Env) -> Vec<RunRow> {
    Db::open(env.home.path())
        .unwrap()
        .runs(Some("w"), None, 100)
        .unwrap()
}

/// Wait until `n` runs are on record and all have ended.
fn ended(env: &Env, n: usize) -> Vec<RunRow> {
    eventually(
        Duration::from_secs(30),
        &format!("{n} ended run(s)"),
        || {
            let rows = runs(env);
            (rows.len() >= n && rows.iter().all(|r| r.status != RunStatus::Running)).then_some(rows)
        },
    )
}

/// Longer than the quiet time after a run plus a debounce: a run that a change of the run's
/// own (or a second burst) had started would be on record by then.
fn past_two_debounces() {
    std::thread::sleep(Duration::from_millis(3 * DEBOUNCE_MS));
}

#[test]
fn a_burst_of_changes_starts_one_run_and_the_runs_own_writes_start_none() {
    let env = Env::new();
    watching_goal(&env);
    let (mut d, log) = daemon(&env);
    eventually(Duration::from_secs(20), "the daemon to start", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("daemon started")
            .then_some(())
    });
    // Nothing changed yet: no run.
    past_two_debounces();
    assert!(runs(&env).is_empty(), "a run before any change");

    // A burst: several files written and rewritten at once.
    for i in 0..5 {
        env.write(&format!("src/f{i}.rs"), "one");
    }
    for i in 0..5 {
        env.write(&format!("src/f{i}.rs"), "two");
    }
    env.write("README.md", "not watched");
    let rows = ended(&env, 1);
    assert_eq!(rows[0].status, RunStatus::Achieved, "{rows:?}");
    assert_eq!(rows[0].trigger, TriggerKind::Watch);
    assert_eq!(rows[0].scheduled_for, None);
    assert_eq!(
        std::fs::read_to_string(env.ws().join("src/out.txt")).unwrap(),
        "made by the run\n"
    );
    // The run wrote src/out.txt, which the globs match: no second run for that.
    past_two_debounces();
    assert_eq!(runs(&env).len(), 1, "the run's own write started another");

    // The daemon still watches: a later change starts exactly one more run.
    env.write("src/later.rs", "x");
    let rows = ended(&env, 2);
    assert!(rows.iter().all(|r| r.trigger == TriggerKind::Watch));
    past_two_debounces();
    assert_eq!(runs(&env).len(), 2, "{:?}", runs(&env));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("files it watches changed").count(),
        2,
        "{text}"
    );
    d.kill().unwrap();
}

#[test]
fn sup_goals_shows_what_a_goal_watches() {
    let env = Env::new();
    watching_goal(&env);
    let out = env
        .sup()
        .args(["goals", "--goals"])
        .arg(env.home.path().join("goals"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("watch src/**"), "{text}");
}

#[test]
fn a_bad_glob_or_debounce_is_exit_2_naming_file_and_line() {
    let env = Env::new();
    for (key, value) in [("watch", "[\"src/[x\"]"), ("debounce", "\"soon\"")] {
        let path = env.write(
            &format!("{key}.toml"),
            &format!("prompt = \"p\"\nmodel = \"script:none.json\"\n{key} = {value}\n"),
        );
        let out = env
            .sup()
            .args(["goal", "--file"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key}: {err}");
        assert!(
            err.contains(&format!("{}:3:", path.display())) && err.contains(&format!("`{key}`")),
            "{key}: {err}"
        );
    }
}

fn runs_of(env: &Env, goal: &str) -> Vec<RunRow> {
    Db::open(env.home.path())
        .unwrap()
        .runs(Some(goal), None, 100)
        .unwrap()
}

/// A goal `name` in `home/goals` watching `watch` of the workspace, whose run writes `writes`.
fn goal_writing(env: &Env, name: &str, watch: &str, writes: &str) {
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    let script = json!([
        {"tool_calls": [
            {"id": "w", "name": "write_file", "input": {"path": writes, "content": name}}
        ]},
        {"text": "done"}
    ]);
    std::fs::write(dir.join(format!("{name}.json")), script.to_string()).unwrap();
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!(
            "prompt = \"work\"\nmodel = \"script:{name}.json\"\nworkspace = \"{}\"\n\
             watch = [\"{watch}\"]\ndebounce = \"{DEBOUNCE_MS}ms\"\n",
            env.ws().display()
        ),
    )
    .unwrap();
}

fn started(log: &std::path::Path) {
    eventually(Duration::from_secs(20), "the daemon to start", || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains("daemon started")
            .then_some(())
    });
}

/// The attack: two goals watch one workspace, and each run writes what the other watches
/// (as an agent may, whatever its goal says). Each goal left out only its own runs' writes,
/// so `a`'s run started `b`, whose run started `a` again, for ever. A run's writes are now
/// left out for every goal watching the workspace it works in.
#[test]
fn two_goals_on_one_workspace_cannot_start_each_other_for_ever() {
    let env = Env::new();
    std::fs::create_dir_all(env.ws().join("a")).unwrap();
    std::fs::create_dir_all(env.ws().join("b")).unwrap();
    goal_writing(&env, "a", "a/**", "b/from-a.txt");
    goal_writing(&env, "b", "b/**", "a/from-b.txt");
    let (mut d, log) = daemon(&env);
    started(&log);
    env.write("a/start.txt", "go");
    eventually(Duration::from_secs(30), "a's run ends", || {
        let rows = runs_of(&env, "a");
        (!rows.is_empty() && rows.iter().all(|r| r.status != RunStatus::Running)).then_some(())
    });
    past_two_debounces();
    past_two_debounces();
    let (a, b) = (runs_of(&env, "a"), runs_of(&env, "b"));
    assert_eq!(a.len(), 1, "a: {a:?}\nb: {b:?}");
    assert!(b.is_empty(), "a's run started b: {b:?}");
    // b still starts on a change of someone else.
    env.write("b/by-hand.txt", "go");
    eventually(Duration::from_secs(30), "b's run ends", || {
        let rows = runs_of(&env, "b");
        (!rows.is_empty() && rows.iter().all(|r| r.status != RunStatus::Running)).then_some(())
    });
    past_two_debounces();
    past_two_debounces();
    assert_eq!(runs_of(&env, "a").len(), 1, "b's run started a again");
    d.kill().unwrap();
}

/// The attack: a run plants a link in the watched folder to a folder outside the workspace
/// (here a stand-in for other runs' folders, or `/`); at the daemon's next start, changes
/// there started the goal as changes of its workspace. Links are no longer followed.
#[test]
fn a_link_in_the_workspace_makes_no_change_outside_it_a_trigger() {
    let env = Env::new();
    watching_goal(&env);
    let outside = env.home.path().join("elsewhere");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, env.ws().join("src/link")).unwrap();
    let (mut d, log) = daemon(&env);
    started(&log);
    std::fs::write(outside.join("x.txt"), "changed outside").unwrap();
    past_two_debounces();
    past_two_debounces();
    assert!(
        runs(&env).is_empty(),
        "a change through the link started a run"
    );
    // The workspace itself is still watched.
    env.write("src/real.rs", "x");
    let rows = ended(&env, 1);
    assert_eq!(rows.len(), 1, "{rows:?}");
    d.kill().unwrap();
}

/// The attack on two daemons sharing one store and goals folder: each daemon left out only
/// the writes of the runs it ran itself, so a run of one daemon was a change for the other,
/// whose run was a change for the first, for ever.
#[test]
fn two_daemons_on_one_store_do_not_start_each_other_on_their_runs_writes() {
    let env = Env::new();
    watching_goal(&env);
    let (mut a, log_a) = daemon(&env);
    started(&log_a);
    std::fs::rename(&log_a, env.home.path().join("daemon-a.log")).unwrap();
    let (mut b, log_b) = daemon(&env);
    started(&log_b);
    env.write("src/by-hand.rs", "x");
    ended(&env, 1);
    past_two_debounces();
    past_two_debounces();
    past_two_debounces();
    let rows = runs(&env);
    assert_eq!(rows.len(), 1, "{rows:?}");
    a.kill().unwrap();
    b.kill().unwrap();
}

/// What leaves a change out is a run that works: a run on record as running whose process
/// was killed (nobody holds its lock) blocks no change of its workspace.
#[test]
fn a_killed_run_still_on_record_as_running_blocks_no_change() {
    let env = Env::new();
    watching_goal(&env);
    let db = Db::open(env.home.path()).unwrap();
    db.conn()
        .execute(
            "INSERT INTO runs (id, goal, trigger, status, started_at, pid, model, workspace, dir)
             VALUES ('killed', 'other', 'cli', 'running', '2026-01-01T00:00:00.000Z', 1,
                     'script:x', ?1, ?2)",
            [
                env.ws().display().to_string(),
                env.home.path().join("runs/killed").display().to_string(),
            ],
        )
        .unwrap();
    let (mut d, log) = daemon(&env);
    started(&log);
    env.write("src/by-hand.rs", "x");
    let rows = ended(&env, 1);
    assert_eq!(rows.len(), 1, "{rows:?}");
    d.kill().unwrap();
}

//! The daemon in-process with a manual clock: time moves when the test says, nothing waits
//! for a real schedule. Successive occurrences, missed ones outside the catch-up window,
//! retention, DST, the concurrency limit; goals that share an expression in different zones;
//! goal files edited and broken while it runs. (The decisions both daemons take alike,
//! overlap, pause, catch-up and jitter, are one table for the two in decisions.rs.)

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::eventually_async;
use chrono::{DateTime, Utc};
use sup::schedule::daemon::{self, Clock, ManualClock};
use sup::store::RunStatus;
use sup::store::db::{Db, parse_stamp};
use tokio_util::sync::CancellationToken;

struct Harness {
    max_concurrent: usize,
    goals: tempfile::TempDir,
    home: tempfile::TempDir,
    clock: Arc<ManualClock>,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    reload: Option<tokio::sync::mpsc::UnboundedSender<()>>,
}

fn t(s: &str) -> DateTime<Utc> {
    parse_stamp(s).unwrap()
}

impl Harness {
    fn new(start: &str) -> Self {
        Harness {
            max_concurrent: 4,
            goals: tempfile::tempdir().unwrap(),
            home: tempfile::tempdir().unwrap(),
            clock: Arc::new(ManualClock::new(t(start))),
            shutdown: CancellationToken::new(),
            task: None,
            reload: None,
        }
    }

    /// A goal whose scripted model answers after `delay_ms`, with a passing check.
    fn goal(&self, name: &str, extra: &str, delay_ms: u64) {
        let script = self.goals.path().join(format!("{name}.script.json"));
        std::fs::write(
            &script,
            format!(r#"[{{"text": "done", "delay_ms": {delay_ms}}}]"#),
        )
        .unwrap();
        std::fs::write(
            self.goals.path().join(format!("{name}.toml")),
            format!(
                "prompt = \"work\"\nmodel = \"script:{name}.script.json\"\nworkspace = \"work-{name}\"\n\
                 tries = 1\n{extra}\n[[check]]\nrun = \"true\"\n"
            ),
        )
        .unwrap();
    }

    fn db(&self) -> Db {
        Db::open(self.home.path()).unwrap()
    }

    fn start(&mut self) {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let cfg = daemon::Config {
            goals_dir: self.goals.path().to_path_buf(),
            home: self.home.path().to_path_buf(),
            max_concurrent: self.max_concurrent,
            grace: Duration::from_secs(5),
            clock: self.clock.clone(),
            defaults: Default::default(),
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.reload = Some(tx);
        let shutdown = self.shutdown.clone();
        self.task = Some(tokio::spawn(async move {
            daemon::run(cfg, shutdown, rx).await.unwrap();
        }));
    }

    /// Ask for the goal files to be read again, and wait until the daemon has (it stops
    /// sleeping on the clock for the reload, then sleeps again).
    async fn reload(&self) {
        self.reload.as_ref().unwrap().send(()).unwrap();
        eventually_async(Duration::from_secs(20), "the daemon to reload", || {
            (self.clock.waiting() == 0).then_some(())
        })
        .await;
        self.idle().await;
    }

    /// Wait until the daemon sleeps on the clock: it has loaded and settled.
    async fn idle(&self) {
        eventually_async(Duration::from_secs(20), "the daemon to sleep", || {
            (self.clock.waiting() > 0).then_some(())
        })
        .await;
    }

    async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    /// Wait (in real time, bounded) until `f` holds.
    async fn until(&self, what: &str, f: impl Fn(&Db) -> bool) {
        let db = self.db();
        eventually_async(Duration::from_secs(20), what, || f(&db).then_some(())).await;
    }

    fn statuses(&self, goal: &str) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .db()
            .occurrences(goal, 1000)
            .unwrap()
            .into_iter()
            .map(|(at, status, _)| (at, status.to_string()))
            .collect();
        v.sort();
        v
    }

    fn run_statuses(&self, goal: &str) -> Vec<String> {
        let mut runs = self.db().runs(Some(goal), None, 100).unwrap();
        runs.sort_by(|a, b| a.scheduled_for.cmp(&b.scheduled_for));
        runs.into_iter().map(|r| r.status.to_string()).collect()
    }

    fn advance_to(&self, s: &str) {
        self.clock.set(t(s));
    }
}

fn status_of(h: &Harness, goal: &str, at: &str) -> Option<String> {
    h.statuses(goal)
        .into_iter()
        .find(|(a, _)| parse_stamp(a) == parse_stamp(at))
        .map(|(_, s)| s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successive_occurrences_run_once_each() {
    let mut h = Harness::new("2026-01-01T00:00:00.500Z");
    h.goal("g", "schedule = \"* * * * * *\"\ntimezone = \"UTC\"", 0);
    h.start();
    h.idle().await;
    for s in ["01", "02", "03"] {
        h.advance_to(&format!("2026-01-01T00:00:{s}.100Z"));
        let at = format!("2026-01-01T00:00:{s}Z");
        h.until(&format!("{at} done"), |_| {
            status_of(&h, "g", &at).as_deref() == Some("done")
        })
        .await;
    }
    h.stop().await;
    assert_eq!(h.run_statuses("g"), ["achieved", "achieved", "achieved"]);
    let runs = h.db().runs(Some("g"), None, 10).unwrap();
    assert!(
        runs.iter()
            .all(|r| r.trigger == sup::store::TriggerKind::Schedule)
    );
}

fn prior_occurrence(h: &Harness, goal: &str, at: &str) {
    assert!(
        h.db()
            .claim(
                goal,
                t(at),
                sup::store::OccurrenceStatus::Done,
                "earlier-daemon"
            )
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_occurrences_outside_the_window_are_recorded_not_run() {
    for extra in ["catch_up = \"10s\"", ""] {
        let mut h = Harness::new("2026-01-01T00:00:30Z");
        h.goal(
            "g",
            &format!("schedule = \"* * * * *\"\ntimezone = \"UTC\"\n{extra}"),
            0,
        );
        prior_occurrence(&h, "g", "2025-12-31T23:57:00Z");
        h.start();
        h.idle().await;
        h.until("three missed", |_| {
            h.statuses("g")
                .iter()
                .filter(|(_, s)| s == "missed")
                .count()
                == 3
        })
        .await;
        // The next occurrence on time still runs.
        h.advance_to("2026-01-01T00:01:00.2Z");
        h.until("the next one runs", |_| {
            status_of(&h, "g", "2026-01-01T00:01:00Z").as_deref() == Some("done")
        })
        .await;
        h.stop().await;
        assert_eq!(h.run_statuses("g"), ["achieved"], "{extra}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_runs_are_pruned_with_their_transcripts() {
    let mut h = Harness::new("2026-01-01T00:00:00.500Z");
    h.goal(
        "g",
        "schedule = \"* * * * * *\"\ntimezone = \"UTC\"\nkeep_runs = 2",
        0,
    );
    h.start();
    h.idle().await;
    for s in ["01", "02", "03", "04"] {
        h.advance_to(&format!("2026-01-01T00:00:{s}.100Z"));
        let at = format!("2026-01-01T00:00:{s}Z");
        h.until(&at, |_| status_of(&h, "g", &at).as_deref() == Some("done"))
            .await;
    }
    h.stop().await;
    let runs = h.db().runs(Some("g"), None, 10).unwrap();
    assert_eq!(runs.len(), 2);
    let dirs = std::fs::read_dir(h.home.path().join("runs"))
        .unwrap()
        .count();
    assert_eq!(dirs, 2, "the pruned runs' folders are gone");
    for r in runs {
        assert!(Path::new(&r.dir).join("transcript.jsonl").exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dst_gap_occurrence_fires_right_after_the_gap() {
    // 02:30 on 2026-03-08 does not exist in New York: the run comes at 03:00 EDT (07:00 UTC).
    let mut h = Harness::new("2026-03-08T06:00:00Z");
    h.goal(
        "g",
        "schedule = \"30 2 * * *\"\ntimezone = \"America/New_York\"",
        0,
    );
    h.start();
    h.idle().await;
    h.advance_to("2026-03-08T07:00:00.300Z");
    h.until("ran after the gap", |_| {
        status_of(&h, "g", "2026-03-08T07:00:00Z").as_deref() == Some("done")
    })
    .await;
    h.stop().await;
    assert_eq!(h.statuses("g").len(), 1);
    let now = h.clock.now();
    assert!(now > t("2026-03-08T07:00:00Z"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occurrences_beyond_max_concurrent_wait_their_turn() {
    let mut h = Harness::new("2026-01-01T00:00:00.500Z");
    h.max_concurrent = 1;
    h.goal("a", "schedule = \"* * * * * *\"\ntimezone = \"UTC\"", 800);
    h.goal("b", "schedule = \"* * * * * *\"\ntimezone = \"UTC\"", 800);
    h.start();
    h.idle().await;
    h.advance_to("2026-01-01T00:00:01.100Z");
    h.until("both done", |db| {
        db.runs(None, Some(RunStatus::Achieved), 10).unwrap().len() == 2
    })
    .await;
    h.stop().await;
    let mut runs = h.db().runs(None, None, 10).unwrap();
    runs.sort_by(|x, y| x.started_at.cmp(&y.started_at));
    let first_end = parse_stamp(runs[0].ended_at.as_deref().unwrap()).unwrap();
    let second_start = parse_stamp(&runs[1].started_at).unwrap();
    assert!(first_end <= second_start, "one at a time: {runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goals_of_one_expression_in_different_zones_fire_at_their_own_times() {
    let mut h = Harness::new("2026-01-01T23:00:00Z");
    // 09:00 in Tokyo is 00:00 UTC; the UTC goal fires nine hours later. A third goal shares
    // the first one's expression and zone.
    h.goal(
        "tokyo",
        "schedule = \"0 9 * * *\"\ntimezone = \"Asia/Tokyo\"",
        0,
    );
    h.goal(
        "tokyo2",
        "schedule = \"0 9 * * *\"\ntimezone = \"Asia/Tokyo\"",
        0,
    );
    h.goal("utc", "schedule = \"0 9 * * *\"\ntimezone = \"UTC\"", 0);
    h.start();
    h.idle().await;
    h.advance_to("2026-01-02T00:00:00.300Z");
    h.until("the Tokyo goals ran", |_| {
        ["tokyo", "tokyo2"]
            .iter()
            .all(|g| status_of(&h, g, "2026-01-02T00:00:00Z").as_deref() == Some("done"))
    })
    .await;
    h.idle().await;
    assert!(h.statuses("utc").is_empty(), "{:?}", h.statuses("utc"));
    h.advance_to("2026-01-02T09:00:00.300Z");
    h.until("the UTC goal ran", |_| {
        status_of(&h, "utc", "2026-01-02T09:00:00Z").as_deref() == Some("done")
    })
    .await;
    h.stop().await;
    assert_eq!(h.statuses("tokyo").len(), 1, "{:?}", h.statuses("tokyo"));
    assert_eq!(h.statuses("utc").len(), 1, "{:?}", h.statuses("utc"));
    assert_eq!(h.run_statuses("utc"), ["achieved"]);
}

/// The prompt a run of `goal` started with, from its transcript.
fn prompt_of(h: &Harness, goal: &str, at: &str) -> String {
    let runs = h.db().runs(Some(goal), None, 100).unwrap();
    let run = runs
        .iter()
        .find(|r| r.scheduled_for.as_deref().and_then(parse_stamp) == Some(t(at)))
        .unwrap_or_else(|| panic!("no run at {at}: {runs:?}"));
    let text = std::fs::read_to_string(Path::new(&run.dir).join("transcript.jsonl")).unwrap();
    let started: serde_json::Value = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["type"] == "run_started")
        .unwrap();
    started["prompt"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_goal_file_runs_at_its_new_time_and_a_broken_one_as_it_was() {
    let mut h = Harness::new("2026-01-01T08:00:00Z");
    h.goal("g", "schedule = \"0 9 * * *\"\ntimezone = \"UTC\"", 0);
    h.start();
    h.idle().await;
    // Edited while the daemon sleeps: a new time and a new prompt.
    let file = h.goals.path().join("g.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("0 9 * * *", "0 10 * * *")
            .replace("prompt = \"work\"", "prompt = \"work, second version\""),
    )
    .unwrap();
    h.reload().await;
    h.advance_to("2026-01-01T10:00:00.300Z");
    h.until("ran at the new time", |_| {
        status_of(&h, "g", "2026-01-01T10:00:00Z").as_deref() == Some("done")
    })
    .await;
    h.idle().await;
    // Nothing at the old time: not run, not missed.
    assert_eq!(h.statuses("g").len(), 1, "{:?}", h.statuses("g"));
    assert_eq!(
        prompt_of(&h, "g", "2026-01-01T10:00:00Z"),
        "work, second version"
    );
    // Broken: the last good version keeps its time, and its runs are built from it.
    std::fs::write(&file, "prompt = \"unterminated\n").unwrap();
    h.reload().await;
    h.advance_to("2026-01-02T10:00:00.300Z");
    h.until("the last good version ran", |_| {
        status_of(&h, "g", "2026-01-02T10:00:00Z").as_deref() == Some("done")
    })
    .await;
    h.stop().await;
    assert_eq!(h.run_statuses("g"), ["achieved", "achieved"]);
    assert_eq!(
        prompt_of(&h, "g", "2026-01-02T10:00:00Z"),
        "work, second version"
    );
}

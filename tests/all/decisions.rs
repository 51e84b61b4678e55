//! The scheduling decisions of both daemons, one table for the two, on a manual clock: the
//! local daemon on its SQLite store and the fleet daemon on a fresh PostgreSQL database
//! (`SUP_TEST_PG`, see fleet.rs), both in-process. An occurrence fires exactly once with two
//! daemons sharing the store; overlap `allow`, `skip`, `queue` and `replace`; a paused goal
//! does not fire; catch-up after a gap (at start, and when the daemon wakes late) with the
//! missed notice; jitter within its bound, waited on the daemon's clock, at a time both
//! daemons work out alike. Time moves when the test says; a run that must stay busy waits in
//! its check for a file the test writes.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sup::schedule::clock::{Clock, ManualClock};
use sup::schedule::{daemon, fleet};
use sup::store::db::{Db, parse_stamp};
use sup::store::pg::PgStore;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use crate::fleet::Pg;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Machine {
    Local,
    Fleet,
}

const BOTH: [Machine; 2] = [Machine::Local, Machine::Fleet];

fn t(s: &str) -> DateTime<Utc> {
    parse_stamp(s).unwrap()
}

/// An occurrence or a run, as the store has it: (goal, scheduled for, status).
type Row = (String, Option<DateTime<Utc>>, String);

/// Daemons of one kind on one store and one manual clock.
struct Harness {
    machine: Machine,
    goals: TempDir,
    /// The local daemons share the first; each fleet daemon has its own.
    homes: Vec<TempDir>,
    clock: Arc<ManualClock>,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    names: Vec<String>,
    pg: Option<(Pg, tokio_postgres::Client)>,
}

impl Harness {
    async fn new(machine: Machine, start: &str) -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let pg = match machine {
            Machine::Local => None,
            Machine::Fleet => {
                let pg = tokio::task::spawn_blocking(Pg::new).await.unwrap();
                // The schema, before the test writes its rows.
                PgStore::open(&pg.url).await.unwrap();
                let (client, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                Some((pg, client))
            }
        };
        Harness {
            machine,
            goals: tempfile::tempdir().unwrap(),
            homes: vec![tempfile::tempdir().unwrap()],
            clock: Arc::new(ManualClock::new(t(start))),
            shutdown: CancellationToken::new(),
            tasks: Vec::new(),
            names: Vec::new(),
            pg,
        }
    }

    fn sql(&self) -> &tokio_postgres::Client {
        &self.pg.as_ref().unwrap().1
    }

    /// A goal in UTC whose scripted model answers at once; with `hold`, its check waits until
    /// `release` is called (the run stays busy without a real sleep).
    fn goal(&mut self, name: &str, schedule: &str, extra: &str, hold: bool) {
        let dir = self.goals.path();
        std::fs::write(
            dir.join(format!("{name}.script.json")),
            r#"[{"text": "done"}]"#,
        )
        .unwrap();
        std::fs::create_dir_all(dir.join(format!("work-{name}"))).unwrap();
        let check = if hold {
            "while [ ! -e release ]; do sleep 0.1; done"
        } else {
            "true"
        };
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "prompt = \"work\"\nmodel = \"script:{name}.script.json\"\n\
                 workspace = \"work-{name}\"\ntries = 1\nschedule = \"{schedule}\"\n\
                 timezone = \"UTC\"\n{extra}\n[[check]]\nrun = \"{check}\"\n"
            ),
        )
        .unwrap();
        self.names.push(name.to_string());
    }

    /// The held runs of `name` end.
    fn release(&self, name: &str) {
        std::fs::write(self.goals.path().join(format!("work-{name}/release")), "").unwrap();
    }

    /// A goal's `[[notify]]` table that writes each `missed` notice to a file; and the file.
    fn missed_sink(&self) -> (String, PathBuf) {
        let sink = self.goals.path().join("missed.json");
        (
            format!(
                "[[notify]]\non = [\"missed\"]\ncommand = [\"sh\", \"-c\", \"cat > '{}'\"]\n",
                sink.display()
            ),
            sink,
        )
    }

    fn db(&self) -> Db {
        Db::open(self.homes[0].path()).unwrap()
    }

    /// An occurrence an earlier daemon ran: catch-up counts from it.
    async fn prior_occurrence(&self, goal: &str, at: &str) {
        match self.machine {
            Machine::Local => {
                let done = sup::store::OccurrenceStatus::Done;
                assert!(
                    self.db()
                        .claim(goal, t(at), done, "earlier-daemon")
                        .unwrap()
                );
            }
            Machine::Fleet => {
                let at = t(at);
                self.sql()
                    .execute(
                        "INSERT INTO occurrences (goal, scheduled_for, kind, status,
                             claimed_by, claimed_at)
                         VALUES ($1, $2, 'schedule', 'done', 'earlier-daemon', now())",
                        &[&goal, &at],
                    )
                    .await
                    .unwrap();
                self.sql()
                    .execute(
                        "INSERT INTO goal_state (goal, last_occurrence) VALUES ($1, $2)",
                        &[&goal, &at],
                    )
                    .await
                    .unwrap();
            }
        }
    }

    async fn set_paused(&self, goal: &str, paused: bool) {
        match self.machine {
            Machine::Local => self.db().set_paused(goal, paused).unwrap(),
            Machine::Fleet => {
                self.sql()
                    .execute(
                        "INSERT INTO goal_state (goal, paused) VALUES ($1, $2)
                         ON CONFLICT (goal) DO UPDATE SET paused = excluded.paused",
                        &[&goal, &paused],
                    )
                    .await
                    .unwrap();
            }
        }
    }

    /// Start `n` daemons on the store, and wait until each sleeps on the clock.
    async fn start(&mut self, n: usize) {
        for i in 0..n {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<()>();
            let shutdown = self.shutdown.clone();
            let goals_dir = self.goals.path().to_path_buf();
            let clock: Arc<dyn Clock> = self.clock.clone();
            let task = match self.machine {
                Machine::Local => {
                    let cfg = daemon::Config {
                        goals_dir,
                        home: self.homes[0].path().to_path_buf(),
                        max_concurrent: 4,
                        grace: Duration::from_secs(5),
                        clock,
                        defaults: Default::default(),
                    };
                    tokio::spawn(async move {
                        let _reload = tx;
                        daemon::run(cfg, shutdown, rx).await.unwrap();
                    })
                }
                Machine::Fleet => {
                    if i > 0 {
                        self.homes.push(tempfile::tempdir().unwrap());
                    }
                    let url = self.pg.as_ref().unwrap().0.url.clone();
                    let cfg = fleet::Config {
                        goals_dir,
                        home: self.homes[i].path().to_path_buf(),
                        max_concurrent: 4,
                        grace: Duration::from_secs(5),
                        lease: Duration::from_secs(3),
                        tags: Vec::new(),
                        defaults: Default::default(),
                        store: PgStore::open(&url).await.unwrap(),
                        clock,
                    };
                    tokio::spawn(async move {
                        let _reload = tx;
                        fleet::run(cfg, shutdown, rx).await.unwrap();
                    })
                }
            };
            self.tasks.push(task);
        }
        crate::common::eventually_async(Duration::from_secs(60), "the daemons to sleep", || {
            (self.clock.waiting() >= n).then_some(())
        })
        .await;
    }

    async fn stop(&mut self) {
        self.shutdown.cancel();
        for task in self.tasks.drain(..) {
            task.await.unwrap();
        }
    }

    fn advance_to(&self, s: &str) {
        self.clock.set(t(s));
    }

    /// Every occurrence and every run in the store, each sorted by goal and time.
    async fn snapshot(&self) -> (Vec<Row>, Vec<Row>) {
        let (mut occ, mut runs): (Vec<Row>, Vec<Row>) = match self.machine {
            Machine::Local => {
                let db = self.db();
                let mut occ = Vec::new();
                for goal in &self.names {
                    for (at, status, _) in db.occurrences(goal, 1000).unwrap() {
                        occ.push((goal.clone(), parse_stamp(&at), status.to_string()));
                    }
                }
                let runs = db.runs(None, None, 1000).unwrap().into_iter().map(|r| {
                    let at = r.scheduled_for.as_deref().and_then(parse_stamp);
                    (r.goal, at, r.status.to_string())
                });
                (occ, runs.collect())
            }
            Machine::Fleet => {
                let rows = |sql: &'static str| async move {
                    self.sql()
                        .query(sql, &[])
                        .await
                        .unwrap()
                        .iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2)))
                        .collect::<Vec<Row>>()
                };
                (
                    rows("SELECT goal, scheduled_for, status FROM occurrences").await,
                    rows("SELECT goal, scheduled_for, status FROM runs").await,
                )
            }
        };
        occ.sort();
        runs.sort();
        (occ, runs)
    }

    /// Wait (in real time, bounded) until what the store holds satisfies `f`.
    async fn until(&self, what: &str, f: impl Fn(&[Row], &[Row]) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (occ, runs) = self.snapshot().await;
            if f(&occ, &runs) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}: timed out waiting for {what}\noccurrences {occ:?}\nruns {runs:?}",
                self.machine
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The statuses of `goal`'s occurrences, oldest first.
    async fn occurrences(&self, goal: &str) -> Vec<(DateTime<Utc>, String)> {
        let (occ, _) = self.snapshot().await;
        occ.into_iter()
            .filter(|(g, _, _)| g == goal)
            .map(|(_, at, s)| (at.unwrap(), s))
            .collect()
    }

    /// The statuses of `goal`'s runs, by the occurrence each is for.
    async fn runs(&self, goal: &str) -> Vec<String> {
        let (_, runs) = self.snapshot().await;
        runs.into_iter()
            .filter(|(g, _, _)| g == goal)
            .map(|(_, _, s)| s)
            .collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // The database is dropped from a blocking section: `Pg` runs a runtime of its own.
        if let Some((pg, client)) = self.pg.take() {
            drop(client);
            tokio::task::block_in_place(|| drop(pg));
        }
    }
}

fn status_at(occ: &[Row], goal: &str, at: &str) -> Option<String> {
    occ.iter()
        .find(|(g, a, _)| g == goal && *a == Some(t(at)))
        .map(|(_, _, s)| s.clone())
}

/// Whether every occurrence and run has settled: none claimed, queued or running.
fn settled(occ: &[Row], runs: &[Row]) -> bool {
    occ.iter()
        .all(|(_, _, s)| !matches!(s.as_str(), "claimed" | "queued" | "running"))
        && runs.iter().all(|(_, _, s)| s != "running")
}

/// Each case at once (each has daemons, a store and a clock of its own); what each gives,
/// in order.
async fn each<T, F: Future>(
    cases: impl IntoIterator<Item = T>,
    f: impl Fn(T) -> F,
) -> Vec<F::Output> {
    futures::future::join_all(cases.into_iter().map(f)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_occurrence_fires_exactly_once_with_two_daemons_on_one_store() {
    each(BOTH, |machine| async move {
        let mut h = Harness::new(machine, "2026-01-01T00:00:00.500Z").await;
        h.goal("tick", "* * * * * *", "", false);
        h.goal("tock", "* * * * * *", "", false);
        h.start(2).await;
        for s in ["01", "02", "03"] {
            h.advance_to(&format!("2026-01-01T00:00:{s}.100Z"));
            let at = format!("2026-01-01T00:00:{s}Z");
            h.until(&format!("{at} done"), |occ, runs| {
                ["tick", "tock"]
                    .iter()
                    .all(|g| status_at(occ, g, &at).as_deref() == Some("done"))
                    && settled(occ, runs)
            })
            .await;
        }
        h.stop().await;
        let (occ, runs) = h.snapshot().await;
        assert_eq!(occ.len(), 6, "{machine:?}: {occ:?}");
        // One run per occurrence: the same (goal, time) twice would be a second firing.
        let mut fired: Vec<Row> = runs.clone();
        fired.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        assert_eq!(fired.len(), runs.len(), "{machine:?}: {runs:?}");
        assert_eq!(runs.len(), 6, "{machine:?}: {runs:?}");
        assert!(
            runs.iter().all(|r| r.2 == "achieved"),
            "{machine:?}: {runs:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_decides_what_an_occurrence_does_while_the_last_run_goes() {
    // (overlap, the occurrences :01 :02 :03, the runs by occurrence)
    let table: [(&str, [&str; 3], &[&str]); 4] = [
        ("allow", ["done", "done", "done"], &["achieved"; 3]),
        ("skip", ["done", "skipped", "skipped"], &["achieved"]),
        (
            "queue",
            ["done", "done", "skipped"],
            &["achieved", "achieved"],
        ),
        (
            "replace",
            ["done", "done", "done"],
            &["interrupted", "interrupted", "achieved"],
        ),
    ];
    let cases = BOTH.into_iter().flat_map(|m| table.map(|row| (m, row)));
    each(
        cases,
        |(machine, (overlap, occurrences, runs))| async move {
            let mut h = Harness::new(machine, "2026-01-01T00:00:00.500Z").await;
            let (notify, sink) = h.missed_sink();
            h.goal(
                "g",
                "* * * * * *",
                &format!("overlap = \"{overlap}\"\n{notify}"),
                true,
            );
            h.start(1).await;
            h.advance_to("2026-01-01T00:00:01.100Z");
            h.until("the first run going", |_, runs| {
                runs.iter().filter(|r| r.2 == "running").count() == 1
            })
            .await;
            for s in ["02", "03"] {
                h.advance_to(&format!("2026-01-01T00:00:{s}.100Z"));
                let at = format!("2026-01-01T00:00:{s}Z");
                h.until(&format!("{at} decided"), |occ, _| {
                    status_at(occ, "g", &at).is_some_and(|s| s != "claimed")
                })
                .await;
            }
            h.release("g");
            h.until("everything settled", settled).await;
            let what = format!("{machine:?}, overlap {overlap}");
            // A skipped occurrence is told as a missed one, with why.
            let skipped: Vec<DateTime<Utc>> = (1..=3)
                .filter(|i| occurrences[i - 1] == "skipped")
                .map(|i| t(&format!("2026-01-01T00:00:0{i}Z")))
                .collect();
            if !skipped.is_empty() {
                let notice: serde_json::Value =
                    crate::common::eventually_async(Duration::from_secs(60), "the notice", || {
                        serde_json::from_str(&std::fs::read_to_string(&sink).ok()?).ok()
                    })
                    .await;
                assert_eq!(notice["status"], "skipped", "{what}: {notice}");
                let at = notice["scheduled_for"].as_str().and_then(parse_stamp);
                assert!(
                    at.is_some_and(|at| skipped.contains(&at)),
                    "{what}: {notice}"
                );
            }
            h.stop().await;
            let got: Vec<String> = h.occurrences("g").await.into_iter().map(|o| o.1).collect();
            assert_eq!(got, occurrences, "{what}");
            assert_eq!(h.runs("g").await, runs, "{what}");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_goal_does_not_fire_until_resumed() {
    each(BOTH, |machine| async move {
        let mut h = Harness::new(machine, "2026-01-01T00:00:00.500Z").await;
        h.goal("g", "* * * * * *", "", false);
        h.set_paused("g", true).await;
        h.start(1).await;
        h.advance_to("2026-01-01T00:00:01.100Z");
        h.until("paused", |occ, _| {
            status_at(occ, "g", "2026-01-01T00:00:01Z").as_deref() == Some("paused")
        })
        .await;
        h.set_paused("g", false).await;
        h.advance_to("2026-01-01T00:00:02.100Z");
        h.until("ran", |occ, runs| {
            status_at(occ, "g", "2026-01-01T00:00:02Z").as_deref() == Some("done")
                && settled(occ, runs)
        })
        .await;
        h.stop().await;
        assert_eq!(h.runs("g").await, ["achieved"], "{machine:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_gap_the_latest_within_catch_up_runs_and_the_rest_are_missed_and_told() {
    // Every minute; the daemon starts at 00:00:30. (how the gap came, catch_up, which run,
    // how many are missed, the missed occurrence told)
    let table = [
        // No daemon ran since 23:57: 23:58, 23:59 and 00:00 came due meanwhile.
        ("down", "0", None, 3, "2026-01-01T00:00:00Z"),
        (
            "down",
            "1m",
            Some("2026-01-01T00:00:00Z"),
            2,
            "2025-12-31T23:59:00Z",
        ),
        // The machine slept: the clock jumps from 00:00:30 to 00:05:30, past five.
        ("asleep", "0", None, 5, "2026-01-01T00:05:00Z"),
        (
            "asleep",
            "1m",
            Some("2026-01-01T00:05:00Z"),
            4,
            "2026-01-01T00:04:00Z",
        ),
    ];
    let cases = BOTH.into_iter().flat_map(|m| table.map(|row| (m, row)));
    each(
        cases,
        |(machine, (gap, catch_up, runs, missed, told))| async move {
            let what = format!("{machine:?}, {gap}, catch_up {catch_up}");
            let mut h = Harness::new(machine, "2026-01-01T00:00:30Z").await;
            let (notify, sink) = h.missed_sink();
            h.goal(
                "g",
                "* * * * *",
                &format!("catch_up = \"{catch_up}\"\n{notify}"),
                false,
            );
            if gap == "down" {
                h.prior_occurrence("g", "2025-12-31T23:57:00Z").await;
            }
            h.start(1).await;
            if gap == "asleep" {
                h.advance_to("2026-01-01T00:05:30Z");
            }
            let total = missed + usize::from(runs.is_some());
            h.until(&format!("{what}: {total} settled"), |occ, r| {
                occ.iter()
                    .filter(|o| o.2 == "missed" || o.2 == "done")
                    .count()
                    == total + usize::from(gap == "down")
                    && settled(occ, r)
            })
            .await;
            let notice: serde_json::Value =
                crate::common::eventually_async(Duration::from_secs(60), "the notice", || {
                    serde_json::from_str(&std::fs::read_to_string(&sink).ok()?).ok()
                })
                .await;
            h.stop().await;
            let occ = h.occurrences("g").await;
            let n_missed = occ.iter().filter(|o| o.1 == "missed").count();
            assert_eq!(n_missed, missed, "{what}: {occ:?}");
            let ran: Vec<DateTime<Utc>> = occ
                .iter()
                .filter(|o| o.1 == "done" && o.0 > t("2025-12-31T23:57:00Z"))
                .map(|o| o.0)
                .collect();
            assert_eq!(ran, runs.map(t).into_iter().collect::<Vec<_>>(), "{what}");
            let want_runs: &[&str] = if runs.is_some() { &["achieved"] } else { &[] };
            assert_eq!(h.runs("g").await, want_runs, "{what}");
            assert_eq!(notice["event"], "missed", "{what}: {notice}");
            assert_eq!(notice["goal"], "g", "{what}: {notice}");
            assert_eq!(notice["status"], "missed", "{what}: {notice}");
            assert_eq!(
                notice["scheduled_for"].as_str().and_then(parse_stamp),
                Some(t(told)),
                "{what}: {notice}"
            );
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jitter_is_waited_on_the_clock_within_its_bound_and_alike_on_both_daemons() {
    let fired = "2026-01-01T10:00:00.100Z";
    let wakes = each(BOTH, |machine| async move {
        let mut h = Harness::new(machine, "2026-01-01T09:59:00Z").await;
        h.goal("j", "0 10 * * *", "jitter = \"30m\"", false);
        h.start(1).await;
        h.advance_to(fired);
        // The run waits on the clock: a sleeper until a time within the jitter, besides the
        // daemon's own until tomorrow's occurrence.
        let bound = t(fired) + chrono::Duration::minutes(30);
        let wake = crate::common::eventually_async(
            Duration::from_secs(60),
            "the run to wait its jitter",
            || {
                h.clock
                    .deadlines()
                    .into_iter()
                    .find(|d| *d > t(fired) && *d <= bound)
            },
        )
        .await;
        assert!(h.runs("j").await.iter().all(|r| r == "running"));
        h.clock.set(wake);
        h.until("the run after its jitter", |occ, runs| {
            status_at(occ, "j", "2026-01-01T10:00:00Z").as_deref() == Some("done")
                && settled(occ, runs)
        })
        .await;
        h.stop().await;
        assert_eq!(h.runs("j").await, ["achieved"], "{machine:?}");
        wake
    })
    .await;
    // The wait is drawn from the goal and its occurrence: both daemons wait the same time.
    assert_eq!(wakes[0], wakes[1]);
}

//! The daemon at scale, each figure beside its target (issue 16): 10,000 goals loaded
//! (start-up time at most 300 ms, memory at most 30 MB; idle CPU), and 1,000 goals due in the
//! same second with a trivial scripted goal (p99 from due time to the run's row written under
//! 100 ms; how late each was claimed). Run: `cargo bench --bench schedule`; add `-- load` or
//! `-- due` for one part.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Timelike, Utc};
use sup::schedule::daemon::{self, Clock, ManualClock, SystemClock};
use sup::store::db::{Db, parse_stamp};
use tokio_util::sync::CancellationToken;

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// CPU time of this process so far (user + system), from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = fields
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

fn write_goals(dir: &Path, n: usize, schedule: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("model.json"), r#"[{"text": "done"}]"#).unwrap();
    std::fs::create_dir_all(dir.join("work")).unwrap();
    for i in 0..n {
        std::fs::write(
            dir.join(format!("g{i:05}.toml")),
            format!(
                "prompt = \"bench\"\nmodel = \"script:model.json\"\nworkspace = \"work\"\n\
                 schedule = \"{schedule}\"\ntimezone = \"UTC\"\nkeep_runs = 5\n"
            ),
        )
        .unwrap();
    }
}

async fn ten_thousand_goals() {
    let tmp = tempfile::tempdir().unwrap();
    let goals = tmp.path().join("goals");
    write_goals(&goals, 10_000, "0 9 * * *");
    let rss_before = status_kib("VmRSS:");
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let cfg = daemon::Config {
        goals_dir: goals,
        home: tmp.path().join("home"),
        max_concurrent: 4,
        grace: Duration::from_secs(5),
        clock: clock.clone(),
        defaults: Default::default(),
    };
    let shutdown = CancellationToken::new();
    let (_tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now();
    let cpu_started = cpu_time();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move { daemon::run(cfg, stop, rx).await.unwrap() });
    while clock.waiting() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let startup = started.elapsed();
    let startup_cpu = cpu_time() - cpu_started;
    let rss_loaded = status_kib("VmRSS:");
    let cpu_before = cpu_time();
    let idle = Duration::from_secs(3);
    tokio::time::sleep(idle).await;
    let cpu_idle = cpu_time() - cpu_before;
    shutdown.cancel();
    task.await.unwrap();
    let goals_mb = rss_loaded.saturating_sub(rss_before) as f64 / 1024.0;
    println!("10,000 goals loaded:");
    println!(
        "  start-up (load, check, first plan)  {:>8.0} ms   (target: at most 300 ms; \
         CPU {:.0} ms)",
        startup.as_secs_f64() * 1e3,
        startup_cpu.as_secs_f64() * 1e3
    );
    println!(
        "  memory for the goals                {goals_mb:>8.1} MB   (target: at most 30 MB; \
         {:.1} MB resident in all)",
        rss_loaded as f64 / 1024.0,
    );
    println!(
        "  idle CPU over {}s: {:.2}% of one core",
        idle.as_secs(),
        cpu_idle.as_secs_f64() / idle.as_secs_f64() * 100.0
    );
}

/// Watch the store under `home` from another thread until it holds `n` runs: when each count
/// of rows was first seen, looking every millisecond (a row is seen once committed).
fn watch_rows(
    home: std::path::PathBuf,
    n: usize,
) -> std::thread::JoinHandle<Vec<(chrono::DateTime<Utc>, usize)>> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        let db = loop {
            if let Ok(db) = Db::open(&home) {
                break db;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut seen = Vec::new();
        let mut last = 0;
        while last < n && Instant::now() < deadline {
            let count: usize = db
                .conn()
                .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
                .unwrap_or(last);
            if count > last {
                seen.push((Utc::now(), count));
                last = count;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        seen
    })
}

async fn thousand_due_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let goals = tmp.path().join("goals");
    // Every goal fires once, at the same second, a few seconds from now.
    let at = Utc::now() + chrono::Duration::seconds(4);
    let schedule = format!("{} {} {} * * *", at.second(), at.minute(), at.hour());
    write_goals(&goals, 1000, &schedule);
    let home = tmp.path().join("home");
    let cfg = daemon::Config {
        goals_dir: goals,
        home: home.clone(),
        max_concurrent: 1000,
        grace: Duration::from_secs(60),
        clock: Arc::new(SystemClock),
        defaults: Default::default(),
    };
    let shutdown = CancellationToken::new();
    let (_tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move { daemon::run(cfg, stop, rx).await.unwrap() });
    let committed = watch_rows(home.clone(), 1000);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Ok(db) = Db::open(&home) {
            let done = db
                .runs(None, Some(sup::store::RunStatus::Achieved), 2000)
                .map(|r| r.len())
                .unwrap_or(0);
            if done >= 1000 || Instant::now() > deadline {
                break;
            }
        }
    }
    shutdown.cancel();
    task.await.unwrap();
    let db = Db::open(&home).unwrap();
    let runs = db.runs(None, None, 2000).unwrap();
    let mut late: Vec<f64> = runs
        .iter()
        .filter_map(|r| {
            let due = parse_stamp(r.scheduled_for.as_deref()?)?;
            let started = parse_stamp(&r.started_at)?;
            Some((started - due).num_microseconds()? as f64 / 1000.0)
        })
        .collect();
    let due = runs
        .iter()
        .find_map(|r| parse_stamp(r.scheduled_for.as_deref()?))
        .unwrap();
    // The k-th row is on record from the first look that saw k rows.
    let seen = committed.join().unwrap();
    let mut visible: Vec<f64> = (1..=runs.len())
        .filter_map(|k| {
            let (t, _) = seen.iter().find(|(_, n)| *n >= k)?;
            Some((*t - due).num_microseconds()? as f64 / 1000.0)
        })
        .collect();
    let mut fired: Vec<f64> = Vec::new();
    for r in &runs {
        for (at, _, _) in db.occurrences(&r.goal, 1).unwrap() {
            let claimed: String = db
                .conn()
                .query_row(
                    "SELECT claimed_at FROM occurrences WHERE goal = ?1 AND scheduled_for = ?2",
                    [&r.goal, &at],
                    |row| row.get(0),
                )
                .unwrap();
            let (Some(due), Some(claimed)) = (parse_stamp(&at), parse_stamp(&claimed)) else {
                continue;
            };
            fired.push((claimed - due).num_microseconds().unwrap_or(0) as f64 / 1000.0);
        }
    }
    println!(
        "1,000 goals due in the same second (--max-concurrent 1000), {} runs:",
        late.len()
    );
    for (what, v, target) in [
        ("claimed", &mut fired, ""),
        ("run's row stamped", &mut late, ""),
        (
            "run's row committed",
            &mut visible,
            "   (target: p99 under 100 ms)",
        ),
    ] {
        v.sort_by(f64::total_cmp);
        let pct = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
        println!(
            "  due to {what:<18} median {:>7.1} ms, p99 {:>7.1} ms, max {:>7.1} ms{target}",
            pct(0.5),
            pct(0.99),
            pct(1.0)
        );
    }
    let _ = SystemClock.now();
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // `cargo bench --bench schedule -- load` (or `-- due`) runs one part, for a profiler.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    if wanted("load") {
        rt.block_on(ten_thousand_goals());
    }
    if wanted("due") {
        rt.block_on(thousand_due_at_once());
    }
}

//! Benchmark: 10,000 goals across three fleet daemons (separate processes of the binary) on
//! one PostgreSQL database, 1,000 of them due in the same second. Prints the time from the
//! due time to each run row (p50, p99, max), the runs per daemon and the duplicates.
//!
//! `cargo bench --bench fleet`; the server is `SUP_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/`); `SUP_BENCH_LOGS=DIR` keeps the daemons' debug logs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GOALS: usize = 10_000;
const DUE: usize = 1_000;
const DAEMONS: usize = 3;

fn base() -> String {
    let b = std::env::var("SUP_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/".into());
    if b.ends_with('/') { b } else { format!("{b}/") }
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL is not reachable at {url}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    c
}

async fn one(url: &str, sql: &str) -> i64 {
    connect(url).await.query_one(sql, &[]).await.unwrap().get(0)
}

/// The daemons, killed however the benchmark ends.
struct Daemons(Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for d in &mut self.0 {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let name = format!("sup_bench_{}", fastrand::u32(..));
    let admin = format!("{}postgres", base());
    connect(&admin)
        .await
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let url = format!("{}{name}", base());
    let dir = tempfile::tempdir().unwrap();
    let goals = dir.path().join("goals");
    std::fs::create_dir_all(goals.join("work")).unwrap();
    std::fs::write(goals.join("m.json"), r#"[{"text": "done"}]"#).unwrap();
    // The 1,000 are due at second 30 of every minute; measured is the first such second after
    // all three daemons loaded every goal.
    let at = "30 * * * * *";
    for i in 0..GOALS {
        let schedule = if i < DUE { at } else { "0 0 0 1 1 *" };
        std::fs::write(
            goals.join(format!("g{i:05}.toml")),
            format!(
                "prompt = \"p\"\nmodel = \"script:m.json\"\nworkspace = \"work\"\n\
                 schedule = \"{schedule}\"\ntimezone = \"UTC\"\ntries = 1\noverlap = \"allow\"\n"
            ),
        )
        .unwrap();
    }
    // The schema, made on first use by any command.
    let made = Command::new(env!("CARGO_BIN_EXE_sup"))
        .args(["runs"])
        .env("SUP_STORE", &url)
        .env("SUP_HOME", dir.path().join("cli"))
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    // `SUP_BENCH_LOGS=DIR` keeps each daemon's debug log there.
    let logs = std::env::var("SUP_BENCH_LOGS").ok();
    let started = Instant::now();
    let daemons = Daemons(
        (0..DAEMONS)
            .map(|m| {
                let home = dir.path().join(format!("home{m}"));
                Command::new(env!("CARGO_BIN_EXE_sup"))
                    .args([
                        "daemon",
                        "--lease",
                        "10s",
                        "--max-concurrent",
                        "8",
                        "--goals",
                    ])
                    .arg(&goals)
                    .env("SUP_HOME", &home)
                    .env("SUP_HOST", format!("m{m}"))
                    .env("SUP_STORE", &url)
                    .env("SUP_APPROVAL", "auto")
                    .env("SUP_CONFIG", dir.path().join("none.toml"))
                    .env(
                        "RUST_LOG",
                        if logs.is_some() { "sup=debug" } else { "warn" },
                    )
                    .stdout(Stdio::null())
                    .stderr(match &logs {
                        Some(dir) => Stdio::from(
                            std::fs::File::create(format!("{dir}/daemon-m{m}.log")).unwrap(),
                        ),
                        None => Stdio::null(),
                    })
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    loop {
        let published = one(&url, "SELECT count(*) FROM goal_versions").await;
        if published >= (GOALS * DAEMONS) as i64 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the daemons did not load their goals in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let now = chrono::Utc::now();
    let minute = now
        - chrono::Duration::nanoseconds(i64::from(now.timestamp_subsec_nanos()))
        - chrono::Duration::seconds(i64::from(chrono::Timelike::second(&now)));
    let mut due = minute + chrono::Duration::seconds(30);
    if due <= now {
        due += chrono::Duration::seconds(60);
    }
    println!(
        "fleet: {DAEMONS} daemons loaded {GOALS} goals each in {:.1}s; {} due at {}",
        started.elapsed().as_secs_f64(),
        DUE,
        due.format("%H:%M:%S")
    );
    while chrono::Utc::now() < due + chrono::Duration::seconds(5) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let c = connect(&url).await;
    let mut lat: Vec<f64> = c
        .query(
            "SELECT (extract(epoch FROM created_at - scheduled_for) * 1000)::float8 FROM runs
             WHERE scheduled_for = $1",
            &[&due],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    let dups = one(
        &url,
        "SELECT count(*) - count(DISTINCT (goal, scheduled_for)) FROM runs",
    )
    .await;
    let per: Vec<String> = c
        .query(
            "SELECT host, count(*) FROM runs WHERE scheduled_for = $1 GROUP BY host ORDER BY host",
            &[&due],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect();
    println!(
        "fleet: {} run rows of {DUE} due (target all) · due→run row p50 {:.1}ms · p99 {:.1}ms \
         (target < 200ms) · max {:.1}ms · duplicates {dups} (target 0) · per daemon: {}",
        lat.len(),
        pct(0.50),
        pct(0.99),
        pct(1.0),
        per.join(", ")
    );
    drop(daemons);
    drop(c);
    let _ = connect(&admin)
        .await
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await;
}

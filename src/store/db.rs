//! The SQLite store at `SUP_HOME/sup.db` (WAL, versioned migrations): runs and their check
//! results, claimed schedule occurrences (unique on goal and time, so an occurrence runs at
//! most once however many daemons share the store), approval requests, and per-goal state.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{Connection, OptionalExtension, params};

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
];

/// A time as the store keeps it: RFC 3339, UTC, whole seconds unless sub-second.
pub fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

pub fn parse_stamp(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// One row of `runs`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunRow {
    pub id: String,
    pub goal: String,
    pub trigger: String,
    pub scheduled_for: Option<String>,
    pub status: String,
    pub stop_reason: Option<String>,
    pub tries: u32,
    pub steps: u32,
    pub usage: Usage,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub error: Option<String>,
    pub pid: u32,
    pub model: String,
    pub workspace: String,
    pub dir: String,
}

/// What a new run is.
pub struct NewRun<'a> {
    pub id: &'a str,
    pub goal: &'a str,
    pub trigger: &'a str,
    pub scheduled_for: Option<DateTime<Utc>>,
    pub model: &'a str,
    pub workspace: &'a str,
    pub dir: &'a str,
}

/// How a run ended.
pub struct Ended<'a> {
    pub status: Status,
    pub stop_reason: StopReason,
    pub tries: u32,
    pub steps: u32,
    pub usage: Usage,
    pub error: Option<&'a str>,
    pub checks: &'a [Vec<CheckReport>],
}

/// One approval request.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ApprovalRow {
    pub id: String,
    pub run_id: String,
    pub goal: String,
    /// `tool` (a call waiting for a yes) or `check` (a person as a check).
    pub kind: String,
    pub tool: String,
    pub input: String,
    pub created_at: String,
    pub deadline: String,
    /// `pending`, `approved`, `denied`, `timed_out`, `cancelled`.
    pub status: String,
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
pub struct GoalStats {
    pub paused: bool,
    pub skipped: u64,
    pub missed: u64,
    pub last: Option<RunRow>,
}

pub struct Db {
    conn: Connection,
    path: String,
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
        Ok(Db { conn, path: shown })
    }

    fn err(&self, source: rusqlite::Error) -> DbError {
        DbError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    pub fn start_run(&self, run: &NewRun) -> Result<(), DbError> {
        self.conn
            .prepare_cached(
                "INSERT INTO runs (id, goal, trigger, scheduled_for, status, started_at, pid, model, workspace, dir)
                 VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6, ?7, ?8, ?9)",
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
                    run.dir
                ]))
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The model of a run recorded before its model was built, once its name is known.
    pub fn set_run_model(&self, id: &str, model: &str) -> Result<(), DbError> {
        self.conn
            .execute(
                "UPDATE runs SET model = ?2 WHERE id = ?1",
                params![id, model],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// A run recorded as started that could not start: an error, with why.
    pub fn fail_run(&self, id: &str, error: &str) -> Result<(), DbError> {
        self.conn
            .execute(
                "UPDATE runs SET status = 'error', stop_reason = 'error', ended_at = ?2, error = ?3
                 WHERE id = ?1 AND status = 'running'",
                params![id, stamp(Utc::now()), error],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn finish_run(&mut self, id: &str, end: &Ended) -> Result<(), DbError> {
        let path = self.path.clone();
        let err = |source| DbError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(err)?;
        tx.execute(
            "UPDATE runs SET status = ?2, stop_reason = ?3, tries = ?4, steps = ?5,
                 input_tokens = ?6, output_tokens = ?7, cache_read_tokens = ?8,
                 cache_write_tokens = ?9, ended_at = ?10, error = ?11 WHERE id = ?1",
            params![
                id,
                end.status.as_str(),
                end.stop_reason.as_str(),
                end.tries,
                end.steps,
                end.usage.input_tokens,
                end.usage.output_tokens,
                end.usage.cache_read_tokens,
                end.usage.cache_write_tokens,
                stamp(Utc::now()),
                end.error
            ],
        )
        .map_err(err)?;
        for (t, reports) in end.checks.iter().enumerate() {
            for (i, r) in reports.iter().enumerate() {
                tx.execute(
                    "INSERT OR REPLACE INTO checks (run_id, try, idx, name, passed, exit_status, outcome, duration_ms, output_path)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    params![id, t + 1, i, r.name, r.passed, r.exit_status, r.outcome, r.duration_ms, r.output_path],
                )
                .map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    /// Runs left `running` by a process that is gone become `interrupted`. Returns how many.
    pub fn mark_orphans(&self) -> Result<usize, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, pid FROM runs WHERE status = 'running'")
            .map_err(|e| self.err(e))?;
        let rows: Vec<(String, u32)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))?;
        let mut n = 0;
        for (id, pid) in rows {
            if !pid_alive(pid) {
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
        }
        Ok(n)
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
        status: Option<&str>,
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
    pub fn checks(&self, id: &str) -> Result<Vec<(u32, CheckReport)>, DbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT try, name, passed, exit_status, outcome, duration_ms, output_path
                 FROM checks WHERE run_id = ?1 ORDER BY try, idx",
            )
            .map_err(|e| self.err(e))?;
        stmt.query_map([id], |r| {
            Ok((
                r.get(0)?,
                CheckReport {
                    name: r.get(1)?,
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

    /// Delete all but the newest `keep` finished runs of `goal`; returns their folders.
    pub fn prune(&self, goal: &str, keep: u32) -> Result<Vec<String>, DbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, dir FROM runs WHERE goal = ?1 AND status != 'running'
                 ORDER BY started_at DESC, id DESC LIMIT -1 OFFSET ?2",
            )
            .map_err(|e| self.err(e))?;
        let old: Vec<(String, String)> = stmt
            .query_map(params![goal, keep], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))?;
        for (id, _) in &old {
            self.conn
                .execute("DELETE FROM runs WHERE id = ?1", [id])
                .map_err(|e| self.err(e))?;
        }
        Ok(old.into_iter().map(|(_, dir)| dir).collect())
    }

    /// Claim an occurrence. `false`: it is claimed already (by another daemon, or before).
    pub fn claim(
        &self,
        goal: &str,
        at: DateTime<Utc>,
        status: &str,
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
    pub fn occurrence(
        &self,
        goal: &str,
        at: DateTime<Utc>,
        status: &str,
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
    pub fn last_occurrence(&self, goal: &str) -> Result<Option<DateTime<Utc>>, DbError> {
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

    pub fn paused(&self, goal: &str) -> Result<bool, DbError> {
        Ok(self
            .conn
            .prepare_cached("SELECT paused FROM goal_state WHERE goal = ?1")
            .and_then(|mut st| st.query_row([goal], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))?
            .unwrap_or(false))
    }

    pub fn goal_stats(&self, goal: &str) -> Result<GoalStats, DbError> {
        let count = |status: &str| -> Result<u64, DbError> {
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
            skipped: count("skipped")?,
            missed: count("missed")?,
            last: self.runs(Some(goal), None, 1)?.into_iter().next(),
        })
    }

    /// Occurrences of a goal, newest first: (scheduled_for, status, run_id).
    pub fn occurrences(
        &self,
        goal: &str,
        limit: u32,
    ) -> Result<Vec<(String, String, Option<String>)>, DbError> {
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
    pub fn request_approval(&self, req: &ApprovalRow) -> Result<(), DbError> {
        self.conn
            .execute(
                "INSERT INTO approvals (id, run_id, goal, kind, tool, input, created_at, deadline, status)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending')",
                params![
                    req.id,
                    req.run_id,
                    req.goal,
                    req.kind,
                    req.tool,
                    req.input,
                    req.created_at,
                    req.deadline
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn approval(&self, id: &str) -> Result<Option<ApprovalRow>, DbError> {
        self.conn
            .query_row("SELECT * FROM approvals WHERE id = ?1", [id], approval_of)
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Pending requests, oldest first.
    pub fn pending_approvals(&self) -> Result<Vec<ApprovalRow>, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT * FROM approvals WHERE status = 'pending' ORDER BY created_at, id")
            .map_err(|e| self.err(e))?;
        stmt.query_map([], approval_of)
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))
    }

    /// Answer a pending request; `false` when it is not pending (answered, expired, gone).
    pub fn decide_approval(
        &self,
        id: &str,
        status: &str,
        always: bool,
        reason: Option<&str>,
        by: &str,
    ) -> Result<bool, DbError> {
        let n = self
            .conn
            .execute(
                "UPDATE approvals SET status = ?2, always = ?3, reason = ?4, decided_at = ?5,
                     decided_by = ?6 WHERE id = ?1 AND status = 'pending'",
                params![id, status, always, reason, stamp(Utc::now()), by],
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
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
    fn an_occurrence_is_claimed_once_across_connections() {
        let dir = tempfile::tempdir().unwrap();
        let a = Db::open(dir.path()).unwrap();
        let b = Db::open(dir.path()).unwrap();
        let at = Utc::now();
        assert!(a.claim("g", at, "claimed", "a").unwrap());
        assert!(!b.claim("g", at, "claimed", "b").unwrap());
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
                trigger: "cli",
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

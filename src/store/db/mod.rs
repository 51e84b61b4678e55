//! The SQLite store at `SUP_HOME/sup.db` (WAL, versioned migrations): runs and their check
//! results, claimed schedule occurrences (unique on goal and time, so an occurrence runs at
//! most once however many daemons share the store), approval requests, and per-goal state.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::{ApprovalKind, ApprovalStatus, OccurrenceStatus, RunStatus, TriggerKind};
use crate::model::Usage;
use crate::trace::{CheckReport, Outcome, StopReason};

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

mod approvals;
mod kept;
mod runs;
mod schedule;
mod schema;

use schema::MIGRATIONS;

pub(crate) use kept::{KeptOutcome, KeptRun, OUTCOME_FILE, PATIENCE};

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
    pub stop_reason: Option<StopReason>,
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

/// The answer to an approval request, as either store records it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Answer<'a> {
    pub(crate) status: ApprovalStatus,
    pub(crate) always: bool,
    pub(crate) reason: Option<&'a str>,
    pub(crate) by: &'a str,
}

impl<'a> Answer<'a> {
    /// Nobody answered before the deadline.
    pub(crate) const TIMED_OUT: Answer<'static> =
        Answer::ended(ApprovalStatus::TimedOut, "the deadline");
    /// The run stopped waiting.
    pub(crate) const CANCELLED: Answer<'static> =
        Answer::ended(ApprovalStatus::Cancelled, "the run was cancelled");

    /// A person's answer: approved (`always`: the same tool and subject for the rest of the
    /// run too) or denied.
    pub(crate) fn given(approve: bool, always: bool, reason: Option<&'a str>, by: &'a str) -> Self {
        let status = if approve {
            ApprovalStatus::Approved
        } else {
            ApprovalStatus::Denied
        };
        Answer {
            status,
            always,
            reason,
            by,
        }
    }

    const fn ended(status: ApprovalStatus, by: &'a str) -> Answer<'a> {
        Answer {
            status,
            always: false,
            reason: None,
            by,
        }
    }

    /// The answer `row` holds (one given in the other store, to record in this one).
    pub(crate) fn of(row: &'a ApprovalRow) -> Answer<'a> {
        Answer {
            status: row.status,
            always: row.always,
            reason: row.reason.as_deref(),
            by: row.decided_by.as_deref().unwrap_or("someone"),
        }
    }
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
    /// Whether the store's file is no longer the one this connection writes: deleted, or
    /// replaced by another (writes would go to a file nobody reads).
    pub(crate) fn is_replaced(&self) -> bool {
        identity(Path::new(&self.path)) != self.file
    }

    /// A SQLite error of this store, naming its file.
    pub(crate) fn err(&self, source: rusqlite::Error) -> DbError {
        DbError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Run the statement `sql`; how many rows it changed.
    pub(crate) fn execute(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<usize, DbError> {
        self.conn.execute(sql, params).map_err(|e| self.err(e))
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
    fn a_burst_is_claimed_once_by_the_daemons_that_share_a_store() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Db::open(dir.path()).unwrap(), Db::open(dir.path()).unwrap());
        let t = parse_stamp("2026-11-30T09:47:26Z").unwrap();
        let window = std::time::Duration::from_secs(1);
        let ms = chrono::Duration::milliseconds;
        assert!(a.claim_burst("w", t, window, "a").unwrap());
        // The other daemon saw the same burst come due a moment later, or earlier.
        assert!(!b.claim_burst("w", t + ms(3), window, "b").unwrap());
        assert!(!b.claim_burst("w", t - ms(900), window, "b").unwrap());
        // Another goal, or a later burst, is claimed.
        assert!(b.claim_burst("v", t, window, "b").unwrap());
        assert!(b.claim_burst("w", t + ms(1500), window, "b").unwrap());
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
                &Outcome {
                    status: crate::trace::Status::Achieved,
                    stop_reason: StopReason::Final,
                    steps: 2,
                    tries: 1,
                    ..Outcome::error(None)
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

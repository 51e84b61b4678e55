//! One read side over either history: the local SQLite store under `SUP_HOME` or a fleet's
//! PostgreSQL store. It holds what the commands and the console read and answer alike (runs
//! and their pages, checks, transcript lines, approval requests and their answers, pause),
//! taking and returning the typed vocabulary; each operation is one match over the two.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use super::db::{Answer, ApprovalRow, Db, DbError, GoalStats, RunRow};
use super::pg::{FleetRun, PgError, PgStore};
use super::query::{self, RunFilter};
use super::{ApprovalStatus, RunStatus};
use crate::trace::CheckReport;

#[derive(Debug, thiserror::Error)]
pub(crate) enum HistoryError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Pg(#[from] PgError),
    #[error("reading the run store failed: {0}")]
    Task(String),
}

impl HistoryError {
    /// Whether the run asked for is not in the store.
    pub(crate) fn is_no_run(&self) -> bool {
        matches!(
            self,
            HistoryError::Db(DbError::NoRun(_)) | HistoryError::Pg(PgError::NoRun(_))
        )
    }
}

/// Why an approval request was not answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AnswerError {
    #[error("approval request {id} is no longer waiting: it was {status} by {by}")]
    NotWaiting {
        id: String,
        status: String,
        by: String,
    },
    #[error("no approval request `{0}`; `sup approvals` lists the waiting ones")]
    NoRequest(String),
    #[error(transparent)]
    Store(#[from] HistoryError),
}

/// A run and, in a fleet, where it ran.
pub(crate) type Located = (RunRow, Option<Ran>);

/// Where a fleet's run ran.
#[derive(Clone, Debug)]
pub(crate) struct Ran {
    pub(crate) host: String,
    /// The daemon that ran it; none for a run a `sup trigger` ran itself.
    pub(crate) daemon: Option<String>,
}

impl Ran {
    fn of(f: &FleetRun) -> Ran {
        Ran {
            host: f.host.clone(),
            daemon: f.daemon_id.clone(),
        }
    }
}

/// The history a command or the console reads.
#[derive(Clone, Debug)]
pub(crate) enum History {
    /// The SQLite store of this `SUP_HOME`, opened for each operation (off the async threads,
    /// its runs whose processes are gone marked first).
    Local(PathBuf),
    Fleet(Box<PgStore>),
}

impl History {
    /// Run `f` on the local store in `home`, off the async threads.
    async fn local<T: Send + 'static>(
        home: &Path,
        f: impl FnOnce(&Db) -> Result<T, DbError> + Send + 'static,
    ) -> Result<T, HistoryError> {
        let home = home.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let db = Db::open(&home)?;
            // A run whose process is gone is no longer running, whoever asks.
            db.mark_orphans()?;
            f(&db)
        })
        .await
        .map_err(|e| HistoryError::Task(e.to_string()))?
        .map_err(HistoryError::from)
    }

    pub(crate) fn is_fleet(&self) -> bool {
        matches!(self, History::Fleet(_))
    }

    /// One page of runs (`offset`, `limit`), newest first, and how many match in all.
    pub(crate) async fn runs_page(
        &self,
        goal: Option<String>,
        status: Option<RunStatus>,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<RunRow>, u64), HistoryError> {
        match self {
            History::Local(home) => {
                Self::local(home, move |db| {
                    let filter = RunFilter {
                        goal: goal.as_deref(),
                        status,
                    };
                    query::runs_page(db, &filter, offset, limit)
                })
                .await
            }
            History::Fleet(pg) => {
                let filter = RunFilter {
                    goal: goal.as_deref(),
                    status,
                };
                let (rows, total) = pg.runs_page(&filter, offset, limit).await?;
                Ok((rows.into_iter().map(|f| f.run).collect(), total))
            }
        }
    }

    /// The names of goals that have runs, sorted.
    pub(crate) async fn goal_names(&self) -> Result<Vec<String>, HistoryError> {
        match self {
            History::Local(home) => Self::local(home, query::goal_names).await,
            History::Fleet(pg) => Ok(pg.goal_names().await?),
        }
    }

    /// One run, and the host it ran on in a fleet.
    pub(crate) async fn run(&self, id: &str) -> Result<Located, HistoryError> {
        match self {
            History::Local(home) => {
                let id = id.to_string();
                Ok((Self::local(home, move |db| db.run(&id)).await?, None))
            }
            History::Fleet(pg) => {
                let f = pg.run(id).await?;
                let ran = Ran::of(&f);
                Ok((f.run, Some(ran)))
            }
        }
    }

    /// Each try's check results of a run.
    pub(crate) async fn checks(&self, id: &str) -> Result<Vec<(u32, CheckReport)>, HistoryError> {
        match self {
            History::Local(home) => {
                let id = id.to_string();
                Self::local(home, move |db| db.checks(&id)).await
            }
            History::Fleet(pg) => Ok(pg.checks(id).await?),
        }
    }

    /// A run's transcript lines (JSON) from position `from` on, each with the position after
    /// it: a byte offset in the run's file, or a sequence number in the fleet's store.
    pub(crate) async fn lines(
        &self,
        run: &RunRow,
        from: u64,
    ) -> Result<Vec<(String, u64)>, HistoryError> {
        match self {
            History::Local(_) => {
                let path = Path::new(&run.dir).join("transcript.jsonl");
                let (text, _) = read_lines(&path, from);
                let mut at = from;
                Ok(text
                    .split_inclusive('\n')
                    .map(|l| {
                        at += l.len() as u64;
                        (l.to_string(), at)
                    })
                    .collect())
            }
            History::Fleet(pg) => {
                let from = i64::try_from(from).unwrap_or(i64::MAX);
                Ok(pg
                    .events_from(&run.id, from)
                    .await?
                    .iter()
                    .map(|(seq, v)| (format!("{v}\n"), (*seq + 1).max(0) as u64))
                    .collect())
            }
        }
    }

    /// Requests waiting for an answer, oldest first.
    pub(crate) async fn pending_approvals(&self) -> Result<Vec<ApprovalRow>, HistoryError> {
        match self {
            History::Local(home) => Self::local(home, |db| db.pending_approvals()).await,
            History::Fleet(pg) => Ok(pg.approvals(ApprovalStatus::Pending).await?),
        }
    }

    /// Answered (or expired) requests, newest answer first, with when they were answered.
    pub(crate) async fn answered_approvals(
        &self,
        limit: u32,
    ) -> Result<Vec<(ApprovalRow, Option<String>)>, HistoryError> {
        match self {
            History::Local(home) => {
                Self::local(home, move |db| query::answered_approvals(db, limit)).await
            }
            History::Fleet(pg) => Ok(pg.answered_approvals(limit).await?),
        }
    }

    /// Approve or deny a waiting request as `by`; returns the status recorded, or why none
    /// was.
    pub(crate) async fn answer(
        &self,
        id: &str,
        approve: bool,
        always: bool,
        reason: Option<&str>,
        by: &str,
    ) -> Result<ApprovalStatus, AnswerError> {
        let answer = Answer::given(approve, always, reason, by);
        let (decided, row) = match self {
            History::Local(home) => {
                let (id, reason, by) = (id.to_string(), reason.map(str::to_string), by.to_string());
                Self::local(home, move |db| {
                    let answer = Answer::given(approve, always, reason.as_deref(), &by);
                    if db.decide_approval(&id, answer)? {
                        return Ok((true, None));
                    }
                    Ok((false, db.approval(&id)?))
                })
                .await?
            }
            History::Fleet(pg) => {
                if pg
                    .decide_approval(id, answer)
                    .await
                    .map_err(HistoryError::from)?
                {
                    (true, None)
                } else {
                    (false, pg.approval(id).await.map_err(HistoryError::from)?)
                }
            }
        };
        if decided {
            return Ok(answer.status);
        }
        Err(match row {
            Some(r) => AnswerError::NotWaiting {
                id: id.to_string(),
                status: r.status.as_str().replace('_', " "),
                by: r.decided_by.unwrap_or_else(|| "someone".into()),
            },
            None => AnswerError::NoRequest(id.to_string()),
        })
    }

    /// Runs, newest first.
    pub(crate) async fn runs(
        &self,
        goal: Option<&str>,
        status: Option<RunStatus>,
        limit: u32,
    ) -> Result<Vec<RunRow>, HistoryError> {
        match self {
            History::Local(home) => {
                let goal = goal.map(str::to_string);
                Self::local(home, move |db| db.runs(goal.as_deref(), status, limit)).await
            }
            History::Fleet(pg) => Ok(pg
                .runs(&RunFilter { goal, status }, 0, limit)
                .await?
                .into_iter()
                .map(|f| f.run)
                .collect()),
        }
    }

    /// Runs as `sup runs` lists them, newest first: each with where it ran, and as `--json`
    /// gives it (with its lineage and worktree, and in a fleet where it ran).
    pub(crate) async fn listed(
        &self,
        goal: Option<&str>,
        status: Option<RunStatus>,
        limit: u32,
    ) -> Result<Vec<(Located, serde_json::Value)>, HistoryError> {
        match self {
            History::Local(home) => {
                let goal = goal.map(str::to_string);
                Self::local(home, move |db| {
                    let rows = db.runs(goal.as_deref(), status, limit)?;
                    Ok(rows
                        .into_iter()
                        .map(|r| {
                            let mut v = serde_json::to_value(&r).unwrap_or_default();
                            if let (Some(obj), Ok(l)) = (v.as_object_mut(), db.lineage(&r.id))
                                && let Ok(serde_json::Value::Object(extra)) =
                                    serde_json::to_value(l)
                            {
                                obj.extend(extra);
                            }
                            ((r, None), v)
                        })
                        .collect())
                })
                .await
            }
            History::Fleet(pg) => Ok(pg
                .runs(&RunFilter { goal, status }, 0, limit)
                .await?
                .into_iter()
                .map(|f| {
                    let v = serde_json::to_value(&f).unwrap_or_default();
                    let ran = Ran::of(&f);
                    ((f.run, Some(ran)), v)
                })
                .collect()),
        }
    }

    /// A goal's figures (paused, skipped and missed occurrences, its last run) and how many
    /// of its occurrences were skipped while it was paused.
    pub(crate) async fn goal_stats(&self, goal: &str) -> Result<(GoalStats, u64), HistoryError> {
        match self {
            History::Local(home) => {
                let goal = goal.to_string();
                Self::local(home, move |db| db.goal_stats(&goal)).await
            }
            History::Fleet(pg) => Ok(pg.goal_stats(goal).await?),
        }
    }

    /// Record a webhook delivery of `goal`: whether it is new (one seen before, by any
    /// console of the same store, runs nothing).
    pub(crate) async fn new_delivery(&self, goal: &str, id: &str) -> Result<bool, HistoryError> {
        match self {
            History::Local(home) => {
                let (goal, id) = (goal.to_string(), id.to_string());
                Self::local(home, move |db| db.new_delivery(&goal, &id)).await
            }
            History::Fleet(pg) => Ok(pg.new_delivery(goal, id).await?),
        }
    }

    /// Forget a delivery whose run could not start, so that it may be delivered again.
    pub(crate) async fn forget_delivery(&self, goal: &str, id: &str) -> Result<(), HistoryError> {
        match self {
            History::Local(home) => {
                let (goal, id) = (goal.to_string(), id.to_string());
                Self::local(home, move |db| db.forget_delivery(&goal, &id)).await
            }
            History::Fleet(pg) => Ok(pg.forget_delivery(goal, id).await?),
        }
    }

    pub(crate) async fn paused(&self, goal: &str) -> Result<bool, HistoryError> {
        match self {
            History::Local(home) => {
                let goal = goal.to_string();
                Self::local(home, move |db| db.paused(&goal)).await
            }
            History::Fleet(pg) => Ok(pg.goal_state(goal).await?.0),
        }
    }

    /// The status of the occurrence of `goal` at `at`, if one was recorded (a fleet also
    /// records `interrupted`).
    pub(crate) async fn occurrence_status(
        &self,
        goal: &str,
        at: DateTime<Utc>,
    ) -> Result<Option<String>, HistoryError> {
        match self {
            History::Local(home) => {
                let goal = goal.to_string();
                let seen = Self::local(home, move |db| db.occurrence_status(&goal, at)).await?;
                Ok(seen.map(|s| s.to_string()))
            }
            History::Fleet(pg) => Ok(pg.occurrence_status(goal, at).await?),
        }
    }

    /// Whether a daemon with a live lease serves `goal`; `None` where the history cannot say
    /// (the local one has no leases).
    pub(crate) async fn live_daemon_for(&self, goal: &str) -> Result<Option<bool>, HistoryError> {
        match self {
            History::Local(_) => Ok(None),
            History::Fleet(pg) => Ok(Some(pg.live_daemon_for(goal).await?)),
        }
    }

    /// Pause or resume `goal` (for the whole fleet in a fleet).
    pub(crate) async fn set_paused(&self, goal: &str, paused: bool) -> Result<(), HistoryError> {
        match self {
            History::Local(home) => {
                let goal = goal.to_string();
                Self::local(home, move |db| db.set_paused(&goal, paused)).await
            }
            History::Fleet(pg) => Ok(pg.set_paused(goal, paused).await?),
        }
    }
}

/// The whole lines of the file at `path` from byte `from` on, and the offset after them.
fn read_lines(path: &Path, from: u64) -> (String, u64) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return (String::new(), from);
    };
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_err() || f.read_to_end(&mut buf).is_err() {
        return (String::new(), from);
    }
    let end = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    buf.truncate(end);
    (
        String::from_utf8_lossy(&buf).into_owned(),
        from + end as u64,
    )
}

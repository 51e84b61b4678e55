//! Runs: their start and end, their checks, notices and what they cost; the history's
//! queries and pruning.

use super::*;

impl Db {
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
        self.execute(
            "UPDATE runs SET model = ?2 WHERE id = ?1",
            params![id, model],
        )?;
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
        self.execute(
            "UPDATE runs SET status = 'error', stop_reason = 'error', ended_at = ?2, error = ?3
             WHERE id = ?1 AND status = 'running'",
            params![
                id,
                stamp(Utc::now()),
                crate::redact::text(error).into_owned()
            ],
        )?;
        Ok(())
    }

    /// Record how a run ended, retrying a busy or locked store with backoff for up to
    /// `patience`; the waits are async, so a daemon's other runs go on meanwhile.
    pub(crate) async fn finish_run_patiently(
        &mut self,
        id: &str,
        end: &Outcome,
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

    pub(crate) fn finish_run(&mut self, id: &str, end: &Outcome) -> Result<(), DbError> {
        let path = self.path.clone();
        let err = |source| DbError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(err)?;
        Self::write_end(&tx, id, end).map_err(err)?;
        tx.commit().map_err(err)
    }

    pub(super) fn write_end(
        tx: &rusqlite::Transaction,
        id: &str,
        end: &Outcome,
    ) -> rusqlite::Result<()> {
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
                end.error
                    .as_deref()
                    .map(|e| crate::redact::text(e).into_owned()),
                end.cost,
                end.answer
                    .as_deref()
                    .map(|a| crate::redact::text(a).into_owned())
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

    pub(super) fn run_of(r: &rusqlite::Row) -> rusqlite::Result<RunRow> {
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

    /// The runs, of any goal and process, that were going at some time from `from` on: not
    /// ended before it (the newest thousand).
    pub(crate) fn runs_going_since(&self, from: DateTime<Utc>) -> Result<Vec<RunRow>, DbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT * FROM runs WHERE status = 'running' OR ended_at >= ?1
                 ORDER BY started_at DESC, id DESC LIMIT 1000",
            )
            .map_err(|e| self.err(e))?;
        stmt.query_map(params![stamp(from)], Self::run_of)
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
        self.execute(
            "INSERT INTO notifications (run_id, goal, event, channel, attempt, at, ok, detail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                n.run_id, n.goal, n.event, n.channel, n.attempt, n.at, n.ok, n.detail
            ],
        )?;
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
}

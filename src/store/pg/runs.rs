//! The fleet's runs: their start, transcript events and end, and the history's queries.

use super::*;
use crate::store::lineage::{self, Lineage};
use crate::store::query::RunFilter;

impl PgStore {
    /// What the run's own process says once it started: its local id, model, folders.
    pub(crate) async fn run_started(
        &self,
        id: &str,
        local_id: &str,
        model: &str,
        workspace: &str,
        dir: &str,
    ) -> Result<(), PgError> {
        self.execute(
            "UPDATE runs SET local_id = $2, model = $3, workspace = $4, dir = $5 WHERE id = $1",
            &[&id, &local_id, &model, &workspace, &dir],
        )
        .await
    }

    /// The cost of a running run so far, so that the day's spending counts it while it
    /// runs and after its daemon is killed.
    pub(crate) async fn set_run_cost(&self, id: &str, cost: f64) -> Result<(), PgError> {
        self.execute(
            "UPDATE runs SET cost = $2 WHERE id = $1 AND status = 'running'",
            &[&id, &cost],
        )
        .await
    }

    /// Append transcript events (seq, event).
    pub(crate) async fn events(
        &self,
        id: &str,
        events: &[(i64, serde_json::Value)],
    ) -> Result<(), PgError> {
        if events.is_empty() {
            return Ok(());
        }
        let seqs: Vec<i64> = events.iter().map(|(s, _)| *s).collect();
        let values: Vec<&serde_json::Value> = events.iter().map(|(_, v)| v).collect();
        self.execute(
            "INSERT INTO events (run_id, seq, event)
             SELECT $1, s, e FROM unnest($2::bigint[], $3::jsonb[]) AS u(s, e)
             ON CONFLICT DO NOTHING",
            &[&id, &seqs, &values],
        )
        .await
    }

    /// Record how a run ended, and close its occurrence. A run the fleet had declared
    /// interrupted keeps that status; its outcome is still recorded in the error text.
    pub(crate) async fn finish_run(&self, id: &str, finish: &Finish) -> Result<(), PgError> {
        let end = &finish.outcome;
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(&e))?;
        tx.execute(
            "UPDATE runs SET status = CASE WHEN status = 'interrupted' THEN status ELSE $2 END,
                 stop_reason = $3, tries = $4, steps = $5, input_tokens = $6,
                 output_tokens = $7, cache_read_tokens = $8, cache_write_tokens = $9,
                 ended_at = now(), error = coalesce($10, error), cost = $11, answer = $12
             WHERE id = $1",
            &[
                &id,
                &end.status.as_str(),
                &end.stop_reason.as_str(),
                &(end.tries as i32),
                &(end.steps as i32),
                &(end.usage.input_tokens as i64),
                &(end.usage.output_tokens as i64),
                &(end.usage.cache_read_tokens as i64),
                &(end.usage.cache_write_tokens as i64),
                &end.error,
                &end.cost,
                &end.answer,
            ],
        )
        .await
        .map_err(|e| self.err(&e))?;
        let l = &finish.lineage;
        let attempt = l.attempt.map(|a| a as i32);
        tx.execute(
            &lineage::update_sql('$'),
            &[
                &id,
                &l.continued_from,
                &l.parent,
                &attempt,
                &l.branch,
                &l.base,
                &l.commit,
                &l.diff_stat,
                &l.repo,
            ],
        )
        .await
        .map_err(|e| self.err(&e))?;
        for (t, reports) in end.checks.iter().enumerate() {
            for (i, r) in reports.iter().enumerate() {
                tx.execute(
                    "INSERT INTO checks (run_id, try, idx, name, passed, exit_status, outcome,
                         duration_ms, output_path)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     ON CONFLICT (run_id, try, idx) DO NOTHING",
                    &[
                        &id,
                        &(t as i32 + 1),
                        &(i as i32),
                        &r.name,
                        &r.passed,
                        &r.exit_status,
                        &r.outcome,
                        &(r.duration_ms as i64),
                        &r.output_path,
                    ],
                )
                .await
                .map_err(|e| self.err(&e))?;
            }
        }
        tx.execute(
            "UPDATE occurrences SET status = CASE WHEN status = 'interrupted' THEN status
                 ELSE 'done' END WHERE run_id = $1",
            &[&id],
        )
        .await
        .map_err(|e| self.err(&e))?;
        tx.commit().await.map_err(|e| self.err(&e))
    }

    /// The runs `filter` selects, newest first: `limit` of them from `offset` on.
    pub(crate) async fn runs(
        &self,
        filter: &RunFilter<'_>,
        offset: u32,
        limit: u32,
    ) -> Result<Vec<FleetRun>, PgError> {
        self.rows(
            &select_runs(&format!(
                " WHERE {FILTERED} ORDER BY started_at DESC, id DESC LIMIT $3 OFFSET $4"
            )),
            &[
                &filter.goal,
                &filter.status,
                &i64::from(limit),
                &i64::from(offset),
            ],
            run_of,
        )
        .await
    }

    /// One run by its fleet id or its local id.
    pub(crate) async fn run(&self, id: &str) -> Result<FleetRun, PgError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                &select_runs(" WHERE id = $1 OR local_id = $1 LIMIT 1"),
                &[&id],
            )
            .await
            .map_err(|e| self.err(&e))?
            .ok_or_else(|| PgError::NoRun(id.to_string()))?;
        Ok(run_of(&row))
    }

    pub(crate) async fn checks(&self, id: &str) -> Result<Vec<(u32, CheckReport)>, PgError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT try, name, passed, exit_status, outcome, duration_ms, output_path
                 FROM checks WHERE run_id = $1 ORDER BY try, idx",
                &[&id],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<_, i32>(0) as u32,
                    CheckReport {
                        kind: crate::trace::CheckKind::of_name(r.get(1)),
                        model: None,
                        name: r.get(1),
                        passed: r.get(2),
                        exit_status: r.get(3),
                        outcome: r.get(4),
                        duration_ms: r.get::<_, i64>(5) as u64,
                        output_tail: String::new(),
                        output_path: r.get(6),
                    },
                )
            })
            .collect())
    }

    /// The last run of `goal` that ended, other than `except`: what `previous.*` in a
    /// template sees, whichever daemon ran it.
    pub(crate) async fn previous_run(
        &self,
        goal: &str,
        except: &str,
    ) -> Result<Option<FleetRun>, PgError> {
        self.row(
            &select_runs(
                " WHERE goal = $1 AND id <> $2
                     AND status <> 'running'
                 ORDER BY started_at DESC, id DESC LIMIT 1",
            ),
            &[&goal, &except],
            run_of,
        )
        .await
    }

    /// Whether `goal` is paused, and its last occurrence.
    pub(crate) async fn goal_state(
        &self,
        goal: &str,
    ) -> Result<(bool, Option<DateTime<Utc>>), PgError> {
        let c = self.client().await?;
        Ok(c.query_opt(
            "SELECT paused, last_occurrence FROM goal_state WHERE goal = $1",
            &[&goal],
        )
        .await
        .map_err(|e| self.err(&e))?
        .map_or((false, None), |r| (r.get(0), r.get(1))))
    }

    /// The status of the occurrence of `goal` at `at`, if the fleet recorded one.
    pub(crate) async fn occurrence_status(
        &self,
        goal: &str,
        at: DateTime<Utc>,
    ) -> Result<Option<String>, PgError> {
        let c = self.client().await?;
        Ok(c.query_opt(
            "SELECT status FROM occurrences WHERE goal = $1 AND scheduled_for = $2",
            &[&goal, &at],
        )
        .await
        .map_err(|e| self.err(&e))?
        .map(|r| r.get(0)))
    }

    /// US dollars spent by the runs of `goal` started at or after `since`, on any daemon.
    pub(crate) async fn cost_since(
        &self,
        goal: &str,
        since: DateTime<Utc>,
    ) -> Result<f64, PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT coalesce(sum(cost), 0)::float8 FROM runs
                 WHERE goal = $1 AND started_at >= $2",
                &[&goal, &since],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(row.get(0))
    }

    /// One page of runs (`offset`, `limit`), newest first, and how many match in all: the web
    /// console's list.
    pub(crate) async fn runs_page(
        &self,
        filter: &RunFilter<'_>,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<FleetRun>, u64), PgError> {
        let total: Option<i64> = self
            .row(
                &format!("SELECT count(*) FROM runs WHERE {FILTERED}"),
                &[&filter.goal, &filter.status],
                |r| r.get(0),
            )
            .await?;
        let rows = self.runs(filter, offset, limit).await?;
        Ok((rows, total.unwrap_or(0).max(0) as u64))
    }

    /// The names of goals that have runs, sorted.
    pub(crate) async fn goal_names(&self) -> Result<Vec<String>, PgError> {
        self.rows("SELECT DISTINCT goal FROM runs ORDER BY goal", &[], |r| {
            r.get(0)
        })
        .await
    }

    /// A run's transcript events from sequence number `from` on, each with its number.
    pub(crate) async fn events_from(
        &self,
        id: &str,
        from: i64,
    ) -> Result<Vec<(i64, serde_json::Value)>, PgError> {
        self.rows(
            "SELECT seq, event FROM events WHERE run_id = $1 AND seq >= $2 ORDER BY seq",
            &[&id, &from],
            |r| (r.get(0), r.get(1)),
        )
        .await
    }

    /// What the goals page shows of a goal: paused, skipped and missed occurrences, the last
    /// run, and occurrences skipped while paused.
    pub(crate) async fn goal_stats(&self, goal: &str) -> Result<(GoalStats, u64), PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT coalesce((SELECT paused FROM goal_state WHERE goal = $1), false),
                     count(*) FILTER (WHERE status = 'skipped'),
                     count(*) FILTER (WHERE status = 'missed'),
                     count(*) FILTER (WHERE status = 'paused')
                 FROM occurrences WHERE goal = $1",
                &[&goal],
            )
            .await
            .map_err(|e| self.err(&e))?;
        let n = |i: usize| row.get::<_, i64>(i).max(0) as u64;
        let last = self.previous_run(goal, "").await?.map(|f| f.run);
        Ok((
            GoalStats {
                paused: row.get(0),
                skipped: n(1),
                missed: n(2),
                last,
            },
            n(3),
        ))
    }
}

/// How a run ended, and its lineage: what can wait on disk while the store is away.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Finish {
    #[serde(flatten)]
    pub(crate) outcome: Outcome,
    /// What ties the run to others and what its worktree left.
    #[serde(default)]
    pub(crate) lineage: Lineage,
}

/// The condition on runs of a `RunFilter`: `$1` the goal, `$2` the status, each when given.
const FILTERED: &str = "($1::text IS NULL OR goal = $1) AND ($2::text IS NULL OR status = $2)";

/// `SELECT` the columns `run_of` reads (the lineage's last, from 25 on) `FROM runs`, then
/// `rest`.
fn select_runs(rest: &str) -> String {
    format!("SELECT {} FROM runs{rest}", *RUN_COLUMNS)
}

/// The columns `run_of` reads.
static RUN_COLUMNS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "id, goal, trigger, scheduled_for, status, stop_reason, tries, steps, input_tokens,
         output_tokens, cache_read_tokens, cache_write_tokens, started_at, ended_at, error, pid,
         model, workspace, dir, host, daemon_id, local_id, created_at, cost, answer, {}",
        lineage::COLUMNS
    )
});

/// A run as the fleet keeps it: the SQLite row plus where it ran.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct FleetRun {
    #[serde(flatten)]
    pub(crate) run: RunRow,
    pub(crate) host: String,
    pub(crate) daemon_id: Option<String>,
    local_id: Option<String>,
    #[serde(flatten)]
    lineage: Lineage,
}

fn run_of(r: &tokio_postgres::Row) -> FleetRun {
    let t = |i: usize| r.get::<_, Option<DateTime<Utc>>>(i).map(stamp);
    FleetRun {
        run: RunRow {
            id: r.get(0),
            goal: r.get(1),
            trigger: r.get(2),
            scheduled_for: t(3),
            status: r.get(4),
            stop_reason: r.get(5),
            tries: r.get::<_, i32>(6) as u32,
            steps: r.get::<_, i32>(7) as u32,
            usage: Usage {
                input_tokens: r.get::<_, i64>(8) as u64,
                output_tokens: r.get::<_, i64>(9) as u64,
                cache_read_tokens: r.get::<_, i64>(10) as u64,
                cache_write_tokens: r.get::<_, i64>(11) as u64,
            },
            started_at: t(12).unwrap_or_default(),
            ended_at: t(13),
            error: r.get(14),
            pid: r.get::<_, i32>(15) as u32,
            model: r.get(16),
            workspace: r.get(17),
            dir: r.get(18),
            cost: r.get(23),
            answer: r.get(24),
        },
        host: r.get(19),
        daemon_id: r.get(20),
        local_id: r.get(21),
        lineage: Lineage {
            continued_from: r.get(25),
            parent: r.get(26),
            attempt: r.get::<_, Option<i32>>(27).map(|a| a.max(0) as u32),
            branch: r.get(28),
            base: r.get(29),
            commit: r.get(30),
            diff_stat: r.get(31),
            repo: r.get(32),
        },
    }
}

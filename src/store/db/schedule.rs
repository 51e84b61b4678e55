//! Schedule occurrences (claimed once across processes) and per-goal state: pause and
//! the last occurrence.

use super::*;

impl Db {
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
        self.claimed(goal, at, n)
    }

    /// Claim a watch trigger's occurrence at `at`, unless the goal has one within `window`
    /// of it: each daemon sharing the store sees the same burst of changes come due at its
    /// own moment, and the first to claim runs it. One statement, so two daemons cannot
    /// both find the window empty.
    pub(crate) fn claim_burst(
        &self,
        goal: &str,
        at: DateTime<Utc>,
        window: std::time::Duration,
        by: &str,
    ) -> Result<bool, DbError> {
        let window = chrono::Duration::from_std(window).unwrap_or_default();
        let n = self
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO occurrences (goal, scheduled_for, status, claimed_by, claimed_at)
                 SELECT ?1, ?2, ?3, ?4, ?5
                 WHERE NOT EXISTS (SELECT 1 FROM occurrences
                                   WHERE goal = ?1 AND scheduled_for BETWEEN ?6 AND ?7)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    goal,
                    stamp(at),
                    OccurrenceStatus::Claimed,
                    by,
                    stamp(Utc::now()),
                    stamp(at - window),
                    stamp(at + window)
                ])
            })
            .map_err(|e| self.err(e))?;
        self.claimed(goal, at, n)
    }

    /// After a claim's insert of `n` rows: the goal's last occurrence moves to `at`.
    fn claimed(&self, goal: &str, at: DateTime<Utc>, n: usize) -> Result<bool, DbError> {
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
        self.execute(
            "INSERT INTO goal_state (goal, paused) VALUES (?1, ?2)
             ON CONFLICT (goal) DO UPDATE SET paused = excluded.paused",
            params![goal, paused],
        )?;
        Ok(())
    }

    /// Record a webhook delivery of `goal`: whether it is new (one seen before runs nothing).
    /// What is kept is bounded (see `crate::store::REPLAY_WINDOW`): deliveries older than
    /// the window are forgotten, and a goal keeps its newest `MAX_DELIVERIES`.
    pub(crate) fn new_delivery(&self, goal: &str, delivery: &str) -> Result<bool, DbError> {
        let now = Utc::now();
        let since =
            now - chrono::Duration::from_std(crate::store::REPLAY_WINDOW).unwrap_or_default();
        self.execute(
            "DELETE FROM webhook_deliveries WHERE received_at < ?1",
            params![stamp(since)],
        )?;
        let n = self.execute(
            "INSERT OR IGNORE INTO webhook_deliveries (goal, delivery, received_at)
             VALUES (?1, ?2, ?3)",
            params![goal, delivery, stamp(now)],
        )?;
        if n == 1 {
            self.execute(
                "DELETE FROM webhook_deliveries WHERE goal = ?1 AND delivery IN (
                     SELECT delivery FROM webhook_deliveries WHERE goal = ?1
                     ORDER BY received_at DESC, rowid DESC LIMIT -1 OFFSET ?2)",
                params![goal, crate::store::MAX_DELIVERIES],
            )?;
        }
        Ok(n == 1)
    }

    /// Forget a delivery whose run could not start, so that it may be delivered again.
    pub(crate) fn forget_delivery(&self, goal: &str, delivery: &str) -> Result<(), DbError> {
        self.execute(
            "DELETE FROM webhook_deliveries WHERE goal = ?1 AND delivery = ?2",
            params![goal, delivery],
        )?;
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

    /// A goal's figures (paused, skipped and missed occurrences, its last run) and how many
    /// of its occurrences were skipped while it was paused.
    pub(crate) fn goal_stats(&self, goal: &str) -> Result<(GoalStats, u64), DbError> {
        let count = |status: OccurrenceStatus| -> Result<u64, DbError> {
            self.conn
                .query_row(
                    "SELECT count(*) FROM occurrences WHERE goal = ?1 AND status = ?2",
                    params![goal, status],
                    |r| r.get(0),
                )
                .map_err(|e| self.err(e))
        };
        let stats = GoalStats {
            paused: self.paused(goal)?,
            skipped: count(OccurrenceStatus::Skipped)?,
            missed: count(OccurrenceStatus::Missed)?,
            last: self.runs(Some(goal), None, 1)?.into_iter().next(),
        };
        Ok((stats, count(OccurrenceStatus::Paused)?))
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
}

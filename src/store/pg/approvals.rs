//! Approval requests in the fleet: mirrored as made, answered once, the waiting daemon woken.

use super::*;

impl PgStore {
    /// Mirror a local approval request into the store (once).
    pub(crate) async fn put_approval(&self, a: &ApprovalRow, daemon: &str) -> Result<(), PgError> {
        self.insert_approval(a, Some(daemon)).await
    }

    /// Put a run's request in the store as it is made (once), under the daemon that runs
    /// the fleet's run `fleet_run`.
    pub(crate) async fn request_approval(
        &self,
        a: &ApprovalRow,
        fleet_run: &str,
    ) -> Result<(), PgError> {
        let c = self.client().await?;
        let daemon: Option<String> = c
            .query_opt("SELECT daemon_id FROM runs WHERE id = $1", &[&fleet_run])
            .await
            .map_err(|e| self.err(&e))?
            .and_then(|r| r.get(0));
        self.insert_approval(a, daemon.as_deref()).await
    }

    async fn insert_approval(&self, a: &ApprovalRow, daemon: Option<&str>) -> Result<(), PgError> {
        self.execute(
            "INSERT INTO approvals (id, run_id, goal, kind, tool, input, created_at, deadline,
                 status, daemon_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', $9) ON CONFLICT (id) DO NOTHING",
            &[
                &a.id,
                &a.run_id,
                &a.goal,
                &a.kind,
                &a.tool,
                &a.input,
                &a.created_at,
                &a.deadline,
                &daemon,
            ],
        )
        .await
    }

    pub(crate) async fn approval(&self, id: &str) -> Result<Option<ApprovalRow>, PgError> {
        self.row(
            &format!("SELECT {COLUMNS} FROM approvals WHERE id = $1"),
            &[&id],
            approval_of,
        )
        .await
    }

    /// Requests of one status (`pending`: waiting), oldest first.
    pub(crate) async fn approvals(
        &self,
        status: ApprovalStatus,
    ) -> Result<Vec<ApprovalRow>, PgError> {
        self.rows(
            &format!("SELECT {COLUMNS} FROM approvals WHERE status = $1 ORDER BY created_at, id"),
            &[&status],
            approval_of,
        )
        .await
    }

    /// Answered (or expired) requests, newest answer first, with when they were answered.
    pub(crate) async fn answered_approvals(
        &self,
        limit: u32,
    ) -> Result<Vec<(ApprovalRow, Option<String>)>, PgError> {
        self.rows(
            &format!(
                "SELECT {COLUMNS}, decided_at FROM approvals WHERE status <> 'pending'
                 ORDER BY decided_at DESC NULLS LAST, id LIMIT $1"
            ),
            &[&i64::from(limit)],
            |r| {
                let at: Option<DateTime<Utc>> = r.get(12);
                (approval_of(r), at.map(stamp))
            },
        )
        .await
    }

    /// Answer a pending request and wake the daemon whose run waits; `false` when it is not
    /// pending.
    pub(crate) async fn decide_approval(&self, id: &str, a: Answer<'_>) -> Result<bool, PgError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "UPDATE approvals SET status = $2, always = $3, reason = $4, decided_at = now(),
                     decided_by = $5 WHERE id = $1 AND status = 'pending'",
                &[&id, &a.status, &a.always, &a.reason, &a.by],
            )
            .await
            .map_err(|e| self.err(&e))?;
        if n == 1 {
            c.execute("SELECT pg_notify('sup_approval', $1)", &[&id])
                .await
                .map_err(|e| self.err(&e))?;
        }
        Ok(n == 1)
    }

    /// A request that ended where its run waits (timed out, cancelled) ends here too.
    pub(crate) async fn close_approval(
        &self,
        id: &str,
        status: ApprovalStatus,
    ) -> Result<(), PgError> {
        self.execute(
            "UPDATE approvals SET status = $2, decided_at = now() WHERE id = $1 AND status = 'pending'",
            &[&id, &status],
        )
        .await
    }
}

/// The columns `approval_of` reads, in its order.
const COLUMNS: &str =
    "id, run_id, goal, kind, tool, input, created_at, deadline, status, always, reason, decided_by";

fn approval_of(r: &tokio_postgres::Row) -> ApprovalRow {
    ApprovalRow {
        id: r.get(0),
        run_id: r.get(1),
        goal: r.get(2),
        kind: r.get(3),
        tool: r.get(4),
        input: r.get(5),
        created_at: r.get(6),
        deadline: r.get(7),
        status: r.get(8),
        always: r.get(9),
        reason: r.get(10),
        decided_by: r.get(11),
    }
}

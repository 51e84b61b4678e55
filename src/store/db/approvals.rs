//! Approval requests: stored pending, read, and answered once.

use super::*;

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

impl Db {
    /// Store a pending approval request.
    pub(crate) fn request_approval(&self, req: &ApprovalRow) -> Result<(), DbError> {
        self.execute(
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
        )?;
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
    pub(crate) fn decide_approval(&self, id: &str, a: Answer<'_>) -> Result<bool, DbError> {
        let n = self.execute(
            "UPDATE approvals SET status = ?2, always = ?3, reason = ?4, decided_at = ?5,
                 decided_by = ?6 WHERE id = ?1 AND status = ?7",
            params![
                id,
                a.status,
                a.always,
                a.reason,
                stamp(Utc::now()),
                a.by,
                ApprovalStatus::Pending
            ],
        )?;
        Ok(n == 1)
    }
}

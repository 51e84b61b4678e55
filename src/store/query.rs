//! Read queries for the web console that the commands do not need: a page of runs with its
//! total, the goals that have runs, and answered approval requests with when they were
//! answered.

use super::RunStatus;
use super::db::{ApprovalRow, Db, DbError, RunRow};

/// Which runs, newest first.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunFilter<'a> {
    pub(crate) goal: Option<&'a str>,
    pub(crate) status: Option<RunStatus>,
}

/// One page of runs (`offset`, `limit`) and how many match in all. Only the conditions
/// given are in the SQL, so SQLite can use the goal, status and time indexes.
pub(crate) fn runs_page(
    db: &Db,
    filter: &RunFilter,
    offset: u32,
    limit: u32,
) -> Result<(Vec<RunRow>, u64), DbError> {
    let conn = db.conn();
    let mut conds = Vec::new();
    let mut args: Vec<&str> = Vec::new();
    if let Some(g) = filter.goal {
        args.push(g);
        conds.push(format!("goal = ?{}", args.len()));
    }
    if let Some(s) = filter.status {
        args.push(s.as_str());
        conds.push(format!("status = ?{}", args.len()));
    }
    let filter_sql = if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    };
    let total: u64 = conn
        .query_row(
            &format!("SELECT count(*) FROM runs {filter_sql}"),
            rusqlite::params_from_iter(&args),
            |r| r.get(0),
        )
        .map_err(|e| db.err(e))?;
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT id FROM runs {filter_sql} ORDER BY started_at DESC, id DESC LIMIT {limit} OFFSET {offset}"
        ))
        .map_err(|e| db.err(e))?;
    let ids: Vec<String> = stmt
        .query_map(rusqlite::params_from_iter(&args), |r| r.get(0))
        .and_then(Iterator::collect)
        .map_err(|e| db.err(e))?;
    let runs = ids
        .iter()
        .map(|id| db.run(id))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((runs, total))
}

/// The names of goals that have runs, sorted.
pub(crate) fn goal_names(db: &Db) -> Result<Vec<String>, DbError> {
    let mut stmt = db
        .conn()
        .prepare_cached("SELECT DISTINCT goal FROM runs ORDER BY goal")
        .map_err(|e| db.err(e))?;
    stmt.query_map([], |r| r.get(0))
        .and_then(Iterator::collect)
        .map_err(|e| db.err(e))
}

/// Answered (or expired) requests, newest answer first, with when they were answered.
pub(crate) fn answered_approvals(
    db: &Db,
    limit: u32,
) -> Result<Vec<(ApprovalRow, Option<String>)>, DbError> {
    let mut stmt = db
        .conn()
        .prepare_cached(
            "SELECT id, decided_at FROM approvals WHERE status != 'pending'
             ORDER BY decided_at DESC, id LIMIT ?1",
        )
        .map_err(|e| db.err(e))?;
    let rows: Vec<(String, Option<String>)> = stmt
        .query_map([limit], |r| Ok((r.get(0)?, r.get(1)?)))
        .and_then(Iterator::collect)
        .map_err(|e| db.err(e))?;
    let mut out = Vec::new();
    for (id, at) in rows {
        if let Some(row) = db.approval(&id)? {
            out.push((row, at));
        }
    }
    Ok(out)
}

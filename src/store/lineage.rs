//! What ties runs together and what an isolated run left, in the local store: the run a
//! continued run goes on from (`continued_from`), a parallel attempt's run and number
//! (`parent`, `attempt`), and a worktree run's branch, base, commit, diff summary and
//! repository. Written beside the run row, read by `sup show`, the console and
//! `sup continue`.

use rusqlite::{OptionalExtension, params};

use super::db::{Db, DbError, RunRow};

/// The lineage and the worktree of one run; every part optional.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Lineage {
    pub(crate) continued_from: Option<String>,
    pub(crate) parent: Option<String>,
    pub(crate) attempt: Option<u32>,
    pub(crate) branch: Option<String>,
    pub(crate) base: Option<String>,
    pub(crate) commit: Option<String>,
    pub(crate) diff_stat: Option<String>,
    pub(crate) repo: Option<String>,
}

/// The lineage's columns in both stores, in the order of `Lineage`'s fields.
pub(crate) const COLUMNS: &str =
    "continued_from, parent, attempt, branch, base_commit, commit_sha, diff_stat, repo";

/// The statement that sets each lineage column given (a `NULL` leaves it as it was) of the
/// run whose id is parameter 1; `mark` writes a parameter (`?` for SQLite, `$` for
/// PostgreSQL), the columns being parameters 2 to 9.
pub(crate) fn update_sql(mark: char) -> String {
    let sets: Vec<String> = COLUMNS
        .split(", ")
        .enumerate()
        .map(|(i, c)| format!("{c} = coalesce({mark}{}, {c})", i + 2))
        .collect();
    format!("UPDATE runs SET {} WHERE id = {mark}1", sets.join(", "))
}

impl Db {
    /// Record what `l` holds for run `id` (a part that is `None` is left as it was).
    pub(crate) fn set_lineage(&self, id: &str, l: &Lineage) -> Result<(), DbError> {
        self.execute(
            &update_sql('?'),
            params![
                id,
                l.continued_from,
                l.parent,
                l.attempt,
                l.branch,
                l.base,
                l.commit,
                l.diff_stat,
                l.repo
            ],
        )?;
        Ok(())
    }

    /// Run `id`'s lineage and worktree.
    pub(crate) fn lineage(&self, id: &str) -> Result<Lineage, DbError> {
        self.conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM runs WHERE id = ?1"),
                [id],
                |r| {
                    Ok(Lineage {
                        continued_from: r.get(0)?,
                        parent: r.get(1)?,
                        attempt: r.get(2)?,
                        branch: r.get(3)?,
                        base: r.get(4)?,
                        commit: r.get(5)?,
                        diff_stat: r.get(6)?,
                        repo: r.get(7)?,
                    })
                },
            )
            .optional()
            .map_err(|e| self.err(e))?
            .ok_or_else(|| DbError::NoRun(id.to_string()))
    }

    /// The attempts of a parallel run, by number.
    pub(crate) fn attempts(&self, parent: &str) -> Result<Vec<(u32, RunRow)>, DbError> {
        let mut stmt = self
            .conn()
            .prepare("SELECT id, attempt FROM runs WHERE parent = ?1 ORDER BY attempt")
            .map_err(|e| self.err(e))?;
        let ids: Vec<(String, u32)> = stmt
            .query_map([parent], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))?;
        ids.into_iter()
            .map(|(id, n)| Ok((n, self.run(&id)?)))
            .collect()
    }

    /// The run that continued run `id`, if one did.
    pub(crate) fn continued_by(&self, id: &str) -> Result<Option<String>, DbError> {
        self.conn()
            .query_row(
                "SELECT id FROM runs WHERE continued_from = ?1 ORDER BY started_at DESC LIMIT 1",
                [id],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Say why an attempt of a parallel run was cancelled (another attempt won).
    pub(crate) fn note_cancelled(&self, id: &str, why: &str) -> Result<(), DbError> {
        self.execute(
            "UPDATE runs SET error = ?2 WHERE id = ?1 AND stop_reason = 'cancelled'",
            params![id, why],
        )?;
        Ok(())
    }
}

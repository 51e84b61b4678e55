//! `sup status`: health for monitors. Per goal the last occurrence, the last verdict (of any
//! run, however triggered), the next occurrence, and whether it is overdue: an occurrence
//! that should have run by now (since the goal file was last written) has no verdict, for
//! example because no daemon ran. Exit 0 when every goal is healthy, 1 otherwise. With
//! `--store` the verdicts and occurrences are the fleet's, from PostgreSQL.

use std::io::Write;
use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::db;
use super::manage::goal_files;
use super::{Ending, Fail};
use crate::schedule::overview;
use crate::store::db::{Db, RunRow, stamp};
use crate::store::pg::PgStore;

/// Where the verdicts and occurrences are read.
pub(crate) enum Source {
    Local(Db),
    Fleet(PgStore),
}

/// What the store knows of a goal: paused, its last run and its last occurrence.
type Known = (bool, Option<RunRow>, Option<DateTime<Utc>>);

impl Source {
    async fn known(&self, name: &str) -> Result<Known, Fail> {
        match self {
            Source::Local(db) => Ok((
                db.paused(name).map_err(Fail::usage)?,
                db.previous_run(name, "").map_err(Fail::usage)?,
                db.last_occurrence(name).map_err(Fail::usage)?,
            )),
            Source::Fleet(pg) => {
                let (paused, last_occurrence) = pg.goal_state(name).await.map_err(Fail::usage)?;
                let last = pg
                    .previous_run(name, "")
                    .await
                    .map_err(Fail::usage)?
                    .map(|f| f.run);
                Ok((paused, last, last_occurrence))
            }
        }
    }

    /// The status of the occurrence of `name` at `at`, if one was recorded.
    async fn occurrence(&self, name: &str, at: DateTime<Utc>) -> Result<Option<String>, Fail> {
        match self {
            Source::Local(db) => Ok(db
                .occurrence_status(name, at)
                .map_err(Fail::usage)?
                .map(|st| st.to_string())),
            Source::Fleet(pg) => pg.occurrence_status(name, at).await.map_err(Fail::usage),
        }
    }
}

pub(crate) async fn status(dir: &Path, json_out: bool) -> Result<Ending, Fail> {
    status_in(&Source::Local(db()?), dir, json_out).await
}

pub(crate) async fn status_in(source: &Source, dir: &Path, json_out: bool) -> Result<Ending, Fail> {
    let now = Utc::now();
    let mut rows = Vec::new();
    for (path, g) in goal_files(dir)? {
        let g = match g {
            Ok(g) => g,
            Err(e) => {
                rows.push(
                    json!({"file": path.display().to_string(), "healthy": false, "error": e}),
                );
                continue;
            }
        };
        let name = &g.file.name;
        let (paused, last, last_occurrence) = source.known(name).await?;
        let since = overview::written_at(&path, now);
        let mut overdue = None;
        if let Some(expected) = overview::due_occurrence(&g, since, now, paused)
            && let Some(s) = &g.timing.schedule
        {
            let seen = source.occurrence(name, expected).await?;
            if !overview::accounted(seen.as_deref()) {
                overdue = Some(expected.with_timezone(&s.tz).to_rfc3339());
            }
        }
        let verdict_ok = last
            .as_ref()
            .is_none_or(|r| r.status == crate::store::RunStatus::Achieved);
        let next = g.timing.schedule.as_ref().and_then(|s| {
            s.next_after(now)
                .map(|t| t.with_timezone(&s.tz).to_rfc3339())
        });
        rows.push(json!({
            "name": name,
            "file": path.display().to_string(),
            "healthy": overdue.is_none() && verdict_ok,
            "paused": paused,
            "schedule": g.timing.schedule.as_ref().map(|s| s.expr.clone()),
            "watch": g.watch,
            "last_occurrence": last_occurrence.map(stamp),
            "last": last.map(|r| json!({
                "run_id": r.id, "status": r.status, "stop_reason": r.stop_reason,
                "trigger": r.trigger, "ended_at": r.ended_at,
            })),
            "next": next,
            "overdue": overdue.is_some(),
            "overdue_since": overdue,
        }));
    }
    let healthy = rows.iter().all(|r| r["healthy"] == true);
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", json!({"healthy": healthy, "goals": rows}));
    } else {
        if rows.is_empty() {
            let _ = writeln!(out, "no goal files in {}", dir.display());
        }
        for r in &rows {
            let _ = writeln!(out, "{}", line(r));
        }
    }
    Ok(if healthy {
        Ending::Achieved
    } else {
        Ending::ChecksFailed
    })
}

fn line(r: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("—").to_string();
    if let Some(e) = r["error"].as_str() {
        return format!("✗ {}: {e}", s(&r["file"]));
    }
    let icon = if r["healthy"] == true { '✓' } else { '✗' };
    let mut l = format!("{icon} {}", s(&r["name"]));
    if r["paused"] == true {
        l.push_str(" · paused");
    }
    if let Some(w) = overview::watch_label(&r["watch"]) {
        l.push_str(&format!(" · {w}"));
    }
    let last = &r["last"];
    if last.is_object() {
        l.push_str(&format!(
            " · last {} ({}, run {})",
            s(&last["status"]),
            s(&last["trigger"]),
            s(&last["run_id"])
        ));
    } else {
        l.push_str(" · never run");
    }
    if r["overdue"] == true {
        l.push_str(&format!(
            " · OVERDUE: the occurrence of {} has no verdict (is the daemon running?)",
            s(&r["overdue_since"])
        ));
    }
    if !r["next"].is_null() {
        l.push_str(&format!(" · next {}", s(&r["next"])));
    }
    l
}

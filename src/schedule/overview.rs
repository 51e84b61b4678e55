//! The goals of a folder as people see them (`sup goals`, the web console): each goal file
//! loaded or with its error, its schedule and time zone, next occurrences, paused or not,
//! skipped and missed counts, and its last run; the occurrence that should have a verdict
//! by now (`sup status` and the console call a goal overdue when it has none); and finding
//! one goal by name.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::goals::{self, ScheduledGoal};
use crate::store::db::{DbError, GoalStats};
use crate::store::history::{History, HistoryError};

#[derive(Debug, thiserror::Error)]
pub(crate) enum OverviewError {
    #[error("cannot read the goals folder {path}: {source}")]
    Folder {
        path: String,
        source: std::io::Error,
    },
    #[error("no goal `{name}` in {dir}; `sup goals --goals DIR` lists them")]
    NoGoal { name: String, dir: String },
    /// The goal's file is broken: the message names the file, line and key.
    #[error("{0}")]
    Broken(String),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    History(#[from] HistoryError),
}

/// How late an occurrence may still be starting before it counts as overdue.
pub(crate) const SLACK: std::time::Duration = std::time::Duration::from_secs(120);

/// Occurrence states that are a verdict or on the way to one: not overdue.
const ACCOUNTED: &[&str] = &["claimed", "running", "queued", "done", "skipped", "paused"];

/// Whether an occurrence recorded with `status` is accounted for (not overdue).
pub(crate) fn accounted(status: Option<&str>) -> bool {
    status.is_some_and(|st| ACCOUNTED.contains(&st))
}

/// The latest occurrence of `g` that should have started by `now` (allowing the slack and
/// the goal's jitter) since its file was written at `since`: overdue unless the store has
/// it `accounted`. None for a paused goal or one without a schedule.
pub(crate) fn due_occurrence(
    g: &ScheduledGoal,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
    paused: bool,
) -> Option<DateTime<Utc>> {
    let s = g.timing.schedule.as_ref().filter(|_| !paused)?;
    let until = now - chrono::Duration::from_std(SLACK + g.timing.jitter).unwrap_or_default();
    latest(s, since, until)
}

/// When the goal file at `path` was last written (`now` when that cannot be read).
pub(crate) fn written_at(path: &Path, now: DateTime<Utc>) -> DateTime<Utc> {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map(DateTime::<Utc>::from)
        .unwrap_or(now)
}

/// The latest occurrence in `(since, until]`, looking back in widening windows so a
/// per-second schedule is not walked from a file written long ago.
fn latest(
    s: &crate::schedule::cron::Schedule,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    for back in [
        chrono::Duration::minutes(2),
        chrono::Duration::hours(2),
        chrono::Duration::days(2),
        chrono::Duration::days(62),
        chrono::Duration::days(800),
    ] {
        let from = (until - back).max(since);
        if let Some(t) = s.between(from, until, 1).0.last() {
            return Some(*t);
        }
        if from == since {
            return None;
        }
    }
    None
}

/// A goal file of the folder, loaded or with its error.
pub(crate) type Loaded = (PathBuf, Result<ScheduledGoal, String>);

pub(crate) fn goal_files(dir: &Path) -> Result<Vec<Loaded>, OverviewError> {
    let loaded = goals::load_dir(dir).map_err(|source| OverviewError::Folder {
        path: dir.display().to_string(),
        source,
    })?;
    Ok(loaded
        .into_iter()
        .map(|(p, r)| (p, r.map_err(|e| e.to_string())))
        .collect())
}

/// The goal named `name` in `dir`.
pub(crate) fn find(dir: &Path, name: &str) -> Result<ScheduledGoal, OverviewError> {
    let mut broken = None;
    for (path, g) in goal_files(dir)? {
        match g {
            Ok(g) if g.file.name == name => return Ok(g),
            Err(e) if path.file_stem().is_some_and(|s| s == name) => broken = Some(e),
            _ => {}
        }
    }
    Err(broken
        .map(OverviewError::Broken)
        .unwrap_or_else(|| OverviewError::NoGoal {
            name: name.to_string(),
            dir: dir.display().to_string(),
        }))
}

/// What a goal watches as `sup goals`, `sup status` and the console say it: `watch src/**,
/// *.py`; `None` for a goal that watches nothing.
pub(crate) fn watch_label(globs: &Value) -> Option<String> {
    let globs: Vec<&str> = globs.as_array()?.iter().filter_map(Value::as_str).collect();
    (!globs.is_empty()).then(|| format!("watch {}", globs.join(", ")))
}

/// Adds to each goal's row its occurrences skipped while it was paused, as `paused` counts
/// them (the console shows the same figure).
pub(crate) fn with_paused_skips(
    rows: &mut [Value],
    mut count: impl FnMut(&str) -> Result<u64, OverviewError>,
) -> Result<(), OverviewError> {
    for r in rows.iter_mut() {
        let Some(name) = r["name"].as_str().map(str::to_string) else {
            continue;
        };
        r["skipped_while_paused"] = json!(count(&name)?);
    }
    Ok(())
}

/// One JSON object per goal file (the `sup goals --json` shape), from either history:
/// `{file, error}` for a broken file, else name, file, schedule, timezone, next (3), paused,
/// skipped, missed, skipped_while_paused (also beside the row), last.
pub(crate) async fn overview_in(
    h: &History,
    dir: &Path,
    now: DateTime<Utc>,
) -> Result<Vec<(Value, u64)>, OverviewError> {
    let mut stats = std::collections::HashMap::new();
    for (_, g) in goal_files(dir)? {
        if let Ok(g) = g {
            let s = h.goal_stats(&g.file.name).await?;
            stats.insert(g.file.name, s);
        }
    }
    let mut paused = std::collections::HashMap::new();
    let mut rows = overview_with(dir, now, |name| {
        let (s, p) = stats.remove(name).unwrap_or_default();
        paused.insert(name.to_string(), p);
        Ok(s)
    })?;
    with_paused_skips(&mut rows, |name| Ok(paused.get(name).copied().unwrap_or(0)))?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let p = r["skipped_while_paused"].as_u64().unwrap_or(0);
            (r, p)
        })
        .collect())
}

/// `overview` with each goal's figures from `stats` (the fleet's store, for one).
pub(crate) fn overview_with(
    dir: &Path,
    now: DateTime<Utc>,
    mut stats: impl FnMut(&str) -> Result<GoalStats, OverviewError>,
) -> Result<Vec<Value>, OverviewError> {
    let mut rows = Vec::new();
    for (path, g) in goal_files(dir)? {
        let row = match g {
            Err(e) => json!({"file": path.display().to_string(), "error": e}),
            Ok(g) => {
                let stats = stats(&g.file.name)?;
                let next: Vec<String> = g
                    .timing
                    .schedule
                    .as_ref()
                    .map(|s| {
                        s.upcoming(now, 3)
                            .into_iter()
                            .map(|t| t.with_timezone(&s.tz).to_rfc3339())
                            .collect()
                    })
                    .unwrap_or_default();
                json!({
                    "name": g.file.name,
                    "file": path.display().to_string(),
                    "schedule": g.timing.schedule.as_ref().map(|s| s.expr.clone()),
                    "timezone": g.timing.schedule.as_ref().map(|s| s.tz.name().to_string()),
                    "watch": g.watch,
                    "next": next,
                    "paused": stats.paused,
                    "skipped": stats.skipped,
                    "missed": stats.missed,
                    "last": stats.last.map(|r| json!({
                        "run_id": r.id, "status": r.status, "stop_reason": r.stop_reason,
                        "started_at": r.started_at, "trigger": r.trigger,
                    })),
                })
            }
        };
        rows.push(row);
    }
    Ok(rows)
}

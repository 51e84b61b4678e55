//! Goal files as the schedule layer sees them: the verify layer's goal file plus a checked
//! schedule (cron expression and time zone, errors naming the file, key and line) and the
//! policies that say what to do with overlapping and missed occurrences.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cron::{Schedule, local_zone, parse_zone};
use crate::verify::file::{GoalFile, GoalFileError};

/// What to do when an occurrence comes while the goal's last run is still going.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// Record the occurrence as skipped.
    Skip,
    /// Let one occurrence wait and run after.
    Queue,
    /// Cancel the running one, then start.
    Replace,
    /// Run side by side.
    Allow,
}

impl Overlap {
    pub fn parse(s: &str) -> Option<Overlap> {
        Some(match s {
            "skip" => Overlap::Skip,
            "queue" => Overlap::Queue,
            "replace" => Overlap::Replace,
            "allow" => Overlap::Allow,
            _ => return None,
        })
    }
}

/// A goal file with its schedule checked.
#[derive(Clone, Debug)]
pub struct ScheduledGoal {
    pub file: GoalFile,
    /// `None` for a goal without `schedule`: the daemon leaves it alone.
    pub schedule: Option<Schedule>,
    pub overlap: Overlap,
    pub catch_up: Duration,
    pub jitter: Duration,
}

/// Load a goal file and check its schedule and time zone.
pub fn load(path: &Path) -> Result<ScheduledGoal, GoalFileError> {
    let file = GoalFile::load(path)?;
    check(file)
}

pub fn check(file: GoalFile) -> Result<ScheduledGoal, GoalFileError> {
    let err = |line: usize, message: String| GoalFileError {
        file: file.path.display().to_string(),
        line,
        message,
    };
    let tz = match &file.timezone {
        Some(z) => parse_zone(&z.value).map_err(|m| err(z.line, format!("key `timezone`: {m}")))?,
        None => local_zone(),
    };
    let schedule = match &file.schedule {
        Some(s) => Some(
            Schedule::parse(&s.value, tz)
                .map_err(|m| err(s.line, format!("key `schedule`: {m}")))?,
        ),
        None => None,
    };
    let overlap = file
        .overlap
        .as_ref()
        .and_then(|o| Overlap::parse(&o.value))
        .unwrap_or(Overlap::Skip);
    Ok(ScheduledGoal {
        overlap,
        catch_up: file.catch_up.unwrap_or(Duration::ZERO),
        jitter: file.jitter.unwrap_or(Duration::ZERO),
        schedule,
        file,
    })
}

/// The goal files of a folder: `*.toml`, sorted.
pub fn paths(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml") && p.is_file())
        .collect();
    paths.sort();
    Ok(paths)
}

/// The goal files of a folder, each loaded or with its error.
pub fn load_dir(
    dir: &Path,
) -> std::io::Result<Vec<(PathBuf, Result<ScheduledGoal, GoalFileError>)>> {
    Ok(paths(dir)?
        .into_iter()
        .map(|p| {
            let loaded = load(&p);
            (p, loaded)
        })
        .collect())
}

//! Goal files as the schedule layer sees them: the verify layer's goal file plus a checked
//! schedule (cron expression and time zone, errors naming the file, key and line) and the
//! policies that say what to do with overlapping and missed occurrences.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cron::{Schedule, local_zone, parse_zone};
pub use crate::config::Overlap;
use crate::config::{GoalFile, GoalFileError, Settings};

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
    let line = |key| file.lines.get(key).copied().unwrap_or(0);
    let s = &file.settings;
    let tz = match &s.timezone {
        Some(z) => parse_zone(z.get_ref())
            .map_err(|m| err(line("timezone"), format!("key `timezone`: {m}")))?,
        None => local_zone(),
    };
    let schedule = match &s.schedule {
        Some(expr) => Some(
            Schedule::parse(expr.get_ref(), tz)
                .map_err(|m| err(line("schedule"), format!("key `schedule`: {m}")))?,
        ),
        None => None,
    };
    let defaults = Settings::defaults();
    Ok(ScheduledGoal {
        overlap: s.overlap.or(defaults.overlap).unwrap_or(Overlap::Skip),
        catch_up: s.catch_up.or(defaults.catch_up).unwrap_or_default(),
        jitter: s.jitter.or(defaults.jitter).unwrap_or_default(),
        schedule,
        file,
    })
}

/// The goal files of a folder: `*.toml`, sorted.
pub fn paths(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    // All in one folder: sorted by name, which is cheaper than comparing paths part by part.
    // A file's type comes with its entry; only a link is followed to see what it is.
    let mut names: Vec<std::ffi::OsString> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| {
            Path::new(&e.file_name())
                .extension()
                .is_some_and(|x| x == "toml")
        })
        .filter(|e| {
            e.file_type()
                .is_ok_and(|t| t.is_file() || (t.is_symlink() && e.path().is_file()))
        })
        .map(|e| e.file_name())
        .collect();
    names.sort_unstable();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
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

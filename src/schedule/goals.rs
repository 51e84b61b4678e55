//! Goal files as the schedule layer sees them: the verify layer's goal file plus a checked
//! schedule (cron expression and time zone, errors naming the file, key and line), its
//! `watch` globs and debounce, and the policies that say what to do with overlapping and
//! missed occurrences; reading a goals folder
//! into a daemon's slots, and watching it for changes (both daemons share these).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cron::Schedule;
pub(crate) use crate::config::Overlap;
use crate::config::{GoalFile, GoalFileError, Settings};
use crate::config::{local_zone, parse_zone};

/// A goal file with its schedule checked.
#[derive(Clone, Debug)]
pub(crate) struct ScheduledGoal {
    pub(crate) file: GoalFile,
    pub(crate) timing: Timing,
    /// `watch` globs (empty: changes start nothing) and how long a burst of them must be
    /// quiet first.
    pub(crate) watch: Vec<String>,
    pub(crate) debounce: Duration,
}

/// When a goal's occurrences run: its schedule, and the policies for an occurrence that
/// finds a run under way, for one missed, and for how long a run waits before it starts.
/// Both daemons keep one for each goal they load.
#[derive(Clone, Debug)]
pub(crate) struct Timing {
    /// `None` for a goal without `schedule`: no occurrence starts it (`watch` or a trigger may).
    pub(crate) schedule: Option<Schedule>,
    pub(crate) overlap: Overlap,
    pub(crate) catch_up: Duration,
    pub(crate) jitter: Duration,
}

/// Load a goal file and check its schedule and time zone.
pub(crate) fn load(path: &Path) -> Result<ScheduledGoal, GoalFileError> {
    let file = GoalFile::load(path)?;
    check(file)
}

pub(crate) fn check(file: GoalFile) -> Result<ScheduledGoal, GoalFileError> {
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
        timing: Timing {
            schedule,
            overlap: s.overlap.or(defaults.overlap).unwrap_or(Overlap::Skip),
            catch_up: s.catch_up.or(defaults.catch_up).unwrap_or_default(),
            jitter: s.jitter.or(defaults.jitter).unwrap_or_default(),
        },
        watch: s.watch.clone(),
        debounce: s.debounce.or(defaults.debounce).unwrap_or_default(),
        file,
    })
}

/// The goal files of a folder: `*.toml`, sorted.
pub(crate) fn paths(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
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
pub(crate) fn load_dir(
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

/// A loaded goal as a daemon keeps it: it knows its file.
pub(crate) trait FromFile {
    fn path(&self) -> &Path;
}

/// Read a goals folder into `slots` (goal name → slot), one file at a time: `prepare` does
/// what can fail for a loaded goal, `apply` makes its slot from that and the old slot (or
/// drops it, with `None`). A file that fails keeps its last good slot; a name another file
/// holds is an error; a file whose goal changed name gives up the old slot; slots whose
/// files are gone go.
pub(crate) fn reload<T: FromFile, P>(
    dir: &Path,
    slots: &mut std::collections::BTreeMap<String, T>,
    mut prepare: impl FnMut(ScheduledGoal) -> Result<P, String>,
    mut apply: impl FnMut(&str, P, Option<T>) -> Option<T>,
) -> std::io::Result<()> {
    let mut seen = std::collections::HashSet::new();
    let by_path: std::collections::HashMap<PathBuf, String> = slots
        .iter()
        .map(|(n, s)| (s.path().to_path_buf(), n.clone()))
        .collect();
    // One file at a time: ten thousand goals never sit in memory twice.
    for path in paths(dir)? {
        seen.insert(path.clone());
        let loaded = load(&path).map_err(|e| e.to_string()).and_then(|g| {
            let name = g.file.name.clone();
            prepare(g).map(|p| (name, p))
        });
        let (name, prepared) = match loaded {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("{e}; the last good version of this goal keeps its schedule");
                continue;
            }
        };
        if let Some(other) = slots.get(&name).filter(|s| s.path() != path) {
            tracing::warn!(
                "{}: the goal name `{name}` is taken by {}",
                path.display(),
                other.path().display()
            );
            continue;
        }
        if let Some(old) = by_path.get(&path).filter(|old| **old != name) {
            slots.remove(old);
        }
        let old = slots.remove(&name);
        if let Some(slot) = apply(&name, prepared, old) {
            slots.insert(name, slot);
        }
    }
    slots.retain(|name, s| {
        let kept = seen.contains(s.path());
        if !kept {
            tracing::info!("goal {name}: its file is gone; no more occurrences");
        }
        kept
    });
    Ok(())
}

/// Watches a goals folder. A change to a goal file is one reload request, however many file
/// events it made. Without a watcher (the kernel refused one) SIGHUP still reloads.
pub(crate) struct Watch {
    _watcher: Option<notify::RecommendedWatcher>,
    rx: tokio::sync::mpsc::UnboundedReceiver<()>,
}

impl Watch {
    pub(crate) fn new(dir: &Path) -> Watch {
        use notify::Watcher;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Goal files only: workspaces and model scripts in the folder change often.
            let goal_file = |e: &notify::Event| {
                e.paths.is_empty()
                    || e.paths
                        .iter()
                        .any(|p| p.extension().is_some_and(|x| x == "toml"))
            };
            if event.is_ok_and(|e| !e.kind.is_access() && goal_file(&e)) {
                let _ = tx.send(());
            }
        })
        .map_err(|e| tracing::warn!("cannot watch the goals folder ({e}); reload with SIGHUP"))
        .ok()
        .and_then(|mut w| {
            w.watch(dir, notify::RecursiveMode::NonRecursive)
                .map_err(|e| {
                    tracing::warn!("cannot watch {} ({e}); reload with SIGHUP", dir.display())
                })
                .ok()
                .map(|()| w)
        });
        Watch {
            _watcher: watcher,
            rx,
        }
    }

    /// The next change (cancel-safe: for `select!`); `None` without a watcher.
    pub(crate) async fn changed(&mut self) -> Option<()> {
        self.rx.recv().await
    }

    /// Let a burst of file events settle into one reload.
    pub(crate) async fn settle(&mut self) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        while self.rx.try_recv().is_ok() {}
    }
}

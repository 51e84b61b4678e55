//! Loading the goal files into the daemon's slots: each file checked as a scheduled goal
//! and as a run, new or changed schedules and watches taken from now, a broken file keeping
//! its last good version.

use super::*;

/// A goal file's text, checked as a scheduled goal and as a run (its spec is made and
/// dropped; the slot keeps what the claim records).
fn check(
    path: &Path,
    text: &str,
    defaults: &Invocation,
    user: &Result<UserConfig, String>,
) -> Result<(goals::ScheduledGoal, RunSpec), String> {
    let goal = GoalFile::parse(path, text)
        .and_then(goals::check)
        .map_err(|e| e.to_string())?;
    let user = user
        .as_ref()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let spec = RunSpec::build_with(defaults, user, Some(&goal.file))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((goal, spec))
}

impl Daemon {
    /// Load (or reload) the goal files. New or changed schedules start from `now`; a broken
    /// file keeps its last good version; a file whose text is unchanged is not read again.
    pub(super) fn load(&mut self, now: DateTime<Utc>, starting: bool) -> Result<(), DaemonError> {
        let paths = goals::paths(&self.cfg.goals_dir).map_err(|source| DaemonError::Goals {
            path: self.cfg.goals_dir.display().to_string(),
            source,
        })?;
        let mut seen: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
        // Which goal each file held, to notice renames without scanning every slot.
        let by_path: std::collections::HashMap<PathBuf, String> = self
            .slots
            .iter()
            .map(|(n, s)| (s.path.clone(), n.clone()))
            .collect();
        // The user config, read once for every goal.
        let user = UserConfig::load().map_err(|e| e.to_string());
        // The next occurrence after `now` of each shared schedule, worked out once (the
        // schedule is held here, so its id stays its own for the pass).
        let mut nexts: std::collections::HashMap<usize, (Schedule, Option<DateTime<Utc>>)> =
            std::collections::HashMap::new();
        self.errors.clear();
        // One file at a time: ten thousand goals never sit in memory twice.
        for path in paths {
            seen.insert(path.clone());
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    let e = format!("{}: cannot read the goal file: {e}", path.display());
                    tracing::warn!("{e}; the last good version of this goal keeps its schedule");
                    self.errors.insert(path, e);
                    continue;
                }
            };
            let unchanged = by_path
                .get(&path)
                .and_then(|n| self.slots.get(n))
                .is_some_and(|s| *s.text == *text);
            if unchanged {
                continue;
            }
            let (goal, spec) = match check(&path, &text, &self.defaults, &user) {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!("{e}; the last good version of this goal keeps its schedule");
                    self.errors.insert(path, e);
                    continue;
                }
            };
            let name = goal.file.name.clone();
            if let Some(other) = self.slots.get(&name).filter(|s| s.path != path) {
                let e = format!(
                    "{}: the goal name `{name}` is taken by {}",
                    path.display(),
                    other.path.display()
                );
                tracing::warn!("{e}");
                self.errors.insert(path, e);
                continue;
            }
            // A file that now has another name gives up its old slot.
            if let Some(old) = by_path.get(&path).filter(|old| **old != name) {
                self.slots.remove(old);
            }
            if goal.timing.schedule.is_none() && goal.watch.is_empty() {
                self.slots.remove(&name);
                continue;
            }
            let old = self.slots.get(&name);
            let next = match &goal.timing.schedule {
                None => None,
                Some(schedule) => {
                    match old.and_then(|s| s.timing.schedule.as_ref().map(|o| (o, s.next))) {
                        Some((o, next)) if o.same(schedule) => next,
                        _ => {
                            if !starting {
                                tracing::info!(
                                    "goal {name}: schedule `{}` ({}) loaded",
                                    schedule.expr,
                                    schedule.tz
                                );
                            }
                            nexts
                                .entry(schedule.id())
                                .or_insert_with(|| (schedule.clone(), schedule.next_after(now)))
                                .1
                        }
                    }
                }
            };
            let watch = if goal.watch.is_empty() {
                None
            } else {
                let globs = match crate::globs::Globs::new(&spec.goal.workspace, &goal.watch) {
                    Ok(g) => g,
                    Err(e) => {
                        let e = format!("{}: {e}", path.display());
                        tracing::warn!(
                            "{e}; the last good version of this goal keeps its schedule"
                        );
                        self.errors.insert(path, e);
                        continue;
                    }
                };
                if !starting
                    && old.is_none_or(|s| s.watch.as_ref().is_none_or(|w| w.patterns != goal.watch))
                {
                    tracing::info!("goal {name}: watch {} loaded", goal.watch.join(", "));
                }
                // A burst under way outlives a reload.
                let due = old.and_then(|s| s.watch.as_ref()).and_then(|w| w.due);
                Some(Watched {
                    patterns: goal.watch.clone(),
                    globs,
                    workspace: spec.goal.workspace.clone(),
                    debounce: goal.debounce,
                    due,
                })
            };
            let (running, queued, ended) = self
                .slots
                .remove(&name)
                .map(|s| (s.running, s.queued, s.ended))
                .unwrap_or_default();
            self.slots.insert(
                name,
                Slot {
                    path,
                    text: text.into(),
                    timing: goal.timing,
                    watch,
                    notify: !spec.notify.is_empty(),
                    model: spec.model_name(),
                    workspace: spec.goal.workspace.display().to_string(),
                    root: std::fs::canonicalize(&spec.goal.workspace)
                        .unwrap_or_else(|_| spec.goal.workspace.clone()),
                    run_goal: spec.goal.name,
                    next,
                    running,
                    ended,
                    queued,
                },
            );
        }
        let gone: Vec<String> = self
            .slots
            .iter()
            .filter(|(_, s)| !seen.contains(&s.path))
            .map(|(n, _)| n.clone())
            .collect();
        for n in gone {
            tracing::info!("goal {n}: its file is gone; no more occurrences");
            self.slots.remove(&n);
        }
        let watched = self
            .slots
            .iter()
            .filter_map(|(n, s)| {
                let w = s.watch.as_ref()?;
                Some((n.clone(), w.workspace.clone(), w.globs.clone()))
            })
            .collect();
        self.workspaces.set(watched);
        Ok(())
    }
}

//! The local daemon's watch triggers: a burst of changes under a goal's workspace that its
//! globs match starts the goal once, and changes its own or another goal's runs make are
//! left out.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Daemon;
use crate::store::{RunStatus, TriggerKind};

/// What a goal with `watch` globs needs to start on a change.
///
/// A burst of changes starts it once: each change (re)sets `due` to a debounce from now, and
/// the goal starts when `due` passes with no change since. The goal's own runs change its
/// workspace, and those changes must not start it again; the daemon cannot tell a run's
/// writes from anyone else's (a run's processes are many and file events carry no writer),
/// so it leaves out every change while a run works in the workspace (from the claim on,
/// whatever started it) and for a debounce after the last one ends (`Slot::ended`), which
/// covers the events of its last writes still on their way. That is a run of any goal of
/// the daemon whose workspace holds or lies in this one, not only this goal's: two goals
/// watching one workspace would otherwise start each other for ever, each run's writes the
/// other's change. A change made by someone else in that time is left out too: the run
/// that was going is taken to have seen it.
pub(super) struct Watched {
    /// The globs as written, for what the daemon says.
    pub(super) patterns: Vec<String>,
    pub(super) globs: crate::globs::Globs,
    pub(super) workspace: PathBuf,
    pub(super) debounce: Duration,
    /// When the goal starts, unless another change comes first.
    pub(super) due: Option<DateTime<Utc>>,
}

impl Daemon {
    /// A change that `name`'s globs match: the goal starts a debounce from now, unless the
    /// change is taken as a run's (see `Watched`).
    pub(super) fn changed(&mut self, name: &str, now: DateTime<Utc>) {
        let Some(slot) = self.slots.get(name) else {
            return;
        };
        let Some(debounce) = slot.watch.as_ref().map(|w| w.debounce) else {
            return;
        };
        let root = &slot.root;
        let busy = self.slots.values().find(|s| {
            (s.root.starts_with(root) || root.starts_with(&s.root))
                && (!s.running.is_empty() || s.ended.is_some_and(|e| now < e + debounce))
        });
        if let Some(s) = busy {
            tracing::debug!(
                "goal {name}: a change while a run of {} works in its workspace or just did, \
                 left out",
                s.run_goal
            );
            return;
        }
        if let Some(w) = self.slots.get_mut(name).and_then(|s| s.watch.as_mut()) {
            w.due = Some(now + debounce);
        }
    }

    /// Goals whose burst of changes has been quiet for its debounce start, each claimed as
    /// an occurrence at the time it came due.
    pub(super) fn watched(&mut self, now: DateTime<Utc>) {
        let due: Vec<(String, DateTime<Utc>, Duration)> = self
            .slots
            .iter_mut()
            .filter_map(|(n, s)| {
                let w = s.watch.as_mut()?;
                let at = w.due.filter(|d| *d <= now)?;
                w.due = None;
                Some((n.clone(), at, w.debounce))
            })
            .collect();
        for (name, at, debounce) in due {
            if let Some(other) = self.run_elsewhere(&name, now, debounce) {
                tracing::debug!(
                    "goal {name}: its change came while run {other} (of another process) \
                     worked in its workspace, or just after; left out"
                );
                continue;
            }
            tracing::info!("goal {name}: files it watches changed");
            self.fire(&name, at, TriggerKind::Watch);
        }
    }

    /// A run on record, of any goal and any process sharing the store (another daemon),
    /// that worked in `name`'s workspace during its burst's last change or a debounce
    /// before it: the change is taken as that run's (see `Watched`). This daemon's own
    /// runs were left out as the changes came.
    fn run_elsewhere(&self, name: &str, now: DateTime<Utc>, debounce: Duration) -> Option<String> {
        let slot = self.slots.get(name)?;
        let window = chrono::Duration::from_std(debounce * 2).unwrap_or_default();
        let rows = self.db.runs_going_since(now - window);
        let rows = rows.map_err(|e| tracing::warn!("{e}")).ok()?;
        rows.into_iter()
            .find(|r| {
                let ws = Path::new(&r.workspace);
                let mine = Path::new(&slot.workspace);
                // A run on record as running whose lock nobody holds (killed) works nowhere;
                // its agent writes only once it holds it.
                let dead = r.status == RunStatus::Running
                    && crate::tools::sandbox::run_alive(Path::new(&r.dir)) != Some(true);
                !dead
                    && (ws.starts_with(mine) || mine.starts_with(ws) || ws.starts_with(&slot.root))
            })
            .map(|r| r.id)
    }
}

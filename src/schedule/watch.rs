//! File triggers: the workspaces of goals with `watch` globs, watched recursively, each change
//! that a goal's globs match sent as that goal's name. What the daemon does with it (the
//! debounce, leaving out a run's own writes) is the daemon's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::Watcher;
use tokio::sync::mpsc;

use crate::globs::Globs;

/// The goals watching one workspace, with their globs.
type Watchers = Vec<(String, Globs)>;

/// Watches the workspaces of goals with `watch` globs.
pub(crate) struct Workspaces {
    watcher: Option<notify::RecommendedWatcher>,
    /// Canonical workspace → the goals that watch it; the watcher's callback reads it.
    goals: Arc<Mutex<BTreeMap<PathBuf, Watchers>>>,
    rx: mpsc::UnboundedReceiver<String>,
}

impl Workspaces {
    pub(crate) fn new() -> Workspaces {
        let (tx, rx) = mpsc::unbounded_channel();
        let goals: Arc<Mutex<BTreeMap<PathBuf, Watchers>>> = Arc::default();
        let seen = goals.clone();
        let handler = move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if event.kind.is_access() || event.kind.is_other() {
                return;
            }
            let Ok(goals) = seen.lock() else { return };
            for (ws, watchers) in goals.iter() {
                for (name, globs) in watchers {
                    let hit = event.paths.iter().any(|p| {
                        p.strip_prefix(ws)
                            .is_ok_and(|rel| !in_git(rel) && globs.matches(rel))
                    });
                    if hit {
                        let _ = tx.send(name.clone());
                    }
                }
            }
        };
        // A link in the workspace is not followed: one the agent planted (`src/l -> /`)
        // would make changes anywhere its target is, such as other runs' folders, changes
        // of the workspace, and exhaust the user's inotify watches.
        let config = notify::Config::default().with_follow_symlinks(false);
        let watcher = notify::RecommendedWatcher::new(handler, config)
            .map_err(|e| tracing::warn!("cannot watch workspaces ({e}); `watch` starts nothing"))
            .ok();
        Workspaces { watcher, goals, rx }
    }

    /// Watch what `want` says (goal name → its workspace and globs), and no more: new
    /// workspaces are watched, those no goal watches now are let go. A workspace that cannot
    /// be watched (it does not exist yet) is tried again at the next call.
    pub(crate) fn set(&mut self, want: Vec<(String, PathBuf, Globs)>) {
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        let Ok(mut goals) = self.goals.lock() else {
            return;
        };
        let mut next: BTreeMap<PathBuf, Watchers> = BTreeMap::new();
        for (name, ws, globs) in want {
            let Ok(ws) = std::fs::canonicalize(&ws) else {
                tracing::warn!(
                    "goal {name}: cannot watch {}: it does not exist",
                    ws.display()
                );
                continue;
            };
            next.entry(ws).or_default().push((name, globs));
        }
        for ws in goals.keys().filter(|w| !next.contains_key(*w)) {
            let _ = watcher.unwatch(ws);
        }
        next.retain(|ws, watchers| {
            goals.contains_key(ws)
                || match watcher.watch(ws, notify::RecursiveMode::Recursive) {
                    Ok(()) => true,
                    Err(e) => {
                        for (name, _) in watchers.iter() {
                            tracing::warn!("goal {name}: cannot watch {}: {e}", ws.display());
                        }
                        false
                    }
                }
        });
        *goals = next;
    }

    /// The next goal a change is for (cancel-safe: for `select!`); never without a watcher.
    pub(crate) async fn changed(&mut self) -> Option<String> {
        self.rx.recv().await
    }
}

/// Whether a workspace-relative path is in a `.git` folder: git's own bookkeeping (a run's
/// commits, a `git status` refreshing the index) is no change to the workspace.
fn in_git(rel: &Path) -> bool {
    rel.components().any(|c| c.as_os_str() == ".git")
}

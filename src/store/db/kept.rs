//! Outcomes kept in a run folder (`outcome.json`) when the store could not take them, and
//! the runs their processes left: recorded at the next start.

use super::*;

/// An outcome that could not be recorded, kept as `outcome.json` beside the run's
/// transcript; the next start records it (instead of calling the run interrupted).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeptOutcome {
    #[serde(flatten)]
    pub(crate) outcome: Outcome,
    /// The run as it was recorded at its start, so that a store made again (deleted or
    /// replaced under a running `sup`) can record a run it never saw start.
    #[serde(default)]
    pub(crate) run: Option<KeptRun>,
}

/// A run's row as its start recorded it, kept with its outcome.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeptRun {
    goal: String,
    trigger: TriggerKind,
    scheduled_for: Option<String>,
    started_at: String,
    model: String,
    workspace: String,
}

impl KeptRun {
    pub(crate) fn of(run: &NewRun, started_at: DateTime<Utc>) -> Self {
        KeptRun {
            goal: run.goal.to_string(),
            trigger: run.trigger,
            scheduled_for: run.scheduled_for.map(stamp),
            started_at: stamp(started_at),
            model: run.model.to_string(),
            workspace: run.workspace.to_string(),
        }
    }
}

/// The file name of a kept outcome inside a run folder.
pub(crate) const OUTCOME_FILE: &str = "outcome.json";

/// How long a busy or locked store is retried before an outcome is kept in a file.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

impl KeptOutcome {
    /// Write it into `dir` (written to a temporary name, then renamed: whole or absent).
    pub(crate) fn keep(&self, dir: &Path) -> std::io::Result<std::path::PathBuf> {
        let path = dir.join(OUTCOME_FILE);
        let tmp = dir.join(format!("{OUTCOME_FILE}.tmp"));
        let text = serde_json::to_string(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, crate::redact::text(&text).as_bytes())?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// The outcome kept in `dir`, if any.
    pub(crate) fn read(dir: &Path) -> Option<KeptOutcome> {
        let text = std::fs::read_to_string(dir.join(OUTCOME_FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }
}

impl Db {
    /// Record run `id` (of folder `dir`) whole from its kept outcome, row and end, when the
    /// store has no row of it (it was made again after the run started).
    pub(crate) fn adopt(&self, id: &str, dir: &Path, kept: &KeptOutcome) -> Result<bool, DbError> {
        let Some(run) = &kept.run else {
            return Ok(false);
        };
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        let added = tx
            .execute(
                "INSERT OR IGNORE INTO runs (id, goal, trigger, scheduled_for, status, started_at,
                     pid, model, workspace, dir)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8, ?9)",
                params![
                    id,
                    run.goal,
                    run.trigger,
                    run.scheduled_for,
                    RunStatus::Running,
                    run.started_at,
                    run.model,
                    run.workspace,
                    dir.display().to_string()
                ],
            )
            .map_err(|e| self.err(e))?;
        if added == 0 {
            return Ok(false);
        }
        Self::write_end(&tx, id, &kept.outcome).map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(true)
    }

    /// Outcomes kept in run folders under `home/runs` whose runs this store has no row of
    /// (it was deleted or replaced while they ran) and whose processes are gone: each is
    /// recorded, and its file goes. Returns how many.
    fn adopt_kept(&self) -> Result<usize, DbError> {
        let Some(home) = Path::new(&self.path).parent() else {
            return Ok(0);
        };
        let Ok(dirs) = std::fs::read_dir(home.join("runs")) else {
            return Ok(0);
        };
        let mut n = 0;
        for dir in dirs.filter_map(Result::ok).map(|e| e.path()) {
            let Some(kept) = KeptOutcome::read(&dir) else {
                continue;
            };
            let Some(id) = dir.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if crate::tools::sandbox::run_alive(&dir) == Some(true) {
                continue;
            }
            if self.adopt(id, &dir, &kept)? {
                if let Err(e) = std::fs::remove_file(dir.join(OUTCOME_FILE)) {
                    tracing::warn!(
                        "recorded the kept outcome of run {id}, but cannot remove it: {e}"
                    );
                }
                tracing::info!("run {id}: recorded the outcome kept in {}", dir.display());
                n += 1;
            }
        }
        Ok(n)
    }

    /// Runs left `running` by a process that is gone become `interrupted`, unless their
    /// outcome was kept in a file (the store could not take it then): that outcome is
    /// recorded. Returns how many runs were settled.
    pub(crate) fn mark_orphans(&self) -> Result<usize, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, pid, dir FROM runs WHERE status = 'running'")
            .map_err(|e| self.err(e))?;
        let rows: Vec<(String, u32, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .and_then(Iterator::collect)
            .map_err(|e| self.err(e))?;
        let mut n = 0;
        for (id, pid, dir) in rows {
            // The run's lock says whether it lives; only runs from before locks go by pid.
            let alive =
                crate::tools::sandbox::run_alive(Path::new(&dir)).unwrap_or_else(|| pid_alive(pid));
            if alive {
                continue;
            }
            if self.record_kept(&id, Path::new(&dir))? {
                n += 1;
                continue;
            }
            n += self.execute(
                "UPDATE runs SET status = 'interrupted', stop_reason = 'cancelled',
                     ended_at = ?2, error = 'the process running it is gone (killed or crashed)'
                 WHERE id = ?1 AND status = 'running'",
                params![id, stamp(Utc::now())],
            )?;
        }
        n += self.adopt_kept()?;
        // An occurrence whose run is over is over too: a stale run's occurrence closes
        // with it, so the goal's history and `sup status` do not show it running forever.
        self.execute(
            "UPDATE occurrences SET status = ?1
             WHERE status = ?2 AND run_id IN (SELECT id FROM runs WHERE status != ?3)",
            params![
                OccurrenceStatus::Done,
                OccurrenceStatus::Running,
                RunStatus::Running
            ],
        )?;
        Ok(n)
    }

    /// Record the outcome kept in `dir` for run `id`, if there is one; the file goes once
    /// recorded.
    fn record_kept(&self, id: &str, dir: &Path) -> Result<bool, DbError> {
        let Some(kept) = KeptOutcome::read(dir) else {
            return Ok(false);
        };
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        Self::write_end(&tx, id, &kept.outcome).map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        if let Err(e) = std::fs::remove_file(dir.join(OUTCOME_FILE)) {
            tracing::warn!("recorded the kept outcome of run {id}, but cannot remove it: {e}");
        }
        tracing::info!("run {id}: recorded the outcome kept in {}", dir.display());
        Ok(true)
    }
}

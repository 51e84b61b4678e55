//! `sup continue RUN_ID`, and what `sup show` says of how runs tie together: the run a run
//! continued (or was continued by), a parallel run's attempts, a worktree run's branch and
//! commit, and `sup show RUN_ID --diff`.

use std::io::Write;

use super::db;
use super::{Cli, Command, Ending, Fail};
use crate::run::resume::{self, Overrides};
use crate::run::worktree;
use crate::store::{self, TriggerKind};
use crate::trace::escape;

/// Continue run `id` from its transcript, with `o` over its recorded settings.
pub(crate) async fn continue_run(id: &str, o: Overrides, json: bool) -> Result<Ending, Fail> {
    let db = db()?;
    db.run(id)?;
    let c = resume::continuable(&db, id).map_err(Fail::from)?;
    drop(db);
    let (spec, is_goal) = match &c.origin.argv {
        Some(argv) => {
            // Relative paths of the command line start where it was given.
            std::env::set_current_dir(&c.origin.cwd).map_err(|e| {
                Fail::usage(anyhow::anyhow!(
                    "run {id} cannot be continued: it started in {}, which is gone: {e}",
                    c.origin.cwd.display()
                ))
            })?;
            let cli = <Cli as clap::Parser>::try_parse_from(
                std::iter::once("sup".to_string()).chain(argv.iter().cloned()),
            )
            .map_err(|e| Fail::usage(anyhow::anyhow!("run {id}: its command line: {e}")))?;
            match cli.command {
                Command::Run(mut a) => {
                    resume::overrides(&mut a.common.settings, o);
                    (super::run::run_spec(a)?, false)
                }
                Command::Goal(mut a) => {
                    resume::overrides(&mut a.common.settings, o);
                    a.tries = o.tries.or(a.tries);
                    (super::run::goal_spec(a)?, true)
                }
                _ => {
                    return Err(Fail::usage(anyhow::anyhow!(
                        "run {id} cannot be continued: it was not started by `sup run` or \
                         `sup goal`"
                    )));
                }
            }
        }
        None => (resume::file_spec(&c.origin, o).map_err(Fail::from)?, true),
    };
    let spec = resume::continuation(spec, &c, &store::home()).map_err(Fail::from)?;
    super::run::execute(spec, json, false, is_goal, TriggerKind::Cli).await
}

/// The lines `sup show` adds for run `id`: what it continued, its attempts, its worktree.
pub(crate) fn show_thread(db: &crate::store::db::Db, id: &str, out: &mut impl Write) {
    let Ok(l) = db.lineage(id) else {
        return;
    };
    if let Some(from) = &l.continued_from {
        let _ = writeln!(out, "continued from run {from}");
    }
    if let Ok(Some(by)) = db.continued_by(id) {
        let _ = writeln!(out, "continued by run {by}");
    }
    if let (Some(parent), Some(n)) = (&l.parent, l.attempt) {
        let _ = writeln!(out, "attempt {n} of parallel run {parent}");
    }
    let attempts = db.attempts(id).unwrap_or_default();
    if !attempts.is_empty() {
        let _ = writeln!(out, "attempts:");
        for (n, r) in &attempts {
            let wins = l.attempt == Some(*n) && r.status == crate::store::RunStatus::Achieved;
            let cancelled = r
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("cancelled"));
            let _ = writeln!(
                out,
                "  attempt {n} · {} · {}{}{}",
                r.id,
                r.status,
                r.stop_reason.map(|s| format!(" ({s})")).unwrap_or_default(),
                if wins {
                    " · wins"
                } else if cancelled {
                    " · cancelled"
                } else {
                    ""
                }
            );
        }
    }
    if let Some(branch) = &l.branch {
        let _ = writeln!(
            out,
            "worktree: branch {branch} · base {} · commit {}",
            l.base.as_deref().map_or("—", short_sha),
            l.commit.as_deref().map_or("—", short_sha)
        );
        for line in l.diff_stat.as_deref().unwrap_or("").lines() {
            let _ = writeln!(out, "  {}", escape(line));
        }
    }
}

fn short_sha(s: &str) -> &str {
    &s[..s.len().min(12)]
}

/// `sup show RUN_ID --diff`: the diff of the run's worktree commit from its base.
pub(crate) fn diff(id: &str) -> Result<Ending, Fail> {
    let db = db()?;
    db.run(id)?;
    let l = db.lineage(id)?;
    let (Some(repo), Some(base), Some(commit)) = (&l.repo, &l.base, &l.commit) else {
        return Err(Fail::usage(anyhow::anyhow!(
            "run {id} has no worktree commit: only runs with isolation = \"worktree\" (or \
             parallel) that ended have a diff"
        )));
    };
    let text = worktree::diff(std::path::Path::new(repo), base, commit).map_err(Fail::usage)?;
    let mut out = std::io::stdout().lock();
    for line in text.lines() {
        let _ = writeln!(out, "{}", escape(line));
    }
    Ok(Ending::Achieved)
}

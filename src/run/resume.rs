//! How runs tie together, and continuing one (`sup continue RUN_ID`, the daemon's
//! `on_interrupt = "continue"`): each run records how it was started (`origin.json` in its
//! folder: the command line or the goal file, the model, a digest of its checks) and its
//! lineage in the store. A run that ended `interrupted`, `unfinished` or `error` is built again
//! from that record, with the conversation of its transcript (a partial last turn closed, each
//! of its calls answered "interrupted before it ran"), on the same worktree branch when it was
//! isolated; the new run is linked to the old one (`continued_from`).

use std::path::{Path, PathBuf};

use sha2::Digest;

use super::worktree::{Finished, Resume, Worktree};
use super::{Invocation, RunError, RunSpec, setup};
use crate::model::{Message, ToolResult};
use crate::store::RunDir;
use crate::store::RunStatus;
use crate::store::db::{Db, RunRow};
use crate::store::lineage::Lineage;
use crate::trace::{Event, Events, Thread as Told};
use crate::verify::{Check, Outcome};

/// The file of a run's folder that says how it was started.
const ORIGIN_FILE: &str = "origin.json";

/// What a result of a call that never ran says.
pub(crate) const NOT_RUN: &str = "interrupted before it ran";

/// How a run ties to others.
#[derive(Clone, Debug, Default)]
pub(crate) struct Thread {
    /// How to build this run again; recorded in its folder.
    pub(crate) origin: Option<Origin>,
    /// The run this one continues, and its conversation to go on with.
    from: Option<(String, Vec<Message>)>,
    /// A parallel attempt: its number, how many, and the parallel run's id.
    pub(crate) attempt: Option<(u32, u32, String)>,
    /// The folder of the run this one continues, whose protected paths' snapshot it keeps.
    from_dir: Option<PathBuf>,
}

impl Thread {
    /// The conversation a continued run starts from.
    pub(crate) fn history(&self) -> Option<Vec<Message>> {
        self.from.as_ref().map(|(_, m)| m.clone())
    }
}

/// How a run was started, enough to build it again.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Origin {
    /// `sup run …` / `sup goal …`: the arguments after the program's name.
    pub(crate) argv: Option<Vec<String>>,
    /// A goal file the daemon ran.
    goal_file: Option<PathBuf>,
    /// The daemon's goals folder.
    goals_dir: Option<PathBuf>,
    /// The folder it was started in.
    pub(crate) cwd: PathBuf,
    /// The model, as resolved (a `script:` path made whole).
    #[serde(default)]
    model: String,
    /// A digest of the checks: a continued run is judged by the same exam.
    #[serde(default)]
    checks: String,
}

impl Origin {
    /// A run from this process's command line.
    pub(crate) fn command_line() -> Origin {
        Origin {
            argv: Some(std::env::args().skip(1).collect()),
            cwd: std::env::current_dir().unwrap_or_default(),
            ..Origin::default()
        }
    }

    /// A daemon's run of a goal file.
    pub(crate) fn goal_file(path: &Path, goals_dir: &Path) -> Origin {
        Origin {
            goal_file: Some(path.to_path_buf()),
            goals_dir: Some(goals_dir.to_path_buf()),
            cwd: std::env::current_dir().unwrap_or_default(),
            ..Origin::default()
        }
    }

    fn read(dir: &Path) -> Option<Origin> {
        let text = std::fs::read_to_string(dir.join(ORIGIN_FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// A digest of what the checks are: their kinds, names, commands and script contents.
pub(crate) fn checks_digest(checks: &[Check]) -> String {
    let mut h = sha2::Sha256::new();
    for c in checks {
        h.update(format!("{:?}\n{}\n", c.kind, c.name).as_bytes());
        if let Some(p) = c.script_path() {
            h.update(std::fs::read(&p).unwrap_or_default());
        }
        h.update(b"\0");
    }
    h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

/// Record, as run `run` starts, its lineage (and its worktree) in the store and its origin in
/// its folder.
pub(crate) fn started(
    spec: &RunSpec,
    db: &Db,
    run: &RunDir,
    tree: Option<&Worktree>,
) -> Result<(), RunError> {
    let t = &spec.thread;
    db.set_lineage(
        &run.id,
        &Lineage {
            continued_from: t.from.as_ref().map(|(id, _)| id.clone()),
            parent: t.attempt.as_ref().map(|(_, _, p)| p.clone()),
            attempt: t.attempt.as_ref().map(|(n, _, _)| *n),
            branch: tree.map(|w| w.branch.clone()),
            base: tree.map(|w| w.base.clone()),
            repo: spec
                .isolate
                .repo
                .as_ref()
                .map(|r| r.top.display().to_string()),
            ..Lineage::default()
        },
    )?;
    // The exam compares with what the first run started from, not with what it left.
    for file in [crate::verify::protect::FILE, crate::verify::judge::FILE] {
        let Some(kept) = t.from_dir.as_ref().map(|d| d.join(file)) else {
            break;
        };
        if kept.exists() {
            std::fs::copy(&kept, run.dir.join(file)).map_err(|e| {
                setup(format!(
                    "cannot keep the snapshot {} of the run continued: {e}",
                    kept.display()
                ))
            })?;
        }
    }
    if let Some(origin) = &t.origin {
        let origin = Origin {
            model: spec.model_name(),
            checks: checks_digest(&spec.goal.checks),
            ..origin.clone()
        };
        let text = serde_json::to_string(&origin).unwrap_or_default();
        if let Err(e) = std::fs::write(
            run.dir.join(ORIGIN_FILE),
            crate::redact::text(&text).as_bytes(),
        ) {
            tracing::warn!("run {}: cannot record how it started: {e}", run.id);
        }
    }
    Ok(())
}

/// As run `run_id` ends: its worktree committed and removed, what it left recorded and told;
/// the parts of its result this adds.
pub(crate) fn ended(
    spec: &RunSpec,
    db: &Db,
    run_id: &str,
    tree: Option<Worktree>,
    outcome: &Outcome,
    events: &Events,
) -> Told {
    let t = &spec.thread;
    let mut told = Told {
        continued_from: t.from.as_ref().map(|(id, _)| id.clone()),
        attempt: t.attempt.as_ref().map(|(n, _, _)| *n),
        ..Told::default()
    };
    let Some(tree) = tree else {
        return told;
    };
    let branch = tree.branch.clone();
    let f: Finished = tree.finish(&spec.goal.name, outcome.status, run_id, spec.isolate.keep);
    let recorded = db.set_lineage(
        run_id,
        &Lineage {
            commit: f.commit.clone(),
            diff_stat: Some(f.diff_stat.clone()),
            ..Lineage::default()
        },
    );
    if let Err(e) = recorded {
        tracing::warn!("run {run_id}: cannot record its worktree's commit: {e}");
    }
    let summary = f
        .diff_stat
        .lines()
        .last()
        .map_or("no changes".to_string(), |l| l.trim().to_string());
    events.emit(Event::Notice {
        text: match &f.branch {
            Some(b) => format!(
                "worktree: the work is on branch {b} · commit {} · {summary} \
                 (`sup show {run_id} --diff`)",
                f.commit.as_deref().map_or("—", |c| &c[..c.len().min(12)])
            ),
            None => format!(
                "worktree: branch {branch} not kept (keep = \"{}\") · {summary}",
                match spec.isolate.keep {
                    crate::config::Keep::Achieved => "achieved",
                    crate::config::Keep::Always => "always",
                    crate::config::Keep::Never => "never",
                }
            ),
        },
    });
    told.branch = f.branch;
    told.commit = f.commit;
    told.diff_stat = Some(f.diff_stat);
    told
}

/// The model of a run: a continued run's `script:` model goes on after the turns its
/// conversation holds, instead of playing them again.
pub(crate) fn model(spec: &RunSpec) -> Result<Box<dyn crate::model::Model>, RunError> {
    let resolved = spec.model_name();
    if let (Some((_, history)), Some(path)) = (&spec.thread.from, resolved.strip_prefix("script:"))
    {
        let played = history
            .iter()
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .count();
        let script = crate::model::script::ScriptModel::load(Path::new(path))?;
        return Ok(Box::new(script.starting_at(played)));
    }
    Ok(crate::model::from_spec(
        &spec.model,
        &spec.model_base,
        &spec.providers,
    )?)
}

/// What `sup continue` may change of a run's recorded settings.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Overrides {
    pub(crate) max_steps: Option<u32>,
    pub(crate) tries: Option<u32>,
    pub(crate) max_cost: Option<f64>,
}

/// A run that may be continued, read from the store and its folder.
pub(crate) struct Continuable {
    pub(crate) row: RunRow,
    pub(crate) origin: Origin,
    lineage: Lineage,
}

/// Run `id`, if it can be continued; otherwise why not (exit 2).
pub(crate) fn continuable(db: &Db, id: &str) -> Result<Continuable, RunError> {
    let row = db.run(id)?;
    let refuse = |why: String| Err(setup(format!("run {id} cannot be continued: {why}")));
    match row.status {
        RunStatus::Interrupted | RunStatus::Unfinished | RunStatus::Error => {}
        RunStatus::Achieved => return refuse("it achieved its goal; there is nothing left".into()),
        RunStatus::Running => return refuse("it is still running".into()),
        s => {
            return refuse(format!(
                "it ended {s}: its checks judged it; start a new run instead"
            ));
        }
    }
    if !db.attempts(id)?.is_empty() {
        return refuse(
            "it is a parallel run; continue one of its attempts (`sup show` lists them)".into(),
        );
    }
    if let Some(by) = db.continued_by(id)? {
        return refuse(format!(
            "run {by} continued it already; continue that one instead"
        ));
    }
    let Some(origin) = Origin::read(Path::new(&row.dir)) else {
        return refuse(format!(
            "how it started was not recorded ({}/{ORIGIN_FILE})",
            row.dir
        ));
    };
    Ok(Continuable {
        lineage: db.lineage(id)?,
        row,
        origin,
    })
}

/// The spec of a goal-file run (a daemon's) built again, with `o` over its settings.
pub(crate) fn file_spec(origin: &Origin, o: Overrides) -> Result<RunSpec, RunError> {
    let Some(path) = &origin.goal_file else {
        return Err(setup("the run was not started from a goal file"));
    };
    let file = crate::schedule::goals::load(path)
        .map_err(crate::config::ConfigError::from)?
        .file;
    let mut flags = crate::config::Settings::default();
    overrides(&mut flags, o);
    let inv = Invocation {
        flags,
        checks: Vec::new(),
        env: crate::config::Settings::from_env()?,
    };
    let mut spec = RunSpec::build(&inv, Some(&file))?;
    spec.sandbox.goals = origin.goals_dir.clone();
    Ok(spec)
}

/// Put `o` into a flags layer.
pub(crate) fn overrides(flags: &mut crate::config::Settings, o: Overrides) {
    if o.max_steps.is_some() {
        flags.max_steps = o.max_steps;
    }
    if o.tries.is_some() {
        flags.tries = o.tries;
    }
    if o.max_cost.is_some() {
        flags.max_cost = o.max_cost;
    }
}

/// `spec`, built again for run `c`, made its continuation: the same model and exam (a goal
/// file whose checks changed since is refused), its conversation, its worktree branch.
pub(crate) fn continuation(
    mut spec: RunSpec,
    c: &Continuable,
    home: &Path,
) -> Result<RunSpec, RunError> {
    let id = &c.row.id;
    if checks_digest(&spec.goal.checks) != c.origin.checks {
        return Err(setup(format!(
            "run {id} cannot be continued: its goal's checks changed since it ran, and a \
             continued run is judged by the exam it started with; start a new run instead"
        )));
    }
    if !c.origin.model.is_empty() {
        spec.model = c.origin.model.clone();
    }
    // One run goes on; a parallel run's attempt is continued on its own.
    spec.isolate.parallel = 1;
    if let Some(branch) = &c.lineage.branch {
        if spec.isolate.repo.is_none() {
            spec.isolate.repo = Some(super::worktree::Repo::of(Path::new(&c.row.workspace))?);
        }
        spec.isolate.resume = Some(Resume {
            branch: branch.clone(),
            base: c.lineage.base.clone().unwrap_or_default(),
            commit: c.lineage.commit.clone(),
            path: home.join("worktrees").join(id),
        });
    }
    let transcript = Path::new(&c.row.dir).join("transcript.jsonl");
    let text = std::fs::read_to_string(&transcript).map_err(|e| {
        setup(format!(
            "run {id} cannot be continued: its transcript {}: {e}",
            transcript.display()
        ))
    })?;
    let messages = conversation(&text);
    if messages.is_empty() {
        return Err(setup(format!(
            "run {id} cannot be continued: its transcript holds no conversation"
        )));
    }
    spec.thread.origin = Some(c.origin.clone());
    spec.thread.from = Some((id.clone(), messages));
    spec.thread.from_dir = Some(PathBuf::from(&c.row.dir));
    Ok(spec)
}

/// The conversation of a transcript, its partial last turn closed: calls without results
/// are answered "interrupted before it ran"; a last answer is followed by a note that the
/// run goes on.
pub(crate) fn conversation(transcript: &str) -> Vec<Message> {
    let mut messages: Vec<Message> = transcript
        .lines()
        .filter_map(|l| serde_json::from_str::<Event>(l).ok())
        .filter_map(|e| match e {
            Event::Message { message } => Some(message),
            _ => None,
        })
        .collect();
    match messages.last() {
        Some(Message::Assistant { tool_calls, .. }) if !tool_calls.is_empty() => {
            let results = tool_calls
                .iter()
                .map(|c| ToolResult {
                    call_id: c.id.clone(),
                    name: c.name.clone(),
                    content: NOT_RUN.into(),
                    is_error: true,
                })
                .collect();
            messages.push(Message::Tool { results });
        }
        Some(Message::Assistant { .. }) => messages.push(Message::User {
            content: "The run stopped here and now goes on: continue the work, and answer \
                      when it is done."
                .into(),
        }),
        _ => {}
    }
    messages
}

/// Runs of goal `goal` the daemon should continue at its start: its latest run, when the
/// process running it is gone and nothing continued it.
pub(crate) fn interrupted_run(db: &Db, goal: &str) -> Option<Continuable> {
    let last = db.runs(Some(goal), None, 1).ok()?.into_iter().next()?;
    if last.status != RunStatus::Interrupted {
        return None;
    }
    continuable(db, &last.id).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolCall;

    fn line(m: Message) -> String {
        serde_json::to_string(&Event::Message { message: m }).unwrap()
    }

    #[test]
    fn a_partial_turn_is_closed_with_every_call_answered() {
        let t = [
            line(Message::User {
                content: "do".into(),
            }),
            line(Message::Assistant {
                text: String::new(),
                tool_calls: vec![
                    ToolCall {
                        id: "a".into(),
                        name: "run_command".into(),
                        arguments: "{}".into(),
                    },
                    ToolCall {
                        id: "b".into(),
                        name: "read_file".into(),
                        arguments: "{}".into(),
                    },
                ],
                reasoning: None,
            }),
            "{\"type\":\"step_started\",\"step\":2}".into(),
        ]
        .join("\n");
        let m = conversation(&t);
        assert_eq!(m.len(), 3);
        let Message::Tool { results } = &m[2] else {
            panic!("{m:?}")
        };
        let ids: Vec<&str> = results.iter().map(|r| r.call_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(results.iter().all(|r| r.is_error && r.content == NOT_RUN));
    }
}

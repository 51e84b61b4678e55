//! The verify loop: run the work loop, run every acceptance check in the workspace, and on
//! failure tell the model what failed and try again, up to N tries. Also owns what a goal is
//! (`Goal`); goal files are `crate::config`'s, assembling a run is `crate::run`'s.

pub(crate) mod check;
pub mod judge;
pub(crate) mod protect;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::model::{Conversation, Message, Usage};
use crate::store::RunDir;
pub use crate::trace::Outcome;
use crate::trace::{Event, Events, Status, StopReason};
use crate::work::{self, Agent, Limits, Work};
pub use check::Check;

/// A goal, ready to run: what to ask, how to judge it, and within which limits.
#[derive(Clone, Debug)]
pub struct Goal {
    pub name: String,
    pub prompt: String,
    pub system: String,
    pub checks: Vec<Check>,
    pub tries: u32,
    /// Start each try again from the prompt plus the latest failure report.
    pub fresh: bool,
    pub limits: Limits,
    /// Canonical.
    pub workspace: PathBuf,
    /// Bytes of each check's output tail shown to the model.
    pub feedback_cap: usize,
    /// What the agent may not create, change or delete (`protect`, `.git`).
    pub protect: Arc<crate::tools::Protected>,
    /// Checks use the workspace's own toolchain rather than the interpreters found at start.
    pub workspace_toolchain: bool,
}

/// The default system prompt.
pub(crate) fn default_system(workspace: &std::path::Path) -> String {
    format!(
        "You are an agent that does real work with tools. Your workspace is {}; all paths are \
         relative to it. Act with the tools, check your work, and when you are done answer \
         without calling tools.",
        workspace.display()
    )
}

/// What a goal run needs besides the goal.
pub struct Runtime<'a> {
    pub agent: Agent<'a>,
    pub run: &'a RunDir,
    /// The run's MCP servers: ended before each try's checks, started again for the next.
    pub mcp: Option<&'a crate::tools::Servers>,
}

/// The status a work loop's stop gives when no check judges it.
fn status_of(stop: StopReason) -> Status {
    match stop {
        StopReason::Final => Status::Achieved,
        StopReason::Cancelled => Status::Interrupted,
        StopReason::Error => Status::Error,
        StopReason::NoProgress
        | StopReason::ChecksFailed
        | StopReason::CheckChanged
        | StopReason::Impossible => Status::Failed,
        _ => Status::Unfinished,
    }
}

/// Run `goal` to its end.
pub async fn run(goal: &Goal, rt: &Runtime<'_>) -> Outcome {
    run_from(goal, rt, None).await
}

/// `run`, going on from `history` (a continued run's conversation) instead of the prompt.
pub(crate) async fn run_from(
    goal: &Goal,
    rt: &Runtime<'_>,
    history: Option<Vec<Message>>,
) -> Outcome {
    let started = Instant::now();
    let originals = check::snapshot(&goal.checks);
    let frozen = check::freeze(&goal.checks, &rt.run.dir.join("checks"));
    let mut protected: Vec<PathBuf> = goal.checks.iter().filter_map(Check::script_path).collect();
    protected.extend(rt.agent.jail.protected.iter().cloned());
    let env: Vec<(String, String)> = vec![
        ("SUP_WORKSPACE".into(), goal.workspace.display().to_string()),
        ("SUP_GOAL".into(), goal.name.clone()),
        ("SUP_RUN_ID".into(), rt.run.id.clone()),
    ];
    let work = Work {
        agent: rt.agent.clone(),
        limits: &goal.limits,
        workspace: goal.workspace.clone(),
        root: Arc::new(crate::tools::Root::open(&goal.workspace)),
        output_dir: rt.run.outputs(),
        protected: Arc::new(protected),
        guarded: goal.protect.clone(),
        env: Arc::new(env.clone()),
        started,
    };
    let mut messages = Conversation::new();
    match history {
        Some(earlier) => {
            for m in earlier {
                work::push(&mut messages, m, rt.agent.events);
            }
        }
        None => begin(&mut messages, goal, goal.prompt.clone(), rt.agent.events),
    }
    let mut out = Outcome::error(None);
    let mut reports: Vec<String> = Vec::new();
    let guarded = &goal.protect;
    // Only checks compare it: a run without them takes none.
    // A continued run finds its first run's snapshot in its folder.
    let mut snapshot = if goal.checks.is_empty() {
        protect::Snapshot::default()
    } else if let Some(kept) = protect::Snapshot::load(&rt.run.dir) {
        kept
    } else {
        let taken = protect::take(&goal.workspace, guarded, &Default::default());
        taken.save(&rt.run.dir);
        taken
    };
    for text in protect::notices(goal) {
        rt.agent.events.emit(Event::Notice { text });
    }
    let toolchain = if goal.workspace_toolchain || goal.checks.is_empty() {
        check::Toolchain::default()
    } else {
        check::Toolchain::pin(&goal.workspace, &rt.run.dir.join("bin"))
    };
    // What judges compare the workspace with, and what they spent: their tokens count in the
    // run's usage and budget, their money (at their own price) in its cost.
    let before = goal
        .checks
        .iter()
        .any(|c| c.as_judge().is_some())
        .then(|| judge::Snapshot::kept_or_take(&rt.run.dir, &goal.workspace));
    let mut agent = Usage::default();
    let mut judge_cost = 0.0;
    let tries = goal.tries.max(1);
    for attempt in 1..=tries {
        out.tries = attempt;
        if !goal.checks.is_empty() {
            rt.agent.events.emit(Event::TryStarted {
                r#try: attempt,
                tries,
            });
        }
        // The checks' jail ends; the try gets a fresh one, with its MCP servers again.
        if attempt > 1
            && !rt.agent.jail.keep_background
            && let Err(e) = again(rt).await
        {
            out.status = Status::Error;
            out.stop_reason = StopReason::Error;
            out.error = Some(format!("try {attempt} could not start: {e}"));
            return out;
        }
        if let Some(changed) = check::changed(&goal.checks, &originals) {
            return tampered(out, changed);
        }
        // What the judges spent is taken off the budget and the cost cap of the work.
        let left = judged_limits(&goal.limits, out.usage, agent, judge_cost);
        let w = Work {
            limits: &left,
            ..work.clone()
        }
        .run(&mut messages, agent)
        .await;
        out.steps += w.steps;
        out.usage += w.usage;
        agent += w.usage;
        out.stop_reason = w.stop_reason;
        out.answer = w.answer.clone();
        out.error = w.error.clone();
        out.cost = goal.limits.price.map(|p| p.cost(&agent) + judge_cost);
        if goal.checks.is_empty()
            || matches!(
                w.stop_reason,
                StopReason::Cancelled | StopReason::Error | StopReason::Context
            )
        {
            out.status = status_of(w.stop_reason);
            return out;
        }
        if let Some(changed) = check::changed(&goal.checks, &originals) {
            return tampered(out, changed);
        }
        // Nothing the agent started may run while the checks judge: not its MCP servers, not
        // what they or its commands started, not its jail; the checks get a jail of their own.
        if !rt.agent.jail.keep_background {
            if let Some(servers) = rt.mcp {
                servers.end().await;
            }
            rt.agent.jail.sweep();
            if let Err(e) = rt.agent.jail.renew() {
                out.status = Status::Error;
                out.stop_reason = StopReason::Error;
                out.error = Some(format!("the checks of try {attempt} could not start: {e}"));
                return out;
            }
        }
        let now = protect::take(&goal.workspace, guarded, &snapshot);
        let changes = protect::compare(&snapshot, &now);
        let answer_file = rt.run.dir.join(format!("try-{attempt}")).join("answer.txt");
        let mut check_env = env.clone();
        check_env.push(("SUP_TRY".into(), attempt.to_string()));
        check_env.push(("SUP_ANSWER".into(), answer_file.display().to_string()));
        // A try that changed what the checks read is judged by none of them.
        let judged: &[Check] = if changes.is_empty() { &frozen } else { &[] };
        let judging = before.as_ref().map(|before| judge::Context {
            prompt: &goal.prompt,
            before,
            evidence_cap: judge::EVIDENCE_CAP,
            refuse: spent_why(goal, &out),
        });
        let round = check::run_all(
            judged,
            &check::CheckRun {
                workspace: &goal.workspace,
                jail: &rt.agent.jail,
                env: &check_env,
                dir: &rt.run.dir.join(format!("try-{attempt}")),
                answer: w.answer.as_deref().unwrap_or(""),
                answer_file: &answer_file,
                feedback_cap: goal.feedback_cap,
                cancel: rt.agent.cancel,
                gate: rt.agent.gate,
                events: rt.agent.events,
                toolchain: &toolchain,
                judge: judging.as_ref(),
            },
            |r| {
                rt.agent.events.emit(Event::Check {
                    r#try: attempt,
                    report: r.clone(),
                })
            },
        )
        .await;
        out.usage += round.usage;
        judge_cost += round.cost;
        out.cost = goal.limits.price.map(|p| p.cost(&agent) + judge_cost);
        let mut results = round.reports;
        if changes.is_empty() {
            // What the checks wrote (caches, coverage) is not the agent's doing.
            snapshot = protect::take(&goal.workspace, guarded, &now);
            snapshot.save(&rt.run.dir);
        } else {
            let report = protect::report(&changes, guarded);
            rt.agent.events.emit(Event::Check {
                r#try: attempt,
                report: report.clone(),
            });
            results.push(report);
        }
        // Kept check output holds no known secret.
        crate::redact::tree(&rt.run.dir.join(format!("try-{attempt}")), &[]);
        let passed = results.iter().all(|r| r.passed);
        out.checks.push(results.clone());
        rt.agent.events.emit(Event::TryFinished {
            r#try: attempt,
            passed,
            stop_reason: w.stop_reason,
        });
        if rt.agent.cancel.is_cancelled() {
            out.status = Status::Interrupted;
            out.stop_reason = StopReason::Cancelled;
            return out;
        }
        if let Some(reason) = round.impossible {
            out.status = Status::Failed;
            out.stop_reason = StopReason::Impossible;
            out.error = Some(format!(
                "a judge said the goal cannot be achieved: {reason}"
            ));
            return out;
        }
        if passed {
            out.status = Status::Achieved;
            return out;
        }
        if matches!(w.stop_reason, StopReason::Budget | StopReason::Cost) {
            out.status = Status::Unfinished;
            return out;
        }
        let report = check::failure_report(&results, attempt, tries);
        reports.push(check::report_key(&results));
        let n = reports.len();
        if n >= 3 && reports[n - 3..].iter().all(|r| *r == reports[n - 1]) {
            out.status = Status::Failed;
            out.stop_reason = StopReason::NoProgress;
            return out;
        }
        if attempt == tries {
            break;
        }
        if goal.fresh {
            messages.clear();
            begin(
                &mut messages,
                goal,
                format!("{}\n\n{report}", goal.prompt),
                rt.agent.events,
            );
        } else {
            work::push(
                &mut messages,
                Message::User { content: report },
                rt.agent.events,
            );
        }
    }
    out.status = Status::Failed;
    out.stop_reason = StopReason::ChecksFailed;
    out
}

/// Before a try after the first: end the checks' jail, give the agent a fresh one, and start
/// the MCP servers in it again.
async fn again(rt: &Runtime<'_>) -> Result<(), String> {
    rt.agent.jail.renew().map_err(|e| e.to_string())?;
    match rt.mcp {
        Some(servers) => servers
            .restart(&rt.agent.jail)
            .await
            .map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// Open a conversation: the system prompt, then `first` as the user's message.
fn begin(messages: &mut Conversation, goal: &Goal, first: String, events: &Events) {
    let system = Message::System {
        content: goal.system.clone(),
    };
    work::push(messages, system, events);
    work::push(messages, Message::User { content: first }, events);
}

/// The work's limits with what the judges spent taken off: their tokens (all of `usage`
/// that is not the agent's) off the token budget, their money off the cost cap.
fn judged_limits(limits: &Limits, usage: Usage, agent: Usage, judge_cost: f64) -> Limits {
    let judged = usage.total().saturating_sub(agent.total());
    Limits {
        token_budget: limits.token_budget.map(|b| b.saturating_sub(judged)),
        max_cost: limits.max_cost.map(|c| c - judge_cost),
        ..limits.clone()
    }
}

/// Why no judge may be asked any more: the run's token budget or cost cap is spent.
fn spent_why(goal: &Goal, out: &Outcome) -> Option<String> {
    if goal
        .limits
        .token_budget
        .is_some_and(|b| out.usage.total() >= b)
    {
        return Some("the run's token budget is spent".into());
    }
    match (out.cost, goal.limits.max_cost) {
        (Some(cost), Some(cap)) if cost >= cap => Some("the run's cost cap is reached".into()),
        _ => None,
    }
}

fn tampered(mut out: Outcome, changed: String) -> Outcome {
    out.status = Status::Failed;
    out.stop_reason = StopReason::CheckChanged;
    out.error = Some(format!(
        "the check {changed} was changed during the run; the goal fails, since a changed \
         exam proves nothing"
    ));
    out
}

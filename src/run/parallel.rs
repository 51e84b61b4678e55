//! Parallel attempts (`parallel = N`): one run of the goal whose N attempts work at once, each
//! a run of its own (its row, folder, transcript, jail and git worktree) with its own verify
//! loop of `tries`. The first attempt whose checks all pass wins; the others are cancelled
//! (their processes end with their runs) and recorded as cancelled. Token and money caps hold
//! over all attempts together (one `Pool`); `max_steps` stays a limit of each work loop. Each
//! attempt's first message says which it is (`attempt 2 of 3`).

use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;

use super::{Launched, Recorded, RunError, RunSpec, Trigger, launch_in};
use crate::model::Usage;
use crate::store::db::{Db, NewRun, PATIENCE};
use crate::store::lineage::Lineage;
use crate::store::{RunDir, Transcript};
use crate::trace::{AttemptReport, Event, EventSink, Events, Status, StopReason, Thread};
use crate::verify::Outcome;
use crate::work::Pool;

/// Tells the parallel run's stream when an attempt starts.
struct Relay {
    attempt: u32,
    of: u32,
    events: Events,
}

impl EventSink for Relay {
    fn emit(&self, event: &Event) {
        if let Event::RunStarted {
            run_id, workspace, ..
        } = event
        {
            self.events.emit(Event::Notice {
                text: format!(
                    "attempt {} of {}: run {run_id} in {workspace}",
                    self.attempt, self.of
                ),
            });
        }
    }
}

/// Run `spec`'s attempts to the first that achieves, recorded as one run (`recorded`, when
/// the caller wrote its row already: a daemon's occurrence).
pub(crate) async fn launch(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    recorded: Option<Recorded>,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    if let Some(why) = &spec.price_refusal {
        return Err(super::setup(why.clone()));
    }
    let n = spec.isolate.parallel;
    let mut db = Db::open(home)?;
    let model = spec.model_name();
    let run = match recorded {
        Some(r) => {
            r.run.make()?;
            if r.model != model {
                db.set_run_model(&r.run.id, &model)?;
            }
            r.run
        }
        None => {
            let run = RunDir::create(home)?;
            db.start_run(&NewRun {
                id: &run.id,
                goal: &spec.goal.name,
                trigger: trigger.kind,
                scheduled_for: trigger.scheduled_for,
                model: &model,
                workspace: &spec.goal.workspace.display().to_string(),
                dir: &run.dir.display().to_string(),
            })?;
            run
        }
    };
    // The goal's run before this one, read before any attempt of this one ends.
    let previous = db.previous_run(&spec.goal.name, &run.id).ok().flatten();
    let mut events = Events::new().with(Arc::new(Transcript::create(&run.transcript())?));
    for sink in sinks {
        events = events.with(sink);
    }
    events.emit(Event::RunStarted {
        run_id: run.id.clone(),
        model: model.clone(),
        workspace: spec.goal.workspace.display().to_string(),
        prompt: spec.prompt_src.text.clone(),
    });
    events.emit(Event::Notice {
        text: format!(
            "parallel: {n} attempts at once, each in a git worktree of its own; the first \
             whose checks all pass wins"
        ),
    });
    let pool = Arc::new(Pool::default());
    let tokens: Vec<CancellationToken> = (0..n).map(|_| cancel.child_token()).collect();
    let mut running = FuturesUnordered::new();
    for (k, token) in (1..=n).zip(tokens.iter().cloned()) {
        let mut s = spec.clone();
        s.isolate.parallel = 1;
        s.thread.attempt = Some((k, n, run.id.clone()));
        s.goal.limits.pool = Some(pool.clone());
        // The parallel run is told, not each attempt.
        s.notify.clear();
        s.prompt_src.text = format!("{}\n\n(attempt {k} of {n})", s.prompt_src.text);
        let relay: Arc<dyn EventSink> = Arc::new(Relay {
            attempt: k,
            of: n,
            events: events.clone(),
        });
        running.push(async move {
            let r = launch_in(&s, home, trigger, None, None, vec![relay], &token).await;
            (k, r)
        });
    }
    let mut winner: Option<u32> = None;
    let mut ended: Vec<(u32, Result<Launched, RunError>)> = Vec::new();
    while let Some((k, r)) = running.next().await {
        let achieved = matches!(&r, Ok(l) if l.outcome.status == Status::Achieved);
        if winner.is_none() && achieved {
            winner = Some(k);
            for (i, t) in tokens.iter().enumerate() {
                if i + 1 != k as usize {
                    t.cancel();
                }
            }
        }
        events.emit(Event::Notice {
            text: match &r {
                Ok(l) => format!(
                    "attempt {k} of {n}: {} ({}){}",
                    l.outcome.status.as_str(),
                    l.outcome.stop_reason.as_str(),
                    if winner == Some(k) { " · wins" } else { "" }
                ),
                Err(e) => format!("attempt {k} of {n}: could not start: {e}"),
            },
        });
        ended.push((k, r));
    }
    ended.sort_by_key(|(k, _)| *k);
    let mut attempts = Vec::new();
    let mut usage = Usage::default();
    let mut cost: Option<f64> = None;
    let mut steps = 0;
    for (k, r) in &ended {
        let Ok(l) = r else { continue };
        usage += l.outcome.usage;
        steps += l.outcome.steps;
        if let Some(c) = l.outcome.cost {
            cost = Some(cost.unwrap_or(0.0) + c);
        }
        let cancelled = winner.is_some()
            && winner != Some(*k)
            && l.outcome.stop_reason == StopReason::Cancelled;
        let note = cancelled.then(|| format!("cancelled: attempt {} won", winner.unwrap_or(0)));
        if let Some(why) = &note
            && let Err(e) = db.note_cancelled(&l.run_id, why)
        {
            tracing::warn!("attempt {k}: cannot record that it was cancelled: {e}");
        }
        attempts.push(AttemptReport {
            attempt: *k,
            run_id: l.run_id.clone(),
            status: l.outcome.status,
            stop_reason: l.outcome.stop_reason,
            note: cancelled.then(|| "cancelled".to_string()),
        });
    }
    let chosen = pick(&ended, winner);
    let Some((k, l)) = chosen else {
        // No attempt started: the first one's error is the run's.
        let error = ended
            .into_iter()
            .find_map(|(_, r)| r.err())
            .unwrap_or_else(|| super::setup("no attempt ran"));
        let _ = db.fail_run(&run.id, &error.to_string());
        return Err(error);
    };
    let mut outcome = Outcome {
        usage,
        cost,
        steps,
        ..l.outcome.clone()
    };
    if cancel.is_cancelled() && winner.is_none() {
        outcome.status = Status::Interrupted;
        outcome.stop_reason = StopReason::Cancelled;
    }
    let theirs = db.lineage(&l.run_id).unwrap_or_default();
    let kept = match spec.isolate.keep {
        crate::config::Keep::Always => true,
        crate::config::Keep::Never => false,
        crate::config::Keep::Achieved => l.outcome.status == Status::Achieved,
    };
    let ours = Lineage {
        attempt: Some(k),
        branch: theirs.branch.clone(),
        base: theirs.base.clone(),
        commit: theirs.commit.clone(),
        diff_stat: theirs.diff_stat.clone(),
        repo: theirs.repo.clone(),
        ..Lineage::default()
    };
    if let Err(e) = db.set_lineage(&run.id, &ours) {
        tracing::warn!("run {}: cannot record its attempts' branch: {e}", run.id);
    }
    events.emit(outcome.event(
        &run.id,
        Thread {
            branch: theirs.branch.filter(|_| kept),
            commit: theirs.commit,
            diff_stat: theirs.diff_stat,
            attempt: Some(k),
            attempts,
            ..Thread::default()
        },
    ));
    db.finish_run_patiently(&run.id, &outcome, PATIENCE).await?;
    // The parallel run is told as one run, from what was recorded.
    if !spec.notify.is_empty()
        && let Ok(row) = db.run(&run.id)
        && let Some((kinds, notice)) =
            crate::notify::Notice::of_run(&row, &outcome.checks, previous.as_ref())
    {
        let notifier = crate::notify::Notifier::new(home, spec.notify.clone());
        notifier.send(&kinds, &notice).await;
        notifier.settle().await;
    }
    Ok(Launched {
        run_id: run.id,
        outcome,
    })
}

/// The attempt whose outcome is the run's: the winner; else the first (by number) that
/// failed its checks, else the first that a limit stopped, else the first that ended.
fn pick(
    ended: &[(u32, Result<Launched, RunError>)],
    winner: Option<u32>,
) -> Option<(u32, &Launched)> {
    let done = || {
        ended
            .iter()
            .filter_map(|(k, r)| r.as_ref().ok().map(|l| (*k, l)))
    };
    if let Some(w) = winner {
        return done().find(|(k, _)| *k == w);
    }
    for status in [Status::Failed, Status::Unfinished, Status::Error] {
        if let Some(found) = done().find(|(_, l)| l.outcome.status == status) {
            return Some(found);
        }
    }
    done().next()
}

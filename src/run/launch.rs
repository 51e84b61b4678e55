//! Starting a run from its `RunSpec`: the approval gate, the run folder, the transcript, the
//! store record, the model, the tools and MCP servers, the jail, then the verify loop; and
//! recording its outcome whatever ends it (an error, a panic, a signal).

use super::*;

/// What started a run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trigger {
    pub(crate) kind: TriggerKind,
    pub(crate) scheduled_for: Option<DateTime<Utc>>,
}

/// A run that happened.
pub(crate) struct Launched {
    pub(crate) run_id: String,
    pub(crate) outcome: Outcome,
}

/// The approval gate of a run. The daemon's runs (scheduled or watched) never prompt (their
/// default is `queue`); a run with no terminal never waits on a prompt (its default is
/// `never`), and says so. Calls are
/// put to the terminal when there is one and the mode is not `queue`, else to the queue;
/// human checks to the terminal when there is one.
fn gate(
    spec: &RunSpec,
    trigger: Trigger,
    run_id: &str,
    home: &Path,
    shared: Option<&Shared>,
    events: &Events,
) -> Gate {
    let scheduled = matches!(trigger.kind, TriggerKind::Schedule | TriggerKind::Watch);
    let terminal = if scheduled { None } else { Terminal::detect() };
    let notice = |text: String| events.emit(Event::Notice { text });
    let mode = match spec.approval {
        Some(Mode::Ask) if scheduled => {
            notice("approval: scheduled runs never prompt; mode ask becomes queue".into());
            Mode::Queue
        }
        Some(Mode::Ask) if terminal.is_none() => {
            notice(
                "approval: no terminal to ask at, so mode never: write and exec calls that no \
                 rule allows are denied (use --approval queue or auto)"
                    .into(),
            );
            Mode::Never
        }
        Some(m) => m,
        None if scheduled => Mode::Queue,
        None if terminal.is_some() => Mode::Ask,
        None => {
            notice(
                "approval: no terminal, so mode never: write and exec calls that no rule \
                 allows are denied (use --approval queue or auto, or allow rules)"
                    .into(),
            );
            Mode::Never
        }
    };
    let queue: Arc<dyn Approver> = Arc::new(QueueApprover {
        home: home.to_path_buf(),
        run_id: run_id.to_string(),
        goal: spec.goal.name.clone(),
        timeout: spec.approval_timeout,
        shared: shared.map(|s| (s.store.clone(), s.run_id.clone())),
    });
    let terminal: Option<Arc<dyn Approver>> = terminal.map(|terminal| {
        Arc::new(TerminalApprover {
            terminal,
            workspace: spec.goal.workspace.clone(),
        }) as Arc<dyn Approver>
    });
    let calls = match &terminal {
        Some(t) if mode != Mode::Queue => t.clone(),
        _ => queue.clone(),
    };
    Gate::new(mode, spec.rules.clone(), calls, terminal.unwrap_or(queue))
        .watching(spec.goal.workspace.clone())
}

/// The goal as this run sees it at `now`: templates rendered, the price and the cost cap set
/// (the smaller of `max_cost` and what is left of `max_cost_per_day` after `spent_today`).
fn this_run(
    spec: &RunSpec,
    now: DateTime<Utc>,
    trigger: Trigger,
    previous: template::Previous,
    spent_today: f64,
) -> Result<Goal, RunError> {
    let mut goal = spec.goal.clone();
    let ctx = template::Context::new(
        spec.timezone,
        now,
        &goal.name,
        template::TriggerVar::new(trigger.kind.as_str(), spec.payload.clone()),
        trigger.scheduled_for,
        previous,
        spec.params.clone(),
    );
    goal.prompt = spec
        .prompt_src
        .render(&ctx)
        .map_err(|e| setup(e.to_string()))?;
    goal.system = spec
        .system_src
        .render(&ctx)
        .map_err(|e| setup(e.to_string()))?;
    goal.limits.price = spec.price;
    if spec.price.is_some() {
        let left_today = spec.max_cost_per_day.map(|cap| cap - spent_today);
        goal.limits.max_cost = match (spec.max_cost, left_today) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(goal)
}

/// The start of `now`'s day in the goal's time zone, when the day's spending counts: only
/// when a daily cap is kept.
fn day_start(spec: &RunSpec, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    spec.price?;
    spec.max_cost_per_day?;
    Some(first_instant_of_day(spec.timezone, now))
}

/// The first instant of `now`'s day in `tz`: local midnight, or, where the clocks skip
/// midnight (a change to summer time at 00:00), the first local time that exists.
fn first_instant_of_day(tz: chrono_tz::Tz, now: DateTime<Utc>) -> DateTime<Utc> {
    let day = now.with_timezone(&tz).date_naive();
    // Clocks skip at most a few hours; the first minute that exists starts the day.
    (0..24 * 60)
        .filter_map(|m| day.and_hms_opt(m / 60, m % 60, 0))
        .find_map(|t| chrono::TimeZone::from_local_datetime(&tz, &t).earliest())
        .map_or(now, |t| t.with_timezone(&Utc))
}

/// The previous run as templates see it, with its checks.
fn previous_of(p: &crate::store::db::RunRow, checks: &[(u32, CheckReport)]) -> template::Previous {
    let last_try = checks.iter().map(|(t, _)| *t).max().unwrap_or(0);
    let mut failed = String::new();
    for (_, c) in checks.iter().filter(|(t, c)| *t == last_try && !c.passed) {
        failed.push_str(&format!("{} ({})\n", c.name, c.outcome));
        for path in c.output_paths() {
            if let Ok((tail, _)) = crate::tools::process::read_tail(Path::new(path), 2000) {
                failed.push_str(&tail);
                if !tail.ends_with('\n') {
                    failed.push('\n');
                }
            }
        }
    }
    template::Previous {
        status: p.status.to_string(),
        answer: p.answer.clone().unwrap_or_default(),
        failed_checks: failed,
    }
}

/// A run of a fleet: its row in the shared store, where `previous.*` and the day's spending
/// are read (whichever daemon ran the earlier runs) and its approval requests are answered.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) store: PgStore,
    /// The run's id in the store.
    pub(crate) run_id: String,
}

/// How long a fleet's run waits for the store to answer before it does not start.
const SHARED_PATIENCE: Duration = Duration::from_secs(30);

/// What the store says of a goal before its run: its previous run, that run as templates
/// see it, and what the goal spent on the day of the run's start.
type Past = (Option<crate::store::db::RunRow>, template::Previous, f64);

/// The goal's `Past` from the local store.
fn past(spec: &RunSpec, db: &Db, now: DateTime<Utc>) -> Result<Past, RunError> {
    let name = &spec.goal.name;
    let previous = db.previous_run(name, "")?;
    let view = previous
        .as_ref()
        .map(|p| previous_of(p, &db.checks(&p.id).unwrap_or_default()));
    let spent = match day_start(spec, now) {
        Some(t) => db.cost_since(name, t)?,
        None => 0.0,
    };
    Ok((previous, view.unwrap_or_default(), spent))
}

/// The goal's `Past` for a fleet's run, from the shared store: its previous run and the
/// day's spending on any daemon.
async fn past_shared(spec: &RunSpec, sh: &Shared, now: DateTime<Utc>) -> Result<Past, RunError> {
    let name = &spec.goal.name;
    let previous = pg::retry("reading the previous run", SHARED_PATIENCE, || {
        sh.store.previous_run(name, &sh.run_id)
    })
    .await?
    .map(|f| f.run);
    let view = match &previous {
        Some(p) => previous_of(p, &sh.store.checks(&p.id).await.unwrap_or_default()),
        None => Default::default(),
    };
    let spent = match day_start(spec, now) {
        Some(t) => {
            pg::retry("reading the day's spending", SHARED_PATIENCE, || {
                sh.store.cost_since(name, t)
            })
            .await?
        }
        None => 0.0,
    };
    Ok((previous, view, spent))
}

/// Set up and run `spec` to its end, recording it in the store under `home`.
pub(crate) async fn launch(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    if spec.isolate.parallel > 1 {
        return parallel::launch(spec, home, trigger, None, sinks, cancel).await;
    }
    launch_in(spec, home, trigger, None, None, sinks, cancel).await
}

/// `launch` for a fleet's run: `previous.*`, `max_cost_per_day` and approval answers come
/// from the shared store.
pub(crate) async fn launch_shared(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    shared: &Shared,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    launch_in(spec, home, trigger, None, Some(shared), sinks, cancel).await
}

/// A run the caller recorded already (the daemon, in the transaction that claimed its
/// occurrence): its folder, and the model its row names.
pub(crate) struct Recorded {
    pub(crate) run: RunDir,
    pub(crate) model: String,
}

/// `launch` for a run whose row the caller wrote already, with the spec `build` makes (here,
/// off the caller's path). A run that cannot start is recorded as an error.
pub(crate) async fn launch_recorded(
    build: impl FnOnce() -> Result<RunSpec, RunError>,
    home: &Path,
    trigger: Trigger,
    recorded: Recorded,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    let id = recorded.run.id.clone();
    let (result, notify, goal) = match build() {
        Ok(spec) if spec.isolate.parallel > 1 => (
            parallel::launch(&spec, home, trigger, Some(recorded), sinks, cancel).await,
            spec.notify,
            spec.goal.name,
        ),
        Ok(spec) => (
            launch_in(&spec, home, trigger, Some(recorded), None, sinks, cancel).await,
            spec.notify,
            spec.goal.name,
        ),
        // Without a spec there are no tables to tell.
        Err(e) => (Err(e), Vec::new(), String::new()),
    };
    if let Err(e) = &result {
        let error = e.to_string();
        let failed = Db::open(home).and_then(|db| db.fail_run(&id, &error));
        if let Err(db) = failed {
            tracing::error!("run {id}: cannot record that it could not start: {db}");
        }
        not_started(home, notify, &goal, &id, trigger, &error).await;
    }
    result
}

/// Tell the `[[notify]]` tables that take `error` that the run `id` could not start.
pub(crate) async fn not_started(
    home: &Path,
    notify: Vec<Notify>,
    goal: &str,
    id: &str,
    trigger: Trigger,
    error: &str,
) {
    if notify.is_empty() {
        return;
    }
    let notice = Notice::not_started(
        goal,
        id,
        trigger.kind.as_str(),
        trigger.scheduled_for,
        error,
    );
    Notifier::new(home, notify)
        .send(&[crate::notify::Kind::Error], &notice)
        .await;
}

pub(crate) async fn launch_in(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    recorded: Option<Recorded>,
    shared: Option<&Shared>,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    if let Some(why) = &spec.price_refusal {
        return Err(setup(why.clone()));
    }
    let mut model = resume::model(spec)?;
    if let Some(path) = &spec.record {
        model = Box::new(Recorder::new(model, path.clone())?);
    }
    let model: Arc<dyn model::Model> = Arc::from(model);
    let judges = judge_models(spec, &model)?;
    let mut tools = registry(&spec.tools)?;
    let mut db = Db::open(home)?;
    // Runs whose process is gone are settled first: an outcome a busy store could not take
    // is recorded now, and what runs killed with `kill -9` or crashed left running ends.
    if let Err(e) = db.mark_orphans() {
        tracing::warn!("{e}");
    }
    crate::tools::sandbox::sweep_dead_runs(home);
    // Their worktree folders go too, their work committed on their branches.
    worktree::sweep_dead(home, &db);
    let now = Utc::now();
    let (previous, view, spent) = match shared {
        None => past(spec, &db, now)?,
        Some(sh) => past_shared(spec, sh, now).await?,
    };
    let mut goal = this_run(spec, now, trigger, view, spent)?;
    for c in &mut goal.checks {
        if let Some(j) = c.as_judge_mut() {
            j.bound = judges
                .get(&model::resolved_name(&j.model, &j.base))
                .cloned();
        }
    }
    let (run, recorded_model) = match recorded {
        Some(r) => {
            r.run.make()?;
            (r.run, Some(r.model))
        }
        None => (RunDir::create(home)?, None),
    };
    // An isolated run works in a worktree of its own from here on.
    let (tree, moved) = match worktree::isolate(spec, &goal, home, &run.id) {
        Ok(Some((s, g, t))) => {
            goal = g;
            (Some(t), Some(s))
        }
        Ok(None) => (None, None),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run.dir);
            return Err(e.into());
        }
    };
    let spec = moved.as_ref().unwrap_or(spec);
    let mut checks: Vec<PathBuf> = spec
        .goal
        .checks
        .iter()
        .filter_map(Check::script_path)
        .collect();
    // What the goal protects is read-only to commands, as the checks are.
    checks.extend(crate::verify::protect::roots(
        &spec.goal.workspace,
        &spec.goal.protect,
    ));
    let jail = match Jail::new(
        &spec.sandbox,
        &spec.goal.workspace,
        &run.dir,
        &run.id,
        home,
        &checks,
    ) {
        Ok(j) => Arc::new(j),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run.dir);
            return Err(e.into());
        }
    };
    // MCP servers start before the first model call; one that cannot start ends the run
    // here, before anything was recorded.
    let (mut servers, mcp_tools) =
        match Servers::start(&spec.mcp, &spec.goal.workspace, &run.dir, &jail, &run.id).await {
            Ok(s) => s,
            Err(e) => {
                jail.sweep();
                let _ = std::fs::remove_dir_all(&run.dir);
                return Err(e.into());
            }
        };
    // From here on every way out shuts the servers down.
    let started = || {
        for t in mcp_tools {
            tools.add(t)?;
        }
        let transcript = Transcript::create(&run.transcript())?;
        let new_run = NewRun {
            id: &run.id,
            goal: &spec.goal.name,
            trigger: trigger.kind,
            scheduled_for: trigger.scheduled_for,
            model: model.name(),
            workspace: &spec.goal.workspace.display().to_string(),
            dir: &run.dir.display().to_string(),
        };
        // As recorded, for a store made again before the run ends.
        let kept_run = KeptRun::of(&new_run, Utc::now());
        if recorded_model.is_none() {
            db.start_run(&new_run)?;
        } else if recorded_model.as_deref() != Some(model.name()) {
            db.set_run_model(&run.id, model.name())?;
        }
        resume::started(spec, &db, &run, tree.as_ref())?;
        Ok::<_, RunError>((transcript, kept_run))
    };
    let (transcript, kept_run) = match started() {
        Ok(t) => t,
        Err(e) => {
            servers.shutdown().await;
            jail.sweep();
            let _ = std::fs::remove_dir_all(&run.dir);
            return Err(e);
        }
    };
    let mut events = Events::new().with(Arc::new(transcript));
    for sink in sinks {
        events = events.with(sink);
    }
    if let Some(spans) = crate::trace::otel::sink(&goal.name) {
        events = events.with(spans);
    }
    if day_start(spec, Utc::now()).is_some() {
        // Under a daily cap the cost is recorded as it grows: a running run, or one killed,
        // counts what it spent.
        match Db::open(home) {
            Ok(db) => {
                events = events.with(Arc::new(CostSink {
                    db: std::sync::Mutex::new(db),
                    run_id: run.id.clone(),
                }))
            }
            Err(e) => tracing::warn!("run {}: its cost is recorded at its end only: {e}", run.id),
        }
    }
    let notifier = Notifier::new(home, spec.notify.clone());
    if !spec.notify.is_empty() {
        events = events.with(notifier.approvals(&goal.name, &run.id, trigger.kind.as_str()));
    }
    events.emit(Event::RunStarted {
        run_id: run.id.clone(),
        model: model.name().to_string(),
        workspace: spec.goal.workspace.display().to_string(),
        prompt: goal.prompt.clone(),
    });
    events.emit(Event::Notice {
        text: jail.describe(),
    });
    let refusals = events.clone();
    jail.on_refusal(move |text| refusals.emit(Event::Notice { text }));
    let gate = gate(spec, trigger, &run.id, home, shared, &events);
    if spec.price.is_none() && (spec.max_cost.is_some() || spec.max_cost_per_day.is_some()) {
        events.emit(Event::Notice {
            text: format!(
                "cost: the price of {} is unknown (unknown_price = \"allow\"), so no cost cap \
                 is kept",
                spec.model
            ),
        });
    }
    let rt = Runtime {
        agent: Agent {
            model: model.as_ref(),
            tools: &tools,
            events: &events,
            cancel,
            gate: Some(&gate),
            jail: jail.clone(),
        },
        run: &run,
        mcp: Some(&servers),
    };
    // A panic anywhere in the run becomes an `error` outcome, recorded like any other.
    let outcome = match AssertUnwindSafe(crate::verify::run_from(&goal, &rt, spec.thread.history()))
        .catch_unwind()
        .await
    {
        Ok(o) => o,
        Err(panic) => panicked(panic.as_ref()),
    };
    servers.shutdown().await;
    // Whatever the agent left running ends with its run.
    jail.sweep();
    let thread = resume::ended(spec, &db, &run.id, tree, &outcome, &events);
    events.emit(outcome.event(&run.id, thread));
    crate::redact::tree(&run.dir, &["transcript.jsonl"]);
    // The outcome first, beside the transcript: it is small, and whole or absent; the next
    // start records it if the store cannot take it now. When the disk is full, what the run
    // kept besides goes first, with a note, so that the outcome fits.
    let kept = KeptOutcome {
        outcome: outcome.clone(),
        run: Some(kept_run),
    };
    let mut dropped = false;
    let mut drop_kept = |events: &Events| {
        if dropped {
            return false;
        }
        dropped = true;
        let freed = run.drop_kept_outputs();
        events.emit(Event::Notice {
            text: format!(
                "the disk is full: the run's kept outputs (tool and check outputs, its tmp \
                 folder; {freed} bytes) were dropped so that its outcome is kept"
            ),
        });
        true
    };
    let mut file = kept.keep(&run.dir);
    if matches!(&file, Err(e) if e.kind() == std::io::ErrorKind::StorageFull) && drop_kept(&events)
    {
        file = kept.keep(&run.dir);
    }
    // A store deleted or replaced while the run went on is made again (this connection
    // writes a file nobody reads), and the run recorded in it whole.
    if db.is_replaced() {
        match Db::open(home) {
            Ok(fresh) => {
                tracing::warn!(
                    "the store {} was deleted or replaced during run {}: it is made again",
                    home.join("sup.db").display(),
                    run.id
                );
                db = fresh;
            }
            Err(e) => {
                tracing::warn!("the store was deleted or replaced and cannot be made again: {e}")
            }
        }
    }
    let mut recorded = db.finish_run_patiently(&run.id, &outcome, PATIENCE).await;
    if matches!(&recorded, Err(e) if crate::store::db::is_full(e)) && drop_kept(&events) {
        recorded = db.finish_run_patiently(&run.id, &outcome, PATIENCE).await;
    }
    if recorded.is_err() && matches!(db.run(&run.id), Err(DbError::NoRun(_))) {
        match db.adopt(&run.id, &run.dir, &kept) {
            Ok(true) => recorded = Ok(()),
            Ok(false) => {}
            Err(e) => tracing::warn!("run {}: {e}", run.id),
        }
    }
    match recorded {
        Ok(()) => {
            if file.is_ok()
                && let Err(e) = std::fs::remove_file(run.dir.join(crate::store::db::OUTCOME_FILE))
            {
                tracing::warn!(
                    "run {}: cannot remove its recorded outcome file: {e}",
                    run.id
                );
            }
            // Built from what was recorded; the outcome is final before anyone is told.
            if !spec.notify.is_empty() {
                match db.run(&run.id) {
                    Ok(row) => {
                        if let Some((kinds, notice)) =
                            Notice::of_run(&row, &outcome.checks, previous.as_ref())
                        {
                            notifier.send(&kinds, &notice).await;
                        }
                    }
                    Err(e) => tracing::warn!("no notice for run {}: {e}", run.id),
                }
            }
            match db.prune(&spec.goal.name, spec.keep_runs) {
                Ok(dirs) => {
                    for dir in dirs {
                        if let Err(e) = std::fs::remove_dir_all(&dir) {
                            tracing::warn!("cannot remove the pruned run folder {dir}: {e}");
                        }
                    }
                }
                Err(e) => tracing::warn!("cannot prune old runs: {e}"),
            }
        }
        // The run's outcome stands whatever the store does: it is kept beside the
        // transcript, and the next start records it.
        Err(e) => match &file {
            Ok(path) => tracing::error!(
                "recording the outcome of run {} failed: {e}; it is kept in {} and the next \
                 `sup` start records it",
                run.id,
                path.display()
            ),
            Err(io) => tracing::error!(
                "recording the outcome of run {} failed: {e}; keeping it in {} failed too: \
                 {io}",
                run.id,
                run.dir.display()
            ),
        },
    }
    // An approval notice still on its way is delivered (or out of time) before the end.
    notifier.settle().await;
    Ok(Launched {
        run_id: run.id,
        outcome,
    })
}

/// Records a run's cost after each model call.
struct CostSink {
    db: std::sync::Mutex<Db>,
    run_id: String,
}

impl EventSink for CostSink {
    fn emit(&self, event: &Event) {
        let Event::StepFinished {
            total_cost: Some(cost),
            ..
        } = event
        else {
            return;
        };
        if let Ok(db) = self.db.lock()
            && let Err(e) = db.set_run_cost(&self.run_id, *cost)
        {
            tracing::warn!("run {}: cannot record its cost so far: {e}", self.run_id);
        }
    }
}

/// The outcome of a run whose code panicked: an error that says where.
fn panicked(panic: &(dyn std::any::Any + Send)) -> Outcome {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown cause".into());
    Outcome::error(Some(format!(
        "sup hit a bug and stopped this run (a panic: {what}); please report it"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_day_starts_at_its_first_instant_where_midnight_does_not_exist() {
        // Santiago skipped from 00:00 to 01:00 on 2024-09-08: the day began at 01:00 (-03).
        let tz: chrono_tz::Tz = "America/Santiago".parse().unwrap();
        let noon = "2024-09-08T15:00:00Z".parse::<DateTime<Utc>>().unwrap();
        assert_eq!(
            first_instant_of_day(tz, noon),
            "2024-09-08T04:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        let day_before = "2024-09-07T15:00:00Z".parse::<DateTime<Utc>>().unwrap();
        assert_eq!(
            first_instant_of_day(tz, day_before),
            "2024-09-07T04:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
    }
}

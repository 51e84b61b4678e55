//! The daemon: sleeps until the earliest next occurrence (or a reload, or shutdown), claims
//! each occurrence in the store before it runs (so it runs at most once across daemons),
//! applies the overlap, catch-up, jitter and pause rules, runs goals through the verify loop
//! with a global concurrency limit, reloads goal files when they change, and on shutdown
//! drains or cancels what runs, recording everything. A run that can start at once is
//! recorded in the transaction that claims its occurrence, on the daemon's one connection,
//! so a thousand due together are all on record within milliseconds; their tasks start after
//! the commit, and make the run's spec, folder, transcript and model there. A loaded goal
//! keeps only what scheduling needs: its file's text (a run is built from it), a schedule
//! shared with every goal of the same expression and zone, its `watch` globs, and what the
//! claim records. A goal with `watch` globs starts when files of its workspace that they
//! match change, once per burst (see `Watched`), through the same claim as an occurrence.
//! Time comes from a `Clock`, so tests move time instead of sleeping.

mod load;
mod watched;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::cron::Schedule;
use super::goals::{self, Timing};
use super::policy::{self, Decision, Settled};
use super::watch::Workspaces;
use crate::config::{GoalFile, UserConfig};
use crate::run::{self, Invocation, Recorded, RunError, RunSpec, Trigger};
use crate::store::db::{Db, DbError, NewRun, stamp};
use crate::store::{OccurrenceStatus, RunDir, TriggerKind};
use watched::Watched;

pub use super::clock::{Clock, ManualClock, SystemClock};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot read the goals folder {path}: {source}")]
    Goals {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Db(#[from] DbError),
}

pub struct Config {
    pub goals_dir: PathBuf,
    pub home: PathBuf,
    pub max_concurrent: usize,
    /// How long running goals get to finish at shutdown before they are cancelled.
    pub grace: Duration,
    pub clock: Arc<dyn Clock>,
    /// Defaults for goal files that leave things out (`SUP_MODEL`, `SUP_APPROVAL`).
    pub defaults: Invocation,
}

struct Running {
    at: DateTime<Utc>,
    cancel: CancellationToken,
}

/// A loaded goal: what scheduling needs, and no more.
struct Slot {
    path: PathBuf,
    /// The text of the version that last loaded: each run is built from it, so a file that
    /// broke since runs as it was.
    text: Arc<str>,
    timing: Timing,
    watch: Option<Watched>,
    /// Whether the goal has `[[notify]]` tables (missed occurrences are told).
    notify: bool,
    /// What the claim records of a run, as the run resolves it.
    run_goal: String,
    model: String,
    workspace: String,
    /// The workspace, canonical where it exists: what a watched workspace is compared with.
    root: PathBuf,
    next: Option<DateTime<Utc>>,
    running: Vec<Running>,
    /// When its last run ended: changes of the workspace soon after are that run's own.
    ended: Option<DateTime<Utc>>,
    queued: Option<(DateTime<Utc>, TriggerKind)>,
}

/// What a run is built from: a goal file's text, with the daemon's defaults.
#[derive(Clone)]
struct Source {
    path: PathBuf,
    text: Arc<str>,
    defaults: Arc<Invocation>,
    /// The daemon's goals folder, never writable by the run.
    goals_dir: PathBuf,
}

impl Source {
    fn spec(&self) -> Result<RunSpec, RunError> {
        let file =
            GoalFile::parse(&self.path, &self.text).map_err(crate::config::ConfigError::from)?;
        let mut spec = RunSpec::build(&self.defaults, Some(&file))?;
        spec.sandbox.goals = Some(self.goals_dir.clone());
        spec.thread.origin = Some(run::resume::Origin::goal_file(&self.path, &self.goals_dir));
        Ok(spec)
    }
}

/// A run to start once the claims are committed.
struct Launch {
    goal: String,
    at: DateTime<Utc>,
    kind: TriggerKind,
    source: Source,
    jitter: Duration,
    cancel: CancellationToken,
    recorded: Option<(Recorded, tokio::sync::OwnedSemaphorePermit)>,
}

impl Launch {
    /// Run it: at once if recorded in the claim's transaction (its permit held), else after
    /// its jitter and once a permit is free. Its run's id and how it ended.
    async fn run(
        self,
        home: PathBuf,
        clock: Arc<dyn Clock>,
        permits: Arc<Semaphore>,
    ) -> (Option<String>, String) {
        let fire = (self.at, self.kind);
        match self.recorded {
            Some((recorded, _permit)) => {
                start_recorded(&self.goal, fire, self.source, &home, recorded, &self.cancel).await
            }
            None => {
                let waits = (self.jitter, clock.as_ref());
                run_one(
                    &self.goal,
                    fire,
                    self.source,
                    &home,
                    waits,
                    &permits,
                    &self.cancel,
                )
                .await
            }
        }
    }
}

struct Done {
    goal: String,
    at: DateTime<Utc>,
    run_id: Option<String>,
    status: String,
}

/// The daemon's state, driven by `run`.
struct Daemon {
    cfg: Config,
    defaults: Arc<Invocation>,
    db: Db,
    id: String,
    slots: BTreeMap<String, Slot>,
    /// Runs claimed and recorded whose tasks start after the commit.
    pending: Vec<Launch>,
    /// The goals paused, read once in a transaction of claims (no one changes them then).
    paused: Option<std::collections::HashSet<String>>,
    /// Files that failed to load, with why; their last good version keeps running.
    errors: BTreeMap<PathBuf, String>,
    tasks: JoinSet<()>,
    done_tx: mpsc::UnboundedSender<Done>,
    permits: Arc<Semaphore>,
    /// Every run's cancel token, for shutdown.
    all_running: Arc<Mutex<Vec<CancellationToken>>>,
    /// The workspaces of goals with `watch` globs.
    workspaces: Workspaces,
}

impl Daemon {
    fn log_db(&self, r: Result<impl Sized, DbError>) {
        if let Err(e) = r {
            tracing::error!("{e}");
        }
    }

    /// At start: occurrences missed while no daemon ran. The latest within `catch_up` runs;
    /// the others are recorded as missed.
    fn catch_up(&mut self, now: DateTime<Utc>) {
        let lasts = match self.db.last_occurrences() {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("{e}");
                return;
            }
        };
        let names: Vec<String> = self.slots.keys().cloned().collect();
        for name in names {
            let Some(&last) = lasts.get(&name) else {
                continue;
            };
            let Some((slot, schedule)) = self
                .slots
                .get(&name)
                .and_then(|s| Some((s, s.timing.schedule.as_ref()?)))
            else {
                continue;
            };
            let settled = policy::catch_up(schedule, last, now, slot.timing.catch_up);
            self.settle(&name, settled);
        }
    }

    /// Record what `policy::settle` missed, and fire what it runs.
    fn settle(&mut self, name: &str, settled: Settled) {
        let Settled {
            missed,
            uncounted,
            fire,
        } = settled;
        if !missed.is_empty() {
            tracing::info!(
                "goal {name}: {} occurrence(s) missed{}",
                missed.len() + uncounted,
                if uncounted > 0 {
                    format!(" ({uncounted} older ones not listed)")
                } else {
                    String::new()
                }
            );
        }
        if let Some(&last) = missed.last() {
            self.tell_missed(name, last, "missed");
        }
        for at in missed {
            let r = self.db.claim(name, at, OccurrenceStatus::Missed, &self.id);
            self.log_db(r);
        }
        if let Some(at) = fire {
            self.fire(name, at, TriggerKind::Schedule);
        }
    }

    /// A `missed` notice for an occurrence that did not run (sent in the background).
    fn tell_missed(&mut self, name: &str, at: DateTime<Utc>, status: &str) {
        let Some(slot) = self.slots.get(name).filter(|s| s.notify) else {
            return;
        };
        let source = self.source(slot);
        let home = self.cfg.home.clone();
        let notice = crate::notify::Notice::missed(name, at, status);
        self.tasks.spawn(async move {
            match source.spec() {
                Ok(spec) => {
                    let notifier = crate::notify::Notifier::new(&home, spec.notify);
                    notifier.send(&[crate::notify::Kind::Missed], &notice).await;
                }
                Err(e) => tracing::warn!("no missed notice for {}: {e}", notice.goal),
            }
        });
    }

    /// Occurrences that came due by `now`, claimed in one transaction. `false` when the
    /// transaction could not begin: nothing was claimed, and the caller tries again soon.
    fn due(&mut self, now: DateTime<Utc>) -> bool {
        if !self
            .slots
            .values()
            .any(|s| s.next.is_some_and(|n| n <= now))
        {
            return true;
        }
        // What started outside this transaction is on record already.
        self.launch_pending();
        // A store deleted or replaced under the daemon is made again, not written unread.
        if self.db.is_replaced() {
            match Db::open(&self.cfg.home) {
                Ok(db) => {
                    tracing::warn!("the store was deleted or replaced: it is made again");
                    self.db = db;
                }
                Err(e) => tracing::error!("the store was deleted or replaced: {e}"),
            }
        }
        if let Err(e) = self.db.conn().execute_batch("BEGIN IMMEDIATE") {
            // Claims never run outside their transaction.
            tracing::error!(
                "cannot begin the claims of {}: {e}; trying again in a second",
                stamp(now)
            );
            return false;
        }
        self.paused = self.db.paused_goals().ok();
        self.due_each(now);
        self.paused = None;
        if let Err(e) = self.db.conn().execute_batch("COMMIT") {
            tracing::error!(
                "cannot commit the claims of {}: {e}; their runs do not start",
                stamp(now)
            );
            let _ = self.db.conn().execute_batch("ROLLBACK");
            // Nothing of them is on record: they start nowhere, and the next start-up
            // catches them up.
            for l in std::mem::take(&mut self.pending) {
                if let Some(slot) = self.slots.get_mut(&l.goal) {
                    slot.running.retain(|r| r.at != l.at);
                }
            }
        }
        true
    }

    fn due_each(&mut self, now: DateTime<Utc>) {
        let names = policy::due_goals(&self.slots, |s| s.next, now);
        for name in names {
            let Some(slot) = self.slots.get_mut(&name) else {
                continue;
            };
            let (Some(first), Some(schedule)) = (slot.next, slot.timing.schedule.as_ref()) else {
                continue;
            };
            let (due, total, next) = policy::due(schedule, first, schedule.next_after(first), now);
            slot.next = next;
            let settled = policy::settle(due, total, now, policy::window(slot.timing.catch_up));
            self.settle(&name, settled);
        }
    }

    /// Claim an occurrence (of the schedule, or of a watched change) and act on it.
    fn fire(&mut self, name: &str, at: DateTime<Utc>, kind: TriggerKind) {
        let burst = self.slots.get(name).and_then(|s| s.watch.as_ref());
        let claim = match burst {
            Some(w) if kind == TriggerKind::Watch => {
                self.db.claim_burst(name, at, w.debounce, &self.id)
            }
            _ => self.db.claim(name, at, OccurrenceStatus::Claimed, &self.id),
        };
        match claim {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!("goal {name} at {}: claimed by another daemon", stamp(at));
                return;
            }
            Err(e) => {
                tracing::error!("goal {name} at {}: cannot claim: {e}", stamp(at));
                return;
            }
        }
        let paused = match &self.paused {
            Some(goals) => Ok(goals.contains(name)),
            None => self.db.paused(name),
        };
        match paused {
            Ok(true) => {
                tracing::info!("goal {name} at {}: paused, not run", stamp(at));
                let r = self.db.occurrence(name, at, OccurrenceStatus::Paused, None);
                self.log_db(r);
                return;
            }
            Ok(false) => {}
            Err(e) => tracing::error!("{e}"),
        }
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        match policy::overlap(
            slot.timing.overlap,
            !slot.running.is_empty(),
            slot.queued.is_some(),
        ) {
            Decision::Start => {}
            Decision::Skip => {
                let why = if slot.queued.is_some() {
                    "one occurrence already waits"
                } else {
                    "the last run is still going"
                };
                tracing::info!("goal {name} at {}: skipped, {why}", stamp(at));
                let r = self
                    .db
                    .occurrence(name, at, OccurrenceStatus::Skipped, None);
                self.log_db(r);
                self.tell_missed(name, at, "skipped");
                return;
            }
            Decision::Queue => {
                tracing::info!(
                    "goal {name} at {}: queued behind the running one",
                    stamp(at)
                );
                slot.queued = Some((at, kind));
                let r = self.db.occurrence(name, at, OccurrenceStatus::Queued, None);
                self.log_db(r);
                return;
            }
            Decision::Replace => {
                tracing::info!("goal {name} at {}: replacing the running one", stamp(at));
                for r in &slot.running {
                    r.cancel.cancel();
                }
            }
        }
        self.start(name, at, kind);
    }

    fn source(&self, slot: &Slot) -> Source {
        Source {
            path: slot.path.clone(),
            text: slot.text.clone(),
            defaults: self.defaults.clone(),
            goals_dir: self.cfg.goals_dir.clone(),
        }
    }

    /// Start a run of `name` for `at`: one that can start at once is recorded now (in the
    /// claim's transaction, when there is one); its task starts with `launch_pending`.
    fn start(&mut self, name: &str, at: DateTime<Utc>, kind: TriggerKind) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        // The run that starts covers a burst of changes under way.
        if let Some(w) = slot.watch.as_mut() {
            w.due = None;
        }
        let Some(slot) = self.slots.get(name) else {
            return;
        };
        let source = self.source(slot);
        // Jitter spreads a schedule's runs; a change wants its run now.
        let jitter = match kind {
            TriggerKind::Schedule => slot.timing.jitter,
            _ => Duration::ZERO,
        };
        let ready = if jitter.is_zero() {
            self.permits.clone().try_acquire_owned().ok()
        } else {
            None
        };
        let recorded = ready.and_then(|permit| {
            let run = RunDir::planned(&self.cfg.home);
            let r = self.db.start_run(&NewRun {
                id: &run.id,
                goal: &slot.run_goal,
                trigger: kind,
                scheduled_for: scheduled_for(kind, at),
                model: &slot.model,
                workspace: &slot.workspace,
                dir: &run.dir.display().to_string(),
            });
            match r {
                Ok(()) => Some((
                    Recorded {
                        run,
                        model: slot.model.clone(),
                    },
                    permit,
                )),
                Err(e) => {
                    tracing::error!("{e}");
                    None
                }
            }
        });
        let run_id = recorded.as_ref().map(|(r, _)| r.run.id.clone());
        let r = self
            .db
            .occurrence(name, at, OccurrenceStatus::Running, run_id.as_deref());
        self.log_db(r);
        let cancel = CancellationToken::new();
        if let Some(slot) = self.slots.get_mut(name) {
            slot.running.push(Running {
                at,
                cancel: cancel.clone(),
            });
        }
        self.pending.push(Launch {
            goal: name.to_string(),
            at,
            kind,
            source,
            jitter,
            cancel,
            recorded,
        });
    }

    /// Start the tasks of the runs started since the last call.
    /// `on_interrupt = "continue"`: a goal's latest run, left interrupted by a daemon that is
    /// gone, goes on from its transcript (as `sup continue RUN_ID`) instead of only being marked.
    fn continue_interrupted(&mut self) {
        for slot in self.slots.values() {
            let wants = GoalFile::parse(&slot.path, &slot.text).is_ok_and(|f| {
                f.settings.on_interrupt == Some(crate::config::OnInterrupt::Continue)
            });
            let Some(c) = wants
                .then(|| run::resume::interrupted_run(&self.db, &slot.run_goal))
                .flatten()
            else {
                continue;
            };
            let home = self.cfg.home.clone();
            let cancel = CancellationToken::new();
            if let Ok(mut all) = self.all_running.lock() {
                all.push(cancel.clone());
            }
            let trigger = Trigger {
                kind: c.row.trigger,
                scheduled_for: c
                    .row
                    .scheduled_for
                    .as_deref()
                    .and_then(crate::store::db::parse_stamp),
            };
            self.tasks.spawn(async move {
                let id = c.row.id.clone();
                let spec = run::resume::file_spec(&c.origin, Default::default())
                    .and_then(|s| run::resume::continuation(s, &c, &home));
                match spec {
                    Ok(spec) => match run::launch(&spec, &home, trigger, Vec::new(), &cancel).await
                    {
                        Ok(l) => tracing::info!(
                            "run {id}, interrupted, continued as run {}: {}",
                            l.run_id,
                            l.outcome.status.as_str()
                        ),
                        Err(e) => tracing::error!("run {id} could not be continued: {e}"),
                    },
                    Err(e) => tracing::warn!("run {id} cannot be continued: {e}"),
                }
            });
        }
    }

    fn launch_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Ok(mut all) = self.all_running.lock() {
            all.retain(|c| !c.is_cancelled());
            all.extend(self.pending.iter().map(|l| l.cancel.clone()));
        }
        for launch in std::mem::take(&mut self.pending) {
            let home = self.cfg.home.clone();
            let permits = self.permits.clone();
            let clock = self.cfg.clock.clone();
            let done = self.done_tx.clone();
            let (goal, at) = (launch.goal.clone(), launch.at);
            let run_id = launch.recorded.as_ref().map(|(r, _)| r.run.id.clone());
            self.tasks.spawn(async move {
                // The run in a task of its own: should it panic, the occurrence is still
                // closed and the goal's overlap slot freed.
                let inner = tokio::spawn(launch.run(home, clock, permits));
                let (run_id, status) = match inner.await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!("goal {goal} at {}: the run failed: {e}", stamp(at));
                        (run_id, format!("error: sup hit a bug ({e})"))
                    }
                };
                let _ = done.send(Done {
                    goal,
                    at,
                    run_id,
                    status,
                });
            });
        }
    }

    fn finished(&mut self, done: Done) {
        tracing::info!(
            "goal {} at {}: finished, {}{}",
            done.goal,
            stamp(done.at),
            done.status,
            done.run_id
                .as_deref()
                .map(|r| format!(" (run {r})"))
                .unwrap_or_default()
        );
        let r = self.db.occurrence(
            &done.goal,
            done.at,
            OccurrenceStatus::Done,
            done.run_id.as_deref(),
        );
        self.log_db(r);
        let Some(slot) = self.slots.get_mut(&done.goal) else {
            return;
        };
        slot.running.retain(|r| r.at != done.at);
        if slot.running.is_empty() {
            slot.ended = Some(self.cfg.clock.now());
        }
        if slot.running.is_empty()
            && let Some((q, kind)) = slot.queued.take()
        {
            self.start(&done.goal, q, kind);
        }
    }
}

/// The time a run records as scheduled for: a schedule's occurrence, none for a change.
fn scheduled_for(kind: TriggerKind, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    (kind == TriggerKind::Schedule).then_some(at)
}

/// How the daemon says a run fired.
fn fired(goal: &str, at: DateTime<Utc>, kind: TriggerKind) {
    tracing::info!("goal {goal} at {}: fired ({kind})", stamp(at));
}

/// A run recorded in the claim's transaction, with its permit held by the caller.
async fn start_recorded(
    goal: &str,
    (at, kind): (DateTime<Utc>, TriggerKind),
    source: Source,
    home: &Path,
    recorded: Recorded,
    cancel: &CancellationToken,
) -> (Option<String>, String) {
    fired(goal, at, kind);
    let trigger = Trigger {
        kind,
        scheduled_for: scheduled_for(kind, at),
    };
    let id = recorded.run.id.clone();
    match run::launch_recorded(
        || source.spec(),
        home,
        trigger,
        recorded,
        Vec::new(),
        cancel,
    )
    .await
    {
        Ok(l) => (Some(l.run_id), l.outcome.status.as_str().to_string()),
        Err(e) => {
            tracing::error!("goal {goal} at {}: could not start: {e}", stamp(at));
            (Some(id), format!("could not start: {e}"))
        }
    }
}

async fn run_one(
    goal: &str,
    (at, kind): (DateTime<Utc>, TriggerKind),
    source: Source,
    home: &Path,
    (jitter, clock): (Duration, &dyn Clock),
    permits: &Semaphore,
    cancel: &CancellationToken,
) -> (Option<String>, String) {
    let wait = policy::jitter_wait(goal, at, jitter);
    if !jitter.is_zero() {
        tracing::info!(
            "goal {goal} at {}: waits {}ms of its jitter",
            stamp(at),
            wait.as_millis()
        );
    }
    if !wait.is_zero() {
        tokio::select! {
            _ = clock.sleep_until(clock.now() + wait) => {}
            _ = cancel.cancelled() => return (None, "cancelled before it started".into()),
        }
    }
    let _permit = tokio::select! {
        p = permits.acquire() => p.ok(),
        _ = cancel.cancelled() => return (None, "cancelled before it started".into()),
    };
    fired(goal, at, kind);
    let trigger = Trigger {
        kind,
        scheduled_for: scheduled_for(kind, at),
    };
    let launched = match source.spec() {
        Ok(spec) => run::launch(&spec, home, trigger, Vec::new(), cancel).await,
        Err(e) => Err(e),
    };
    match launched {
        Ok(l) => (Some(l.run_id), l.outcome.status.as_str().to_string()),
        Err(e) => {
            tracing::error!("goal {goal} at {}: could not start: {e}", stamp(at));
            (None, format!("could not start: {e}"))
        }
    }
}

/// Run the daemon until `shutdown`; `reload` asks for goal files to be read again.
pub async fn run(
    cfg: Config,
    shutdown: CancellationToken,
    mut reload: mpsc::UnboundedReceiver<()>,
) -> Result<(), DaemonError> {
    let db = Db::open(&cfg.home)?;
    let orphans = db.mark_orphans()?;
    if orphans > 0 {
        tracing::info!(
            "{orphans} run(s) left running by a process that is gone are now interrupted"
        );
    }
    run::worktree::sweep_dead(&cfg.home, &db);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut d = Daemon {
        permits: Arc::new(Semaphore::new(cfg.max_concurrent.max(1))),
        defaults: Arc::new(cfg.defaults.clone()),
        cfg,
        db,
        id: format!(
            "{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ),
        slots: BTreeMap::new(),
        pending: Vec::new(),
        paused: None,
        errors: BTreeMap::new(),
        tasks: JoinSet::new(),
        done_tx,
        all_running: Arc::new(Mutex::new(Vec::new())),
        workspaces: Workspaces::new(),
    };
    // Watched before the first read: a file written while the daemon starts is not missed.
    let mut watch = goals::Watch::new(&d.cfg.goals_dir);
    let clock = d.cfg.clock.clone();
    let now = clock.now();
    d.load(now, true)?;
    tracing::info!(
        "daemon started: {} goal(s) with a schedule or watch from {}",
        d.slots.len(),
        d.cfg.goals_dir.display()
    );
    d.catch_up(now);
    d.launch_pending();
    d.continue_interrupted();
    loop {
        let now = clock.now();
        let claimed = d.due(now);
        d.watched(now);
        d.launch_pending();
        let watch_due = d.slots.values().filter_map(|s| s.watch.as_ref()?.due).min();
        let wake = if claimed {
            d.slots
                .values()
                .filter_map(|s| s.next)
                .chain(watch_due)
                .min()
        } else {
            Some(now + chrono::Duration::seconds(1))
        };
        let sleep = super::clock::sleep_until_or_never(clock.as_ref(), wake);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = sleep => {}
            Some(done) = done_rx.recv() => d.finished(done),
            Some(()) = reload.recv() => reload_now(&mut d, &clock, &mut watch).await,
            Some(()) = watch.changed() => reload_now(&mut d, &clock, &mut watch).await,
            Some(goal) = d.workspaces.changed() => d.changed(&goal, clock.now()),
            Some(_) = d.tasks.join_next(), if !d.tasks.is_empty() => {}
        }
    }
    drain(&mut d, &mut done_rx).await;
    Ok(())
}

async fn reload_now(d: &mut Daemon, clock: &Arc<dyn Clock>, watch: &mut goals::Watch) {
    watch.settle().await;
    if let Err(e) = d.load(clock.now(), false) {
        tracing::warn!("reload failed: {e}; the goals keep their schedules");
    }
}

/// Stop firing; give running goals the grace period, then cancel them; record all.
async fn drain(d: &mut Daemon, done_rx: &mut mpsc::UnboundedReceiver<Done>) {
    let running = d.slots.values().map(|s| s.running.len()).sum::<usize>();
    tracing::info!(
        "stopping: {running} running goal(s) get {} to finish",
        humantime::format_duration(d.cfg.grace)
    );
    let queued: Vec<(String, DateTime<Utc>)> = d
        .slots
        .iter_mut()
        .filter_map(|(n, s)| s.queued.take().map(|(q, _)| (n.clone(), q)))
        .collect();
    for (name, at) in queued {
        let r = d.db.occurrence(&name, at, OccurrenceStatus::Skipped, None);
        d.log_db(r);
    }
    let grace = tokio::time::sleep(d.cfg.grace);
    tokio::pin!(grace);
    let mut cancelled = false;
    loop {
        tokio::select! {
            joined = d.tasks.join_next() => {
                if joined.is_none() {
                    break;
                }
            }
            _ = &mut grace, if !cancelled => {
                cancelled = true;
                tracing::info!("grace period over: cancelling the goals still running");
                if let Ok(all) = d.all_running.lock() {
                    for c in all.iter() {
                        c.cancel();
                    }
                }
            }
        }
        while let Ok(done) = done_rx.try_recv() {
            d.finished(done);
        }
        d.launch_pending();
    }
    while let Ok(done) = done_rx.try_recv() {
        d.finished(done);
    }
    tracing::info!("daemon stopped");
}

//! The daemon: sleeps until the earliest next occurrence (or a reload, or shutdown), claims
//! each occurrence in the store before it runs (so it runs at most once across daemons),
//! applies the overlap, catch-up, jitter and pause rules, runs goals through the verify loop
//! with a global concurrency limit, reloads goal files when they change, and on shutdown
//! drains or cancels what runs, recording everything. A run that can start at once is
//! recorded in the transaction that claims its occurrence, on the daemon's one connection,
//! so a thousand due together are all on record within milliseconds; folders, transcripts
//! and models are made afterwards, in the runs' own tasks. Time comes from a `Clock`, so
//! tests move time instead of sleeping.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::cron::Schedule;
use super::goals::{self, Overlap, ScheduledGoal};
use crate::run::{self, Invocation, RunSpec, Trigger};
use crate::store::db::{Db, DbError, NewRun, stamp};
use crate::store::{OccurrenceStatus, RunDir, TriggerKind};

/// How late an occurrence may be noticed and still count as on time.
const ON_TIME: Duration = Duration::from_secs(2);
/// Missed occurrences recorded one by one at most, per catch-up.
const MISSED_CAP: usize = 1000;

/// Where the daemon gets the time.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
    fn sleep_until(&self, t: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The real clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
    fn sleep_until(&self, t: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let wait = (t - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        Box::pin(tokio::time::sleep(wait))
    }
}

/// A clock that moves only when told: for tests.
pub struct ManualClock {
    now: watch::Sender<DateTime<Utc>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        ManualClock {
            now: watch::Sender::new(start),
        }
    }
    pub fn set(&self, t: DateTime<Utc>) {
        self.now.send_replace(t);
    }
    /// How many sleepers wait on this clock: a test knows the daemon is idle when it is > 0.
    pub fn waiting(&self) -> usize {
        self.now.receiver_count()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.borrow()
    }
    fn sleep_until(&self, t: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let mut rx = self.now.subscribe();
        Box::pin(async move {
            while *rx.borrow_and_update() < t {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

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

struct Slot {
    path: PathBuf,
    spec: RunSpec,
    schedule: Schedule,
    overlap: Overlap,
    catch_up: Duration,
    jitter: Duration,
    next: Option<DateTime<Utc>>,
    running: Vec<Running>,
    queued: Option<DateTime<Utc>>,
}

impl goals::FromFile for Slot {
    fn path(&self) -> &Path {
        &self.path
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
    db: Db,
    id: String,
    slots: BTreeMap<String, Slot>,
    tasks: JoinSet<()>,
    done_tx: mpsc::UnboundedSender<Done>,
    permits: Arc<Semaphore>,
    /// Every run's cancel token, for shutdown.
    all_running: Arc<Mutex<Vec<CancellationToken>>>,
}

fn spec_of(goal: &ScheduledGoal, defaults: &Invocation) -> Result<RunSpec, String> {
    RunSpec::build(defaults, Some(&goal.file))
        .map_err(|e| format!("{}: {e}", goal.file.path.display()))
}

impl Daemon {
    fn log_db(&self, r: Result<impl Sized, DbError>) {
        if let Err(e) = r {
            tracing::error!("{e}");
        }
    }

    /// Load (or reload) the goal files. New or changed schedules start from `now`; a broken
    /// file keeps its last good version.
    fn load(&mut self, now: DateTime<Utc>, starting: bool) -> Result<(), DaemonError> {
        let defaults = &self.cfg.defaults;
        goals::reload(
            &self.cfg.goals_dir,
            &mut self.slots,
            |g| {
                let spec = spec_of(&g, defaults)?;
                Ok((g, spec))
            },
            |name, (goal, spec), old| {
                let schedule = goal.schedule.clone()?;
                let changed = old.as_ref().is_none_or(|s| {
                    s.schedule.expr != schedule.expr || s.schedule.tz != schedule.tz
                });
                let next = if changed {
                    if !starting {
                        tracing::info!(
                            "goal {name}: schedule `{}` ({}) loaded",
                            schedule.expr,
                            schedule.tz
                        );
                    }
                    schedule.next_after(now)
                } else {
                    old.as_ref().and_then(|s| s.next)
                };
                let (running, queued) = old.map(|s| (s.running, s.queued)).unwrap_or_default();
                Some(Slot {
                    path: goal.file.path.clone(),
                    spec,
                    schedule,
                    overlap: goal.overlap,
                    catch_up: goal.catch_up,
                    jitter: goal.jitter,
                    next,
                    running,
                    queued,
                })
            },
        )
        .map_err(|source| DaemonError::Goals {
            path: self.cfg.goals_dir.display().to_string(),
            source,
        })?;
        Ok(())
    }

    /// At start: occurrences missed while no daemon ran. The latest within `catch_up` runs;
    /// the others are recorded as missed.
    fn catch_up(&mut self, now: DateTime<Utc>) {
        let names: Vec<String> = self.slots.keys().cloned().collect();
        for name in names {
            let last = match self.db.last_occurrence(&name) {
                Ok(Some(t)) => t,
                Ok(None) => continue,
                Err(e) => {
                    tracing::error!("{e}");
                    continue;
                }
            };
            let Some(slot) = self.slots.get(&name) else {
                continue;
            };
            let (missed, total) = slot.schedule.between(last, now, MISSED_CAP);
            let window = slot.catch_up;
            self.settle(&name, missed, total, now, window);
        }
    }

    /// Of `due` (oldest first, `total` in all): run the latest if it is within `window` of
    /// `now`, record the rest as missed.
    fn settle(
        &mut self,
        name: &str,
        mut due: Vec<DateTime<Utc>>,
        total: usize,
        now: DateTime<Utc>,
        window: Duration,
    ) {
        let Some(latest) = due.pop() else { return };
        let on_time = (now - latest).to_std().unwrap_or(Duration::ZERO) <= window;
        let mut missed = due;
        if !on_time {
            missed.push(latest);
        }
        let uncounted = total.saturating_sub(missed.len() + usize::from(on_time));
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
        if on_time {
            self.fire(name, latest);
        }
    }

    /// A `missed` notice for an occurrence that did not run (sent in the background).
    fn tell_missed(&mut self, name: &str, at: DateTime<Utc>, status: &str) {
        let Some(slot) = self.slots.get(name).filter(|s| !s.spec.notify.is_empty()) else {
            return;
        };
        let notifier = crate::notify::Notifier::new(&self.cfg.home, slot.spec.notify.clone());
        let notice = crate::notify::Notice::missed(name, at, status);
        self.tasks.spawn(async move {
            notifier.send(&[crate::notify::Kind::Missed], &notice).await;
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
        if let Err(e) = self.db.conn().execute_batch("BEGIN IMMEDIATE") {
            // Claims never run outside their transaction.
            tracing::error!(
                "cannot begin the claims of {}: {e}; trying again in a second",
                stamp(now)
            );
            return false;
        }
        self.due_each(now);
        if let Err(e) = self.db.conn().execute_batch("COMMIT") {
            tracing::error!("cannot commit the claims of {}: {e}", stamp(now));
            let _ = self.db.conn().execute_batch("ROLLBACK");
        }
        true
    }

    fn due_each(&mut self, now: DateTime<Utc>) {
        let names: Vec<String> = self
            .slots
            .iter()
            .filter(|(_, s)| s.next.is_some_and(|n| n <= now))
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let Some(slot) = self.slots.get_mut(&name) else {
                continue;
            };
            let Some(first) = slot.next else { continue };
            let (mut later, total) = slot.schedule.between(first, now, MISSED_CAP);
            let mut due = vec![first];
            due.append(&mut later);
            slot.next = slot.schedule.next_after(now);
            let window = slot.catch_up.max(ON_TIME);
            self.settle(&name, due, total + 1, now, window);
        }
    }

    /// Claim an occurrence and act on it.
    fn fire(&mut self, name: &str, at: DateTime<Utc>) {
        match self.db.claim(name, at, OccurrenceStatus::Claimed, &self.id) {
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
        match self.db.paused(name) {
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
        if !slot.running.is_empty() {
            match slot.overlap {
                Overlap::Skip => {
                    tracing::info!(
                        "goal {name} at {}: skipped, the last run is still going",
                        stamp(at)
                    );
                    let r = self
                        .db
                        .occurrence(name, at, OccurrenceStatus::Skipped, None);
                    self.log_db(r);
                    self.tell_missed(name, at, "skipped");
                    return;
                }
                Overlap::Queue => {
                    if slot.queued.is_some() {
                        tracing::info!(
                            "goal {name} at {}: skipped, one occurrence already waits",
                            stamp(at)
                        );
                        let r = self
                            .db
                            .occurrence(name, at, OccurrenceStatus::Skipped, None);
                        self.log_db(r);
                    } else {
                        tracing::info!(
                            "goal {name} at {}: queued behind the running one",
                            stamp(at)
                        );
                        slot.queued = Some(at);
                        let r = self.db.occurrence(name, at, OccurrenceStatus::Queued, None);
                        self.log_db(r);
                    }
                    return;
                }
                Overlap::Replace => {
                    tracing::info!("goal {name} at {}: replacing the running one", stamp(at));
                    for r in &slot.running {
                        r.cancel.cancel();
                    }
                }
                Overlap::Allow => {}
            }
        }
        self.start(name, at);
    }

    fn start(&mut self, name: &str, at: DateTime<Utc>) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let cancel = CancellationToken::new();
        slot.running.push(Running {
            at,
            cancel: cancel.clone(),
        });
        if let Ok(mut all) = self.all_running.lock() {
            all.retain(|c| !c.is_cancelled());
            all.push(cancel.clone());
        }
        let spec = slot.spec.clone();
        let jitter = slot.jitter;
        let home = self.cfg.home.clone();
        let permits = self.permits.clone();
        let done = self.done_tx.clone();
        let goal = name.to_string();
        // A run that can start now is recorded now, in the claim's transaction.
        let ready = if jitter.is_zero() {
            self.permits.clone().try_acquire_owned().ok()
        } else {
            None
        };
        let recorded = ready.and_then(|permit| {
            let run = RunDir::planned(&home);
            let r = self.db.start_run(&NewRun {
                id: &run.id,
                goal: &spec.goal.name,
                trigger: TriggerKind::Schedule,
                scheduled_for: Some(at),
                model: &spec.model,
                workspace: &spec.goal.workspace.display().to_string(),
                dir: &run.dir.display().to_string(),
            });
            match r {
                Ok(()) => Some((run, permit)),
                Err(e) => {
                    tracing::error!("{e}");
                    None
                }
            }
        });
        let run_id = recorded.as_ref().map(|(run, _)| run.id.clone());
        let r = self
            .db
            .occurrence(name, at, OccurrenceStatus::Running, run_id.as_deref());
        self.log_db(r);
        self.tasks.spawn(async move {
            // The run in a task of its own: should it panic, the occurrence is still closed
            // and the goal's overlap slot freed.
            let name = goal.clone();
            let inner = tokio::spawn(async move {
                match recorded {
                    Some((run, _permit)) => {
                        start_recorded(&name, at, &spec, &home, run, &cancel).await
                    }
                    None => run_one(&name, at, &spec, &home, jitter, &permits, &cancel).await,
                }
            });
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
        if slot.running.is_empty()
            && let Some(q) = slot.queued.take()
        {
            self.start(&done.goal, q);
        }
    }
}

/// A run recorded in the claim's transaction, with its permit held by the caller.
async fn start_recorded(
    goal: &str,
    at: DateTime<Utc>,
    spec: &RunSpec,
    home: &Path,
    run: RunDir,
    cancel: &CancellationToken,
) -> (Option<String>, String) {
    tracing::info!("goal {goal} at {}: fired", stamp(at));
    let trigger = Trigger {
        kind: TriggerKind::Schedule,
        scheduled_for: Some(at),
    };
    let id = run.id.clone();
    match run::launch_recorded(spec, home, trigger, run, Vec::new(), cancel).await {
        Ok(l) => (Some(l.run_id), l.outcome.status.as_str().to_string()),
        Err(e) => {
            tracing::error!("goal {goal} at {}: could not start: {e}", stamp(at));
            (Some(id), format!("could not start: {e}"))
        }
    }
}

async fn run_one(
    goal: &str,
    at: DateTime<Utc>,
    spec: &RunSpec,
    home: &Path,
    jitter: Duration,
    permits: &Semaphore,
    cancel: &CancellationToken,
) -> (Option<String>, String) {
    if !jitter.is_zero() {
        let wait = jitter.mul_f64(fastrand::f64());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = cancel.cancelled() => return (None, "cancelled before it started".into()),
        }
    }
    let _permit = tokio::select! {
        p = permits.acquire() => p.ok(),
        _ = cancel.cancelled() => return (None, "cancelled before it started".into()),
    };
    tracing::info!("goal {goal} at {}: fired", stamp(at));
    let trigger = Trigger {
        kind: TriggerKind::Schedule,
        scheduled_for: Some(at),
    };
    match run::launch(spec, home, trigger, Vec::new(), cancel).await {
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
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut d = Daemon {
        permits: Arc::new(Semaphore::new(cfg.max_concurrent.max(1))),
        cfg,
        db,
        id: format!(
            "{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ),
        slots: BTreeMap::new(),
        tasks: JoinSet::new(),
        done_tx,
        all_running: Arc::new(Mutex::new(Vec::new())),
    };
    let clock = d.cfg.clock.clone();
    let now = clock.now();
    d.load(now, true)?;
    tracing::info!(
        "daemon started: {} scheduled goal(s) from {}",
        d.slots.len(),
        d.cfg.goals_dir.display()
    );
    d.catch_up(now);
    let mut watch = goals::Watch::new(&d.cfg.goals_dir);
    loop {
        let now = clock.now();
        let wake = if d.due(now) {
            d.slots.values().filter_map(|s| s.next).min()
        } else {
            Some(now + chrono::Duration::seconds(1))
        };
        let sleep = async {
            match wake {
                Some(t) => clock.sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = sleep => {}
            Some(done) = done_rx.recv() => d.finished(done),
            Some(()) = reload.recv() => reload_now(&mut d, &clock, &mut watch).await,
            Some(()) = watch.changed() => reload_now(&mut d, &clock, &mut watch).await,
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
        .filter_map(|(n, s)| s.queued.take().map(|q| (n.clone(), q)))
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
    }
    while let Ok(done) = done_rx.try_recv() {
        d.finished(done);
    }
    tracing::info!("daemon stopped");
}

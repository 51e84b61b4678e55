//! The fleet daemon (`sup daemon --store postgres://…`): one of many daemons sharing a
//! PostgreSQL store. It registers itself and renews a lease; claims due occurrences and manual
//! triggers in the store (exactly once; pause and overlap decided there; its own share of a
//! busy second first); cancels its runs that a newer occurrence replaces; runs what it claimed
//! with its own concurrency limit and tags; writes runs, transcript events and outcomes to the
//! store (an outcome that cannot be written waits on disk); closes the runs of daemons whose
//! lease ran out; watches its goals folder and publishes its goal versions; and bridges
//! approval requests of its runs to the store, learning of answers through `LISTEN`/`NOTIFY`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use sha2::Digest;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::clock::Clock;
use super::fleet_run::give_up;
pub(crate) use super::fleet_run::{execute, flush_spool};
use super::goals::{self, Overlap, Timing};
use super::policy::{self, Settled};
use crate::run::{Invocation, RunSpec, Trigger};
use crate::store::db::{Db, stamp};
use crate::store::pg::{self, Claimed, Claimer, Due, PgError, PgStore};
use crate::store::{OccurrenceStatus, TriggerKind};

/// How soon an occurrence comes due for housekeeping to wait for it.
const IMMINENT: chrono::Duration = chrono::Duration::milliseconds(200);
/// Claims per transaction (each holds a lock per goal until it commits).
const BATCH: usize = 500;
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("cannot read the goals folder {path}: {source}")]
    Goals {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] PgError),
}

/// What a fleet daemon is given (public for the in-process tests, which give it a manual
/// clock).
pub struct Config {
    pub goals_dir: PathBuf,
    pub home: PathBuf,
    pub max_concurrent: usize,
    pub grace: Duration,
    /// How long a daemon that stops renewing keeps its runs; it renews every third of it.
    pub lease: Duration,
    /// What this machine has; a goal with `tags` runs only where all of them are.
    pub tags: Vec<String>,
    pub defaults: Invocation,
    pub store: PgStore,
    /// Where the daemon gets the time of its schedules.
    pub clock: Arc<dyn Clock>,
}

struct Goal {
    path: PathBuf,
    spec: RunSpec,
    timing: Timing,
    tags: Vec<String>,
    retry: bool,
    hash: String,
    modified: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
    /// Another live daemon holds a newer version: it schedules the goal.
    stale: bool,
}

impl goals::FromFile for Goal {
    fn path(&self) -> &Path {
        &self.path
    }
}

/// A run that ended: its fleet id and goal.
struct Done {
    run_id: String,
    goal: String,
}

struct Daemon {
    cfg: Config,
    me: Claimer,
    goals: BTreeMap<String, Goal>,
    permits: Arc<Semaphore>,
    running: HashMap<String, CancellationToken>,
    /// The daemons with a live lease, as of the last renewal, for the shares of claims.
    fleet: Vec<String>,
    tasks: JoinSet<()>,
    done_tx: mpsc::UnboundedSender<Done>,
    /// Since when the store has answered without a break; only a daemon that has been in
    /// touch for a whole lease may declare others dead.
    healthy_since: Option<Instant>,
    /// The differing goal versions last seen, to log each change once.
    versions_seen: String,
    ticks: u64,
}

/// A file's content hash and modified time.
fn version_of(path: &Path) -> (String, DateTime<Utc>) {
    let bytes = std::fs::read(path).unwrap_or_default();
    let hash = sha2::Sha256::digest(&bytes);
    let hex: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map(DateTime::<Utc>::from)
        .unwrap_or_else(|_| Utc::now());
    (hex, modified)
}

impl Daemon {
    /// Read the goal files; a broken one is reported and keeps its last good version.
    fn load(&mut self, now: DateTime<Utc>) -> Result<(), FleetError> {
        let defaults = &self.cfg.defaults;
        let goals_dir = &self.cfg.goals_dir;
        goals::reload(
            &self.cfg.goals_dir,
            &mut self.goals,
            |g| match RunSpec::build(defaults, Some(&g.file)) {
                Ok(mut spec) => {
                    spec.sandbox.goals = Some(goals_dir.clone());
                    if !g.watch.is_empty() {
                        tracing::warn!(
                            "goal {}: `watch` starts goals of `sup daemon` without a shared \
                             store; the fleet daemon leaves it out",
                            g.file.name
                        );
                    }
                    Ok((g, spec))
                }
                Err(e) => Err(format!("{}: {e}", g.file.path.display())),
            },
            |_, (g, spec), old| {
                let next = match (&old, &g.timing.schedule) {
                    (Some(o), Some(s))
                        if o.timing
                            .schedule
                            .as_ref()
                            .is_some_and(|os| os.expr == s.expr && os.tz == s.tz) =>
                    {
                        o.next
                    }
                    (_, Some(s)) => s.next_after(now),
                    (_, None) => None,
                };
                let (hash, modified) = version_of(&g.file.path);
                Some(Goal {
                    path: g.file.path.clone(),
                    spec,
                    timing: g.timing,
                    tags: g.file.settings.tags.clone(),
                    retry: g.file.settings.retry_interrupted.unwrap_or(false),
                    hash,
                    modified,
                    next,
                    stale: old.is_some_and(|o| o.stale),
                })
            },
        )
        .map_err(|source| FleetError::Goals {
            path: self.cfg.goals_dir.display().to_string(),
            source,
        })
    }

    /// Read the goal files again (after a burst of changes settled) and publish the versions.
    async fn reload(&mut self, watch: &mut goals::Watch) {
        watch.settle().await;
        if let Err(e) = self.load(self.cfg.clock.now()) {
            tracing::warn!("reload failed: {e}; the goals keep their schedules");
        }
        self.publish().await;
    }

    /// Whether this daemon may run the goal: it has its tags.
    fn fits(&self, g: &Goal) -> bool {
        g.tags.iter().all(|t| self.cfg.tags.contains(t))
    }

    /// Names of the goals this daemon runs, for triggers.
    fn served(&self) -> Vec<String> {
        self.goals
            .iter()
            .filter(|(_, g)| self.fits(g))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Publish this daemon's goal versions; where live daemons differ, say so, and leave
    /// the scheduling to the newest version.
    async fn publish(&mut self) {
        let versions: Vec<(String, String, DateTime<Utc>)> = self
            .goals
            .iter()
            .filter(|(_, g)| self.fits(g))
            .map(|(n, g)| (n.clone(), g.hash.clone(), g.modified))
            .collect();
        let store = self.cfg.store.clone();
        let id = self.me.id.clone();
        if let Err(e) = pg::retry("publishing goal versions", give_up(), || {
            store.publish_goals(&id, &versions)
        })
        .await
        {
            tracing::error!("{e}");
            return;
        }
        self.check_versions().await;
    }

    /// Where live daemons hold different versions of a goal, say so (once per change), and
    /// leave the scheduling to the newest version.
    async fn check_versions(&mut self) {
        let differ = match self.cfg.store.goal_versions().await {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("{e}");
                return;
            }
        };
        for g in self.goals.values_mut() {
            g.stale = false;
        }
        let seen = format!("{differ:?}");
        let changed = seen != self.versions_seen;
        self.versions_seen = seen;
        for (goal, vs) in differ {
            let Some(newest) = vs.first() else { continue };
            let listed: Vec<String> = vs
                .iter()
                .map(|(d, h, m)| format!("{d}: {h} ({})", stamp(*m)))
                .collect();
            if changed {
                tracing::warn!(
                    "goal {goal}: daemons hold different versions [{}]; the newest ({}) schedules it",
                    listed.join(", "),
                    newest.1
                );
            }
            if let Some(g) = self.goals.get_mut(&goal) {
                g.stale = g.hash != newest.1;
            }
        }
    }

    /// At start: occurrences missed while no daemon ran. The latest within `catch_up` runs,
    /// the others are recorded as missed.
    async fn catch_up(&mut self, now: DateTime<Utc>) {
        let last = match self.cfg.store.last_occurrences().await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("{e}");
                return;
            }
        };
        let mut due = Vec::new();
        for (name, g) in &self.goals {
            let (Some(s), Some(last)) = (&g.timing.schedule, last.get(name)) else {
                continue;
            };
            if g.stale || !self.fits(g) {
                continue;
            }
            let settled = policy::catch_up(s, *last, now, g.timing.catch_up);
            self.settle(name, g, settled, &mut due).await;
        }
        self.claim(TriggerKind::Schedule, due, None).await;
    }

    /// Record what `policy::settle` missed (and tell the last of it); what runs is due.
    async fn settle(&self, name: &str, g: &Goal, settled: Settled, due: &mut Vec<Due>) {
        let Settled {
            missed,
            uncounted,
            fire,
        } = settled;
        if let Some(&last) = missed.last() {
            tracing::info!(
                "goal {name}: {} occurrence(s) missed",
                missed.len() + uncounted
            );
            if let Err(e) = self.cfg.store.missed(&self.me, name, &missed).await {
                tracing::error!("{e}");
            }
            self.tell_missed(name, last, OccurrenceStatus::Missed);
        }
        if let Some(at) = fire {
            due.push(Due {
                goal: name.to_string(),
                at,
                overlap: g.timing.overlap,
                retry_interrupted: g.retry,
            });
        }
    }

    /// A `missed` notice for an occurrence that did not run (sent in the background).
    fn tell_missed(&self, name: &str, at: DateTime<Utc>, status: OccurrenceStatus) {
        let Some(g) = self.goals.get(name).filter(|g| !g.spec.notify.is_empty()) else {
            return;
        };
        let notifier = crate::notify::Notifier::new(&self.cfg.home, g.spec.notify.clone());
        let notice = crate::notify::Notice::missed(name, at, status.as_str());
        tokio::spawn(async move {
            notifier.send(&[crate::notify::Kind::Missed], &notice).await;
        });
    }

    /// Occurrences that came due by `now`.
    async fn due(&mut self, now: DateTime<Utc>) {
        let mut due = Vec::new();
        let names = policy::due_goals(&self.goals, |g| g.next, now);
        // Goals often share a schedule: each (schedule, time) is computed once.
        let mut memo: HashMap<(String, String, DateTime<Utc>), Option<DateTime<Utc>>> =
            HashMap::new();
        for name in names {
            let Some(g) = self.goals.get_mut(&name) else {
                continue;
            };
            let (Some(s), Some(first)) = (&g.timing.schedule, g.next) else {
                continue;
            };
            let after_first = *memo
                .entry((s.expr.clone(), s.tz.name().to_string(), first))
                .or_insert_with(|| s.next_after(first));
            let (list, total, next) = policy::due(s, first, after_first, now);
            g.next = next;
            let g = &self.goals[&name];
            if g.stale || !self.fits(g) {
                continue;
            }
            let settled = policy::settle(list, total, now, policy::window(g.timing.catch_up));
            self.settle(&name, g, settled, &mut due).await;
        }
        if due.is_empty() {
            return;
        }
        if let Some(first) = due.iter().map(|d| d.at).min() {
            tracing::debug!(
                "{} occurrence(s) due; {}ms after the first",
                due.len(),
                (self.cfg.clock.now() - first).num_milliseconds()
            );
        }
        // A daemon without room lets those with room claim first (and claims no share).
        if self.permits.available_permits() == 0 {
            tokio::time::sleep(Duration::from_millis(30 + u64::from(fastrand::u8(..) % 50))).await;
        }
        self.claim(TriggerKind::Schedule, due, None).await;
    }

    /// Claim in the store and start what this daemon won. A daemon with room first claims
    /// its own share of the goals (rendezvous hashing over the live daemons), so that daemons
    /// racing for the same second claim side by side instead of queueing on each other's
    /// locks; then whatever the others left (a daemon that is late, gone or without the tags).
    /// The runs start once everything is claimed: their folders, transcripts and store writes
    /// stay off the claim's path.
    /// Claim `due`; what runs of it starts here, with `payload` (a webhook's body) when given.
    async fn claim(
        &mut self,
        kind: TriggerKind,
        due: Vec<Due>,
        payload: Option<Arc<serde_json::Value>>,
    ) -> Vec<Claimed> {
        if due.is_empty() {
            return Vec::new();
        }
        let started = Instant::now();
        let (mine, rest): (Vec<Due>, Vec<Due>) = if self.permits.available_permits() == 0 {
            (Vec::new(), due)
        } else {
            due.into_iter().partition(|d| self.owns(&d.goal))
        };
        let (share, others) = (mine.len(), rest.len());
        let mut out = self.claim_in_store(kind, mine).await;
        let own = out.len();
        out.extend(self.claim_in_store(kind, rest).await);
        tracing::debug!(
            "claims: {own} of its share of {share}, {} of the other {others}, in {}ms",
            out.len() - own,
            started.elapsed().as_millis()
        );
        for c in &out {
            match c {
                Claimed::Run { goal, at, run_id } => {
                    if !self.running.contains_key(run_id) {
                        self.start(goal, kind, *at, run_id, payload.clone());
                    }
                }
                Claimed::Not { goal, at, status } => {
                    tracing::info!("goal {goal} at {}: {status}", stamp(*at));
                    if *status == OccurrenceStatus::Skipped && kind == TriggerKind::Schedule {
                        self.tell_missed(goal, *at, *status);
                    }
                }
            }
        }
        out
    }

    /// Whether this daemon's share of the fleet's goals holds `goal`.
    fn owns(&self, goal: &str) -> bool {
        self.fleet
            .iter()
            // The daemon with the highest hash of (goal, daemon) claims the goal first.
            .max_by_key(|d| policy::stable_hash(&[goal, d]))
            .is_none_or(|d| *d == self.me.id)
    }

    /// Claim in batches, each retried while the store is away.
    async fn claim_in_store(&self, kind: TriggerKind, due: Vec<Due>) -> Vec<Claimed> {
        let mut out = Vec::new();
        for chunk in due.chunks(BATCH) {
            let store = &self.cfg.store;
            match pg::retry("claiming occurrences", give_up(), || {
                store.claim(&self.me, kind, chunk)
            })
            .await
            {
                Ok(c) => out.extend(c),
                Err(e) => tracing::error!("cannot claim {} occurrence(s): {e}", chunk.len()),
            }
        }
        out
    }

    fn start(
        &mut self,
        goal: &str,
        kind: TriggerKind,
        at: DateTime<Utc>,
        run_id: &str,
        payload: Option<Arc<serde_json::Value>>,
    ) {
        let Some(g) = self.goals.get(goal) else {
            tracing::error!("goal {goal}: claimed but no longer loaded; run {run_id} not started");
            return;
        };
        let cancel = CancellationToken::new();
        self.running.insert(run_id.to_string(), cancel.clone());
        let mut spec = g.spec.clone();
        spec.payload = payload;
        let store = self.cfg.store.clone();
        let home = self.cfg.home.clone();
        let permits = self.permits.clone();
        let done = self.done_tx.clone();
        let run_id = run_id.to_string();
        let goal = goal.to_string();
        // A scheduled run waits its share of the goal's jitter, as on one machine.
        let wait = match kind {
            TriggerKind::Schedule => policy::jitter_wait(&goal, at, g.timing.jitter),
            _ => Duration::ZERO,
        };
        if !g.timing.jitter.is_zero() && kind == TriggerKind::Schedule {
            tracing::info!(
                "goal {goal} at {}: waits {}ms of its jitter",
                stamp(at),
                wait.as_millis()
            );
        }
        let clock = self.cfg.clock.clone();
        let until = clock.now() + wait;
        self.tasks.spawn(async move {
            if !wait.is_zero() {
                tokio::select! {
                    _ = clock.sleep_until(until) => {}
                    _ = cancel.cancelled() => {}
                }
            }
            let _permit = tokio::select! {
                p = permits.acquire_owned() => p.ok(),
                _ = cancel.cancelled() => None,
            };
            tracing::info!("goal {goal} at {}: fired as run {run_id}", stamp(at));
            let scheduled_for = (kind == TriggerKind::Schedule).then_some(at);
            if let Err(e) = execute(
                &store,
                &run_id,
                &spec,
                &home,
                Trigger {
                    kind,
                    scheduled_for,
                },
                Vec::new(),
                &cancel,
            )
            .await
            {
                tracing::error!("goal {goal}: run {run_id} could not start: {e}");
            }
            let _ = done.send(Done { run_id, goal });
        });
    }

    async fn finished(&mut self, done: Done) {
        self.running.remove(&done.run_id);
        self.start_queued(&done.goal).await;
    }

    /// A run of `goal` ended (here, or on a daemon declared dead): its oldest queued
    /// occurrence starts, when the goal queues and nothing else of it runs.
    async fn start_queued(&mut self, goal: &str) {
        let Some(g) = self.goals.get(goal) else {
            return;
        };
        if g.timing.overlap != Overlap::Queue {
            return;
        }
        let retry = g.retry;
        match self.cfg.store.take_queued(&self.me, goal, retry).await {
            Ok(Some((at, run_id))) => self.start(goal, TriggerKind::Schedule, at, &run_id, None),
            Ok(None) => {}
            Err(e) => tracing::error!("{e}"),
        }
    }

    /// A newer occurrence replaces this run (overlap `replace`), wherever it was claimed.
    fn replaced(&self, run_id: &str) {
        if let Some(c) = self.running.get(run_id).filter(|c| !c.is_cancelled()) {
            tracing::info!("run {run_id}: replaced by a newer occurrence; cancelling");
            c.cancel();
        }
    }

    /// Manual triggers (and retries) of goals this daemon serves.
    async fn triggers(&mut self) {
        let room = self.permits.available_permits().max(1) as i64;
        let served = self.served();
        let taken = match self.cfg.store.take_triggers(&self.me, &served, room).await {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("{e}");
                return;
            }
        };
        for t in taken {
            let Some(g) = self.goals.get(&t.goal) else {
                continue;
            };
            let (id, goal, kind) = (t.id, t.goal, t.kind);
            let due = vec![Due {
                goal: goal.clone(),
                at: t.at,
                overlap: g.timing.overlap,
                retry_interrupted: g.retry,
            }];
            tracing::info!("goal {goal}: {kind} trigger {id} taken");
            let (kind, payload) = match kind {
                TriggerKind::Webhook => (
                    TriggerKind::Webhook,
                    t.payload
                        .and_then(|p| serde_json::from_str(&p).ok())
                        .map(Arc::new),
                ),
                _ => (TriggerKind::Manual, None),
            };
            let claimed = self.claim(kind, due, payload).await;
            let (status, run_id) = match claimed.first() {
                Some(Claimed::Run { run_id, .. }) => ("running", Some(run_id.clone())),
                Some(Claimed::Not { status, .. }) => (status.as_str(), None),
                None => ("taken", None),
            };
            if let Err(e) = self
                .cfg
                .store
                .settle_trigger(id, status, run_id.as_deref())
                .await
            {
                tracing::error!("{e}");
            }
        }
    }

    /// Renew the lease; close the runs of daemons whose lease ran out; write outcomes that
    /// waited on disk; bridge approvals.
    async fn tick(&mut self) {
        match self.cfg.store.renew(&self.me.id).await {
            Ok(renewed) => {
                if self.healthy_since.is_none() {
                    tracing::info!("the store answers again");
                }
                self.healthy_since.get_or_insert_with(Instant::now);
                for run_id in &renewed.cancel {
                    self.replaced(run_id);
                }
                self.fleet = renewed.fleet;
                if !self.fleet.contains(&self.me.id) {
                    self.fleet.push(self.me.id.clone());
                }
                if !renewed.was_alive {
                    tracing::warn!(
                        "this daemon's lease had run out and the fleet declared it dead; its \
                         runs were marked interrupted; it renews again now"
                    );
                }
            }
            Err(e) => {
                if self.healthy_since.take().is_some() {
                    tracing::warn!("cannot renew the lease: {e}; retrying");
                }
                return;
            }
        }
        if self
            .healthy_since
            .is_some_and(|t| t.elapsed() >= self.cfg.lease)
        {
            match self.cfg.store.reap(&self.me.id).await {
                Ok(reaped) => {
                    let mut goals = BTreeSet::new();
                    for r in reaped {
                        tracing::warn!(
                            "daemon {} is gone: its run {} of goal {} is interrupted{}",
                            r.daemon,
                            r.run_id,
                            r.goal,
                            if r.retried { "; a retry is queued" } else { "" }
                        );
                        goals.insert(r.goal);
                    }
                    for goal in goals {
                        self.start_queued(&goal).await;
                    }
                }
                Err(e) => tracing::error!("{e}"),
            }
        }
        flush_spool(&self.cfg.store, &self.cfg.home).await;
        self.ticks += 1;
        if self.ticks.is_multiple_of(3) {
            self.check_versions().await;
        }
        self.bridge_approvals(None).await;
        self.triggers().await;
    }

    /// Local approval requests go to the store; answers in the store come back to the
    /// local queue, where the waiting run picks them up.
    async fn bridge_approvals(&self, answered: Option<&str>) {
        let local = match Db::open(&self.cfg.home) {
            Ok(db) => db,
            Err(e) => {
                tracing::error!("{e}");
                return;
            }
        };
        let pending = local.pending_approvals().unwrap_or_default();
        for a in &pending {
            if let Err(e) = self.cfg.store.put_approval(a, &self.me.id).await {
                tracing::error!("{e}");
                return;
            }
        }
        let ids: Vec<&str> = match answered {
            Some(id) => vec![id],
            None => pending.iter().map(|a| a.id.as_str()).collect(),
        };
        for id in ids {
            let Ok(Some(a)) = self.cfg.store.approval(id).await else {
                continue;
            };
            if matches!(
                a.status,
                crate::store::ApprovalStatus::Approved | crate::store::ApprovalStatus::Denied
            ) {
                let answer = crate::store::db::Answer::of(&a);
                if let Err(e) = local.decide_approval(id, answer) {
                    tracing::error!("{e}");
                }
            }
        }
        // Requests that ended here (timed out, cancelled) end in the store too.
        if answered.is_none()
            && let Ok(theirs) = self
                .cfg
                .store
                .approvals(crate::store::ApprovalStatus::Pending)
                .await
        {
            for a in theirs {
                if let Ok(Some(l)) = local.approval(&a.id)
                    && l.status != crate::store::ApprovalStatus::Pending
                {
                    let _ = self.cfg.store.close_approval(&a.id, l.status).await;
                }
            }
        }
    }
}

/// Forward `NOTIFY`s on the fleet's channels; reconnect with backoff when the connection
/// drops.
async fn listen(
    store: PgStore,
    tx: mpsc::UnboundedSender<(String, String)>,
    stop: CancellationToken,
) {
    let mut wait = Duration::from_millis(100);
    loop {
        match store.listener().await {
            Ok((client, mut conn)) => {
                let (ntx, mut nrx) = mpsc::unbounded_channel();
                let pump = tokio::spawn(async move {
                    let mut stream = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
                    while let Some(m) = stream.next().await {
                        match m {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                let _ =
                                    ntx.send((n.channel().to_string(), n.payload().to_string()));
                            }
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                });
                if client
                    .batch_execute("LISTEN sup_trigger; LISTEN sup_approval; LISTEN sup_cancel")
                    .await
                    .is_ok()
                {
                    wait = Duration::from_millis(100);
                    // Anything missed while away is found by the next tick's poll.
                    let _ = tx.send(("sup_trigger".into(), String::new()));
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            n = nrx.recv() => match n {
                                Some(n) => { let _ = tx.send(n); }
                                None => break,
                            },
                        }
                    }
                }
                pump.abort();
            }
            Err(e) => tracing::debug!("listen: {e}"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}

/// Run the fleet daemon until `shutdown`; `reload` asks for goal files to be read again.
pub async fn run(
    cfg: Config,
    shutdown: CancellationToken,
    mut reload: mpsc::UnboundedReceiver<()>,
) -> Result<(), FleetError> {
    let host = pg::this_host();
    let id = cfg
        .store
        .register(&host, &cfg.tags, cfg.max_concurrent, cfg.lease)
        .await?;
    tracing::info!(
        "daemon {id} joined the fleet at {} (lease {}ms, tags [{}])",
        cfg.store.at(),
        cfg.lease.as_millis(),
        cfg.tags.join(", ")
    );
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut d = Daemon {
        permits: Arc::new(Semaphore::new(cfg.max_concurrent.max(1))),
        me: Claimer { id, host },
        cfg,
        goals: BTreeMap::new(),
        running: HashMap::new(),
        fleet: Vec::new(),
        tasks: JoinSet::new(),
        done_tx,
        healthy_since: Some(Instant::now()),
        versions_seen: String::new(),
        ticks: 0,
    };
    // Watched before the first read: a file written while the daemon starts is not missed.
    let mut watch = goals::Watch::new(&d.cfg.goals_dir);
    let clock = d.cfg.clock.clone();
    let now = clock.now();
    d.load(now)?;
    tracing::info!(
        "daemon started: {} goal(s) from {}",
        d.goals.len(),
        d.cfg.goals_dir.display()
    );
    d.publish().await;
    d.catch_up(now).await;
    let (note_tx, mut note_rx) = mpsc::unbounded_channel();
    let stop_listen = CancellationToken::new();
    tokio::spawn(listen(d.cfg.store.clone(), note_tx, stop_listen.clone()));
    let mut ticker = tokio::time::interval((d.cfg.lease / 3).max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let wake = d.goals.values().filter_map(|g| g.next).min();
        let sleep = super::clock::sleep_until_or_never(clock.as_ref(), wake);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = sleep => d.due(clock.now()).await,
            _ = ticker.tick() => {
                // Housekeeping waits for an occurrence about to come due.
                if let Some(t) = wake.filter(|t| *t - clock.now() < IMMINENT) {
                    clock.sleep_until(t).await;
                    d.due(clock.now()).await;
                }
                d.tick().await
            }
            Some(done) = done_rx.recv() => d.finished(done).await,
            Some((channel, payload)) = note_rx.recv() => match channel.as_str() {
                "sup_trigger" => d.triggers().await,
                "sup_approval" => d.bridge_approvals(Some(&payload)).await,
                "sup_cancel" => d.replaced(&payload),
                _ => {}
            },
            Some(()) = reload.recv() => d.reload(&mut watch).await,
            Some(()) = watch.changed() => d.reload(&mut watch).await,
            Some(_) = d.tasks.join_next(), if !d.tasks.is_empty() => {}
        }
    }
    stop_listen.cancel();
    tracing::info!(
        "stopping: {} running goal(s) get {} to finish",
        d.running.len(),
        humantime::format_duration(d.cfg.grace)
    );
    let grace = tokio::time::sleep(d.cfg.grace);
    tokio::pin!(grace);
    let mut cancelled = false;
    loop {
        tokio::select! {
            joined = d.tasks.join_next() => if joined.is_none() { break },
            _ = &mut grace, if !cancelled => {
                cancelled = true;
                for c in d.running.values() {
                    c.cancel();
                }
            }
        }
    }
    if let Err(e) = d.cfg.store.stop_daemon(&d.me.id).await {
        tracing::error!("{e}");
    }
    tracing::info!("daemon stopped");
    Ok(())
}

//! A fleet run's way to the store: its transcript events written as they come (the first
//! says where the run lives locally; the cost so far counts at once), its outcome recorded,
//! and an outcome the store cannot take kept under `SUP_HOME/fleet-spool/` until it can.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::run::{self as launch, RunError, RunSpec, Trigger};
use crate::store::pg::{self, Finish, PgStore};
use crate::trace::{Event, EventSink, Outcome};

/// How long a write is retried before it is given up (outcomes then wait on disk);
/// `SUP_STORE_RETRY` says otherwise.
pub(crate) fn give_up() -> Duration {
    std::env::var("SUP_STORE_RETRY")
        .ok()
        .and_then(|s| crate::duration::parse_duration(&s).ok())
        .unwrap_or(Duration::from_secs(60))
}

/// A sink that sends each event to the store, in order, from a task of its own.
struct StoreSink {
    tx: mpsc::UnboundedSender<(i64, serde_json::Value)>,
    seq: AtomicI64,
}

impl EventSink for StoreSink {
    fn emit(&self, event: &Event) {
        if matches!(event, Event::TextDelta { .. }) {
            return;
        }
        let Ok(mut value) = serde_json::to_value(event) else {
            return;
        };
        if let Some(obj) = value.as_object_mut() {
            obj.insert(
                "at".into(),
                Utc::now()
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                    .into(),
            );
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send((seq, value));
    }
}

/// Write a run's events as they come; the first says where the run lives locally.
async fn write_events(
    store: PgStore,
    home: PathBuf,
    run_id: String,
    mut rx: mpsc::UnboundedReceiver<(i64, serde_json::Value)>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        for (_, e) in &batch {
            if e["type"] == "run_started" {
                let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
                let local = s("run_id");
                let dir = home.join("runs").join(&local).display().to_string();
                let (model, workspace) = (s("model"), s("workspace"));
                let r = pg::retry("recording a run's start", give_up(), || {
                    store.run_started(&run_id, &local, &model, &workspace, &dir)
                })
                .await;
                if let Err(e) = r {
                    tracing::error!("run {run_id}: {e}");
                }
            }
        }
        // The cost so far counts for `max_cost_per_day` before the run ends.
        let cost = batch.iter().rev().find_map(|(_, e)| {
            e["total_cost"]
                .as_f64()
                .filter(|_| e["type"] == "step_finished")
        });
        if let Some(cost) = cost
            && let Err(e) = store.set_run_cost(&run_id, cost).await
        {
            tracing::warn!("run {run_id}: cannot record its cost so far: {e}");
        }
        if let Err(e) = pg::retry("writing transcript events", give_up(), || {
            store.events(&run_id, &batch)
        })
        .await
        {
            tracing::error!(
                "run {run_id}: {} transcript event(s) not written to the store: {e}; the local \
                 transcript has them",
                batch.len()
            );
        }
    }
}

fn spool_dir(home: &Path) -> PathBuf {
    home.join("fleet-spool")
}

/// Write outcomes that waited on disk; each file goes once written.
pub(crate) async fn flush_spool(store: &PgStore, home: &Path) {
    let Ok(entries) = std::fs::read_dir(spool_dir(home)) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let Some(run_id) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(finish) = serde_json::from_str::<Finish>(&text) else {
            tracing::error!("{}: not an outcome; left as it is", path.display());
            continue;
        };
        match store.finish_run(&run_id, &finish).await {
            Ok(()) => {
                tracing::info!("run {run_id}: its outcome, kept on disk, is now in the store");
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => {
                tracing::warn!("run {run_id}: the outcome still waits on disk: {e}");
                return;
            }
        }
    }
}

/// Run a claimed run (its row exists in the store) to its end: the local run folder and
/// SQLite record as always, its events and outcome in the store. An outcome the store
/// cannot take waits under `SUP_HOME/fleet-spool/` until it can.
pub(crate) async fn execute(
    store: &PgStore,
    run_id: &str,
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    mut sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<launch::Launched, RunError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_events(
        store.clone(),
        home.to_path_buf(),
        run_id.to_string(),
        rx,
    ));
    sinks.push(Arc::new(StoreSink {
        tx,
        seq: AtomicI64::new(0),
    }));
    let shared = launch::Shared {
        store: store.clone(),
        run_id: run_id.to_string(),
    };
    let result = launch::launch_shared(spec, home, trigger, &shared, sinks, cancel).await;
    let _ = writer.await;
    let finish = match &result {
        Ok(l) => Finish {
            outcome: l.outcome.clone(),
            // What ties the run to others and what its worktree left, as its local record
            // has them.
            lineage: crate::store::db::Db::open(home)
                .and_then(|db| db.lineage(&l.run_id))
                .unwrap_or_else(|e| {
                    tracing::warn!("run {run_id}: its lineage is not in the store: {e}");
                    Default::default()
                }),
        },
        Err(e) => Finish {
            outcome: Outcome::error(Some(format!("could not start: {e}"))),
            lineage: Default::default(),
        },
    };
    if let Err(e) = pg::retry("recording an outcome", give_up(), || {
        store.finish_run(run_id, &finish)
    })
    .await
    {
        let dir = spool_dir(home);
        let path = dir.join(format!("{run_id}.json"));
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&path, serde_json::to_vec(&finish).unwrap_or_default()));
        match written {
            Ok(()) => tracing::warn!(
                "run {run_id}: cannot record its outcome ({e}); kept in {} until the store \
                 comes back",
                path.display()
            ),
            Err(w) => tracing::error!(
                "run {run_id}: cannot record its outcome ({e}) nor keep it on disk ({w})"
            ),
        }
    }
    // Told once recorded, as a local run that cannot start is.
    if let Err(e) = &result {
        launch::not_started(
            home,
            spec.notify.clone(),
            &spec.goal.name,
            run_id,
            trigger,
            &e.to_string(),
        )
        .await;
    }
    result
}

//! What only a shared PostgreSQL store (`--store postgres://…` or `SUP_STORE`) has: the
//! fleet daemon, `sup daemons`, and `sup trigger`'s two ways of running a goal in a fleet
//! (handed to a live daemon, or claimed and run here). The history commands are `manage`'s,
//! over `store::history`, for either store.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::manage::short;
use super::run::invocation;
use super::{Ending, Fail};
use crate::config::{Overlap, Settings};
use crate::run::{Invocation, RunSpec, Trigger};
use crate::schedule::fleet;
use crate::store::{self, TriggerKind, db::stamp, pg};
use crate::trace::{EventSink, HumanTrace, JsonLines};

/// Open the store named by `--store`; its faults are usage errors (exit 2) with the
/// server's words and what to check.
pub(crate) async fn open(url: &str) -> Result<pg::PgStore, Fail> {
    if !pg::is_pg_url(url) {
        let url = pg::without_password(url);
        return Err(Fail::usage(anyhow!(
            "--store `{url}` is not a PostgreSQL URL: write postgres://USER@HOST:PORT/DATABASE, \
             or leave --store and SUP_STORE out for the SQLite store under SUP_HOME"
        )));
    }
    pg::PgStore::open(url).await.map_err(Fail::usage)
}

fn defaults() -> Result<Invocation, Fail> {
    invocation(Settings::default())
}

pub(crate) struct DaemonArgs {
    pub(crate) goals: PathBuf,
    pub(crate) max_concurrent: usize,
    pub(crate) grace: Duration,
    pub(crate) lease: Duration,
    pub(crate) tags: Vec<String>,
    /// Also serve the fleet's web console here.
    pub(crate) serve: Option<std::net::SocketAddr>,
}

pub(crate) async fn daemon(url: &str, a: DaemonArgs) -> Result<Ending, Fail> {
    if !a.goals.is_dir() {
        return Err(Fail::usage(anyhow!(
            "the goals folder {} does not exist; pass --goals DIR",
            a.goals.display()
        )));
    }
    let store = open(url).await?;
    let shutdown = CancellationToken::new();
    let reload_rx = super::manage::daemon_signals(&shutdown).map_err(Fail::usage)?;
    let console = match a.serve {
        Some(addr) => Some(
            super::serve::start(
                addr,
                a.goals.clone(),
                Some((store.clone(), url.to_string())),
                shutdown.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let cfg = fleet::Config {
        goals_dir: a.goals,
        home: store::home(),
        max_concurrent: a.max_concurrent,
        grace: a.grace,
        lease: a.lease,
        tags: a.tags,
        defaults: defaults()?,
        store,
        clock: std::sync::Arc::new(crate::schedule::clock::SystemClock),
    };
    fleet::run(cfg, shutdown, reload_rx)
        .await
        .map_err(Fail::usage)?;
    if let Some(c) = console {
        let _ = c.await;
    }
    Ok(Ending::Achieved)
}

pub(crate) async fn daemons(url: &str, json_out: bool) -> Result<Ending, Fail> {
    let rows = open(url).await?.daemons().await.map_err(Fail::usage)?;
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", serde_json::to_string(&rows).unwrap_or_default());
        return Ok(Ending::Achieved);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no daemons have joined this store");
    }
    for d in rows {
        let _ = writeln!(
            out,
            "{}  {}  host {} · pid {} · sup {} · max {} · tags [{}]\n    started {} · renewed {}",
            d.id,
            d.state,
            d.host,
            d.pid,
            d.version,
            d.max_concurrent,
            d.tags.join(", "),
            short(&stamp(d.started_at)),
            short(&stamp(d.renewed_at)),
        );
        if d.running.is_empty() {
            let _ = writeln!(out, "    running nothing");
        } else {
            let _ = writeln!(out, "    running {}", d.running.join(", "));
        }
    }
    Ok(Ending::Achieved)
}

/// `sup trigger`'s hand-off to a live daemon that serves the goal: the trigger is recorded
/// in the store, and followed until a daemon starts it or says why not.
pub(crate) async fn hand_off(
    store: &pg::PgStore,
    name: &str,
    kind: TriggerKind,
    payload: Option<&serde_json::Value>,
    json_out: bool,
) -> Result<Ending, Fail> {
    let user = crate::approval::answer::os_user();
    let by = match kind {
        TriggerKind::Webhook => "webhook",
        _ => "sup trigger",
    };
    let by = format!("{user}@{} ({by})", pg::this_host());
    let text = payload.map(|p| p.to_string());
    let id = store
        .request_trigger(name, &by, kind, text.as_deref())
        .await
        .map_err(Fail::usage)?;
    eprintln!("· trigger {id} of {name} handed to the fleet");
    for _ in 0..200 {
        let (status, run_id) = store.trigger_state(id).await.map_err(Fail::usage)?;
        match status.as_str() {
            "pending" | "claimed" => {}
            "running" => {
                let run_id = run_id.unwrap_or_default();
                if json_out {
                    println!(
                        "{}",
                        json!({"trigger": id, "status": status, "run_id": run_id})
                    );
                } else {
                    println!(
                        "{name}: started as run {run_id} by the fleet; `sup show {run_id}` follows it"
                    );
                }
                return Ok(Ending::Achieved);
            }
            other => {
                if json_out {
                    println!("{}", json!({"trigger": id, "status": other}));
                } else {
                    println!("{name}: not run: {other} (overlap and pause rules of the goal)");
                }
                return Ok(Ending::Achieved);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if json_out {
        println!("{}", json!({"trigger": id, "status": "pending"}));
    } else {
        println!("{name}: trigger {id} waits for a daemon with room");
    }
    Ok(Ending::Achieved)
}

/// `sup trigger` in a fleet with no live daemon for the goal: this process claims the
/// occurrence, under the goal's overlap rules, and runs it.
pub(crate) async fn claim_and_run(
    store: &pg::PgStore,
    (name, overlap): (&str, Overlap),
    spec: &RunSpec,
    kind: TriggerKind,
    json_out: bool,
) -> Result<Ending, Fail> {
    let me = pg::Claimer {
        id: format!("cli-{}-{}", pg::this_host(), std::process::id()),
        host: pg::this_host(),
    };
    let claimed = store
        .claim(
            &me,
            kind,
            &[pg::Due {
                goal: name.to_string(),
                at: chrono::Utc::now(),
                overlap,
                retry_interrupted: false,
            }],
        )
        .await
        .map_err(Fail::usage)?;
    let run_id = match claimed.first() {
        Some(pg::Claimed::Run { run_id, .. }) => run_id.clone(),
        Some(pg::Claimed::Not { status, .. }) => {
            if json_out {
                println!("{}", json!({"status": status}));
            } else {
                println!("{name}: not run: {status} (overlap and pause rules of the goal)");
            }
            return Ok(Ending::Achieved);
        }
        None => {
            return Err(Fail::usage(anyhow!(
                "{name}: the claim was lost; try again"
            )));
        }
    };
    let sink: Arc<dyn EventSink> = if json_out {
        Arc::new(JsonLines::new())
    } else {
        Arc::new(HumanTrace::new(!spec.goal.checks.is_empty()))
    };
    let cancel = CancellationToken::new();
    super::run::watch_signals(cancel.clone())?;
    let launched = fleet::execute(
        store,
        &run_id,
        spec,
        &store::home(),
        Trigger {
            kind,
            scheduled_for: None,
        },
        vec![sink],
        &cancel,
    )
    .await
    .map_err(Fail::from)?;
    let outcome = launched.outcome;
    if !json_out
        && outcome.status == crate::trace::Status::Achieved
        && let Some(answer) = outcome.answer.as_deref().filter(|a| !a.is_empty())
    {
        println!("{answer}");
    }
    Ok(Ending::of(outcome.status))
}

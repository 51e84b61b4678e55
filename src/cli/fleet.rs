//! The commands against a shared PostgreSQL store (`--store postgres://…` or `SUP_STORE`)
//! that have no local twin: the fleet daemon, `sup daemons`, and the history and trigger
//! commands answered from the store, so they work from any machine (pause and the approval
//! commands are `manage`'s, over `store::history`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::manage::short;
use super::run::invocation;
use super::{Ending, Fail};
use crate::config::Settings;
use crate::run::{Invocation, RunSpec, Trigger};
use crate::schedule::fleet;
use crate::store::{self, db::stamp, pg};
use crate::trace::{Event, EventSink, HumanTrace, JsonLines};

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

pub(crate) async fn runs(
    url: &str,
    goal: Option<&str>,
    status: Option<crate::store::RunStatus>,
    limit: u32,
    json_out: bool,
) -> Result<Ending, Fail> {
    let rows = open(url)
        .await?
        .runs(goal, status, limit)
        .await
        .map_err(Fail::usage)?;
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", serde_json::to_string(&rows).unwrap_or_default());
        return Ok(Ending::Achieved);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no runs");
        return Ok(Ending::Achieved);
    }
    let rows: Vec<_> = rows
        .iter()
        .map(|f| (&f.run, Some(f.host.as_str())))
        .collect();
    super::manage::print_runs(&mut out, &rows);
    Ok(Ending::Achieved)
}

pub(crate) async fn show(url: &str, id: &str) -> Result<Ending, Fail> {
    let store = open(url).await?;
    let f = store.run(id).await.map_err(Fail::usage)?;
    let run = &f.run;
    let checks = store.checks(&run.id).await.map_err(Fail::usage)?;
    let events = store.transcript(&run.id).await.map_err(Fail::usage)?;
    let trace = HumanTrace::to(!checks.is_empty(), Box::new(std::io::stdout()));
    let mut had_result = false;
    for v in &events {
        let Ok(event) = serde_json::from_value::<Event>(v.clone()) else {
            continue;
        };
        had_result |= matches!(event, Event::Result { .. });
        trace.emit(&event);
    }
    let here = pg::this_host() == f.host;
    let mut out = std::io::stdout().lock();
    if events.is_empty() {
        let _ = writeln!(out, "(no transcript events in the store yet)");
    }
    if !checks.is_empty() {
        let _ = writeln!(out, "\nchecks:");
        for (t, c) in &checks {
            let _ = writeln!(
                out,
                "  try {t} · {} {} · {} · {}ms",
                if c.passed { '✓' } else { '✗' },
                c.name,
                c.outcome,
                c.duration_ms
            );
            for path in c.output_paths() {
                if !here {
                    let _ = writeln!(out, "    whole output on host {}: {path}", f.host);
                    continue;
                }
                if let Ok((tail, cut)) = crate::tools::process::read_tail(Path::new(path), 4096)
                    && !tail.trim().is_empty()
                {
                    let _ = writeln!(out, "    {path}{}:", if cut { " (last part)" } else { "" });
                    for l in tail.lines() {
                        let _ = writeln!(out, "      {l}");
                    }
                }
            }
        }
    }
    let _ = writeln!(
        out,
        "\noutcome: {}{} · {} tries · {} steps · {}",
        run.status,
        run.stop_reason
            .map(|s| format!(" ({s})"))
            .unwrap_or_default(),
        run.tries,
        run.steps,
        crate::trace::tokens(&run.usage)
    );
    let _ = writeln!(
        out,
        "goal {} · {} · started {} · ended {}",
        run.goal,
        run.trigger,
        short(&run.started_at),
        run.ended_at
            .as_deref()
            .map(short)
            .unwrap_or_else(|| "—".into())
    );
    let _ = writeln!(
        out,
        "ran on host {} (daemon {}) · run folder {}{}",
        f.host,
        f.daemon_id.as_deref().unwrap_or("none"),
        if run.dir.is_empty() { "—" } else { &run.dir },
        if here {
            ""
        } else {
            " (kept outputs are there, on that host)"
        }
    );
    if let Some(e) = &run.error {
        let _ = writeln!(out, "error: {e}");
    }
    if !had_result && run.status == crate::store::RunStatus::Running {
        let _ = writeln!(out, "(the run is still going)");
    }
    Ok(Ending::Achieved)
}

/// `sup trigger` with a store: a live daemon that serves the goal picks it up; with none,
/// this process claims it and runs it, under the same overlap rules.
pub(crate) async fn trigger(
    url: &str,
    dir: &Path,
    name: &str,
    json_out: bool,
    payload: Option<serde_json::Value>,
) -> Result<Ending, Fail> {
    let goal = super::manage::find_goal(dir, name)?;
    let store = open(url).await?;
    let user = crate::approval::answer::os_user();
    let (kind, by) = match payload {
        Some(_) => (crate::store::TriggerKind::Webhook, "webhook"),
        None => (crate::store::TriggerKind::Manual, "sup trigger"),
    };
    let by = format!("{user}@{} ({by})", pg::this_host());
    if store.live_daemon_for(name).await.map_err(Fail::usage)? {
        let text = payload.as_ref().map(|p| p.to_string());
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
        return Ok(Ending::Achieved);
    }
    let mut spec = RunSpec::build(&defaults()?, Some(&goal.file)).map_err(Fail::from)?;
    spec.sandbox.goals = Some(dir.to_path_buf());
    spec.payload = payload.map(std::sync::Arc::new);
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
                overlap: goal.overlap,
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
        &store,
        &run_id,
        &spec,
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

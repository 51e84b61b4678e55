//! The schedule and history commands: `sup daemon`, `sup goals`, `sup runs`, `sup show`,
//! `sup trigger`, `sup pause`, `sup resume`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use chrono::Utc;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::run::{execute, launch_fail};
use super::{Fail, exit};
use crate::schedule::daemon::{self, SystemClock};
use crate::schedule::goals::{self, ScheduledGoal};
use crate::store::{self, db::Db};
use crate::trace::{Event, EventSink, HumanTrace};
use crate::verify::launch::{Overrides, RunSpec};

fn db() -> Result<Db, Fail> {
    let db = Db::open(&store::home()).map_err(Fail::usage)?;
    // A run whose process is gone is no longer running, whoever asks.
    db.mark_orphans().map_err(Fail::usage)?;
    Ok(db)
}

/// A goal file of the folder, loaded or with its error.
type Loaded = (PathBuf, Result<ScheduledGoal, String>);

fn goal_files(dir: &Path) -> Result<Vec<Loaded>, Fail> {
    let loaded = goals::load_dir(dir)
        .with_context(|| format!("cannot read the goals folder {}", dir.display()))
        .map_err(Fail::usage)?;
    Ok(loaded
        .into_iter()
        .map(|(p, r)| (p, r.map_err(|e| e.to_string())))
        .collect())
}

/// The goal named `name` in `dir`.
fn find_goal(dir: &Path, name: &str) -> Result<ScheduledGoal, Fail> {
    let mut broken = None;
    for (path, g) in goal_files(dir)? {
        match g {
            Ok(g) if g.file.name == name => return Ok(g),
            Err(e) if path.file_stem().is_some_and(|s| s == name) => broken = Some(e),
            _ => {}
        }
    }
    Err(Fail::usage(anyhow!(broken.unwrap_or_else(|| format!(
        "no goal `{name}` in {}; `sup goals --goals DIR` lists them",
        dir.display()
    )))))
}

pub async fn daemon(goals: PathBuf, max_concurrent: usize, grace: Duration) -> Result<u8, Fail> {
    if !goals.is_dir() {
        return Err(Fail::usage(anyhow!(
            "the goals folder {} does not exist; pass --goals DIR",
            goals.display()
        )));
    }
    use tokio::signal::unix::{SignalKind, signal};
    let shutdown = CancellationToken::new();
    let (reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut term = signal(SignalKind::terminate()).map_err(Fail::usage)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Fail::usage)?;
    let mut hup = signal(SignalKind::hangup()).map_err(Fail::usage)?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = hup.recv() => {
                    tracing::info!("SIGHUP: reloading goal files");
                    let _ = reload_tx.send(());
                }
            }
        }
        stop.cancel();
        // A second signal: leave now.
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        crate::tools::mcp::kill_all();
        std::process::exit(i32::from(exit::INTERRUPTED));
    });
    let cfg = daemon::Config {
        goals_dir: goals,
        home: store::home(),
        max_concurrent,
        grace,
        clock: Arc::new(SystemClock),
        defaults: {
            let (default_model, default_approval) = super::run::env_defaults()?;
            Overrides {
                default_model,
                default_approval,
                ..Overrides::default()
            }
        },
    };
    daemon::run(cfg, shutdown, reload_rx)
        .await
        .map_err(Fail::usage)?;
    Ok(exit::ACHIEVED)
}

fn short(t: &str) -> String {
    crate::store::db::parse_stamp(t)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| t.to_string())
}

pub fn goals(dir: &Path, json_out: bool) -> Result<u8, Fail> {
    let db = db()?;
    let now = Utc::now();
    let mut rows = Vec::new();
    for (path, g) in goal_files(dir)? {
        let row = match g {
            Err(e) => json!({"file": path.display().to_string(), "error": e}),
            Ok(g) => {
                let stats = db.goal_stats(&g.file.name).map_err(Fail::usage)?;
                let next: Vec<String> = g
                    .schedule
                    .as_ref()
                    .map(|s| {
                        s.upcoming(now, 3)
                            .into_iter()
                            .map(|t| t.with_timezone(&s.tz).to_rfc3339())
                            .collect()
                    })
                    .unwrap_or_default();
                json!({
                    "name": g.file.name,
                    "file": path.display().to_string(),
                    "schedule": g.schedule.as_ref().map(|s| s.expr.clone()),
                    "timezone": g.schedule.as_ref().map(|s| s.tz.name().to_string()),
                    "next": next,
                    "paused": stats.paused,
                    "skipped": stats.skipped,
                    "missed": stats.missed,
                    "last": stats.last.map(|r| json!({
                        "run_id": r.id, "status": r.status, "stop_reason": r.stop_reason,
                        "started_at": r.started_at, "trigger": r.trigger,
                    })),
                })
            }
        };
        rows.push(row);
    }
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", serde_json::Value::Array(rows));
        return Ok(exit::ACHIEVED);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no goal files in {}", dir.display());
    }
    for r in rows {
        if let Some(e) = r["error"].as_str() {
            let _ = writeln!(
                out,
                "✗ {}\n  error: {e}\n",
                r["file"].as_str().unwrap_or("")
            );
            continue;
        }
        let name = r["name"].as_str().unwrap_or("");
        match r["schedule"].as_str() {
            Some(s) => {
                let _ = writeln!(
                    out,
                    "{name}  {s}  ({}){}",
                    r["timezone"].as_str().unwrap_or(""),
                    if r["paused"] == true {
                        "  · paused"
                    } else {
                        ""
                    }
                );
                let next: Vec<&str> = r["next"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
                    .collect();
                let _ = writeln!(out, "  next: {}", next.join(", "));
            }
            None => {
                let _ = writeln!(
                    out,
                    "{name}  (no schedule: run it with `sup goal --file` or `sup trigger`)"
                );
            }
        }
        let last = &r["last"];
        if last.is_object() {
            let _ = writeln!(
                out,
                "  last: {} · {} · {} · run {}",
                last["status"].as_str().unwrap_or(""),
                last["trigger"].as_str().unwrap_or(""),
                short(last["started_at"].as_str().unwrap_or("")),
                last["run_id"].as_str().unwrap_or("")
            );
        } else {
            let _ = writeln!(out, "  last: never run");
        }
        let _ = writeln!(out, "  skipped {} · missed {}\n", r["skipped"], r["missed"]);
    }
    Ok(exit::ACHIEVED)
}

pub fn runs(
    goal: Option<&str>,
    status: Option<&str>,
    limit: u32,
    json_out: bool,
) -> Result<u8, Fail> {
    let db = db()?;
    let rows = db.runs(goal, status, limit).map_err(Fail::usage)?;
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", serde_json::to_string(&rows).unwrap_or_default());
        return Ok(exit::ACHIEVED);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no runs");
        return Ok(exit::ACHIEVED);
    }
    let _ = writeln!(
        out,
        "{:<26} {:<14} {:<9} {:<12} {:<15} {:>5} {:>5}  {:<19}  SCHEDULED FOR",
        "RUN", "GOAL", "TRIGGER", "STATUS", "STOP", "TRIES", "STEPS", "STARTED"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<26} {:<14} {:<9} {:<12} {:<15} {:>5} {:>5}  {:<19}  {}",
            r.id,
            r.goal,
            r.trigger,
            r.status,
            r.stop_reason.unwrap_or_default(),
            r.tries,
            r.steps,
            short(&r.started_at),
            r.scheduled_for.as_deref().map(short).unwrap_or_default()
        );
    }
    Ok(exit::ACHIEVED)
}

pub fn show(id: &str) -> Result<u8, Fail> {
    let db = db()?;
    let run = db.run(id).map_err(Fail::usage)?;
    let checks = db.checks(id).map_err(Fail::usage)?;
    let transcript = Path::new(&run.dir).join("transcript.jsonl");
    let text = std::fs::read_to_string(&transcript).unwrap_or_default();
    let trace = HumanTrace::to(!checks.is_empty(), Box::new(std::io::stdout()));
    let mut had_result = false;
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Event>(line) else {
            continue;
        };
        had_result |= matches!(event, Event::Result { .. });
        trace.emit(&event);
    }
    let mut out = std::io::stdout().lock();
    if text.is_empty() {
        let _ = writeln!(out, "(no transcript at {})", transcript.display());
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
            for path in c.output_path.iter().flat_map(|p| p.split(' ')) {
                if let Ok((tail, cut)) = crate::tools::process::read_tail(Path::new(path), 4096) {
                    if tail.trim().is_empty() {
                        continue;
                    }
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
        "\noutcome: {}{} · {} tries · {} steps · {} in / {} out tokens",
        run.status,
        run.stop_reason
            .as_deref()
            .map(|s| format!(" ({s})"))
            .unwrap_or_default(),
        run.tries,
        run.steps,
        run.usage.input_tokens,
        run.usage.output_tokens
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
    if let Some(e) = &run.error {
        let _ = writeln!(out, "error: {e}");
    }
    if !had_result && run.status == "running" {
        let _ = writeln!(out, "(the run is still going)");
    }
    Ok(exit::ACHIEVED)
}

pub async fn trigger(dir: &Path, name: &str, json_out: bool) -> Result<u8, Fail> {
    let goal = find_goal(dir, name)?;
    let (default_model, default_approval) = super::run::env_defaults()?;
    let overrides = Overrides {
        default_model,
        default_approval,
        ..Overrides::default()
    };
    let spec = RunSpec::build(&overrides, Some(&goal.file)).map_err(launch_fail)?;
    execute(spec, json_out, true, "manual").await
}

pub fn pause(dir: &Path, name: &str, paused: bool) -> Result<u8, Fail> {
    find_goal(dir, name)?;
    db()?.set_paused(name, paused).map_err(Fail::usage)?;
    println!(
        "{name}: {}",
        if paused {
            "paused; a running daemon skips its occurrences until `sup resume`"
        } else {
            "resumed"
        }
    );
    Ok(exit::ACHIEVED)
}

pub fn approvals(json_out: bool) -> Result<u8, Fail> {
    let rows = db()?.pending_approvals().map_err(Fail::usage)?;
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", serde_json::to_string(&rows).unwrap_or_default());
        return Ok(exit::ACHIEVED);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no approval requests are waiting");
    }
    for r in rows {
        let what = if r.kind == "check" {
            format!("human check: {}", r.input)
        } else {
            format!("{} {}", r.tool, crate::trace::one_line(&r.input, 200))
        };
        let _ = writeln!(
            out,
            "{}  {what}\n    goal {} · run {} · asked {} · denied at {} unless answered",
            r.id,
            r.goal,
            r.run_id,
            short(&r.created_at),
            short(&r.deadline)
        );
    }
    Ok(exit::ACHIEVED)
}

pub fn answer(id: &str, approve: bool, always: bool, reason: Option<String>) -> Result<u8, Fail> {
    let db = db()?;
    // The operating-system user of this process, from its uid; `$USER` is whatever anyone
    // set it to.
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name);
    let (status, verb) = if approve {
        ("approved", "sup approve")
    } else {
        ("denied", "sup deny")
    };
    let by = format!("{user} (via {verb})");
    if db
        .decide_approval(id, status, always, reason.as_deref(), &by)
        .map_err(Fail::usage)?
    {
        println!("{id}: {status}");
        return Ok(exit::ACHIEVED);
    }
    let why = match db.approval(id).map_err(Fail::usage)? {
        Some(r) => format!(
            "approval request {id} is no longer waiting: it was {} by {}",
            r.status.replace('_', " "),
            r.decided_by.unwrap_or_else(|| "someone".into())
        ),
        None => format!("no approval request `{id}`; `sup approvals` lists the waiting ones"),
    };
    Err(Fail::usage(anyhow!(why)))
}

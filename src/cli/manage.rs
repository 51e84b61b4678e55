//! The schedule and history commands: `sup daemon`, `sup goals`, `sup runs`, `sup show`,
//! `sup trigger`, `sup pause`, `sup resume`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::run::{execute, invocation};
use super::{Ending, Fail};
use crate::config::Settings;
use crate::run::RunSpec;
use crate::schedule::daemon::{self, SystemClock};
use crate::schedule::goals::{self, ScheduledGoal};
use crate::schedule::overview;
use crate::store::db::RunRow;
use crate::store::{self, ApprovalKind, RunStatus, TriggerKind, db::Db};
use crate::trace::{Event, EventSink, HumanTrace, escape, has_hidden};

pub(super) fn db() -> Result<Db, Fail> {
    let db = Db::open(&store::home())?;
    // A run whose process is gone is no longer running, whoever asks.
    db.mark_orphans()?;
    Ok(db)
}

/// A goal file of the folder, loaded or with its error.
pub(super) type Loaded = (PathBuf, Result<ScheduledGoal, String>);

pub(super) fn goal_files(dir: &Path) -> Result<Vec<Loaded>, Fail> {
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
    overview::find(dir, name).map_err(Fail::usage)
}

pub(crate) async fn daemon(
    goals: PathBuf,
    max_concurrent: usize,
    grace: Duration,
    serve: Option<std::net::SocketAddr>,
) -> Result<Ending, Fail> {
    if !goals.is_dir() {
        return Err(Fail::usage(anyhow!(
            "the goals folder {} does not exist; pass --goals DIR",
            goals.display()
        )));
    }
    use tokio::signal::unix::{SignalKind, signal};
    let shutdown = CancellationToken::new();
    let (reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut term = signal(SignalKind::terminate()).map_err(Fail::store)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Fail::store)?;
    let mut hup = signal(SignalKind::hangup()).map_err(Fail::store)?;
    let console = match serve {
        Some(addr) => Some(super::serve::start(addr, goals.clone(), None, shutdown.clone()).await?),
        None => None,
    };
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
        std::process::exit(i32::from(Ending::Interrupted.code()));
    });
    let cfg = daemon::Config {
        goals_dir: goals,
        home: store::home(),
        max_concurrent,
        grace,
        clock: Arc::new(SystemClock),
        defaults: invocation(Settings::default())?,
    };
    let ran = daemon::run(cfg, shutdown.clone(), reload_rx).await;
    shutdown.cancel();
    if let Some(console) = console {
        let _ = console.await;
    }
    ran.map_err(|e| match e {
        daemon::DaemonError::Goals { .. } => Fail::usage(e),
        daemon::DaemonError::Db(_) => Fail::store(e),
    })?;
    Ok(Ending::Achieved)
}

fn short(t: &str) -> String {
    crate::store::db::parse_stamp(t)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| t.to_string())
}

pub(crate) fn goals(dir: &Path, json_out: bool) -> Result<Ending, Fail> {
    let db = db()?;
    let now = Utc::now();
    let rows = overview::overview(dir, &db, now).map_err(Fail::usage)?;
    print_goals(dir, rows, json_out)
}

/// `sup goals` as text or JSON, from the local store's rows or the fleet's.
pub(crate) fn print_goals(
    dir: &Path,
    rows: Vec<serde_json::Value>,
    json_out: bool,
) -> Result<Ending, Fail> {
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", serde_json::Value::Array(rows));
        return Ok(Ending::Achieved);
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
        let _ = writeln!(
            out,
            "  skipped {} · missed {} · skipped while paused {}\n",
            r["skipped"], r["missed"], r["skipped_while_paused"]
        );
    }
    Ok(Ending::Achieved)
}

pub(crate) fn runs(
    goal: Option<&str>,
    status: Option<RunStatus>,
    limit: u32,
    json_out: bool,
) -> Result<Ending, Fail> {
    let db = db()?;
    let rows = db.runs(goal, status, limit)?;
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", serde_json::to_string(&rows).unwrap_or_default());
        return Ok(Ending::Achieved);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no runs");
        return Ok(Ending::Achieved);
    }
    let rows: Vec<(&RunRow, Option<&str>)> = rows.iter().map(|r| (r, None)).collect();
    print_runs(&mut out, &rows);
    Ok(Ending::Achieved)
}

pub(crate) fn show(id: &str) -> Result<Ending, Fail> {
    let db = db()?;
    let run = db.run(id)?;
    let checks = db.checks(id)?;
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
                escape(&c.name),
                c.outcome,
                c.duration_ms
            );
            for path in c.output_path.iter().flat_map(|p| p.lines()) {
                if let Ok((tail, cut)) = crate::tools::process::read_tail(Path::new(path), 4096) {
                    if tail.trim().is_empty() {
                        continue;
                    }
                    let _ = writeln!(out, "    {path}{}:", if cut { " (last part)" } else { "" });
                    for l in tail.lines() {
                        let _ = writeln!(out, "      {}", escape(l));
                    }
                }
            }
        }
    }
    let _ = writeln!(
        out,
        "\noutcome: {}{} · {} tries · {} steps · {} in / {} out tokens{}",
        run.status,
        run.stop_reason
            .as_deref()
            .map(|s| format!(" ({s})"))
            .unwrap_or_default(),
        run.tries,
        run.steps,
        run.usage.input_tokens,
        run.usage.output_tokens,
        run.cost
            .map(|c| format!(" · {}", crate::trace::usd(c)))
            .unwrap_or_default()
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
        let _ = writeln!(out, "error: {}", escape(e));
    }
    let notices = db.notices(id).map_err(Fail::usage)?;
    if !notices.is_empty() {
        let _ = writeln!(out, "\nnotifications:");
        for n in notices {
            let _ = writeln!(
                out,
                "  {} {} → {} · attempt {} · {} · {}",
                if n.ok { '✓' } else { '✗' },
                n.event,
                n.channel,
                n.attempt,
                n.detail,
                short(&n.at)
            );
        }
    }
    if !had_result && run.status == RunStatus::Running {
        let _ = writeln!(out, "(the run is still going)");
    }
    Ok(Ending::Achieved)
}

pub(crate) async fn trigger(dir: &Path, name: &str, json_out: bool) -> Result<Ending, Fail> {
    let goal = find_goal(dir, name)?;
    let inv = invocation(Settings::default())?;
    let mut spec = RunSpec::build(&inv, Some(&goal.file)).map_err(Fail::from)?;
    // A run of a daemon's goal cannot change the daemon's goals, however it was started.
    spec.sandbox.goals = Some(dir.to_path_buf());
    execute(spec, json_out, true, TriggerKind::Manual).await
}

pub(crate) fn pause(dir: &Path, name: &str, paused: bool) -> Result<Ending, Fail> {
    find_goal(dir, name)?;
    db()?.set_paused(name, paused)?;
    println!(
        "{name}: {}",
        if paused {
            "paused; a running daemon skips its occurrences until `sup resume`"
        } else {
            "resumed"
        }
    );
    Ok(Ending::Achieved)
}

pub(crate) fn approvals(json_out: bool) -> Result<Ending, Fail> {
    print_approvals(db()?.pending_approvals()?, json_out)
}

/// `sup approvals` as text or JSON, from the local store's requests or the fleet's: hidden
/// characters are shown escaped and flagged on both.
pub(crate) fn print_approvals(
    rows: Vec<crate::store::db::ApprovalRow>,
    json_out: bool,
) -> Result<Ending, Fail> {
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", serde_json::to_string(&rows).unwrap_or_default());
        return Ok(Ending::Achieved);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no approval requests are waiting");
    }
    for r in rows {
        let what = if r.kind == ApprovalKind::Check {
            format!("human check: {}", r.input)
        } else {
            format!("{} {}", r.tool, crate::trace::one_line(&r.input, 200))
        };
        // Inputs are stored as JSON, where control characters are already escaped: look at
        // the strings themselves.
        let decoded = serde_json::from_str::<serde_json::Value>(&r.input).ok();
        let flag = if has_hidden(&what) || decoded.as_ref().is_some_and(holds_hidden) {
            " ⚠ holds control characters or invisible Unicode, shown escaped"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{}  {}{flag}\n    goal {} · run {} · asked {} · denied at {} unless answered",
            r.id,
            escape(&what),
            escape(&r.goal),
            r.run_id,
            short(&r.created_at),
            short(&r.deadline)
        );
    }
    Ok(Ending::Achieved)
}

/// The table of `sup runs`, local or the fleet's (with the host each ran on).
pub(crate) fn print_runs(out: &mut impl Write, rows: &[(&RunRow, Option<&str>)]) {
    let fleet = rows.iter().any(|(_, h)| h.is_some());
    let host = |h: &str| {
        if fleet {
            format!("{h:<16} ")
        } else {
            String::new()
        }
    };
    let _ = writeln!(
        out,
        "{:<26} {:<14} {:<9} {:<12} {:<15} {:>5} {:>5} {:>9}  {:<19}  {}SCHEDULED FOR",
        "RUN",
        "GOAL",
        "TRIGGER",
        "STATUS",
        "STOP",
        "TRIES",
        "STEPS",
        "COST",
        "STARTED",
        host("HOST")
    );
    for (r, h) in rows {
        let _ = writeln!(
            out,
            "{:<26} {:<14} {:<9} {:<12} {:<15} {:>5} {:>5} {:>9}  {:<19}  {}{}",
            r.id,
            r.goal,
            r.trigger,
            r.status,
            r.stop_reason.as_deref().unwrap_or_default(),
            r.tries,
            r.steps,
            r.cost.map(crate::trace::usd).unwrap_or_else(|| "—".into()),
            short(&r.started_at),
            host(h.unwrap_or_default()),
            r.scheduled_for.as_deref().map(short).unwrap_or_default()
        );
    }
}

/// Whether any string in a JSON value holds control characters or invisible Unicode.
fn holds_hidden(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => has_hidden(s),
        serde_json::Value::Array(a) => a.iter().any(holds_hidden),
        serde_json::Value::Object(o) => o.values().any(holds_hidden),
        _ => false,
    }
}

pub(crate) fn answer(
    id: &str,
    approve: bool,
    always: bool,
    reason: Option<String>,
) -> Result<Ending, Fail> {
    let db = db()?;
    let user = crate::approval::answer::os_user();
    let verb = if approve { "sup approve" } else { "sup deny" };
    let by = format!("{user} (via {verb})");
    let status = crate::approval::answer::answer(&db, id, approve, always, reason.as_deref(), &by)
        .map_err(Fail::usage)?;
    println!("{id}: {status}");
    Ok(Ending::Achieved)
}

//! The schedule and history commands: `sup daemon`, `sup goals`, `sup runs`, `sup show`,
//! `sup trigger`, `sup pause`, `sup resume`, `sup approvals`, `sup approve`, `sup deny`.
//! Each is written once over `store::history::History`, this machine's store or a fleet's;
//! what only a fleet has (its daemon, `sup daemons`) is `super::fleet`'s.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use chrono::Utc;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::run::{execute, invocation};
use super::{Ending, Fail};
use crate::config::{Overlap, Settings};
use crate::run::{RunSpec, Trigger};
use crate::schedule::daemon::{self, SystemClock};
use crate::schedule::goals::{self, ScheduledGoal};
use crate::schedule::overview;
use crate::store::db::RunRow;
use crate::store::history::History;
use crate::store::pg::PgStore;
use crate::store::{self, ApprovalKind, RunStatus, TriggerKind};
use crate::trace::{Event, EventSink, HumanTrace, JsonLines, Results, escape, has_hidden};

use super::db;

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
pub(super) fn find_goal(dir: &Path, name: &str) -> Result<ScheduledGoal, Fail> {
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
    let shutdown = CancellationToken::new();
    let reload_rx = daemon_signals(&shutdown).map_err(Fail::store)?;
    let console = match serve {
        Some(addr) => Some(super::serve::start(addr, goals.clone(), None, shutdown.clone()).await?),
        None => None,
    };
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

/// Watch a daemon's signals: TERM or INT cancels `shutdown` (a second one leaves at once),
/// HUP asks for the goal files to be read again.
pub(super) fn daemon_signals(
    shutdown: &CancellationToken,
) -> std::io::Result<tokio::sync::mpsc::UnboundedReceiver<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let (reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
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
    Ok(reload_rx)
}

pub(super) fn short(t: &str) -> String {
    crate::store::db::parse_stamp(t)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| t.to_string())
}

/// `sup goals`: the goal files with the history's figures (in a fleet, its run ids and
/// counts, and where its daemons hold different versions of a goal).
pub(crate) async fn goals(history: &History, dir: &Path, json_out: bool) -> Result<Ending, Fail> {
    let rows = overview::overview_in(history, dir, Utc::now())
        .await
        .map_err(Fail::usage)?;
    let code = print_goals(dir, rows.into_iter().map(|(r, _)| r).collect(), json_out)?;
    if let (History::Fleet(pg), false) = (history, json_out) {
        goal_versions(pg).await?;
    }
    Ok(code)
}

/// Where the fleet's daemons hold different versions of a goal.
async fn goal_versions(store: &crate::store::pg::PgStore) -> Result<Ending, Fail> {
    let differ = store.goal_versions().await.map_err(Fail::usage)?;
    let mut out = std::io::stdout().lock();
    for (goal, vs) in differ {
        let _ = writeln!(
            out,
            "! {goal}: the fleet's daemons hold different versions; the newest schedules it:"
        );
        for (d, h, m) in vs {
            let _ = writeln!(
                out,
                "    {h}  modified {}  daemon {d}",
                short(&crate::store::db::stamp(m))
            );
        }
    }
    Ok(Ending::Achieved)
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
        let watch = crate::schedule::overview::watch_label(&r["watch"]);
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
                if let Some(w) = &watch {
                    let _ = writeln!(out, "  {w}");
                }
            }
            None if let Some(w) = &watch => {
                let _ = writeln!(
                    out,
                    "{name}  {w}{}",
                    if r["paused"] == true {
                        "  · paused"
                    } else {
                        ""
                    }
                );
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

/// `sup runs`: the history's runs, newest first (in a fleet, with the host each ran on).
pub(crate) async fn runs(
    history: &History,
    goal: Option<&str>,
    status: Option<RunStatus>,
    limit: u32,
    json_out: bool,
) -> Result<Ending, Fail> {
    let rows = history.listed(goal, status, limit).await?;
    let mut out = std::io::stdout().lock();
    if json_out {
        let rows: Vec<_> = rows.into_iter().map(|(_, v)| v).collect();
        let _ = writeln!(out, "{}", serde_json::to_string(&rows).unwrap_or_default());
        return Ok(Ending::Achieved);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no runs");
        return Ok(Ending::Achieved);
    }
    let rows: Vec<(&RunRow, Option<&str>)> = rows
        .iter()
        .map(|((r, ran), _)| (r, ran.as_ref().map(|h| h.host.as_str())))
        .collect();
    print_runs(&mut out, &rows);
    Ok(Ending::Achieved)
}

/// `sup show`: a run's transcript, checks and outcome from the history; in a fleet, where
/// it ran (a check's output kept on another host is named, not read).
pub(crate) async fn show(history: &History, id: &str, full: bool) -> Result<Ending, Fail> {
    let (run, ran) = history.run(id).await?;
    let checks = history.checks(&run.id).await?;
    let lines = history.lines(&run, 0).await?;
    let here = ran
        .as_ref()
        .is_none_or(|r| r.host == crate::store::pg::this_host());
    let trace = HumanTrace::to(!checks.is_empty(), Box::new(std::io::stdout()))
        .with_results(Results::Whole);
    let mut had_result = false;
    for (line, _) in &lines {
        let Ok(event) = serde_json::from_str::<Event>(line) else {
            continue;
        };
        had_result |= matches!(event, Event::Result { .. });
        trace.emit(&event);
    }
    let mut out = std::io::stdout().lock();
    if lines.is_empty() {
        let _ = match history {
            History::Local(_) => writeln!(
                out,
                "(no transcript at {})",
                Path::new(&run.dir).join("transcript.jsonl").display()
            ),
            History::Fleet(_) => writeln!(out, "(no transcript events in the store yet)"),
        };
    }
    if full && here {
        kept_outputs(&mut out, Path::new(&run.dir));
    }
    let hidden = lines
        .iter()
        .filter_map(|(l, _)| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|v| holds_hidden(&v));
    if hidden {
        let _ = writeln!(
            out,
            "⚠ this run holds control characters or invisible Unicode, shown escaped above"
        );
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
            for path in c.output_paths() {
                if let (false, Some(r)) = (here, &ran) {
                    let _ = writeln!(out, "    whole output on host {}: {path}", r.host);
                    continue;
                }
                let cap = if full { usize::MAX } else { 4096 };
                if let Ok((tail, cut)) = crate::tools::process::read_tail(Path::new(path), cap) {
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
        "\noutcome: {}{} · {} {} · {} {} · {}{}",
        run.status,
        run.stop_reason
            .map(|s| format!(" ({s})"))
            .unwrap_or_default(),
        run.tries,
        if run.tries == 1 { "try" } else { "tries" },
        run.steps,
        if run.steps == 1 { "step" } else { "steps" },
        crate::trace::tokens(&run.usage),
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
    if let Some(r) = &ran {
        let _ = writeln!(
            out,
            "ran on host {} (daemon {}) · run folder {}{}",
            r.host,
            r.daemon.as_deref().unwrap_or("none"),
            if run.dir.is_empty() { "—" } else { &run.dir },
            if here {
                ""
            } else {
                " (kept outputs are there, on that host)"
            }
        );
    }
    if let Some(e) = &run.error {
        let _ = writeln!(out, "error: {}", escape(e));
    }
    if let History::Local(_) = history {
        // What only this machine's store keeps: the run's thread and its notifications.
        let db = db()?;
        super::continued::show_thread(&db, &run.id, &mut out);
        notices(&db, &run.id, &mut out)?;
    }
    if !had_result && run.status == RunStatus::Running {
        let _ = writeln!(out, "(the run is still going)");
    }
    Ok(Ending::Achieved)
}

/// The notifications sent about a run, as `sup show` lists them.
fn notices(db: &crate::store::db::Db, id: &str, out: &mut impl Write) -> Result<(), Fail> {
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
    Ok(())
}

/// `sup show --full`: each tool output kept whole in the run's `outputs` folder.
fn kept_outputs(out: &mut impl Write, dir: &Path) {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("outputs"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    if files.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nkept outputs:");
    for path in files {
        let text = std::fs::read(&path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let _ = writeln!(out, "  {}:", path.display());
        for l in text.lines() {
            let _ = writeln!(out, "    {}", escape(l));
        }
    }
}

/// `sup trigger`: run a goal of the folder now. In a fleet, a live daemon that serves the
/// goal picks it up; with none, this process claims it and runs it, under the same overlap
/// rules.
pub(crate) async fn trigger(
    history: &History,
    dir: &Path,
    name: &str,
    json_out: bool,
    approval: Option<crate::approval::Mode>,
    payload: Option<serde_json::Value>,
) -> Result<Ending, Fail> {
    let goal = find_goal(dir, name)?;
    let kind = match payload {
        Some(_) => TriggerKind::Webhook,
        None => TriggerKind::Manual,
    };
    let settings = match history {
        History::Local(_) => Settings {
            approval,
            ..Settings::default()
        },
        // `--approval` is this machine's: a fleet's run is set up as its daemons set theirs up.
        History::Fleet(store) => {
            if store.live_daemon_for(name).await.map_err(Fail::usage)? {
                return hand_off(store, name, kind, payload.as_ref(), json_out).await;
            }
            Settings::default()
        }
    };
    let mut spec = RunSpec::build(&invocation(settings)?, Some(&goal.file)).map_err(Fail::from)?;
    // A run of a daemon's goal cannot change the daemon's goals, however it was started.
    spec.sandbox.goals = Some(dir.to_path_buf());
    spec.payload = payload.map(std::sync::Arc::new);
    match history {
        History::Local(_) => {
            // A goal of a daemon's folder run with no terminal (the console's "run now", a
            // script) waits for a person as its scheduled runs do, rather than denying every
            // call.
            if spec.approval.is_none() && crate::approval::Terminal::detect().is_none() {
                eprintln!(
                    "· approval: no terminal, so mode queue: answer calls with `sup approve ID` \
                     or on the console (--approval sets another)"
                );
                spec.approval = Some(crate::approval::Mode::Queue);
            }
            execute(spec, json_out, false, true, kind).await
        }
        History::Fleet(store) => {
            claim_and_run(store, (name, goal.timing.overlap), &spec, kind, json_out).await
        }
    }
}

/// `sup trigger`'s hand-off to a live daemon that serves the goal: the trigger is recorded
/// in the store, and followed until a daemon starts it or says why not.
async fn hand_off(
    store: &PgStore,
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
    let by = format!("{user}@{} ({by})", crate::store::pg::this_host());
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
async fn claim_and_run(
    store: &PgStore,
    (name, overlap): (&str, Overlap),
    spec: &RunSpec,
    kind: TriggerKind,
    json_out: bool,
) -> Result<Ending, Fail> {
    let me = crate::store::pg::Claimer {
        id: format!(
            "cli-{}-{}",
            crate::store::pg::this_host(),
            std::process::id()
        ),
        host: crate::store::pg::this_host(),
    };
    let claimed = store
        .claim(
            &me,
            kind,
            &[crate::store::pg::Due {
                goal: name.to_string(),
                at: chrono::Utc::now(),
                overlap,
                retry_interrupted: false,
            }],
        )
        .await
        .map_err(Fail::usage)?;
    let run_id = match claimed.first() {
        Some(crate::store::pg::Claimed::Run { run_id, .. }) => run_id.clone(),
        Some(crate::store::pg::Claimed::Not { status, .. }) => {
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
    let launched = crate::schedule::fleet::execute(
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

pub(crate) async fn pause(
    history: &History,
    dir: &Path,
    name: &str,
    paused: bool,
) -> Result<Ending, Fail> {
    find_goal(dir, name)?;
    history.set_paused(name, paused).await?;
    let said = match (paused, history.is_fleet()) {
        (true, false) => "paused; a running daemon skips its occurrences until `sup resume`",
        (true, true) => "paused for the whole fleet until `sup resume`",
        (false, _) => "resumed",
    };
    println!("{name}: {said}");
    Ok(Ending::Achieved)
}

pub(crate) async fn approvals(history: &History, json_out: bool) -> Result<Ending, Fail> {
    let rows = history.pending_approvals().await?;
    // Where each file call really leads (symlinks resolved in its run's workspace).
    let mut targets = Vec::new();
    for r in &rows {
        let workspace = history
            .run(&r.run_id)
            .await
            .ok()
            .map(|(run, _)| run.workspace);
        let input = serde_json::from_str(&r.input).ok();
        targets.push(workspace.zip(input).and_then(|(w, input)| {
            crate::approval::answer::target(&r.tool, &input, Path::new(&w))
        }));
    }
    print_approvals(&rows, &targets, json_out)
}

/// `sup approvals` as text or JSON, from the local store's requests or the fleet's, with
/// where each file call really leads (`targets`, one a row): hidden characters are shown
/// escaped and flagged on both.
pub(crate) fn print_approvals(
    rows: &[crate::store::db::ApprovalRow],
    targets: &[Option<String>],
    json_out: bool,
) -> Result<Ending, Fail> {
    let mut out = std::io::stdout().lock();
    if json_out {
        let listed: Vec<serde_json::Value> = rows
            .iter()
            .zip(targets)
            .map(|(r, t)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("target".into(), t.clone().into());
                }
                v
            })
            .collect();
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(&listed).unwrap_or_default()
        );
        return Ok(Ending::Achieved);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no approval requests are waiting");
    }
    for (r, target) in rows.iter().zip(targets) {
        let check = r.kind == ApprovalKind::Check;
        let _ = writeln!(
            out,
            "{}  {}\n    goal {} · run {} · asked {} · denied at {} unless answered",
            r.id,
            waiting_call(&r.tool, check, &r.input, target.as_deref()),
            escape(&r.goal),
            r.run_id,
            short(&r.created_at),
            short(&r.deadline)
        );
    }
    Ok(Ending::Achieved)
}

/// What a waiting request asks, as `sup approvals` shows it: a human check's question or the
/// call (a file call's path that leads elsewhere through a symlink with its `target`),
/// escaped, and flagged when it held control characters or invisible Unicode.
pub(crate) fn waiting_call(tool: &str, check: bool, input: &str, target: Option<&str>) -> String {
    // Inputs are stored as JSON, where control characters are already escaped: look at the
    // strings themselves.
    let decoded = serde_json::from_str::<serde_json::Value>(input).ok();
    let path = decoded
        .as_ref()
        .and_then(|v| v.get("path")?.as_str().map(str::to_string));
    let leads = match (path, target) {
        (Some(p), Some(t)) if crate::tools::paths::normalize(&p) != t => format!("{p} → {t} "),
        _ => String::new(),
    };
    let what = if check {
        format!("human check: {input}")
    } else {
        format!("{tool} {leads}{}", crate::trace::one_line(input, 200))
    };
    let flag = if has_hidden(&what) || decoded.as_ref().is_some_and(holds_hidden) {
        " ⚠ holds control characters or invisible Unicode, shown escaped"
    } else {
        ""
    };
    format!("{}{flag}", escape(&what))
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
            r.stop_reason.map_or("", |s| s.as_str()),
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

pub(crate) async fn answer(
    history: &History,
    id: &str,
    approve: bool,
    always: bool,
    reason: Option<String>,
) -> Result<Ending, Fail> {
    let user = crate::approval::answer::os_user();
    let verb = if approve { "sup approve" } else { "sup deny" };
    let by = if history.is_fleet() {
        format!("{user}@{} (via {verb})", crate::store::pg::this_host())
    } else {
        format!("{user} (via {verb})")
    };
    let status = history
        .answer(id, approve, always, reason.as_deref(), &by)
        .await
        .map_err(Fail::usage)?;
    println!("{id}: {status}");
    Ok(Ending::Achieved)
}

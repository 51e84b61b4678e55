//! The goals page: each goal file's schedule, next occurrences, last verdict, paused state
//! and file errors, its health as `sup status` judges it (overdue or not, a daemon alive),
//! a chart of its last runs drawn on the server as SVG, and its actions (run now, pause,
//! resume).

use std::collections::HashMap;
use std::path::Path as FsPath;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State as Ext};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use maud::html;
use serde_json::Value;

use super::State;
use super::auth::{Authorized, CsrfForm};
use super::layout::{
    PageError, Viewer, error_page, history_error, layout, short, status_badge, urlencode,
};
use super::render;
use crate::schedule::overview;
use crate::store::db::{RunRow, parse_stamp};
use crate::store::history::History;

pub(crate) async fn goals(
    Ext(state): Ext<Arc<State>>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    let dir = state.cfg.goals_dir.clone();
    if !dir.is_dir() {
        // Nothing to list (a console started where there is no goals folder): say so.
        return goals_page(&state, &viewer, &[], &HashMap::new());
    }
    let rows = match overview::overview_in(&state.history, &dir, Utc::now()).await {
        Ok(x) => x,
        Err(e) => {
            return PageError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                .into_response();
        }
    };
    let health = goal_health(&state.history, &dir).await;
    match health {
        Ok(h) => goals_page(&state, &viewer, &rows, &h),
        Err(e) => e.into_response(),
    }
}

/// How many runs a goal's chart shows.
const HISTORY: u32 = 50;

/// A goal's health as `sup status` judges it, and its recent runs.
#[derive(Default)]
struct Health {
    /// The occurrence (UTC) that should have a verdict by now and has none.
    overdue: Option<String>,
    /// Whether a daemon that serves the goal is alive; None where this console cannot know.
    daemon: Option<bool>,
    /// Its last runs, newest first.
    history: Vec<RunRow>,
}

async fn goal_health(h: &History, dir: &FsPath) -> Result<HashMap<String, Health>, PageError> {
    // The console of `sup daemon --serve` is the daemon's own: alive while it answers.
    let own = (!super::STANDALONE.load(std::sync::atomic::Ordering::Relaxed)).then_some(true);
    let now = Utc::now();
    let mut out = HashMap::new();
    let files = overview::goal_files(dir)
        .map_err(|e| PageError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    for (path, g) in files {
        let Ok(g) = g else { continue };
        let name = g.file.name.clone();
        let paused = h.paused(&name).await.map_err(history_error)?;
        let due = overview::due_occurrence(&g, overview::written_at(&path, now), now, paused);
        let overdue = match due {
            Some(at) => {
                let seen = h
                    .occurrence_status(&name, at)
                    .await
                    .map_err(history_error)?;
                (!overview::accounted(seen.as_deref())).then(|| at.to_rfc3339())
            }
            None => None,
        };
        let daemon = h
            .live_daemon_for(&name)
            .await
            .map_err(history_error)?
            .or(own);
        let history = h
            .runs(Some(&name), None, HISTORY)
            .await
            .map_err(history_error)?;
        out.insert(
            name,
            Health {
                overdue,
                daemon,
                history,
            },
        );
    }
    Ok(out)
}

/// Seconds a run took (so far, while it runs).
fn seconds(run: &RunRow) -> f64 {
    let Some(start) = parse_stamp(&run.started_at) else {
        return 0.0;
    };
    let end = run
        .ended_at
        .as_deref()
        .and_then(parse_stamp)
        .unwrap_or_else(Utc::now);
    ((end - start).num_milliseconds().max(0) as f64) / 1000.0
}

/// The goal's last runs as bars, oldest on the left: the height is the duration, the colour
/// the outcome; each bar links to its run and names it, its outcome, duration and cost.
fn history_chart(runs: &[RunRow]) -> maud::Markup {
    const W: f64 = 9.0;
    const GAP: f64 = 2.0;
    const H: f64 = 48.0;
    let bars: Vec<(&RunRow, f64)> = runs.iter().rev().map(|r| (r, seconds(r))).collect();
    let longest = bars.iter().map(|(_, d)| *d).fold(0.001, f64::max);
    let width = (bars.len() as f64 * (W + GAP)).max(W);
    let achieved = runs
        .iter()
        .filter(|r| r.status == crate::store::RunStatus::Achieved)
        .count();
    let cost: f64 = runs.iter().filter_map(|r| r.cost).sum();
    html! {
        svg.history xmlns="http://www.w3.org/2000/svg" width=(width) height=(H)
            viewBox={ "0 0 " (width) " " (H) } role="img"
            aria-label={ "the last " (runs.len()) " runs" } {
            @for (i, (r, d)) in bars.iter().enumerate() {
                @let bar = (d / longest * (H - 4.0)).max(3.0);
                a href={ "/runs/" (r.id) } {
                    rect class={ "bar " (r.status.as_str()) } x=(i as f64 * (W + GAP))
                        y=(H - bar) width=(W) height=(bar) {
                        title { (r.id) " · " (r.status.as_str()) " · " (format!("{d:.1}s"))
                            @if let Some(c) = r.cost { " · " (crate::trace::usd(c)) } }
                    }
                }
            }
        }
        p.meta.history-summary {
            (runs.len()) " runs · " (achieved) " achieved"
            @if cost > 0.0 { " · " (crate::trace::usd(cost)) " in all" }
        }
    }
}

fn goals_page(
    state: &State,
    viewer: &Viewer,
    rows: &[(Value, u64)],
    health: &HashMap<String, Health>,
) -> Response {
    let none = Health::default();
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let body = html! {
        p.meta { "Goal files in " code { (state.cfg.goals_dir.display()) } }
        @if !state.cfg.goals_dir.is_dir() {
            p.empty { "There is no goals folder here: start the console with "
                code { "--goals DIR" } " to show its goals." }
        } @else if rows.is_empty() { p.empty { "No goal files." } }
        @for (r, paused_skips) in rows {
            @if let Some(e) = r["error"].as_str() {
                section.goal.broken {
                    h3 { "✗ " (s(&r["file"])) }
                    pre.problem { (render::clean(e)) }
                }
            } @else {
                @let name = s(&r["name"]);
                @let paused = r["paused"] == true;
                @let h = health.get(&name).unwrap_or(&none);
                @let failing = r["last"].is_object() && r["last"]["status"] != "achieved";
                section.goal id={ "goal-" (name) } {
                    h3 { (name) @if paused { " " span.badge.paused { "paused" } } }
                    dl {
                        dt { "Schedule" }
                        dd { @if r["schedule"].is_string() { code { (s(&r["schedule"])) } " (" (s(&r["timezone"])) ")" }
                             @else { "none: runs only when triggered" } }
                        @if let Some(w) = overview::watch_label(&r["watch"]) {
                            dt { "Watch" } dd { code { (w) } }
                        }
                        dt { "Next" }
                        dd { @for t in r["next"].as_array().into_iter().flatten() { span.next { (s(t)) } } }
                        dt { "Last verdict" }
                        dd {
                            @if r["last"].is_object() {
                                (status_badge(&s(&r["last"]["status"])))
                                " · " (s(&r["last"]["trigger"])) " · " (short(&s(&r["last"]["started_at"])))
                                " · " a href={ "/runs/" (s(&r["last"]["run_id"])) } { "run " (s(&r["last"]["run_id"])) }
                            } @else { "never run" }
                        }
                        dt { "Health" }
                        dd.health {
                            @if let Some(at) = &h.overdue {
                                span.badge.failed { "overdue" } " the occurrence of " (short(at))
                                    " has no verdict"
                            } @else if failing {
                                span.badge.failed { "failing" } " its last run did not achieve"
                            } @else { span.badge.achieved { "healthy" } }
                            " · daemon: "
                            @match h.daemon {
                                Some(true) => { span.daemon.alive { "alive" } }
                                Some(false) => { span.daemon.dead { "none alive serves it" } }
                                None => { span.daemon { "not known to a console alone (see "
                                    code { "sup status" } ")" } }
                            }
                        }
                        dt { "History" }
                        dd { @if h.history.is_empty() { "no runs yet" } @else { (history_chart(&h.history)) } }
                        dt { "Occurrences" }
                        dd.counts { "skipped " (r["skipped"]) " · missed " (r["missed"]) " · skipped while paused " span.paused-count { (paused_skips) } }
                        dt { "File" } dd { code { (s(&r["file"])) } }
                    }
                    @if let Some(sess) = &viewer.0 {
                        div.actions {
                            form method="post" action={ "/goals/" (urlencode(&name)) "/trigger" } {
                                input type="hidden" name="csrf" value=(sess.csrf);
                                button type="submit" { "Run now" }
                            }
                            @if paused {
                                form method="post" action={ "/goals/" (urlencode(&name)) "/resume" } {
                                    input type="hidden" name="csrf" value=(sess.csrf);
                                    button type="submit" { "Resume" }
                                }
                            } @else {
                                form method="post" action={ "/goals/" (urlencode(&name)) "/pause" } {
                                    input type="hidden" name="csrf" value=(sess.csrf);
                                    button type="submit" { "Pause" }
                                }
                            }
                        }
                    } @else {
                        p { a href="/signin?next=/goals" { "Sign in" } " to run, pause or resume." }
                    }
                }
            }
        }
    };
    layout("Goals", viewer, body).into_response()
}

pub(crate) async fn goal_action(
    Ext(state): Ext<Arc<State>>,
    Path((name, verb)): Path<(String, String)>,
    _: Authorized<CsrfForm>,
) -> Response {
    let dir = state.cfg.goals_dir.clone();
    let goal = name.clone();
    let v = verb.clone();
    let found = match overview::find(&dir, &goal) {
        Err(e @ overview::OverviewError::NoGoal { .. }) => {
            Err(PageError::new(StatusCode::NOT_FOUND, e.to_string()))
        }
        Err(e) => Err(PageError::new(StatusCode::CONFLICT, e.to_string())),
        Ok(_) => match v.as_str() {
            "pause" | "resume" => state
                .history
                .set_paused(&goal, v == "pause")
                .await
                .map_err(history_error),
            "trigger" => Ok(()),
            _ => Err(PageError::new(
                StatusCode::NOT_FOUND,
                "Run now, pause or resume, nothing else.",
            )),
        },
    };
    if let Err(e) = found {
        return e.into_response();
    }
    if verb == "trigger" {
        // A run of its own process, as `sup trigger NAME` would start it: recorded as manual;
        // in a fleet, handed to a daemon that serves the goal.
        match state.spawn_trigger(&name, &[], std::process::Stdio::null) {
            Ok((mut child, held)) => {
                tokio::spawn(async move {
                    let _ = child.wait().await;
                    drop(held);
                });
            }
            Err(e) => {
                return error_page(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot start `sup trigger {name}`: {e}"),
                );
            }
        }
        return Redirect::to(&format!("/runs?goal={}", urlencode(&name))).into_response();
    }
    Redirect::to("/goals").into_response()
}

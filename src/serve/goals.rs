//! The goals page: each goal file's schedule, next occurrences, last verdict, paused state
//! and file errors, and its actions (run now, pause, resume).

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Form, Path, State as Ext};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use maud::html;
use serde_json::Value;

use super::State;
use super::auth::{CsrfForm, authorize};
use super::layout::{
    PageError, Viewer, db_error, error_page, fleet, layout, pg_error, short, status_badge,
    urlencode, with_db,
};
use super::render;
use crate::schedule::overview;
use crate::store::db::GoalStats;
use crate::store::pg::PgStore;
use crate::store::query;

pub(crate) async fn goals(
    Ext(state): Ext<Arc<State>>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    let dir = state.cfg.goals_dir.clone();
    if !dir.is_dir() {
        // Nothing to list (a console started where there is no goals folder): say so.
        return goals_page(&state, &viewer, &[]);
    }
    let loaded = match fleet(&state) {
        Some(pg) => fleet_goals(pg, &dir).await,
        None => local_goals(&state, dir).await,
    };
    let rows = match loaded {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    goals_page(&state, &viewer, &rows)
}

/// Each goal of the folder as `overview` shows it, with its occurrences skipped while
/// paused, from the fleet's store.
async fn fleet_goals(pg: &PgStore, dir: &FsPath) -> Result<Vec<(Value, u64)>, PageError> {
    let files = overview::goal_files(dir)
        .map_err(|e| PageError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let mut stats = std::collections::HashMap::new();
    for (_, g) in files {
        if let Ok(g) = g {
            let name = g.file.name.clone();
            stats.insert(name, pg.goal_stats(&g.file.name).await.map_err(pg_error)?);
        }
    }
    let mut paused = std::collections::HashMap::new();
    let rows = overview::overview_with(dir, Utc::now(), |name| {
        let (s, p) = stats.remove(name).unwrap_or((
            GoalStats {
                paused: false,
                skipped: 0,
                missed: 0,
                last: None,
            },
            0,
        ));
        paused.insert(name.to_string(), p);
        Ok(s)
    })
    .map_err(|e| PageError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let p = r["name"]
                .as_str()
                .and_then(|n| paused.get(n).copied())
                .unwrap_or(0);
            (r, p)
        })
        .collect())
}

async fn local_goals(state: &Arc<State>, dir: PathBuf) -> Result<Vec<(Value, u64)>, PageError> {
    with_db(state, move |db| {
        let rows = overview::overview(&dir, db, Utc::now())
            .map_err(|e| PageError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let mut out = Vec::new();
        for r in rows {
            let paused_skips = match r["name"].as_str() {
                Some(n) => query::occurrence_count(db, n, "paused").map_err(db_error)?,
                None => 0,
            };
            out.push((r, paused_skips));
        }
        Ok(out)
    })
    .await
}

fn goals_page(state: &State, viewer: &Viewer, rows: &[(Value, u64)]) -> Response {
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
                section.goal id={ "goal-" (name) } {
                    h3 { (name) @if paused { " " span.badge.paused { "paused" } } }
                    dl {
                        dt { "Schedule" }
                        dd { @if r["schedule"].is_string() { code { (s(&r["schedule"])) } " (" (s(&r["timezone"])) ")" }
                             @else { "none: runs only when triggered" } }
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
    Extension(viewer): Extension<Viewer>,
    Path((name, verb)): Path<(String, String)>,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    if let Err(e) = authorize(&viewer, &headers, &f.csrf) {
        return e.into_response();
    }
    let dir = state.cfg.goals_dir.clone();
    let goal = name.clone();
    let v = verb.clone();
    if let Some(pg) = fleet(&state) {
        let found = match overview::find(&dir, &goal) {
            Err(e @ overview::OverviewError::NoGoal { .. }) => {
                Err(PageError::new(StatusCode::NOT_FOUND, e.to_string()))
            }
            Err(e) => Err(PageError::new(StatusCode::CONFLICT, e.to_string())),
            Ok(_) => match v.as_str() {
                "pause" | "resume" => pg.set_paused(&goal, v == "pause").await.map_err(pg_error),
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
    } else {
        let found = with_db(&state, move |db| {
            overview::find(&dir, &goal).map_err(|e| match e {
                overview::OverviewError::NoGoal { .. } => {
                    PageError::new(StatusCode::NOT_FOUND, e.to_string())
                }
                e => PageError::new(StatusCode::CONFLICT, e.to_string()),
            })?;
            match v.as_str() {
                "pause" | "resume" => db.set_paused(&goal, v == "pause").map_err(db_error),
                "trigger" => Ok(()),
                _ => Err(PageError::new(
                    StatusCode::NOT_FOUND,
                    "Run now, pause or resume, nothing else.",
                )),
            }
        })
        .await;
        if let Err(e) = found {
            return e.into_response();
        }
    }
    if verb == "trigger" {
        // A run of its own process, as `sup trigger NAME` would start it: recorded as manual;
        // in a fleet, handed to a daemon that serves the goal.
        let mut cmd = tokio::process::Command::new(&state.cfg.exe);
        cmd.arg("trigger")
            .arg(&name)
            .arg("--goals")
            .arg(&state.cfg.goals_dir)
            // The environment sup started with: the run needs the provider keys.
            .env_clear()
            .envs(crate::startup::original_env());
        if let Some((_, url)) = &state.cfg.fleet {
            cmd.env("SUP_STORE", url);
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // Held, so that no run's sweep ends it.
        match crate::tools::sandbox::spawn_held(&mut cmd) {
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

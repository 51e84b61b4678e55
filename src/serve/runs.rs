//! The run pages: the list of runs (filters, pages), one run (summary, its waiting approval
//! requests with their buttons, a rerun button, step durations, transcript live over
//! server-sent events, checks, kept outputs) and a run's kept files as plain text.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, Query, State as Ext};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use maud::html;
use serde::Deserialize;
use serde_json::Value;

use super::State;
use super::layout::{
    PageError, Viewer, error_page, history_error, layout, short, status_badge, urlencode, with_db,
};
use super::render;
use crate::store::RunStatus;
use crate::store::db::{RunRow, parse_stamp};
use crate::trace::{CheckReport, Event, HumanTrace};

const STATUSES: &[&str] = &[
    "running",
    "achieved",
    "failed",
    "unfinished",
    "error",
    "interrupted",
];
const PER_PAGE: u32 = 50;
/// How often a live transcript looks for new lines: in the run's file…
const TAIL_POLL: Duration = Duration::from_millis(50);
/// …and in the fleet's store.
const FLEET_TAIL_POLL: Duration = Duration::from_millis(250);

fn duration(run: &RunRow) -> String {
    let (Some(start), end) = (
        parse_stamp(&run.started_at),
        run.ended_at.as_deref().and_then(parse_stamp),
    ) else {
        return String::new();
    };
    let end = end.unwrap_or_else(Utc::now);
    let secs = (end - start).num_milliseconds().max(0) as f64 / 1000.0;
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        humantime::format_duration(Duration::from_secs(secs as u64)).to_string()
    }
}

fn link_query(goal: Option<&str>, status: Option<&str>, page: u32, per: u32) -> String {
    let mut q = vec![format!("page={page}")];
    if let Some(g) = goal {
        q.push(format!("goal={}", urlencode(g)));
    }
    if let Some(s) = status {
        q.push(format!("status={}", urlencode(s)));
    }
    if per != PER_PAGE {
        q.push(format!("per={per}"));
    }
    format!("/runs?{}", q.join("&"))
}

#[derive(Deserialize)]
pub(crate) struct RunsQuery {
    goal: Option<String>,
    status: Option<String>,
    page: Option<u32>,
    per: Option<u32>,
}

pub(crate) async fn runs(
    Ext(state): Ext<Arc<State>>,
    Extension(viewer): Extension<Viewer>,
    Query(q): Query<RunsQuery>,
) -> Response {
    let goal = q.goal.filter(|g| !g.is_empty());
    let status = q.status.filter(|s| !s.is_empty());
    let per = q.per.unwrap_or(PER_PAGE).clamp(1, 500);
    let page = q.page.unwrap_or(1).max(1);
    let offset = (page - 1).saturating_mul(per);
    let h = &state.history;
    let loaded = async {
        // A status the store does not know matches no run.
        let (rows, total) = match status.as_deref().map(RunStatus::parse) {
            Some(None) => (Vec::new(), 0),
            typed => {
                h.runs_page(goal.clone(), typed.flatten(), offset, per)
                    .await?
            }
        };
        Ok((rows, total, h.goal_names().await?))
    }
    .await
    .map_err(history_error);
    let (rows, total, goals) = match loaded {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let pages = total.div_ceil(u64::from(per)).max(1);
    let body = html! {
        form.filters method="get" action="/runs" {
            label { "goal "
                select name="goal" {
                    option value="" { "all" }
                    @for g in &goals {
                        option value=(g) selected[goal.as_deref() == Some(g)] { (g) }
                    }
                }
            }
            label { "status "
                select name="status" {
                    option value="" { "all" }
                    @for s in STATUSES {
                        option value=(s) selected[status.as_deref() == Some(*s)] { (s) }
                    }
                }
            }
            button type="submit" { "Filter" }
            span.count { (total) " run" @if total != 1 { "s" } }
        }
        @if rows.is_empty() {
            p.empty { "No runs." }
        } @else {
            table.runs {
                thead { tr {
                    th { "Run" } th { "Goal" } th { "Status" } th { "Stop reason" }
                    th.num { "Tries" } th.num { "Steps" } th.num { "Tokens in / out" }
                    th.num { "Cost" } th.num { "Duration" } th { "Trigger" } th { "Started (UTC)" }
                } }
                tbody {
                    @for r in &rows {
                        tr {
                            td { a href={ "/runs/" (r.id) } { (r.id) } }
                            td { (r.goal) }
                            td { (status_badge(r.status.as_str())) }
                            td { (r.stop_reason.map_or("", |s| s.as_str())) }
                            td.num { (r.tries) }
                            td.num { (r.steps) }
                            td.num { (r.usage.input_tokens) " / " (r.usage.output_tokens) }
                            td.num { (r.cost.map(crate::trace::usd).unwrap_or_else(|| "—".into())) }
                            td.num { (duration(r)) }
                            td { (r.trigger) }
                            td { (short(&r.started_at)) }
                        }
                    }
                }
            }
        }
        nav.pages {
            @if page > 1 {
                a rel="prev" href=(link_query(goal.as_deref(), status.as_deref(), page - 1, per)) { "← newer" }
            }
            span { "page " (page) " of " (pages) }
            @if u64::from(page) < pages {
                a rel="next" href=(link_query(goal.as_deref(), status.as_deref(), page + 1, per)) { "older →" }
            }
        }
    };
    layout("Runs", &viewer, body).into_response()
}

/// Files kept for a run, relative to its folder: cut tool outputs and check outputs.
fn kept_files(run: &RunRow, checks: &[(u32, CheckReport)]) -> Vec<String> {
    let dir = PathBuf::from(&run.dir);
    let mut outputs: Vec<String> = std::fs::read_dir(dir.join("outputs"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().is_file())
                .map(|e| format!("outputs/{}", e.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    outputs.sort();
    let mut files = vec!["transcript.jsonl".to_string()];
    files.append(&mut outputs);
    for (_, c) in checks {
        for p in c.output_paths() {
            if let Ok(rel) = FsPath::new(p).strip_prefix(&dir) {
                let rel = rel.to_string_lossy().into_owned();
                if !files.contains(&rel) {
                    files.push(rel);
                }
            }
        }
    }
    files
}

fn trace_for(run: &RunRow) -> HumanTrace {
    HumanTrace::to(run.goal != "run", Box::new(std::io::sink()))
}

pub(crate) async fn run(
    Ext(state): Ext<Arc<State>>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> Response {
    let h = &state.history;
    let loaded = async {
        let (run, host) = h.run(&id).await?;
        let checks = h.checks(&run.id).await?;
        let lines = h.lines(&run, 0).await?;
        let offset = lines.last().map_or(0, |(_, at)| *at);
        let text: String = lines.into_iter().map(|(l, _)| l).collect();
        Ok((run, checks, text, offset, host))
    }
    .await
    .map_err(history_error);
    let (run, checks, text, offset, host) = match loaded {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let run_id = run.id.clone();
    let waiting = h.pending_approvals().await.map_err(history_error);
    let waiting: Vec<_> = match waiting {
        Ok(w) => w.into_iter().filter(|a| a.run_id == run_id).collect(),
        Err(e) => return e.into_response(),
    };
    let steps = step_durations(&text);
    let rerun = crate::schedule::overview::find(&state.cfg.goals_dir, &run.goal).is_ok();
    let trace = trace_for(&run);
    let live = run.status == crate::store::RunStatus::Running;
    let files = kept_files(&run, &checks);
    let thread = if h.is_fleet() {
        Default::default()
    } else {
        let id = run.id.clone();
        with_db(&state, move |db| Ok(super::thread::load(db, &id)))
            .await
            .unwrap_or_default()
    };
    let body = html! {
        (super::thread::section(&thread))
        dl.summary {
            dt { "Status" } dd { (status_badge(run.status.as_str()))
                @if let Some(s) = &run.stop_reason { " · " (s) } }
            dt { "Goal" } dd { a href={ "/runs?goal=" (urlencode(&run.goal)) } { (run.goal) } }
            dt { "Trigger" } dd { (run.trigger)
                @if let Some(s) = &run.scheduled_for { " · scheduled for " (short(s)) } }
            @if let Some(h) = &host { dt { "Host" } dd { (h.host) } }
            dt { "Model" } dd { (run.model) }
            dt { "Workspace" } dd { code { (run.workspace) } }
            dt { "Tries · steps" } dd { (run.tries) " · " (run.steps) }
            dt { "Tokens" } dd { (run.usage.input_tokens) " in · " (run.usage.output_tokens) " out" }
            @if let Some(c) = run.cost { dt { "Cost" } dd { (crate::trace::usd(c)) } }
            dt { "Started · duration" } dd { (short(&run.started_at)) " UTC · " (duration(&run)) }
            @if let Some(e) = &run.error { dt { "Error" } dd.problem { (render::clean(e)) } }
        }
        @if !waiting.is_empty() {
            h2 { "Waiting for a person" }
            @for a in &waiting {
                section.request id={ "req-" (a.id) } {
                    p.meta { @if a.kind == crate::store::ApprovalKind::Check { "human check " } @else { (a.tool) " " } code { (a.id) }
                        " · denied at " (short(&a.deadline)) " UTC unless answered" }
                    pre.what { (render::clean(&crate::trace::one_line(&a.input, 400))) }
                    @if let Some(sess) = &viewer.0 {
                        div.actions {
                            form method="post" action={ "/approvals/" (a.id) "/approve" } {
                                input type="hidden" name="csrf" value=(sess.csrf);
                                button.approve type="submit" { "Approve" }
                            }
                            form.deny method="post" action={ "/approvals/" (a.id) "/deny" } {
                                input type="hidden" name="csrf" value=(sess.csrf);
                                input type="text" name="reason" placeholder="reason (the model reads it)" maxlength="2000";
                                button.deny type="submit" { "Deny" }
                            }
                        }
                    } @else {
                        p { a href={ "/signin?next=/runs/" (run.id) } { "Sign in" } " to answer." }
                    }
                }
            }
        }
        @if rerun && !live {
            @if let Some(sess) = &viewer.0 {
                form.rerun method="post" action={ "/goals/" (urlencode(&run.goal)) "/trigger" } {
                    input type="hidden" name="csrf" value=(sess.csrf);
                    button type="submit" { "Run " (run.goal) " again" }
                }
            }
        }
        @if !steps.is_empty() {
            h2 { "Steps" }
            table.steps {
                thead { tr { th { "Step" } th.num { "Time" } } }
                tbody {
                    @for (step, ms) in &steps {
                        tr { td { (step) } td.num { (ms) "ms" } }
                    }
                }
            }
        }
        h2 { "Transcript" @if live { " " span.live { "live" } } }
        div id="transcript" class="transcript"
            data-live=(if live { "1" } else { "0" })
            data-src={ "/runs/" (run.id) "/events?from=" (offset) } {
            @for e in render::events(&text) {
                @if let Some(m) = render::event(&trace, &e) { (m) }
            }
            @if text.is_empty() { p.empty { "No transcript yet." } }
        }
        @if !checks.is_empty() {
            h2 { "Checks" }
            table.checks {
                thead { tr { th { "Try" } th { "Check" } th { "Outcome" } th.num { "Time" } } }
                tbody {
                    @for (t, c) in &checks {
                        tr class=(if c.passed { "ok" } else { "err" }) {
                            td { (t) }
                            td { (if c.passed { "✓ " } else { "✗ " }) (c.name) }
                            td { (c.outcome) }
                            td.num { (c.duration_ms) "ms" }
                        }
                    }
                }
            }
        }
        @if !files.is_empty() {
            h2 { "Kept outputs" }
            ul.files {
                @for f in &files {
                    li { a href={ "/runs/" (run.id) "/files/" (f) } { (f) } }
                }
            }
        }
    };
    layout(&format!("Run {}", run.id), &viewer, body).into_response()
}

/// Each step's wall time, from the transcript's timestamps: from its `step_started` to the
/// next step, or to the end of its work loop. A step still running is left out.
fn step_durations(text: &str) -> Vec<(u64, i64)> {
    let mut out = Vec::new();
    let mut open: Option<(u64, chrono::DateTime<Utc>)> = None;
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(at) = v["at"]
            .as_str()
            .and_then(|a| chrono::DateTime::parse_from_rfc3339(a).ok())
        else {
            continue;
        };
        let at = at.with_timezone(&Utc);
        let kind = v["type"].as_str().unwrap_or("");
        if matches!(kind, "step_started" | "work_finished")
            && let Some((step, from)) = open.take()
        {
            out.push((step, (at - from).num_milliseconds().max(0)));
        }
        if kind == "step_started" {
            open = v["step"].as_u64().map(|s| (s, at));
        }
    }
    out
}

#[derive(Deserialize)]
pub(crate) struct FromQuery {
    from: Option<u64>,
}

/// The transcript from an offset on, as server-sent events: `line` (one event's HTML, its id
/// the offset after it) until the run ends, then `end`.
pub(crate) async fn run_events(
    Ext(state): Ext<Arc<State>>,
    Path(id): Path<String>,
    Query(q): Query<FromQuery>,
    headers: HeaderMap,
) -> Response {
    let run = match load_run(&state, id).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let from = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .or(q.from)
        .unwrap_or(0);
    let tail = Tail {
        offset: from,
        queued: VecDeque::new(),
        done: false,
        polls: 0,
        trace: trace_for(&run),
        state,
        run,
    };
    let stream = futures::stream::unfold(tail, Tail::next);
    axum::response::sse::Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

struct Tail {
    offset: u64,
    queued: VecDeque<Sse>,
    done: bool,
    polls: u32,
    trace: HumanTrace,
    state: Arc<State>,
    run: RunRow,
}

/// A run by its id, from the store the console serves.
async fn load_run(state: &Arc<State>, id: String) -> Result<RunRow, PageError> {
    state
        .history
        .run(&id)
        .await
        .map(|(run, _)| run)
        .map_err(history_error)
}

impl Tail {
    async fn next(mut self) -> Option<(Result<Sse, Infallible>, Tail)> {
        loop {
            if let Some(e) = self.queued.pop_front() {
                return Some((Ok(e), self));
            }
            if self.done || self.state.shutdown.is_cancelled() {
                return None;
            }
            let lines = self
                .state
                .history
                .lines(&self.run, self.offset)
                .await
                .unwrap_or_default();
            for (line, at) in lines {
                self.offset = at;
                let Ok(event) = serde_json::from_str::<Event>(&line) else {
                    continue;
                };
                if let Some(html) = render::event(&self.trace, &event) {
                    // A newline inside <pre> as a character reference: one `data:` line.
                    let data = html.into_string().replace('\n', "&#10;");
                    self.queued
                        .push_back(Sse::default().event("line").id(at.to_string()).data(data));
                }
                if matches!(event, Event::Result { .. }) {
                    self.done = true;
                }
            }
            if self.done {
                self.queued
                    .push_back(Sse::default().event("end").data("end"));
                continue;
            }
            if !self.queued.is_empty() {
                continue;
            }
            // Every second without news: has the run ended without a result (killed)?
            self.polls += 1;
            if self.polls.is_multiple_of(20) {
                let running = load_run(&self.state, self.run.id.clone())
                    .await
                    .is_ok_and(|r| r.status == crate::store::RunStatus::Running);
                if !running {
                    self.done = true;
                    continue;
                }
            }
            let poll = if self.state.history.is_fleet() {
                FLEET_TAIL_POLL
            } else {
                TAIL_POLL
            };
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = self.state.shutdown.cancelled() => {}
            }
        }
    }
}

/// A kept file of a run, as plain text; nothing outside the run's folder.
pub(crate) async fn run_file(
    Ext(state): Ext<Arc<State>>,
    Path((id, path)): Path<(String, String)>,
) -> Response {
    let run = match load_run(&state, id).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let not_found = || error_page(StatusCode::NOT_FOUND, "No such file kept for this run.");
    // Opened beneath the run folder (`openat2` with RESOLVE_BENEATH where the kernel has it):
    // its `tmp` is the agent's, and a symlink flipped there between a check of the path and
    // the read would serve any file the console can read (its own /proc/self/environ).
    let Ok(dir) = cap_std::fs::Dir::open_ambient_dir(&run.dir, cap_std::ambient_authority()) else {
        return not_found();
    };
    match tokio::task::spawn_blocking(move || dir.read(&path)).await {
        Ok(Ok(bytes)) => (
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (header::CONTENT_SECURITY_POLICY, "sandbox"),
            ],
            bytes,
        )
            .into_response(),
        _ => not_found(),
    }
}

//! The pages and actions: runs (filters, pages), one run (transcript live over server-sent
//! events, checks, kept outputs), approvals (waiting and answered; approve, approve always,
//! deny with a reason), goals (schedule, next occurrences, last verdict, paused, file
//! errors; run now, pause, resume), and the embedded style sheet and script. Each page
//! loads from the local store, or from the fleet's (PostgreSQL) when the console has one.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Form, Path, Query, State as Ext};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;
use serde_json::Value;

use super::State;
use super::auth::{CsrfForm, authorize};
use super::render;
use crate::approval::answer::{AnswerError, answer as record_answer, describe};
use crate::schedule::overview;
use crate::store::db::{Db, DbError, GoalStats, RunRow, parse_stamp};
use crate::store::pg::{PgError, PgStore};
use crate::store::query::{self, RunFilter};
use crate::trace::{CheckReport, Event, HumanTrace};

/// Who is looking: a signed-in person, or nobody (loopback without a token).
#[derive(Clone, Debug)]
pub(crate) struct Viewer(pub(crate) Option<super::Session>);

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

pub(crate) fn layout(title: &str, viewer: &Viewer, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · sup" }
                link rel="stylesheet" href="/static/style.css";
                script src="/static/live.js" defer {}
            }
            body {
                header {
                    nav {
                        a.brand href="/runs" { "sup" }
                        a href="/runs" { "Runs" }
                        a href="/approvals" { "Approvals" }
                        a href="/goals" { "Goals" }
                    }
                    span.who {
                        @if let Some(s) = &viewer.0 {
                            "signed in as " b { (s.name) }
                            form.inline method="post" action="/signout" {
                                input type="hidden" name="csrf" value=(s.csrf);
                                button.link type="submit" { "sign out" }
                            }
                        } @else {
                            a href="/signin" { "sign in" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

pub(crate) fn error_page(status: StatusCode, text: &str) -> Response {
    let page = layout(
        status.canonical_reason().unwrap_or("Error"),
        &Viewer(None),
        html! { p.problem { (text) } p { a href="/runs" { "Back to the runs" } } },
    );
    (status, page).into_response()
}

/// A page that could not be made: its status and what to tell the person.
pub(crate) struct PageError(pub(crate) StatusCode, pub(crate) String);

impl PageError {
    pub(crate) fn new(status: StatusCode, text: impl Into<String>) -> Self {
        PageError(status, text.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        error_page(self.0, &self.1)
    }
}

fn db_error(e: DbError) -> PageError {
    match e {
        DbError::NoRun(_) => PageError::new(StatusCode::NOT_FOUND, e.to_string()),
        e => PageError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn pg_error(e: PgError) -> PageError {
    match e {
        PgError::NoRun(_) => PageError::new(StatusCode::NOT_FOUND, e.to_string()),
        e => PageError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The fleet's store, when the console serves one.
fn fleet(state: &State) -> Option<&PgStore> {
    state.cfg.fleet.as_ref().map(|(s, _)| s)
}

/// Transcript events from the fleet's store as JSON lines, each with the sequence number
/// after it.
fn event_lines(events: &[(i64, Value)]) -> Vec<(String, u64)> {
    events
        .iter()
        .map(|(seq, v)| (format!("{v}\n"), (*seq + 1).max(0) as u64))
        .collect()
}

/// Run `f` on the store, off the async threads.
async fn with_db<T: Send + 'static>(
    state: &Arc<State>,
    f: impl FnOnce(&Db) -> Result<T, PageError> + Send + 'static,
) -> Result<T, PageError> {
    let home = state.cfg.home.clone();
    tokio::task::spawn_blocking(move || {
        let db = Db::open(&home).map_err(db_error)?;
        // A run whose process is gone is no longer running, whoever asks.
        db.mark_orphans().map_err(db_error)?;
        f(&db)
    })
    .await
    .unwrap_or_else(|e| {
        Err(PageError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the page failed: {e}"),
        ))
    })
}

fn short(t: &str) -> String {
    parse_stamp(t)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| t.to_string())
}

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

fn status_badge(status: &str) -> Markup {
    html! { span class={ "badge " (status) } { (status) } }
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

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) async fn index() -> Redirect {
    Redirect::to("/runs")
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
    let (g, s) = (goal.clone(), status.clone());
    let offset = (page - 1).saturating_mul(per);
    let loaded = match fleet(&state) {
        Some(pg) => {
            async {
                let (rows, total) = pg
                    .runs_page(g.as_deref(), s.as_deref(), offset, per)
                    .await
                    .map_err(pg_error)?;
                let goals = pg.goal_names().await.map_err(pg_error)?;
                Ok((rows.into_iter().map(|f| f.run).collect(), total, goals))
            }
            .await
        }
        None => {
            with_db(&state, move |db| {
                let filter = RunFilter {
                    goal: g.as_deref(),
                    status: s.as_deref(),
                };
                let (rows, total) = query::runs_page(db, &filter, offset, per).map_err(db_error)?;
                let goals = query::goal_names(db).map_err(db_error)?;
                Ok((rows, total, goals))
            })
            .await
        }
    };
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
                            td { (r.stop_reason.as_deref().unwrap_or("")) }
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

/// The complete lines of a transcript from `from`, and the offset after them.
fn read_lines(path: &FsPath, from: u64) -> (String, u64) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return (String::new(), from);
    };
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_err() || f.read_to_end(&mut buf).is_err() {
        return (String::new(), from);
    }
    let end = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    buf.truncate(end);
    (
        String::from_utf8_lossy(&buf).into_owned(),
        from + end as u64,
    )
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
        for p in c.output_path.iter().flat_map(|p| p.split(' ')) {
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
    let loaded = match fleet(&state) {
        Some(pg) => {
            async {
                let f = pg.run(&id).await.map_err(pg_error)?;
                let checks = pg.checks(&f.run.id).await.map_err(pg_error)?;
                let events = pg.events_from(&f.run.id, 0).await.map_err(pg_error)?;
                let lines = event_lines(&events);
                let offset = lines.last().map_or(0, |(_, at)| *at);
                let text: String = lines.into_iter().map(|(l, _)| l).collect();
                Ok((f.run, checks, text, offset, Some(f.host)))
            }
            .await
        }
        None => {
            with_db(&state, move |db| {
                let run = db.run(&id).map_err(db_error)?;
                let checks = db.checks(&id).map_err(db_error)?;
                let transcript = FsPath::new(&run.dir).join("transcript.jsonl");
                let (text, offset) = read_lines(&transcript, 0);
                Ok((run, checks, text, offset, None))
            })
            .await
        }
    };
    let (run, checks, text, offset, host) = match loaded {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let trace = trace_for(&run);
    let live = run.status == crate::store::RunStatus::Running;
    let files = kept_files(&run, &checks);
    let body = html! {
        dl.summary {
            dt { "Status" } dd { (status_badge(run.status.as_str()))
                @if let Some(s) = &run.stop_reason { " · " (s) } }
            dt { "Goal" } dd { a href={ "/runs?goal=" (urlencode(&run.goal)) } { (run.goal) } }
            dt { "Trigger" } dd { (run.trigger)
                @if let Some(s) = &run.scheduled_for { " · scheduled for " (short(s)) } }
            @if let Some(h) = &host { dt { "Host" } dd { (h) } }
            dt { "Model" } dd { (run.model) }
            dt { "Workspace" } dd { code { (run.workspace) } }
            dt { "Tries · steps" } dd { (run.tries) " · " (run.steps) }
            dt { "Tokens" } dd { (run.usage.input_tokens) " in · " (run.usage.output_tokens) " out" }
            @if let Some(c) = run.cost { dt { "Cost" } dd { (crate::trace::usd(c)) } }
            dt { "Started · duration" } dd { (short(&run.started_at)) " UTC · " (duration(&run)) }
            @if let Some(e) = &run.error { dt { "Error" } dd.problem { (render::clean(e)) } }
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
        path: FsPath::new(&run.dir).join("transcript.jsonl"),
        offset: from,
        queued: VecDeque::new(),
        done: false,
        polls: 0,
        trace: trace_for(&run),
        fleet: fleet(&state).cloned(),
        state,
        id: run.id,
    };
    let stream = futures::stream::unfold(tail, Tail::next);
    axum::response::sse::Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

struct Tail {
    path: PathBuf,
    offset: u64,
    queued: VecDeque<Sse>,
    done: bool,
    polls: u32,
    trace: HumanTrace,
    /// The fleet's store, where the events are when there is one.
    fleet: Option<PgStore>,
    state: Arc<State>,
    id: String,
}

/// A run by its id, from the store the console serves.
async fn load_run(state: &Arc<State>, id: String) -> Result<RunRow, PageError> {
    match fleet(state) {
        Some(pg) => pg.run(&id).await.map(|f| f.run).map_err(pg_error),
        None => with_db(state, move |db| db.run(&id).map_err(db_error)).await,
    }
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
            let lines = match &self.fleet {
                Some(pg) => pg
                    .events_from(&self.id, self.offset as i64)
                    .await
                    .map(|e| event_lines(&e))
                    .unwrap_or_default(),
                None => {
                    let (text, _) = read_lines(&self.path, self.offset);
                    let mut at = self.offset;
                    text.split_inclusive('\n')
                        .map(|l| {
                            at += l.len() as u64;
                            (l.to_string(), at)
                        })
                        .collect()
                }
            };
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
                let running = load_run(&self.state, self.id.clone())
                    .await
                    .is_ok_and(|r| r.status == crate::store::RunStatus::Running);
                if !running {
                    self.done = true;
                    continue;
                }
            }
            let poll = if self.fleet.is_some() {
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

pub(crate) async fn approvals(
    Ext(state): Ext<Arc<State>>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    let loaded = match fleet(&state) {
        Some(pg) => fleet_approvals(pg).await,
        None => local_approvals(&state).await,
    };
    let (waiting, answered) = match loaded {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    approvals_page(&viewer, &waiting, &answered)
}

/// Waiting requests with what each asks, and answered ones with when.
type Approvals = (
    Vec<(crate::store::db::ApprovalRow, String)>,
    Vec<(crate::store::db::ApprovalRow, Option<String>)>,
);

/// What a request asks, in words: the question of a human check, else the call.
fn what(p: &crate::store::db::ApprovalRow, workspace: Option<String>) -> String {
    if p.kind == crate::store::ApprovalKind::Check {
        return p.input.clone();
    }
    let workspace = PathBuf::from(workspace.unwrap_or_else(|| ".".into()));
    let input: Value = serde_json::from_str(&p.input).unwrap_or(Value::Null);
    describe(&p.tool, &input, &workspace)
        .trim_start()
        .to_string()
}

async fn fleet_approvals(pg: &PgStore) -> Result<Approvals, PageError> {
    let mut waiting = Vec::new();
    for p in pg
        .approvals(crate::store::ApprovalStatus::Pending)
        .await
        .map_err(pg_error)?
    {
        let workspace = pg.run(&p.run_id).await.ok().map(|f| f.run.workspace);
        let w = what(&p, workspace);
        waiting.push((p, w));
    }
    let answered = pg.answered_approvals(50).await.map_err(pg_error)?;
    Ok((waiting, answered))
}

async fn local_approvals(state: &Arc<State>) -> Result<Approvals, PageError> {
    with_db(state, |db| {
        let pending = db.pending_approvals().map_err(db_error)?;
        let mut waiting = Vec::new();
        for p in pending {
            let w = what(&p, db.run(&p.run_id).ok().map(|r| r.workspace));
            waiting.push((p, w));
        }
        let answered = query::answered_approvals(db, 50).map_err(db_error)?;
        Ok((waiting, answered))
    })
    .await
}

fn approvals_page(
    viewer: &Viewer,
    waiting: &[(crate::store::db::ApprovalRow, String)],
    answered: &[(crate::store::db::ApprovalRow, Option<String>)],
) -> Response {
    let body = html! {
        h2 { "Waiting" }
        @if waiting.is_empty() { p.empty { "No approval requests are waiting." } }
        @for (r, what) in waiting {
            section.request id={ "req-" (r.id) } {
                h3 {
                    @if r.kind == crate::store::ApprovalKind::Check { "Human check " } @else { (r.tool) " " }
                    code { (r.id) }
                }
                p.meta {
                    "goal " (r.goal) " · run " a href={ "/runs/" (r.run_id) } { (r.run_id) }
                    " · asked " (short(&r.created_at)) " UTC · denied at " (short(&r.deadline))
                    " UTC unless answered"
                }
                pre.what { (render::clean(what)) }
                @if let Some(s) = &viewer.0 {
                    div.actions {
                        form method="post" action={ "/approvals/" (r.id) "/approve" } {
                            input type="hidden" name="csrf" value=(s.csrf);
                            button.approve type="submit" { "Approve" }
                        }
                        @if r.kind != crate::store::ApprovalKind::Check {
                            form method="post" action={ "/approvals/" (r.id) "/approve" } {
                                input type="hidden" name="csrf" value=(s.csrf);
                                input type="hidden" name="always" value="1";
                                button.approve type="submit" title="Also allow the same tool and argument for the rest of this run" { "Approve always" }
                            }
                        }
                        form.deny method="post" action={ "/approvals/" (r.id) "/deny" } {
                            input type="hidden" name="csrf" value=(s.csrf);
                            input type="text" name="reason" placeholder="reason (the model reads it)" maxlength="2000";
                            button.deny type="submit" { "Deny" }
                        }
                    }
                } @else {
                    p { a href="/signin?next=/approvals" { "Sign in" } " to answer." }
                }
            }
        }
        h2 { "Answered" }
        @if answered.is_empty() { p.empty { "None yet." } }
        @else {
            table.answered {
                thead { tr { th { "Request" } th { "What" } th { "Run" } th { "Answer" } th { "By" } th { "When (UTC)" } th { "Reason" } } }
                tbody {
                    @for (r, at) in answered {
                        tr {
                            td { code { (r.id) } }
                            td { (r.tool) " " span.arg { (render::clean(&crate::trace::one_line(&r.input, 80))) } }
                            td { a href={ "/runs/" (r.run_id) } { (r.run_id) } }
                            td { (status_badge(r.status.as_str())) @if r.always { " (always)" } }
                            td { (r.decided_by.as_deref().unwrap_or("")) }
                            td { (at.as_deref().map(short).unwrap_or_default()) }
                            td { (render::clean(r.reason.as_deref().unwrap_or(""))) }
                        }
                    }
                }
            }
        }
    };
    layout("Approvals", viewer, body).into_response()
}

#[derive(Deserialize)]
pub(crate) struct AnswerForm {
    csrf: String,
    #[serde(default)]
    always: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

pub(crate) async fn answer(
    Ext(state): Ext<Arc<State>>,
    Extension(viewer): Extension<Viewer>,
    Path((id, verb)): Path<(String, String)>,
    headers: HeaderMap,
    Form(f): Form<AnswerForm>,
) -> Response {
    let session = match authorize(&viewer, &headers, &f.csrf) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let approve = match verb.as_str() {
        "approve" => true,
        "deny" => false,
        _ => return error_page(StatusCode::NOT_FOUND, "Approve or deny, nothing else."),
    };
    let always = approve && f.always.is_some_and(|a| a == "1");
    let reason = f
        .reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty() && !approve);
    let by = format!("web:{}", session.name);
    if let Some(pg) = fleet(&state) {
        let status = if approve {
            crate::store::ApprovalStatus::Approved
        } else {
            crate::store::ApprovalStatus::Denied
        };
        let done = match pg
            .decide_approval(&id, status, always, reason.as_deref(), &by)
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(match pg.approval(&id).await {
                Ok(Some(r)) => PageError::new(
                    StatusCode::CONFLICT,
                    AnswerError::NotWaiting {
                        id: id.clone(),
                        status: r.status.as_str().replace('_', " "),
                        by: r.decided_by.unwrap_or_else(|| "someone".into()),
                    }
                    .to_string(),
                ),
                Ok(None) => PageError::new(
                    StatusCode::NOT_FOUND,
                    AnswerError::NoRequest(id.clone()).to_string(),
                ),
                Err(e) => pg_error(e),
            }),
            Err(e) => Err(pg_error(e)),
        };
        return match done {
            Ok(()) => Redirect::to("/approvals").into_response(),
            Err(e) => e.into_response(),
        };
    }
    let done = with_db(&state, move |db| {
        record_answer(db, &id, approve, always, reason.as_deref(), &by).map_err(|e| match e {
            AnswerError::Db(e) => db_error(e),
            AnswerError::NoRequest(_) => PageError::new(StatusCode::NOT_FOUND, e.to_string()),
            AnswerError::NotWaiting { .. } => PageError::new(StatusCode::CONFLICT, e.to_string()),
        })
    })
    .await;
    match done {
        Ok(_) => Redirect::to("/approvals").into_response(),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn goals(
    Ext(state): Ext<Arc<State>>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    let dir = state.cfg.goals_dir.clone();
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
        @if rows.is_empty() { p.empty { "No goal files." } }
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

pub(crate) async fn style() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("static/style.css"),
    )
        .into_response()
}

pub(crate) async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("static/live.js"),
    )
        .into_response()
}

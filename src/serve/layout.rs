//! What every page shares: the layout (navigation, who is signed in), error pages, the
//! store a page loads from (the local one off the async threads, or the fleet's), the small
//! formatters (times, status badges, URL components), and the embedded style sheet and
//! script.

use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, html};

use super::State;
use crate::store::db::{Db, DbError, parse_stamp};
use crate::store::history::HistoryError;

/// Who is looking: a signed-in person, or nobody (loopback without a token).
#[derive(Clone, Debug)]
pub(crate) struct Viewer(pub(crate) Option<super::Session>);

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

pub(super) fn db_error(e: DbError) -> PageError {
    match e {
        DbError::NoRun(_) => PageError::new(StatusCode::NOT_FOUND, e.to_string()),
        e => PageError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

pub(super) fn history_error(e: HistoryError) -> PageError {
    let status = if e.is_no_run() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    PageError::new(status, e.to_string())
}

/// Run `f` on the store, off the async threads.
pub(super) async fn with_db<T: Send + 'static>(
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

pub(super) fn short(t: &str) -> String {
    parse_stamp(t)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| t.to_string())
}

pub(super) fn status_badge(status: &str) -> Markup {
    html! { span class={ "badge " (status) } { (status) } }
}

pub(super) fn urlencode(s: &str) -> String {
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

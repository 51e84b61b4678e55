//! The approval pages: requests waiting (what each asks; approve, approve always, deny with
//! a reason) and those answered, and the answer itself, recorded in the local store or the
//! fleet's.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State as Ext};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;
use serde_json::Value;

use super::State;
use super::auth::{Authorized, Csrf};
use super::layout::{PageError, Viewer, error_page, history_error, layout, short, status_badge};
use super::render;
use crate::approval::answer::describe;
use crate::store::history::{AnswerError, History, HistoryError};

pub(crate) async fn approvals(
    Ext(state): Ext<Arc<State>>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    let loaded = load_approvals(&state.history).await.map_err(history_error);
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

async fn load_approvals(h: &History) -> Result<Approvals, HistoryError> {
    let mut waiting = Vec::new();
    for p in h.pending_approvals().await? {
        let workspace = h.run(&p.run_id).await.ok().map(|(r, _)| r.workspace);
        let w = what(&p, workspace);
        waiting.push((p, w));
    }
    let answered = h.answered_approvals(50).await?;
    Ok((waiting, answered))
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

impl Csrf for AnswerForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

pub(crate) async fn answer(
    Ext(state): Ext<Arc<State>>,
    Path((id, verb)): Path<(String, String)>,
    Authorized { session, form: f }: Authorized<AnswerForm>,
) -> Response {
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
    let done = state
        .history
        .answer(&id, approve, always, reason.as_deref(), &by)
        .await
        .map_err(|e| match e {
            AnswerError::Store(e) => history_error(e),
            AnswerError::NoRequest(_) => PageError::new(StatusCode::NOT_FOUND, e.to_string()),
            AnswerError::NotWaiting { .. } => PageError::new(StatusCode::CONFLICT, e.to_string()),
        });
    match done {
        Ok(_) => Redirect::to("/approvals").into_response(),
        Err(e) => e.into_response(),
    }
}

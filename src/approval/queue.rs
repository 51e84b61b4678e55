//! The unattended approver: a request is stored, and the run waits until `sup approve` /
//! `sup deny` answers it from any terminal, its deadline passes (a denial) or the run is
//! cancelled.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::{Approver, Decided, Judgement, Reply, Request};
use crate::store::db::{ApprovalRow, Db, parse_stamp, stamp};
use crate::store::{ApprovalKind, ApprovalStatus};
use crate::trace::{Event, Events};

const POLL: Duration = Duration::from_millis(200);

/// Where a run's requests go and how long they wait.
#[derive(Clone, Debug)]
pub struct QueueApprover {
    pub home: PathBuf,
    pub run_id: String,
    pub goal: String,
    pub timeout: Duration,
}

impl QueueApprover {
    /// Store a request and wait for its answer, its deadline or cancellation.
    async fn wait(
        &self,
        kind: ApprovalKind,
        id: &str,
        tool: &str,
        input: String,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Result<ApprovalRow, String> {
        let request = format!("a-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let deadline = crate::store::db::deadline_after(Utc::now(), self.timeout);
        let row = ApprovalRow {
            id: request.clone(),
            run_id: self.run_id.clone(),
            goal: self.goal.clone(),
            kind,
            tool: tool.to_string(),
            input: input.clone(),
            created_at: stamp(Utc::now()),
            deadline: stamp(deadline),
            status: ApprovalStatus::Pending,
            always: false,
            reason: None,
            decided_by: None,
        };
        let db = Db::open(&self.home).map_err(|e| e.to_string())?;
        db.request_approval(&row).map_err(|e| e.to_string())?;
        events.emit(Event::ApprovalRequested {
            id: id.to_string(),
            request: request.clone(),
            tool: tool.to_string(),
            input,
            deadline: row.deadline.clone(),
        });
        loop {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = cancel.cancelled() => {
                    let _ = db.decide_approval(&request, ApprovalStatus::Cancelled, false, None, "the run was cancelled");
                    return Err("the run was cancelled while the request waited".into());
                }
            }
            let Some(now) = db.approval(&request).map_err(|e| e.to_string())? else {
                return Err(format!(
                    "approval request {request} vanished from the store"
                ));
            };
            if now.status != ApprovalStatus::Pending {
                return Ok(now);
            }
            if parse_stamp(&now.deadline).is_some_and(|d| d <= Utc::now()) {
                let _ = db.decide_approval(
                    &request,
                    ApprovalStatus::TimedOut,
                    false,
                    None,
                    "the deadline",
                );
                if let Ok(Some(row)) = db.approval(&request) {
                    return Ok(row);
                }
            }
        }
    }
}

#[async_trait]
impl Approver for QueueApprover {
    async fn approve(
        &self,
        req: &Request<'_>,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Reply {
        let row = match self
            .wait(
                ApprovalKind::Tool,
                req.id,
                req.tool,
                req.input.to_string(),
                events,
                cancel,
            )
            .await
        {
            Ok(row) => row,
            Err(e) => {
                return Reply::No {
                    by: "the queue".into(),
                    reason: Some(e.clone()),
                    why: e,
                    decided: Decided::Denied,
                };
            }
        };
        let by = row.decided_by.clone().unwrap_or_else(|| "a person".into());
        match row.status {
            ApprovalStatus::Approved => Reply::Yes {
                by: format!("{by} (request {})", row.id),
                always: row.always,
            },
            ApprovalStatus::TimedOut => {
                let why = format!(
                    "nobody answered approval request {} within {}",
                    row.id,
                    humantime::format_duration(self.timeout)
                );
                Reply::No {
                    by: "the deadline".into(),
                    reason: Some(why.clone()),
                    why,
                    decided: Decided::TimedOut,
                }
            }
            _ => Reply::No {
                by: format!("{by} (request {})", row.id),
                why: match &row.reason {
                    Some(r) => format!("{by} denied request {}: {r}", row.id),
                    None => format!("{by} denied request {}", row.id),
                },
                reason: row.reason,
                decided: Decided::Denied,
            },
        }
    }

    async fn judge(
        &self,
        question: &str,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Judgement {
        match self
            .wait(
                ApprovalKind::Check,
                "human",
                "human",
                question.to_string(),
                events,
                cancel,
            )
            .await
        {
            Ok(row) if row.status == ApprovalStatus::Approved => Judgement::Accepted,
            Ok(row) if row.status == ApprovalStatus::TimedOut => Judgement::Rejected(format!(
                "nobody answered the check within {}",
                humantime::format_duration(self.timeout)
            )),
            Ok(row) => {
                Judgement::Rejected(row.reason.unwrap_or_else(|| {
                    format!("rejected by {}", row.decided_by.unwrap_or_default())
                }))
            }
            Err(e) => Judgement::Rejected(e),
        }
    }
}

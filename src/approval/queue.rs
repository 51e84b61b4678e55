//! The unattended approver: a request is stored, and the run waits until `sup approve` /
//! `sup deny` answers it from any terminal, its deadline passes (a denial) or the run is
//! cancelled. A fleet's run also puts its request in the shared store and learns of the
//! answer there through `LISTEN`/`NOTIFY` on a connection of its own; it looks again only
//! slowly, in case a notification was lost with its connection.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::{Approver, Decided, Judgement, Reply, Request};
use crate::store::db::{Answer, ApprovalRow, Db, parse_stamp, stamp};
use crate::store::pg::PgStore;
use crate::store::{ApprovalKind, ApprovalStatus};
use crate::trace::{Event, Events};

const POLL: Duration = Duration::from_millis(200);
/// A fleet's run looks for its answer this often while it listens…
const LISTENING_POLL: Duration = Duration::from_secs(30);
/// …and this often while its listening connection is down.
const DEAF_POLL: Duration = Duration::from_secs(2);

/// Where a run's requests go and how long they wait.
#[derive(Clone, Debug)]
pub(crate) struct QueueApprover {
    pub(crate) home: PathBuf,
    pub(crate) run_id: String,
    pub(crate) goal: String,
    pub(crate) timeout: Duration,
    /// A fleet's run: the shared store and the run's id there.
    pub(crate) shared: Option<(PgStore, String)>,
}

/// Notifications of answers to one request, on a connection of its own; `None` from `recv`
/// when the connection is gone.
struct Listening {
    _client: tokio_postgres::Client,
    rx: tokio::sync::mpsc::UnboundedReceiver<()>,
    pump: tokio::task::JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

async fn listen(store: &PgStore, request: &str) -> Option<Listening> {
    use futures::StreamExt;
    let (client, mut conn) = match store.listener().await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("approval {request}: cannot listen: {e}");
            return None;
        }
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let id = request.to_string();
    let pump = tokio::spawn(async move {
        let mut stream = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = stream.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m
                && n.payload() == id
                && tx.send(()).is_err()
            {
                return;
            }
        }
    });
    match client.batch_execute("LISTEN sup_approval").await {
        Ok(()) => Some(Listening {
            _client: client,
            rx,
            pump,
        }),
        Err(e) => {
            tracing::debug!("approval {request}: cannot listen: {e}");
            pump.abort();
            None
        }
    }
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
        if let Some((store, fleet_run)) = &self.shared {
            return self.wait_shared(store, fleet_run, db, &row, cancel).await;
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = cancel.cancelled() => {
                    let _ = db.decide_approval(&request, Answer::CANCELLED);
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
                let _ = db.decide_approval(&request, Answer::TIMED_OUT);
                if let Ok(Some(row)) = db.approval(&request) {
                    return Ok(row);
                }
            }
        }
    }
}

impl QueueApprover {
    /// Wait in a fleet: the request goes to the shared store too; an answer there (from any
    /// machine, woken by `NOTIFY`) or here ends the wait, and is recorded here. The deadline
    /// and cancellation end it in both stores.
    async fn wait_shared(
        &self,
        store: &PgStore,
        fleet_run: &str,
        db: Db,
        row: &ApprovalRow,
        cancel: &CancellationToken,
    ) -> Result<ApprovalRow, String> {
        let request = row.id.as_str();
        // Listen first, then put the request: no answer can come between the two unheard.
        let mut ears = listen(store, request).await;
        if let Err(e) = store.request_approval(row, fleet_run).await {
            tracing::warn!(
                "approval {request}: not in the shared store yet ({e}); the daemon puts it there"
            );
        }
        let deadline = parse_stamp(&row.deadline).unwrap_or_else(Utc::now);
        loop {
            // An answer in the shared store, recorded here; or one given here.
            // Only an answer to this very request: an old request of another run that drew
            // the same id (the shared store keeps every request) answers nothing here.
            if let Ok(Some(a)) = store.approval(request).await
                && a.run_id == row.run_id
                && a.created_at == row.created_at
                && (a.status == ApprovalStatus::Approved || a.status == ApprovalStatus::Denied)
            {
                db.decide_approval(request, Answer::of(&a))
                    .map_err(|e| e.to_string())?;
            }
            let Some(now) = db.approval(request).map_err(|e| e.to_string())? else {
                return Err(format!(
                    "approval request {request} vanished from the store"
                ));
            };
            if now.status != ApprovalStatus::Pending {
                let _ = store.close_approval(request, now.status).await;
                return Ok(now);
            }
            if deadline <= Utc::now() {
                let _ = db.decide_approval(request, Answer::TIMED_OUT);
                continue;
            }
            if ears.is_none() {
                ears = listen(store, request).await;
            }
            let poll = if ears.is_some() {
                LISTENING_POLL
            } else {
                DEAF_POLL
            };
            let until_deadline = (deadline - Utc::now()).to_std().unwrap_or(Duration::ZERO);
            let heard = async {
                match ears.as_mut() {
                    Some(l) => l.rx.recv().await.is_some(),
                    None => std::future::pending().await,
                }
            };
            let lost = tokio::select! {
                h = heard => !h,
                _ = tokio::time::sleep(poll.min(until_deadline)) => false,
                _ = cancel.cancelled() => {
                    let _ = db.decide_approval(request, Answer::CANCELLED);
                    let _ = store.close_approval(request, ApprovalStatus::Cancelled).await;
                    return Err("the run was cancelled while the request waited".into());
                }
            };
            if lost {
                tracing::debug!("approval {request}: the listening connection is gone");
                ears = None;
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

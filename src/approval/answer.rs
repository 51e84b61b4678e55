//! Answering a queued approval request from outside the run (`sup approve`, `sup deny`, the
//! web console), and the description of a call a person is asked about (the exact command,
//! or the diff of a file write).

use crate::store::ApprovalStatus;
use crate::store::db::{Db, DbError};

pub(crate) use super::terminal::{describe, target};

#[derive(Debug, thiserror::Error)]
pub(crate) enum AnswerError {
    #[error("approval request {id} is no longer waiting: it was {status} by {by}")]
    NotWaiting {
        id: String,
        status: String,
        by: String,
    },
    #[error("no approval request `{0}`; `sup approvals` lists the waiting ones")]
    NoRequest(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Approve or deny a waiting request as `by`; returns the status recorded.
pub(crate) fn answer(
    db: &Db,
    id: &str,
    approve: bool,
    always: bool,
    reason: Option<&str>,
    by: &str,
) -> Result<&'static str, AnswerError> {
    let status = if approve {
        ApprovalStatus::Approved
    } else {
        ApprovalStatus::Denied
    };
    if db.decide_approval(id, status, always, reason, by)? {
        return Ok(status.as_str());
    }
    Err(match db.approval(id)? {
        Some(r) => AnswerError::NotWaiting {
            id: id.to_string(),
            status: r.status.as_str().replace('_', " "),
            by: r.decided_by.unwrap_or_else(|| "someone".into()),
        },
        None => AnswerError::NoRequest(id.to_string()),
    })
}

/// The operating-system user of this process, from its uid: `$USER` is whatever anyone set it
/// to.
pub(crate) fn os_user() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name)
}

//! Who answers a queued approval request from outside the run (`sup approve`, `sup deny`, the
//! web console; the answer itself is `store::history::History::answer`), and the description
//! of a call a person is asked about (the exact command, or the diff of a file write).

pub(crate) use super::terminal::{describe, target};

/// The operating-system user of this process, from its uid: `$USER` is whatever anyone set it
/// to.
pub(crate) fn os_user() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name)
}

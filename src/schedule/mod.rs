//! The schedule loop: cron occurrences in a time zone, claims in the store so each runs at
//! most once, overlap and catch-up policies, reloads, watched workspaces, and the daemon that
//! fires goals through the verify loop.

pub mod clock;
pub mod cron;
pub mod daemon;
pub mod fleet;
mod fleet_run;
pub mod goals;
pub mod overview;
pub(crate) mod policy;
pub(crate) mod watch;

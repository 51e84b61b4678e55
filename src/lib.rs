//! `sup` supervises LLM agent loops in three nested layers: `work` (model ⇄ tools),
//! `verify` (checks and retries) and `schedule` (the daemon). `model` and `tools` sit under
//! the work loop; `store` and `trace` serve every layer, `rules`, `redact` and `startup` sit
//! beneath them all; `cli` is the edge.

pub mod approval;
pub mod cli;
pub mod config;
pub(crate) mod duration;
mod globs;
pub mod model;
pub mod notify;
pub mod redact;
mod rules;
pub mod run;
pub mod schedule;
pub mod serve;
mod startup;
pub mod store;
pub mod template;
#[cfg(test)]
mod testing;
pub mod tools;
pub mod trace;
pub mod verify;
mod words;
pub mod work;

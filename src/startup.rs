//! The environment `sup` was started with, secrets included. `tools::sandbox::at_start`
//! takes every secret-named variable out of the process's own environment (so nothing `sup`
//! starts inherits it; `cli::main` takes `SUP_STORE` out once parsed) and keeps the whole
//! environment here: providers, notifications and the console read their keys here; the
//! agent's processes never get this environment whole.

use std::ffi::OsString;
use std::sync::OnceLock;

static ENV: OnceLock<Vec<(OsString, OsString)>> = OnceLock::new();

/// Keep `env` as the environment `sup` started with (once; later calls change nothing).
pub(crate) fn keep(env: Vec<(OsString, OsString)>) {
    let _ = ENV.set(env);
}

/// Whether the start-up environment was kept (it is not when `sup` is used as a library).
pub(crate) fn kept() -> bool {
    ENV.get().is_some()
}

/// A variable of the environment `sup` started with (secrets included), or of the current
/// one when it was not kept (library use).
pub(crate) fn var(name: &str) -> Option<String> {
    match ENV.get() {
        Some(env) => env
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.to_str().map(str::to_string)),
        None => std::env::var(name).ok(),
    }
}

/// The environment `sup` started with, secrets included: for what the user runs (notify
/// commands, a console's `sup trigger`), never for the agent's processes.
pub(crate) fn original_env() -> Vec<(OsString, OsString)> {
    match ENV.get() {
        Some(env) => env.clone(),
        None => std::env::vars_os().collect(),
    }
}

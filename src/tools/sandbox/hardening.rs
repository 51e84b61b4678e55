//! The start-up hardening of `sup` itself (non-dumpable, child subreaper, secret variables
//! moved out of its environment, a secret hidden in its command line) and the scrubbed
//! environment its jailed processes get.

use std::ffi::OsString;
use std::sync::OnceLock;

/// Whether a variable is withheld from the agent's processes: its name contains KEY, SECRET,
/// TOKEN, PASSWORD, PASSWD, CREDENTIAL or AUTH, in any case (cargo's `CARGO_PKG_*` aside).
pub(crate) fn is_secret_name(name: &str) -> bool {
    // Cargo's own description of a package (`CARGO_PKG_AUTHORS`) under `cargo run`.
    if name.starts_with("CARGO_PKG_") {
        return false;
    }
    let upper = name.to_ascii_uppercase();
    [
        "KEY",
        "SECRET",
        "TOKEN",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "AUTH",
    ]
    .iter()
    .any(|w| upper.contains(w))
}

/// What hardening failed at start-up, for the first trace line.
pub(super) static PROBLEMS: OnceLock<Vec<String>> = OnceLock::new();

/// Harden `sup` right after start-up, before any thread or child exists: make it
/// non-dumpable (so processes of the same user cannot read its memory or
/// `/proc/PID/environ`), make it the subreaper of what it starts (orphans come back to it, so
/// they can be found and ended), and move every secret-named variable from its environment
/// into memory. Failures are kept for the trace; none stops a run.
pub fn at_start() {
    super::pidns::init_if_asked();
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    let mut problems = Vec::new();
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        problems.push(format!(
            "sup could not make itself non-dumpable ({}): processes of your user can read its \
             environment",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        problems.push(format!(
            "sup could not become a child subreaper ({}): processes that leave their session \
             may outlive their run",
            std::io::Error::last_os_error()
        ));
    }
    for (name, _) in &env {
        if name.to_str().is_some_and(is_secret_name) {
            // SAFETY: called from `main` before the runtime or any other thread starts.
            unsafe { std::env::remove_var(name) };
        }
    }
    let _ = PROBLEMS.set(problems);
    crate::startup::keep(env);
}

/// Overwrite `text` with `with` (as long) wherever it is in this process's command line,
/// which every process of the machine can read (`/proc/PID/cmdline`), the agent's commands
/// too. Call it once the command line is parsed: `std::env::args` reads the same memory.
pub fn hide_in_cmdline(text: &[u8], with: &[u8]) {
    if text.is_empty() || text.len() != with.len() {
        return;
    }
    // arg_start and arg_end, fields 48 and 49 of /proc/self/stat.
    let Some((start, end)) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let close = stat.rfind(')')?;
            let mut fields = stat.get(close + 2..)?.split(' ').skip(45);
            let start: usize = fields.next()?.parse().ok()?;
            let end: usize = fields.next()?.parse().ok()?;
            (start != 0 && end > start).then_some((start, end))
        })
    else {
        return;
    };
    // SAFETY: [arg_start, arg_end) holds this process's argument strings, on its initial
    // stack: mapped and writable for the life of the process; the command line was parsed
    // into owned values, and nothing else reads it while this runs.
    let area = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    let mut i = 0;
    while i + text.len() <= area.len() {
        if area[i..i + text.len()] == *text {
            area[i..i + text.len()].copy_from_slice(with);
            i += text.len();
        } else {
            i += 1;
        }
    }
}

/// The environment for the agent's processes: sup's own without secret-named variables,
/// plus those passed by name; and the names withheld.
pub(crate) fn scrubbed_env(pass: &[String]) -> (Vec<(OsString, OsString)>, Vec<String>) {
    let mut env = Vec::new();
    let mut withheld = Vec::new();
    for (k, v) in crate::startup::original_env() {
        let name = k.to_string_lossy();
        // `SUP_STORE` may carry a password, and with it the agent could answer its own
        // approvals in a shared store.
        let secret = is_secret_name(&name) || name == "SUP_STORE";
        if secret && !pass.iter().any(|p| *p == name) {
            withheld.push(name.into_owned());
        } else {
            // A value passed by name stays out of everything sup writes or shows the model.
            if pass.iter().any(|p| *p == name) {
                crate::redact::add(&v.to_string_lossy());
            }
            env.push((k, v));
        }
    }
    withheld.sort();
    (env, withheld)
}

/// `safe.bareRepository=explicit` for every git the agent's processes run, after any
/// `GIT_CONFIG_COUNT` settings of `env`: a folder the agent filled with `HEAD`, `config`,
/// `objects/` and `refs/` is not taken for a repository (whose `core.fsmonitor` or hooks an
/// allowed `git -C folder status` would run) unless a command names it with `--git-dir`.
pub(super) fn git_explicit_bare(env: &[(OsString, OsString)]) -> [(String, String); 3] {
    let n: usize = env
        .iter()
        .find(|(k, _)| k == "GIT_CONFIG_COUNT")
        .and_then(|(_, v)| v.to_str()?.parse().ok())
        .unwrap_or(0);
    [
        (format!("GIT_CONFIG_KEY_{n}"), "safe.bareRepository".into()),
        (format!("GIT_CONFIG_VALUE_{n}"), "explicit".into()),
        ("GIT_CONFIG_COUNT".into(), (n + 1).to_string()),
    ]
}

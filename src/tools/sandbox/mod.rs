//! The sandbox of every process started for the agent (`run_command`, command tools, MCP
//! servers, checks): its settings (`SandboxSettings`, the goal keys), the per-run `Jail` that
//! applies them to a command before exec (Landlock rules, read-only bind mounts over `.git`,
//! goal, check and config files inside writable folders, a private `TMPDIR`, an environment
//! without secrets), the proxy of a network allowlist, the start-up hardening of `sup` itself (non-dumpable, child subreaper,
//! secret variables moved out of its environment) and the sweep that ends the processes a run
//! left behind.

mod hardening;
mod hidden;
mod jail;
mod limits;
mod mounts;
mod pidns;
mod policy;
mod proxy;
mod reaper;
mod seccomp;

pub(crate) use hardening::is_secret_name;
pub use hardening::{at_start, hide_in_cmdline};
pub use jail::{Armed, Jail};
pub(crate) use pidns::ns_of;
pub use policy::{HostPattern, Network, Policy, Sandbox};
pub(crate) use policy::{SandboxSettings, check_env_pass, goal_path, network, parse_size};
pub(crate) use reaper::{
    Held, parent_of, run_alive, run_of, spawn_held, spawning, sweep_dead_runs,
};

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "the sandbox is required (sandbox_required / --sandbox-required) but {0}; run where \
         the kernel has these Landlock features, or drop the requirement"
    )]
    Required(String),
    #[error("cannot set up the sandbox: {0}")]
    Setup(String),
}

//! Process lifetime: the run's lock (liveness is an `flock`), the record of its process
//! groups, the sweep that ends what a run left behind, the sweep at start-up of what dead
//! runs left, and the registry of running children the sweep leaves alone.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use super::SandboxError;

pub(super) const LOCK: &str = "lock";
/// The inits of the jails alive in this process: children of sup, never swept as orphans
/// (what lives below them is the jail's, swept by membership).
pub(super) static INITS: Mutex<Vec<i32>> = Mutex::new(Vec::new());
/// The file of a run folder that names its jail (device and inode of its PID namespace),
/// for the sweep after a `sup` that was killed.
pub(super) const JAIL: &str = "jail";
pub(super) const GROUPS: &str = "process-groups";

pub(super) fn lock(run_dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, SandboxError> {
    // Locked under a private name, then renamed: whoever finds `lock` finds it held, never
    // in the moment between its creation and its locking.
    let path = run_dir.join(LOCK);
    let tmp = run_dir.join(format!("{LOCK}.{}.tmp", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&tmp)
        .map_err(|e| SandboxError::Setup(format!("cannot create {}: {e}", tmp.display())))?;
    let held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| SandboxError::Setup(format!("cannot lock {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, &path)
        .map_err(|e| SandboxError::Setup(format!("cannot create {}: {e}", path.display())))?;
    Ok(held)
}

/// Whether the run in `run_dir` is alive: `Some(true)` while its lock is held, `Some(false)`
/// when nobody holds it, `None` when it has no lock file (older runs).
pub(crate) fn run_alive(run_dir: &Path) -> Option<bool> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(run_dir.join(LOCK))
        .ok()?;
    Some(nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err())
}

/// The start time of a process (clock ticks since boot), to tell it from a later process
/// with the same pid.
pub(super) fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.rfind(')')?;
    stat.get(close + 2..)?.split(' ').nth(19)?.parse().ok()
}

/// At start-up: end what runs under `home` that are over (killed with `kill -9`, crashed)
/// left running — every process that started with their `SUP_RUN_ID`, and their recorded
/// process groups whose leader has the recorded start time (a reused pid is never hit).
pub(crate) fn sweep_dead_runs(home: &Path) -> usize {
    let runs = home.join("runs");
    let dead =
        |id: &str| !id.is_empty() && !id.contains('/') && run_alive(&runs.join(id)) == Some(false);
    let mut killed = 0;
    // A run that ended normally removed its lock: only killed or crashed runs are left to
    // look for, and without one the machine's processes are not read at all.
    let any_dead = std::fs::read_dir(&runs)
        .is_ok_and(|d| d.flatten().any(|e| dead(&e.file_name().to_string_lossy())));
    if !any_dead {
        return 0;
    }
    let procs = processes();
    // The jails of dead runs whose namespace is still there (a jail's init ends with its
    // sup, so this is rare): every member.
    let jails: Vec<(u64, u64)> = std::fs::read_dir(&runs)
        .map(|d| {
            d.flatten()
                .filter(|e| dead(&e.file_name().to_string_lossy()))
                .filter_map(|e| {
                    let t = std::fs::read_to_string(e.path().join(JAIL)).ok()?;
                    let mut f = t.split_whitespace().map(str::parse::<u64>);
                    let (dev, ino, init, start) = (
                        f.next()?.ok()?,
                        f.next()?.ok()?,
                        f.next()?.ok()?,
                        f.next()?.ok()?,
                    );
                    // Only while that very namespace is there: its init still runs. Its
                    // inode alone names another run's jail once it is gone and reused.
                    let init = i32::try_from(init).ok()?;
                    (start_time(init) == Some(start)
                        && super::pidns::ns_of(init) == Some((dev, ino)))
                    .then_some((dev, ino))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut doomed: Vec<i32> = procs
        .iter()
        .filter(|(pid, _)| {
            run_of(*pid).is_some_and(|r| dead(&r))
                || super::pidns::ns_of(*pid).is_some_and(|n| jails.contains(&n))
        })
        .map(|(pid, _)| *pid)
        .collect();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, ppid) in &procs {
        children.entry(*ppid).or_default().push(*pid);
    }
    if let Ok(dir) = std::fs::read_dir(&runs) {
        for entry in dir.flatten() {
            let record = entry.path().join(GROUPS);
            let id = entry.file_name().to_string_lossy().into_owned();
            if !record.exists() || !dead(&id) {
                continue;
            }
            for line in std::fs::read_to_string(&record).unwrap_or_default().lines() {
                let mut it = line.split(' ');
                let (Some(Ok(pid)), Some(Ok(start))) = (
                    it.next().map(str::parse::<i32>),
                    it.next().map(str::parse::<u64>),
                ) else {
                    continue;
                };
                if start_time(pid) == Some(start) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    doomed.push(pid);
                }
            }
            let _ = std::fs::remove_file(&record);
        }
    }
    let mut i = 0;
    while i < doomed.len() {
        if let Some(c) = children.get(&doomed[i]) {
            doomed.extend(c.iter().copied());
        }
        i += 1;
    }
    for pid in doomed {
        if nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// Process group leaders that tools and checks run right now (pids). The sweep leaves them
/// and what hangs below them alone.
static LEADERS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Held (for reading) while a child of `sup` is spawned and registered, and (for writing)
/// while a sweep runs: no sweep ever sees a child between its fork and its exec (when it is
/// still a copy of `sup`) or before it is known as a leader. Std's spawn returns only once
/// the child has called exec.
static SPAWN: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Hold while spawning a child and registering it (`hold`, the MCP server groups).
pub(crate) fn spawning() -> std::sync::RwLockReadGuard<'static, ()> {
    SPAWN.read().unwrap_or_else(|e| e.into_inner())
}

/// Spawn `cmd`, held (see `Held`) before any sweep can see it.
pub(crate) fn spawn_held(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<(tokio::process::Child, Option<Held>)> {
    let _spawning = spawning();
    let child = cmd.spawn()?;
    let held = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Held::new);
    Ok((child, held))
}

/// A running child the sweep must leave alone, until dropped.
pub(crate) struct Held(i32);

impl Held {
    pub(crate) fn new(pid: i32) -> Held {
        if let Ok(mut l) = LEADERS.lock() {
            l.push(pid);
        }
        Held(pid)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(mut l) = LEADERS.lock() {
            l.retain(|p| *p != self.0);
        }
    }
}

/// `(pid, ppid)` of every process.
fn processes() -> Vec<(i32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        Some((pid, parent_of(pid)?))
    })
    .collect()
}

/// Whether this process has no child at all, running or exited (`waitid` says `ECHILD`).
fn no_children() -> bool {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    waitid(Id::All, flags) == Err(nix::errno::Errno::ECHILD)
}

/// The parent of process `pid`, from `/proc/PID/stat`.
pub(crate) fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.rfind(')')?;
    stat.get(close + 2..)?.split(' ').nth(1)?.parse().ok()
}

/// The value of `var` in the environment a process started with, if it can be read.
fn env_of(pid: i32, var: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{var}=");
    env.split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The `SUP_RUN_ID` a process started with, if it can be read.
pub(crate) fn run_of(pid: i32) -> Option<String> {
    env_of(pid, "SUP_RUN_ID")
}

/// See `Jail::sweep`: `jail` is the sweeping run's PID namespace (device, inode) and its
/// init. Returns how many processes were killed.
pub(crate) fn sweep(jail: Option<((u64, u64), i32)>) -> usize {
    let me = std::process::id() as i32;
    // Only the `sup` binary, which made itself a subreaper at start-up, owns every child it
    // has; a program using the library (a test harness) has children of its own, so there
    // only the members of the run's jail are the run's.
    let subreaper = crate::startup::kept();
    let _no_spawn = SPAWN.write().unwrap_or_else(|e| e.into_inner());
    let inits: HashSet<i32> = INITS
        .lock()
        .map(|l| l.iter().copied().collect())
        .unwrap_or_default();
    let mut killed = 0;
    // Outside any jail only sup's own children are swept: with none at all (no tool or
    // server runs, no orphan came back), the machine's processes need not be read.
    if jail.is_none() && (!subreaper || no_children()) {
        return 0;
    }
    for _ in 0..50 {
        let procs = processes();
        let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
        for (pid, ppid) in &procs {
            children.entry(*ppid).or_default().push(*pid);
        }
        let below = |from: Vec<i32>| -> Vec<i32> {
            let mut all = from;
            let mut i = 0;
            while i < all.len() {
                if let Some(c) = children.get(&all[i]) {
                    all.extend(c.iter().copied());
                }
                i += 1;
            }
            all
        };
        // Running tool processes and MCP servers, with all they started and still hold (a
        // run ends its MCP servers before it sweeps for its checks).
        let leaders: Vec<i32> = LEADERS.lock().map(|l| l.clone()).unwrap_or_default();
        let held: HashSet<i32> = below(leaders).into_iter().collect();
        let roots: Vec<i32> = procs
            .iter()
            .filter(|(pid, ppid)| {
                if held.contains(pid) || inits.contains(pid) {
                    return false;
                }
                // A member of the jail, whoever its parent is; or, outside any jail, an
                // orphan that the subreaper brought back to sup.
                jail.is_some_and(|(ns, _)| super::pidns::ns_of(*pid) == Some(ns))
                    || (subreaper && *ppid == me)
            })
            .map(|(pid, _)| *pid)
            .collect();
        if roots.is_empty() {
            break;
        }
        for pid in below(roots.clone()) {
            if held.contains(&pid) || inits.contains(&pid) {
                continue;
            }
            if nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
            {
                killed += 1;
            }
        }
        for pid in roots {
            reap(pid);
        }
    }
    killed
}

/// Wait for a killed child of ours to end (briefly; a process stuck in the kernel is left).
fn reap(pid: i32) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    for _ in 0..200 {
        match waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => std::thread::sleep(std::time::Duration::from_millis(1)),
            _ => return,
        }
    }
}

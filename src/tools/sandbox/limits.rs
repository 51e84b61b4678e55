//! The limits of a run's jail, `max_processes` and `max_memory`: a cgroup of the run where
//! sup can make one (cgroup v2 with the `pids` and `memory` controllers, else the v1
//! `pids` and `memory` hierarchies; as root, or in a delegated slice), which every jailed
//! process enters before exec; else `RLIMIT_NPROC` (counted in the command's user
//! namespace) and `RLIMIT_AS` per process. The run's jail init is moved into the cgroup, so
//! the cgroup of a live run is never empty: an empty `sup-*` cgroup is a dead run's, removed
//! at the next start. Also whether the cgroup's memory limit was hit or its OOM killer
//! ended a process, so a result can say a command was killed for memory.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Processes at most by default.
pub(super) const DEFAULT_PROCESSES: u64 = 1024;

/// Half the machine's memory, or 4 GB where it cannot be read.
pub(super) fn default_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024 / 2)
        })
        .unwrap_or(4 << 30)
}

fn shown(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{}G", bytes >> 30)
    } else if bytes >= 1 << 30 {
        format!("{:.1}G", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{}M", bytes >> 20)
    }
}

/// The cgroup folders of a run, one per hierarchy, and the files counting its memory events.
#[derive(Debug)]
struct Cgroup {
    dirs: Vec<PathBuf>,
    /// How a child joins each.
    joins: Vec<Join>,
    /// `memory.events` (v2) or `memory.oom_control` (v1): its `oom_kill` line.
    oom_kills: PathBuf,
    /// Times the limit was reached: the `oom` line of `memory.events` (v2), or
    /// `memory.failcnt` (v1). Counted before the OOM killer sends its SIGKILL, while
    /// `oom_kill` is counted after it: a killed command can be seen dead before that one.
    hits: PathBuf,
    v2: bool,
    /// The thread that spawns the run's commands inside the cgroups (v1).
    spawner: Option<Spawner>,
}

/// A cgroup a child joins: the `cgroup.procs` it writes `0` (itself) into, unless its line
/// in `/proc/self/cgroup` (`needle`) shows it is in the cgroup already.
#[derive(Clone, Debug)]
struct Join {
    procs: CString,
    needle: Vec<u8>,
}

impl Join {
    fn new(dir: &Path, needle: String) -> Result<Join, String> {
        Ok(Join {
            procs: CString::new(dir.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .map_err(|e| e.to_string())?,
            needle: needle.into_bytes(),
        })
    }
}

/// `dir` inside the cgroup `at` of a hierarchy, as `/proc/self/cgroup` names it.
fn inside(at: &str, name: &str) -> String {
    format!("{}/{name}", at.trim_end_matches('/'))
}

/// What a spawner thread is asked: spawn this command (inside the runtime, when given), and
/// send it back with its child.
type Job = (
    tokio::process::Command,
    Option<tokio::runtime::Handle>,
    std::sync::mpsc::SyncSender<(tokio::process::Command, Spawned)>,
);

type Spawned = std::io::Result<(tokio::process::Child, Option<super::reaper::Held>)>;

/// A thread of sup's in the run's v1 cgroups (a v1 cgroup holds threads) that spawns the
/// run's commands: a child starts in the cgroups of the thread that forked it, and so need
/// not move into them. A move waits for an RCU grace period, many milliseconds, per command.
#[derive(Debug)]
struct Spawner {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Write the calling thread's id into `tasks` of each of `dirs`.
fn move_thread(dirs: &[PathBuf]) -> std::io::Result<()> {
    // SAFETY: gettid cannot fail.
    let tid = unsafe { libc::gettid() }.to_string();
    for d in dirs {
        write(&d.join("tasks"), &tid)?;
    }
    Ok(())
}

impl Spawner {
    /// A thread in `dirs`; it goes back to their parents when dropped.
    fn new(dirs: &[PathBuf]) -> std::io::Result<Spawner> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let (ready, started) = std::sync::mpsc::sync_channel(1);
        let inside = dirs.to_vec();
        let thread = std::thread::Builder::new()
            .name("sup-jail-spawner".into())
            .spawn(move || {
                let entered = move_thread(&inside);
                let ok = entered.is_ok();
                let _ = ready.send(entered);
                if !ok {
                    return;
                }
                for (mut cmd, runtime, reply) in queue {
                    let _in_runtime = runtime.as_ref().map(|r| r.enter());
                    let spawned = super::reaper::spawn_held(&mut cmd);
                    let _ = reply.send((cmd, spawned));
                }
                let parents: Vec<PathBuf> = inside
                    .iter()
                    .filter_map(|d| d.parent().map(Path::to_path_buf))
                    .collect();
                let _ = move_thread(&parents);
            })?;
        match started.recv() {
            Ok(Ok(())) => Ok(Spawner {
                jobs: Some(jobs),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    fn spawn(&self, cmd: &mut tokio::process::Command) -> Spawned {
        let runtime = tokio::runtime::Handle::try_current().ok();
        let owned = std::mem::replace(cmd, tokio::process::Command::new(""));
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let Some(jobs) = &self.jobs else {
            *cmd = owned;
            return super::reaper::spawn_held(cmd);
        };
        if let Err(std::sync::mpsc::SendError((owned, _, _))) = jobs.send((owned, runtime, reply)) {
            *cmd = owned;
            return super::reaper::spawn_held(cmd);
        }
        match answer.recv() {
            Ok((back, spawned)) => {
                *cmd = back;
                spawned
            }
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Memory events of the cgroup seen so far: OOM kills, and times the limit was hit.
#[derive(Debug, Default)]
struct Seen {
    kills: u64,
    hits: u64,
}

#[derive(Debug)]
pub(super) struct Limits {
    pub(super) processes: u64,
    pub(super) memory: u64,
    cgroup: Option<Cgroup>,
    /// Why there is no cgroup, for the trace.
    why: String,
    seen: Mutex<Seen>,
}

/// How old an empty cgroup `sup-*` of another SUP_HOME must be to be removed: a live run's
/// holds its jail init from its first moment on, so an empty one is a dead run's, or one
/// being set up right now.
const LEFT_OVER: std::time::Duration = std::time::Duration::from_secs(600);

/// Remove the empty cgroups `sup-RUN_ID` in `parent` that dead runs left (a `sup` killed, or
/// that exited without dropping its jail): those of this SUP_HOME's runs that are over (under
/// `runs`), and those of no run here made long enough ago. The kernel refuses (EBUSY) to
/// remove one a process is in.
fn clean(parent: &Path, runs: &Path) {
    let Ok(dir) = std::fs::read_dir(parent) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_prefix("sup-") else {
            continue;
        };
        if id.is_empty() || id.contains('/') {
            continue;
        }
        let run = runs.join(id);
        let dead = if run.exists() {
            super::reaper::run_alive(&run) == Some(false)
        } else {
            e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > LEFT_OVER)
        };
        if dead && empty(&e.path()) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// Whether no process is in the cgroup `dir` and it has no child cgroup.
fn empty(dir: &Path) -> bool {
    let no_procs =
        std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty());
    let no_children = std::fs::read_dir(dir)
        .map(|d| !d.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir())))
        .unwrap_or(false);
    no_procs && no_children
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value)
}

/// A cgroup v2 child of sup's own where `pids` and `memory` can be enabled.
fn v2(run_id: &str, runs: &Path, processes: u64, memory: u64) -> Result<Cgroup, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        })
        .ok_or("sup is in no cgroup v2")?;
    let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|r| r.join("cgroup.controllers").exists())
        .ok_or("no cgroup v2 is mounted")?;
    let parent = root.join(own.trim_start_matches('/'));
    let has = std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
    if !has.split_whitespace().any(|c| c == "pids")
        || !has.split_whitespace().any(|c| c == "memory")
    {
        return Err(format!(
            "cgroup v2 at {} has no pids and memory controllers",
            parent.display()
        ));
    }
    clean(&parent, runs);
    let dir = parent.join(format!("sup-{run_id}"));
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let set = || -> std::io::Result<()> {
        write(&dir.join("pids.max"), &processes.to_string())?;
        write(&dir.join("memory.max"), &memory.to_string())?;
        let _ = write(&dir.join("memory.swap.max"), "0");
        Ok(())
    };
    if let Err(e) = set() {
        let _ = std::fs::remove_dir(&dir);
        return Err(format!("cannot set the limits of {}: {e}", dir.display()));
    }
    let joins = vec![Join::new(
        &dir,
        format!("0::{}\n", inside(&own, &format!("sup-{run_id}"))),
    )?];
    Ok(Cgroup {
        joins,
        oom_kills: dir.join("memory.events"),
        hits: dir.join("memory.events"),
        dirs: vec![dir],
        v2: true,
        spawner: None,
    })
}

/// The cgroup v1 `pids` and `memory` hierarchies, below sup's own cgroup in each.
fn v1(run_id: &str, runs: &Path, processes: u64, memory: u64) -> Result<Cgroup, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut dirs = Vec::new();
    let mut joins = Vec::new();
    for (controller, file, value) in [
        ("pids", "pids.max", processes),
        ("memory", "memory.limit_in_bytes", memory),
    ] {
        let base = PathBuf::from("/sys/fs/cgroup").join(controller);
        let (names, at) = own
            .lines()
            .find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, names, path) = (f.next()?, f.next()?, f.next()?);
                names
                    .split(',')
                    .any(|n| n == controller)
                    .then(|| (names.to_string(), path.to_string()))
            })
            .ok_or_else(|| format!("no cgroup v1 {controller} hierarchy"))?;
        let parent = base.join(at.trim_start_matches('/'));
        clean(&parent, runs);
        let dir = parent.join(format!("sup-{run_id}"));
        let made = std::fs::create_dir(&dir)
            .map_err(|e| (e, false))
            .and_then(|()| write(&dir.join(file), &value.to_string()).map_err(|e| (e, true)));
        if let Err((e, created)) = made {
            // Only what this run made: a folder that was there already is another's.
            if created {
                let _ = std::fs::remove_dir(&dir);
            }
            for d in &dirs {
                let _ = std::fs::remove_dir(d);
            }
            return Err(format!("cannot make the cgroup {}: {e}", dir.display()));
        }
        let needle = format!(":{names}:{}\n", inside(&at, &format!("sup-{run_id}")));
        let join = Join::new(&dir, needle);
        dirs.push(dir);
        match join {
            Ok(j) => joins.push(j),
            Err(e) => {
                for d in &dirs {
                    let _ = std::fs::remove_dir(d);
                }
                return Err(e);
            }
        }
    }
    let memory = dirs.get(1).cloned().unwrap_or_default();
    Ok(Cgroup {
        oom_kills: memory.join("memory.oom_control"),
        hits: memory.join("memory.failcnt"),
        spawner: Spawner::new(&dirs).ok(),
        joins,
        dirs,
        v2: false,
    })
}

impl Limits {
    pub(super) fn new(
        run_id: &str,
        runs: &Path,
        processes: Option<u64>,
        memory: Option<u64>,
    ) -> Limits {
        let processes = processes.unwrap_or(DEFAULT_PROCESSES);
        let memory = memory.unwrap_or_else(default_memory);
        let (cgroup, why) = match v2(run_id, runs, processes, memory) {
            Ok(c) => (Some(c), String::new()),
            Err(e2) => match v1(run_id, runs, processes, memory) {
                Ok(c) => (Some(c), String::new()),
                Err(e1) => (None, format!("{e2}; {e1}")),
            },
        };
        Limits {
            processes,
            memory,
            cgroup,
            why,
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Move the run's jail init into the cgroup, so that it is not empty while the run lives
    /// (an empty one is a dead run's, see `clean`). Best effort: without it, the cgroup is
    /// still removed when the run ends.
    pub(super) fn hold(&self, init: i32) {
        let Some(c) = &self.cgroup else { return };
        for d in &c.dirs {
            let _ = write(&d.join("cgroup.procs"), &init.to_string());
        }
    }

    /// For the first trace line; it names the mechanism: `cgroup v2`, `cgroup v1` or `rlimit`.
    pub(super) fn describe(&self) -> String {
        match &self.cgroup {
            Some(c) => format!(
                "limits: {} processes, {} of memory for the whole run (cgroup {}, {})",
                self.processes,
                shown(self.memory),
                if c.v2 { "v2" } else { "v1" },
                c.dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => format!(
                "limits: {} processes, {} of memory per process (rlimit: RLIMIT_NPROC in each \
                 command's user namespace and RLIMIT_AS, not per run: {})",
                self.processes,
                shown(self.memory),
                self.why
            ),
        }
    }

    /// Spawn a jailed command: from inside the cgroups where a thread of sup's is in them.
    pub(super) fn spawn(&self, cmd: &mut tokio::process::Command) -> Spawned {
        match self.cgroup.as_ref().and_then(|c| c.spawner.as_ref()) {
            Some(s) => s.spawn(cmd),
            None => super::reaper::spawn_held(cmd),
        }
    }

    /// What a child needs to enter the limits.
    pub(super) fn entry(&self) -> Entry {
        match &self.cgroup {
            Some(c) => Entry {
                joins: c.joins.clone(),
                rlimits: None,
            },
            None => Entry {
                joins: Vec::new(),
                rlimits: Some((self.processes, self.memory)),
            },
        }
    }

    /// Whether a command just failed for memory: since the last time asked, the cgroup's OOM
    /// killer ended a process, or the command was killed (`killed`, by SIGKILL) while the
    /// run's memory reached its limit; with rlimits, its stderr says an allocation failed.
    pub(super) fn memory_note(&self, stderr: &str, killed: bool) -> Option<String> {
        let limit = shown(self.memory);
        if let Some(c) = &self.cgroup {
            let count = |path: &Path, key: &str| -> u64 {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                if key.is_empty() {
                    return text.trim().parse().unwrap_or(0);
                }
                text.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(0)
            };
            let kills = count(&c.oom_kills, "oom_kill ");
            let hits = count(&c.hits, if c.v2 { "oom " } else { "" });
            let mut seen = self.seen.lock().ok()?;
            let new_kill = kills > seen.kills;
            let new_hit = hits > seen.hits;
            *seen = Seen { kills, hits };
            return (new_kill || (killed && new_hit)).then(|| {
                format!(
                    "[sandbox] killed for memory: the run's processes reached max_memory = \
                     {limit}"
                )
            });
        }
        let failed = [
            "MemoryError",
            "Cannot allocate memory",
            "out of memory",
            "bad_alloc",
            "memory allocation of",
        ];
        failed.iter().any(|f| stderr.contains(f)).then(|| {
            format!(
                "[sandbox] killed for memory: an allocation failed at max_memory = {limit} per \
                 process (RLIMIT_AS)"
            )
        })
    }
}

impl Drop for Limits {
    /// End what is left in the cgroup and remove it.
    fn drop(&mut self) {
        let Some(c) = &mut self.cgroup else { return };
        // Its thread out of the cgroups first; sup itself is never killed here.
        c.spawner = None;
        let me = std::process::id() as i32;
        for d in &c.dirs {
            for _ in 0..100 {
                let pids = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                if pids.trim().is_empty() {
                    break;
                }
                let pids: Vec<i32> = pids
                    .lines()
                    .filter_map(|p| p.trim().parse::<i32>().ok())
                    .filter(|p| *p != me)
                    .collect();
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The cgroup files a child joins, or the rlimits it sets.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    joins: Vec<Join>,
    rlimits: Option<(u64, u64)>,
}

impl Entry {
    /// In the child before exec (before Landlock): enter the cgroups it is not in yet (a
    /// child of the spawner thread is in them), or set the rlimits. Only system calls.
    pub(super) fn enter(&self) -> std::io::Result<()> {
        let mut buf = [0u8; 4096];
        let mut len = 0;
        if !self.joins.is_empty() {
            // SAFETY: open, read and close on a NUL-terminated path and a local buffer.
            unsafe {
                let fd = libc::open(
                    c"/proc/self/cgroup".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                if fd >= 0 {
                    while len < buf.len() {
                        let n = libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len);
                        if n <= 0 {
                            break;
                        }
                        len += n as usize;
                    }
                    libc::close(fd);
                }
            }
        }
        let mine = &buf[..len];
        for j in &self.joins {
            if !j.needle.is_empty() && mine.windows(j.needle.len()).any(|w| w == j.needle) {
                continue;
            }
            let p = &j.procs;
            // SAFETY: open, write and close on a NUL-terminated path and a local buffer.
            unsafe {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if n < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        if let Some((processes, memory)) = self.rlimits {
            for (resource, value) in [(libc::RLIMIT_NPROC, processes), (libc::RLIMIT_AS, memory)] {
                let lim = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                // SAFETY: setrlimit with a local struct.
                if unsafe { libc::setrlimit(resource, &lim) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

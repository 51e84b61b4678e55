//! The limits of a run's jail, `max_processes` and `max_memory`: a cgroup of the run where
//! sup can make one (cgroup v2 with the `pids` and `memory` controllers, else the v1
//! `pids` and `memory` hierarchies; as root, or in a delegated slice), which every jailed
//! process enters before exec; else `RLIMIT_NPROC` (counted in the command's user
//! namespace) and `RLIMIT_AS` per process. Also how many processes the cgroup's OOM killer
//! ended, so a result can say a command was killed for memory.

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

/// The cgroup folders of a run, one per hierarchy, and the file counting its OOM kills.
#[derive(Debug)]
struct Cgroup {
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each, written by the child with `0` (itself).
    procs: Vec<CString>,
    events: Option<PathBuf>,
    v2: bool,
}

#[derive(Debug)]
pub(super) struct Limits {
    pub(super) processes: u64,
    pub(super) memory: u64,
    cgroup: Option<Cgroup>,
    /// Why there is no cgroup, for the trace.
    why: String,
    /// OOM kills seen so far.
    seen: Mutex<u64>,
}

/// Remove the empty cgroups `sup-RUN_ID` in `parent` of runs under `runs` that are over (a
/// `sup` that exited without dropping its jail, or was killed, leaves them).
fn clean(parent: &Path, runs: &Path) {
    let Ok(dir) = std::fs::read_dir(parent) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_prefix("sup-") else {
            continue;
        };
        if !id.is_empty()
            && !id.contains('/')
            && super::reaper::run_alive(&runs.join(id)) == Some(false)
        {
            // Refused (EBUSY) while a process is in it.
            let _ = std::fs::remove_dir(e.path());
        }
    }
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
    Ok(Cgroup {
        procs: vec![
            CString::new(dir.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .map_err(|e| e.to_string())?,
        ],
        events: Some(dir.join("memory.events")),
        dirs: vec![dir],
        v2: true,
    })
}

/// The cgroup v1 `pids` and `memory` hierarchies, below sup's own cgroup in each.
fn v1(run_id: &str, runs: &Path, processes: u64, memory: u64) -> Result<Cgroup, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut dirs = Vec::new();
    for (controller, file, value) in [
        ("pids", "pids.max", processes),
        ("memory", "memory.limit_in_bytes", memory),
    ] {
        let base = PathBuf::from("/sys/fs/cgroup").join(controller);
        let at = own
            .lines()
            .find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, names, path) = (f.next()?, f.next()?, f.next()?);
                names
                    .split(',')
                    .any(|n| n == controller)
                    .then(|| path.to_string())
            })
            .ok_or_else(|| format!("no cgroup v1 {controller} hierarchy"))?;
        let parent = base.join(at.trim_start_matches('/'));
        clean(&parent, runs);
        let dir = parent.join(format!("sup-{run_id}"));
        let made =
            std::fs::create_dir(&dir).and_then(|()| write(&dir.join(file), &value.to_string()));
        if let Err(e) = made {
            let _ = std::fs::remove_dir(&dir);
            for d in &dirs {
                let _ = std::fs::remove_dir(d);
            }
            return Err(format!("cannot make the cgroup {}: {e}", dir.display()));
        }
        dirs.push(dir);
    }
    let procs = dirs
        .iter()
        .map(|d| CString::new(d.join("cgroup.procs").as_os_str().as_encoded_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    Ok(Cgroup {
        events: dirs.get(1).map(|d| d.join("memory.oom_control")),
        procs,
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
            seen: Mutex::new(0),
        }
    }

    /// For the first trace line.
    pub(super) fn describe(&self) -> String {
        match &self.cgroup {
            Some(c) => format!(
                "limits: {} processes, {} of memory for the whole run (cgroup {}, {})",
                self.processes,
                shown(self.memory),
                if c.v2 { "v2" } else { "v1" },
                c.dirs
                    .first()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default()
            ),
            None => format!(
                "limits: {} processes (RLIMIT_NPROC in each command's user namespace), {} of \
                 memory per process (RLIMIT_AS), not per run: {}",
                self.processes,
                shown(self.memory),
                self.why
            ),
        }
    }

    /// What a child needs to enter the limits.
    pub(super) fn entry(&self) -> Entry {
        match &self.cgroup {
            Some(c) => Entry {
                procs: c.procs.clone(),
                rlimits: None,
            },
            None => Entry {
                procs: Vec::new(),
                rlimits: Some((self.processes, self.memory)),
            },
        }
    }

    /// Whether a command just failed for memory: the cgroup's OOM killer ended a process
    /// since the last time asked, or (with rlimits) its stderr says an allocation failed.
    pub(super) fn memory_note(&self, stderr: &str) -> Option<String> {
        let limit = shown(self.memory);
        if let Some(events) = self.cgroup.as_ref().and_then(|c| c.events.as_ref()) {
            let kills: u64 = std::fs::read_to_string(events)
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("oom_kill "))
                        .and_then(|n| n.trim().parse().ok())
                })
                .unwrap_or(0);
            let mut seen = self.seen.lock().ok()?;
            if kills > *seen {
                *seen = kills;
                return Some(format!(
                    "[sandbox] killed for memory: the run's processes reached max_memory = {limit}"
                ));
            }
            return None;
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
        let Some(c) = &self.cgroup else { return };
        for d in &c.dirs {
            for _ in 0..100 {
                let pids = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                if pids.trim().is_empty() {
                    break;
                }
                for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
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
    procs: Vec<CString>,
    rlimits: Option<(u64, u64)>,
}

impl Entry {
    /// In the child before exec (before Landlock): enter the cgroup, or set the rlimits.
    /// Only system calls.
    pub(super) fn enter(&self) -> std::io::Result<()> {
        for p in &self.procs {
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

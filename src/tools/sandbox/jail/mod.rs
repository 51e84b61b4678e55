//! The jail of a run: what its processes are started with (policy, Landlock ruleset, the
//! read-only mounts, the scrubbed environment, a private `TMPDIR`), applied to each command
//! before exec by `Jail::apply`; its PID namespace, renewed before a try's checks (which get
//! one of their own) and again for the next try (`Jail::renew`); its first-trace-line
//! description and the explanations of a refusal given to the model.

mod explain;
mod namespace;

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::SandboxError;
use super::hardening::{PROBLEMS, git_explicit_bare, scrubbed_env};
use super::hidden::lenient_canonical;
use super::limits::Limits;
use super::mounts::{
    Bind, Hide, Mode, allow_own_pts, drop_capabilities, hide_behind_read_only_mounts, mount_flags,
};
use super::pidns::PidNs;
use super::policy::{Network, Policy, Sandbox};
use super::proxy::Proxy;
use super::reaper::{GROUPS, Held, INITS, JAIL, LOCK, lock, spawning, start_time, sweep};
use super::seccomp::Filter;
use landlock::{
    ABI, Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};

/// The Landlock ABI of this kernel; 0 without Landlock.
pub(crate) fn landlock_abi() -> i32 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attribute only queries the version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// Device files ordinary tools write.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// Everything a run's processes are started with: which policy, the scrubbed environment,
/// the private temp folder; applied to each command by `Jail::apply`.
#[derive(Debug)]
pub struct Jail {
    policy: Policy,
    network: Network,
    /// The proxy that is the only way out of a jail with a network allowlist.
    proxy: Option<Proxy>,
    pub(crate) keep_background: bool,
    abi: i32,
    writable: Vec<PathBuf>,
    binds: Vec<Bind>,
    /// Read-only paths inside writable folders, for the model's explanations.
    read_only: Vec<PathBuf>,
    env: Vec<(OsString, OsString)>,
    withheld: Vec<String>,
    /// Protections this run lacks, in words.
    missing: Vec<String>,
    tmp: PathBuf,
    run_id: String,
    /// The run's PID namespace: every jailed process lives in it. Ended before a try's
    /// checks, which get a fresh one of their own, and made anew for the next try
    /// (`Jail::renew`).
    ns: Mutex<Option<PidNs>>,
    /// Where commands start; relative paths in their messages are relative to it.
    workspace: PathBuf,
    /// The run folder, where the lock and the process-group record live.
    run_dir: PathBuf,
    /// Held while the run lives: a run whose lock nobody holds is over.
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
    /// The record of the run's process groups, open for appending.
    groups: Option<Mutex<std::fs::File>>,
    /// Files and folders the file tools must refuse to write (goal file, user config, the
    /// daemon's goals folder, SUP_HOME), canonical.
    pub(crate) protected: Vec<PathBuf>,
    /// Folders bound onto themselves so they cannot be moved (they hold read-only paths).
    pinned: Vec<PathBuf>,
    /// The daemon's goals folder, when a daemon started the run.
    goals: Option<PathBuf>,
    /// Whether commands get a terminal folder of their own (a new `devpts` instance on
    /// `/dev/pts`), so the terminals of the person (the approval prompt's among them) are not
    /// there to open.
    own_pts: bool,
    /// The seccomp filter of every jailed process.
    seccomp: Option<Filter>,
    /// Paths mounted over with empty ones, and the empty file bound over hidden files.
    hides: Vec<Hide>,
    hidden: Vec<PathBuf>,
    empty: CString,
    /// `max_processes` and `max_memory`.
    limits: Option<Limits>,
}

/// What a command needs kept open until it has been spawned.
pub struct Armed {
    _ruleset: Option<OwnedFd>,
    /// The namespaces the command enters: copies of the jail's.
    _ns: Option<NsFiles>,
}

/// Copies of a jail's namespace files: PID, and the user, mount and network namespaces
/// where the run has them.
type NsFiles = (OwnedFd, Option<OwnedFd>, Option<OwnedFd>, Option<OwnedFd>);

impl Jail {
    /// No sandbox, but the scrubbed environment (library use and tests).
    pub fn unconfined() -> Jail {
        let (env, withheld) = scrubbed_env(&[]);
        Jail::bare(env, withheld)
    }

    /// A jail of `env` and nothing else: no policy, no run, nothing set up yet.
    fn bare(env: Vec<(OsString, OsString)>, withheld: Vec<String>) -> Jail {
        Jail {
            policy: Policy::Off,
            network: Network::On,
            proxy: None,
            keep_background: false,
            abi: 0,
            writable: Vec::new(),
            binds: Vec::new(),
            read_only: Vec::new(),
            env,
            withheld,
            missing: Vec::new(),
            tmp: std::env::temp_dir(),
            run_id: String::new(),
            ns: Mutex::new(None),
            workspace: PathBuf::new(),
            run_dir: PathBuf::new(),
            _lock: None,
            groups: None,
            protected: Vec::new(),
            pinned: Vec::new(),
            goals: None,
            own_pts: false,
            seccomp: None,
            hides: Vec::new(),
            hidden: Vec::new(),
            empty: CString::default(),
            limits: None,
        }
    }

    /// Set up the jail of a run. Besides `s.protect` (goal file, user config), SUP_HOME
    /// and the check scripts are never writable.
    pub fn new(
        s: &Sandbox,
        workspace: &Path,
        run_dir: &Path,
        run_id: &str,
        home: &Path,
        checks: &[PathBuf],
    ) -> Result<Jail, SandboxError> {
        let tmp = run_dir.join("tmp");
        std::fs::create_dir_all(&tmp)
            .map_err(|e| SandboxError::Setup(format!("cannot create {}: {e}", tmp.display())))?;
        let tmp = std::fs::canonicalize(&tmp).unwrap_or(tmp);
        let (env, withheld) = scrubbed_env(&s.env_pass);
        let env = crate::tools::git_env::pin(env, workspace);
        let policy = s.policy.unwrap_or_default();
        let held = lock(run_dir)?;
        let mut jail = Jail::bare(env, withheld);
        jail.policy = policy;
        jail.network = s.network.clone().unwrap_or_default();
        jail.keep_background = s.keep_background;
        jail.abi = landlock_abi();
        jail.missing = PROBLEMS.get().cloned().unwrap_or_default();
        jail.tmp = tmp.clone();
        jail.run_id = run_id.to_string();
        jail.workspace = workspace.to_path_buf();
        jail.run_dir = run_dir.to_path_buf();
        jail._lock = Some(held);
        jail.groups = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(run_dir.join(GROUPS))
            .ok()
            .map(Mutex::new);
        // The file tools write only beneath the workspace: a goals folder or SUP_HOME (whose
        // runs hold the frozen checks) that holds the workspace, rather than is or lies in
        // it, is out of their reach already.
        jail.protected = s
            .protect
            .iter()
            .map(|p| lenient_canonical(p))
            .chain(
                s.goals
                    .iter()
                    .chain(std::iter::once(&home.to_path_buf()))
                    .map(|g| lenient_canonical(g))
                    .filter(|g| !workspace.starts_with(g) || workspace == g.as_path()),
            )
            .collect();
        jail.goals = s.goals.as_deref().map(lenient_canonical);
        if policy == Policy::Off {
            jail.missing
                .push("sandbox off: commands can write and connect wherever you can".into());
            return jail.finish(s.required);
        }
        if jail.abi == 0 {
            jail.missing.push(
                "this kernel has no Landlock: commands are not confined to the workspace".into(),
            );
            jail.policy = Policy::Off;
            return jail.finish(s.required);
        }
        if policy == Policy::WorkspaceWrite {
            jail.writable.push(workspace.to_path_buf());
            jail.writable.extend(s.writable.iter().cloned());
        }
        jail.writable.push(tmp);
        let git = workspace.join(".git");
        let mut keep_out: Vec<PathBuf> = checks.to_vec();
        keep_out.push(home.to_path_buf());
        if !s.writable.contains(&git) {
            keep_out.push(git);
        }
        keep_out.extend(s.goals.iter().cloned());
        // A file sup reads later (the user config) that does not exist yet inside a writable
        // folder is created empty, so it can be kept read-only like one that exists.
        for p in &s.protect {
            if !p.exists() && jail.is_writable(&lenient_canonical(p)) {
                let made = p
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| {
                        std::fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .open(p)
                            .map(drop)
                    });
                if let Err(e) = made {
                    jail.missing.push(format!(
                        "{} does not exist and could not be created empty ({e}): commands \
                         could create it",
                        p.display()
                    ));
                }
            }
            keep_out.push(p.clone());
        }
        jail.protect(keep_out);
        jail.hide(s, home);
        jail.limits = Some(Limits::new(
            run_id,
            run_dir.parent().unwrap_or(run_dir),
            s.max_processes,
            s.max_memory,
        ));
        let allow = match &jail.network {
            Network::Allow(list) => Some(list.clone()),
            _ => None,
        };
        match jail.fresh_namespace(allow.is_some()) {
            Ok(mut ns) => {
                if let Some(list) = allow {
                    jail.start_proxy(ns.listener.take(), list);
                }
                jail.hold(&ns);
                jail.ns = Mutex::new(Some(ns));
            }
            Err(e) => {
                jail.missing.push(format!(
                    "no PID namespace for the run ({e}): its processes are known by their \
                     parent only, a double fork escapes the sweep, and the checks get no jail of \
                     their own"
                ));
                if allow.is_some() {
                    jail.missing.push(
                        "the network allowlist needs a network namespace of its own: the \
                         network is off"
                            .into(),
                    );
                    jail.network = Network::Off;
                }
            }
        }
        jail.own_pts = true;
        if Filter::supported() {
            jail.seccomp = Some(Filter::new(s.unix_sockets));
        } else {
            jail.missing.push(
                "this kernel has no seccomp filters: unix sockets, io_uring and ptrace are not \
                 denied"
                    .into(),
            );
        }
        if jail.abi < 3 {
            jail.missing
                .push("truncating files is not confined (needs Landlock ABI 3)".into());
        }
        if jail.network == Network::Off && jail.abi < 4 {
            jail.missing
                .push("network = false is not enforced (needs Landlock ABI 4)".into());
        }
        if jail.abi < 6 {
            jail.missing.push(
                "signals and abstract unix sockets are not scoped (needs Landlock ABI 6)".into(),
            );
        }
        if let Err(e) = jail.probe() {
            let mut exposed: Vec<String> = jail
                .read_only
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            exposed.push("your terminals (/dev/pts)".into());
            jail.missing.push(format!(
                "{} stay writable by commands (no mount namespace: {e})",
                exposed.join(", ")
            ));
            exposed.extend(
                jail.hidden
                    .iter()
                    .map(|p| format!("{} (not hidden)", p.display())),
            );
            jail.own_pts = false;
            if let Some(ns) = jail.ns.get_mut().unwrap_or_else(|e| e.into_inner()) {
                ns.mnt_ns = None;
            }
            jail.hides.clear();
            jail.hidden.clear();
            jail.binds.clear();
            jail.read_only.clear();
            jail.pinned.clear();
            if let Err(e) = jail.probe() {
                jail.missing.push(format!(
                    "Landlock could not be applied ({e}): commands are not confined"
                ));
                jail.policy = Policy::Off;
            }
        }
        jail.finish(s.required)
    }

    /// Mount over SUP_HOME (but for the run's own folder and the workspace), `/etc/sup`,
    /// the credential stores and `hidden` with empty ones, apart from `readable`.
    fn hide(&mut self, s: &Sandbox, home: &Path) {
        match super::hidden::plan(s, home, &self.writable, &self.run_dir, &self.workspace) {
            Ok((hides, hidden, empty)) => {
                self.hides = hides;
                self.hidden = hidden;
                self.empty = empty;
            }
            Err(e) => self.missing.push(e),
        }
    }

    fn is_writable(&self, p: &Path) -> bool {
        self.writable.iter().any(|w| p.starts_with(w))
    }

    /// Keep `paths` (those inside a writable folder) out of reach of commands. Each is
    /// bind-mounted read-only onto itself. A writable folder inside one of them (the temp
    /// folder inside SUP_HOME, a workspace inside the daemon's goals folder) is bound writable
    /// again on top, and a path to protect inside that one read-only again. Every writable
    /// folder between the outermost writable folder and a read-only mount is bound onto
    /// itself too: a mount point cannot be renamed or removed (EBUSY), so no rename of a
    /// parent carries the read-only mount away and puts another file in its place.
    fn protect(&mut self, paths: Vec<PathBuf>) {
        let mut ro: Vec<PathBuf> = paths
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .filter(|p| self.is_writable(p))
            .collect();
        ro.sort();
        ro.dedup();
        let reopen: Vec<PathBuf> = self
            .writable
            .iter()
            .filter(|w| !ro.contains(w) && ro.iter().any(|r| w.starts_with(r)))
            .cloned()
            .collect();
        // Whether `p` is writable through the mounts: as the deepest of them at or above it
        // says; `None` where none is.
        let writable = |p: &Path| -> Option<bool> {
            ro.iter()
                .map(|r| (r, false))
                .chain(reopen.iter().map(|w| (w, true)))
                .filter(|(m, _)| p.starts_with(m))
                .max_by_key(|(m, _)| m.components().count())
                .map(|(_, w)| w)
        };
        let mut binds: Vec<(PathBuf, Mode)> = Vec::new();
        for r in &ro {
            if r.parent().and_then(writable) != Some(false) {
                binds.push((r.clone(), Mode::ReadOnly));
            }
        }
        for w in &reopen {
            if w.parent().and_then(writable) == Some(false) {
                binds.push((w.clone(), Mode::Writable));
            }
        }
        let mut pins: Vec<PathBuf> = Vec::new();
        for (r, _) in binds.iter().filter(|(_, m)| *m == Mode::ReadOnly) {
            let Some(root) = self
                .writable
                .iter()
                .filter(|w| r.starts_with(w))
                .min_by_key(|w| w.components().count())
            else {
                continue;
            };
            for a in r.ancestors().skip(1) {
                if a == root || !a.starts_with(root) {
                    break;
                }
                if writable(a) != Some(false)
                    && !reopen.iter().any(|w| w == a)
                    && !pins.iter().any(|x| x == a)
                {
                    pins.push(a.to_path_buf());
                }
            }
        }
        binds.extend(pins.into_iter().map(|p| (p, Mode::Pin)));
        // Outer mounts first, so that inner ones lie on top of them.
        binds.sort_by_key(|(p, _)| p.components().count());
        for (p, mode) in binds {
            if self.bind(&p, mode) {
                match mode {
                    Mode::ReadOnly => self.read_only.push(p),
                    Mode::Pin => self.pinned.push(p),
                    Mode::Writable => {}
                }
            }
        }
    }

    fn bind(&mut self, p: &Path, mode: Mode) -> bool {
        let flags = nix::sys::statvfs::statvfs(p)
            .map(|v| mount_flags(v.flags()))
            .unwrap_or(0);
        let Ok(path) = CString::new(p.as_os_str().as_bytes()) else {
            return false;
        };
        self.binds.push(Bind { path, flags, mode });
        true
    }

    fn finish(self, required: bool) -> Result<Jail, SandboxError> {
        if required && !self.missing.is_empty() {
            return Err(SandboxError::Required(self.missing.join("; ")));
        }
        Ok(self)
    }

    /// Start `true` in the jail once, so a kernel that refuses part of it is known before
    /// any real command runs.
    fn probe(&self) -> std::io::Result<()> {
        let mut cmd = std::process::Command::new("true");
        // Marked as this run's, so a concurrent run's sweep leaves it alone.
        cmd.env("SUP_RUN_ID", &self.run_id)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let _armed = self.arm(&mut cmd, self.policy)?;
        let (mut child, _held) = {
            let _spawning = spawning();
            let child = cmd.spawn()?;
            let held = Held::new(child.id() as i32);
            (child, held)
        };
        let status = child.wait()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "the probe ended with {status}"
            )))
        }
    }

    /// One line for the start of the trace: the policy, what is missing, what was withheld.
    pub fn describe(&self) -> String {
        let mut s = format!("sandbox: {}", self.policy.name());
        if self.policy != Policy::Off {
            match (&self.network, &self.proxy) {
                (Network::On, _) => s.push_str(", network on"),
                (Network::Off, _) => s.push_str(", network off"),
                (Network::Allow(_), Some(p)) => {
                    let hosts: Vec<String> = p.hosts().iter().map(ToString::to_string).collect();
                    s.push_str(&format!(
                        ", network: allowlist ({} host{}: {}) via proxy 127.0.0.1:{} in a \
                         network namespace of its own",
                        hosts.len(),
                        if hosts.len() == 1 { "" } else { "s" },
                        hosts.join(", "),
                        p.port()
                    ));
                }
                (Network::Allow(_), None) => s.push_str(", network: allowlist (no proxy)"),
            }
            s.push_str(&format!("; writable: {}", listed(&self.writable)));
            if !self.read_only.is_empty() {
                s.push_str(&format!("; read-only: {}", listed(&self.read_only)));
            }
        }
        if !self.hidden.is_empty() {
            s.push_str(&format!("; hidden: {}", listed(&self.hidden)));
        }
        if let Some(f) = &self.seccomp {
            s.push_str(&format!("; {}", f.describe()));
        }
        if let Some((id, _)) = self.current() {
            s.push_str(&format!(
                "; jail: PID namespace {} held by sup (ends with the run and with sup)",
                id.1
            ));
            s.push_str(if self.keep_background {
                "; keep_background = true: the agent's processes and MCP servers stay alive \
                 through the checks, which run in the agent's jail"
            } else {
                "; before each try's checks the jail ends with all in it, MCP servers \
                 included, and the checks run in a fresh one of their own; the next try \
                 gets another, with the MCP servers started again"
            });
        }
        if let Some(l) = &self.limits {
            s.push_str(&format!("; {}", l.describe()));
        }
        if let Some(g) = &self.goals {
            s.push_str(&format!(
                "; the daemon's goals folder {} is never writable by its runs",
                g.display()
            ));
        }
        if !self.missing.is_empty() {
            s.push_str(&format!(
                "; MISSING PROTECTION: {}",
                self.missing.join("; ")
            ));
        }
        if !self.withheld.is_empty() {
            s.push_str(&format!(
                "; withheld from tools: {}",
                self.withheld.join(", ")
            ));
        }
        s
    }

    /// Give `cmd` the scrubbed environment (then `extra`, then `TMPDIR`) and, unless the
    /// policy is off, the sandbox, applied in the child before exec.
    pub fn apply(
        &self,
        cmd: &mut tokio::process::Command,
        extra: &[(String, String)],
        policy: Option<Policy>,
    ) -> Result<Armed, SandboxError> {
        cmd.env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(extra.iter().map(|(k, v)| (k, v)))
            .envs(git_explicit_bare(&self.env))
            .env("TMPDIR", &self.tmp);
        // A direct child dies with `sup`, however `sup` ends. It leads a session of its own
        // (and so a process group, which its timeout kills): without a controlling terminal
        // it cannot open `/dev/tty`, to type an answer into the approval prompt (TIOCSTI) or
        // draw over it.
        // SAFETY: setsid and prctl with integer arguments only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        self.arm(cmd.as_std_mut(), policy.unwrap_or(self.policy))
            .map_err(|e| SandboxError::Setup(e.to_string()))
    }

    fn arm(&self, cmd: &mut std::process::Command, policy: Policy) -> std::io::Result<Armed> {
        if policy == Policy::Off || self.policy == Policy::Off {
            return Ok(Armed {
                _ruleset: None,
                _ns: None,
            });
        }
        let ruleset = self.ruleset().map_err(std::io::Error::other)?;
        let fd = ruleset.as_ref().map_or(-1, |f| f.as_raw_fd());
        let binds = self.binds.clone();
        let hides = self.hides.clone();
        let limits = self.limits.as_ref().map(Limits::entry);
        // Copies of the namespace's files, open until the spawn: a renewal meanwhile closes
        // the jail's own.
        let ns = {
            let held = self.ns.lock().unwrap_or_else(|e| e.into_inner());
            let copy = |f: &Option<OwnedFd>| f.as_ref().map(OwnedFd::try_clone).transpose();
            match held.as_ref() {
                Some(n) => Some((
                    n.pid_ns.try_clone()?,
                    copy(&n.user_ns)?,
                    copy(&n.mnt_ns)?,
                    copy(&n.net_ns)?,
                )),
                None => None,
            }
        };
        let raw = |f: &Option<OwnedFd>| f.as_ref().map_or(-1, |f| f.as_raw_fd());
        let (pid_ns, user_ns, mnt_ns, net_ns) =
            ns.as_ref().map_or((-1, -1, -1, -1), |(p, u, m, n)| {
                (p.as_raw_fd(), raw(u), raw(m), raw(n))
            });
        let empty = self.empty.clone();
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        // In the jail's user namespace already, an ordinary user needs no other.
        let maps = (uid != 0 && ns.is_none()).then(|| {
            (
                format!("{uid} {uid} 1").into_bytes(),
                format!("{gid} {gid} 1").into_bytes(),
            )
        });
        let own_pts = self.own_pts;
        let seccomp = self.seccomp.clone();
        let pts_access = AccessFs::from_file(ABI::from(self.abi.min(6))).bits();
        let closure = move || -> std::io::Result<()> {
            // Runs in the child between fork and exec: system calls only, no allocation.
            if let Some(l) = &limits {
                l.enter()?;
            }
            if pid_ns >= 0 {
                super::pidns::enter(pid_ns, user_ns, net_ns)?;
            }
            let own_proc = pid_ns >= 0;
            if mnt_ns >= 0 {
                super::pidns::enter_mounts(mnt_ns)?;
            } else if !binds.is_empty() || own_pts || !hides.is_empty() || own_proc {
                hide_behind_read_only_mounts(
                    &binds,
                    maps.as_ref(),
                    own_pts,
                    &hides,
                    &empty,
                    own_proc,
                )?;
            }
            if own_pts && fd >= 0 {
                // The new terminal folder and its ptmx are other inodes than the rules the
                // ruleset was made with: allow them by themselves.
                allow_own_pts(fd, pts_access)?;
            }
            drop_capabilities()?;
            // SAFETY: plain system calls on integers and an fd we own.
            unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if fd >= 0 && libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Last: the filter refuses the mounts and namespaces made above.
            if let Some(f) = &seccomp {
                f.install()?;
            }
            Ok(())
        };
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure only makes async-signal-safe system calls.
        unsafe { cmd.pre_exec(closure) };
        Ok(Armed {
            _ruleset: ruleset,
            _ns: ns,
        })
    }

    /// The Landlock ruleset: read everywhere, write in the writable folders and the device
    /// files, TCP only when the network is on, signals and abstract sockets scoped.
    fn ruleset(&self) -> Result<Option<OwnedFd>, landlock::RulesetError> {
        let abi = ABI::from(self.abi.min(6));
        let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi))?;
        if self.network == Network::Off && self.abi >= 4 {
            ruleset = ruleset.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?;
        }
        if self.abi >= 6 {
            ruleset = ruleset.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
        }
        let mut created = ruleset.create()?;
        if let Ok(root) = PathFd::new("/") {
            created = created.add_rule(PathBeneath::new(root, AccessFs::from_read(abi)))?;
        }
        for w in &self.writable {
            if let Ok(fd) = PathFd::new(w) {
                created = created.add_rule(PathBeneath::new(fd, AccessFs::from_all(abi)))?;
            }
        }
        for d in DEVICES {
            if let Ok(fd) = PathFd::new(d) {
                created = created.add_rule(PathBeneath::new(fd, AccessFs::from_file(abi)))?;
            }
        }
        Ok(created.into())
    }

    /// End every process this run left behind: every member of its jail (background jobs,
    /// `setsid`, `nohup` and double-fork escapes included, whoever their parent is) but the
    /// running tool processes and MCP servers, and, outside any jail, the orphans the
    /// subreaper brought back to `sup`, with all their descendants. Other runs' jails are
    /// not this one's, whatever their processes' environment says.
    pub(crate) fn sweep(&self) -> usize {
        sweep(self.current())
    }

    /// Spawn a command `apply` armed, held (see `spawn_held`): inside the run's cgroups from
    /// the start where a thread of sup's is in them.
    pub(crate) fn spawn(
        &self,
        cmd: &mut tokio::process::Command,
    ) -> std::io::Result<(tokio::process::Child, Option<Held>)> {
        match &self.limits {
            Some(l) => l.spawn(cmd),
            None => super::reaper::spawn_held(cmd),
        }
    }

    /// Note a process group this run started, with its start time, so that a later `sup`
    /// can end it should this one be killed.
    pub(crate) fn record(&self, pid: i32) {
        let Some(groups) = &self.groups else { return };
        let Some(start) = start_time(pid) else { return };
        use std::io::Write;
        if let Ok(mut f) = groups.lock() {
            // One write per line, so a reader never sees half of one.
            let _ = f.write_all(format!("{pid} {start}\n").as_bytes());
        }
    }
}

impl Drop for Jail {
    /// A run that ends normally leaves nothing to sweep after it.
    fn drop(&mut self) {
        if let (Some((_, init)), Ok(mut inits)) = (self.current(), INITS.lock()) {
            inits.retain(|i| *i != init);
        }
        if !self.run_dir.as_os_str().is_empty() {
            let _ = std::fs::remove_file(self.run_dir.join(GROUPS));
        }
        // Removed while still held: a run without a lock file is over and swept, so the
        // next start has nothing of it to look for among the machine's processes.
        if self._lock.is_some() {
            let _ = std::fs::remove_file(self.run_dir.join(LOCK));
        }
    }
}

/// Paths as the first trace line lists them.
fn listed(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

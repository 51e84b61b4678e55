//! The sandbox of every process started for the agent (`run_command`, command tools, MCP
//! servers, checks): its settings (`SandboxSettings`, the goal keys), the per-run `Jail` that
//! applies them to a command before exec (Landlock rules, read-only bind mounts over `.git`,
//! goal, check and config files inside writable folders, a private `TMPDIR`, an environment
//! without secrets), the start-up hardening of `sup` itself (non-dumpable, child subreaper,
//! secret variables moved out of its environment) and the sweep that ends the processes a run
//! left behind.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use landlock::{
    ABI, Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use serde::Deserialize;
use toml::Spanned;

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

/// What commands may write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Write in the workspace, the run's temp folder and `writable`; read anywhere.
    #[default]
    WorkspaceWrite,
    /// Write only in the run's temp folder.
    ReadOnly,
    /// No sandbox.
    Off,
}

impl Policy {
    pub(crate) fn parse(s: &str) -> Result<Policy, String> {
        match s {
            "workspace-write" => Ok(Policy::WorkspaceWrite),
            "read-only" => Ok(Policy::ReadOnly),
            "off" => Ok(Policy::Off),
            _ => Err(format!(
                "`{s}` is not a sandbox policy: use workspace-write, read-only or off"
            )),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Policy::WorkspaceWrite => "workspace-write",
            Policy::ReadOnly => "read-only",
            Policy::Off => "off",
        }
    }
}

/// The sandbox keys of a goal file, as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SandboxSettings {
    pub(crate) sandbox: Option<Policy>,
    pub(crate) network: Option<bool>,
    #[serde(default)]
    pub(crate) writable: Vec<Spanned<String>>,
    pub(crate) sandbox_required: Option<bool>,
    pub(crate) keep_background: Option<bool>,
    #[serde(default)]
    pub(crate) env_pass: Vec<Spanned<String>>,
}

/// Sandbox settings with paths resolved: from a goal file, from flags, or both merged.
#[derive(Clone, Debug, Default)]
pub struct Sandbox {
    pub policy: Option<Policy>,
    pub network: Option<bool>,
    /// Canonical folders writable besides the workspace.
    pub writable: Vec<PathBuf>,
    pub required: bool,
    pub keep_background: bool,
    pub env_pass: Vec<String>,
    /// Files never writable by the agent (the goal file, the user config).
    pub protect: Vec<PathBuf>,
    /// The daemon's goals folder, when a daemon starts the run: never writable by it.
    pub goals: Option<PathBuf>,
}

/// A name a variable can have: a letter or `_`, then letters, digits or `_`.
pub(crate) fn is_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(crate) fn check_env_pass(name: &str) -> Result<(), String> {
    if is_var_name(name) {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a variable name (letters, digits and `_`, not starting with a digit)"
        ))
    }
}

impl SandboxSettings {
    /// Resolve against the goal file's folder. A bad value gives its byte offset in the file
    /// and what is wrong.
    pub(crate) fn resolve(&self, dir: &Path) -> Result<Sandbox, (usize, String)> {
        let mut writable = Vec::new();
        for w in &self.writable {
            let given = w.get_ref();
            let path = match given.strip_prefix("~/") {
                Some(rest) => std::env::var_os("HOME")
                    .map(|h| PathBuf::from(h).join(rest))
                    .unwrap_or_else(|| PathBuf::from(given)),
                None => dir.join(given),
            };
            let full = std::fs::canonicalize(&path)
                .ok()
                .filter(|p| p.is_dir())
                .ok_or_else(|| {
                    (
                        w.span().start,
                        format!(
                            "key `writable`: {} is not an existing folder; create it or \
                             remove it from the list",
                            path.display()
                        ),
                    )
                })?;
            writable.push(full);
        }
        let mut env_pass = Vec::new();
        for e in &self.env_pass {
            check_env_pass(e.get_ref())
                .map_err(|m| (e.span().start, format!("key `env_pass`: {m}")))?;
            env_pass.push(e.get_ref().clone());
        }
        Ok(Sandbox {
            policy: self.sandbox,
            network: self.network,
            writable,
            required: self.sandbox_required.unwrap_or(false),
            keep_background: self.keep_background.unwrap_or(false),
            env_pass,
            protect: Vec::new(),
            goals: None,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Start-up hardening and secrets.

/// Whether a variable is withheld from the agent's processes: its name contains KEY, SECRET,
/// TOKEN, PASSWORD, PASSWD, CREDENTIAL or AUTH, in any case.
pub(crate) fn is_secret_name(name: &str) -> bool {
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
static PROBLEMS: OnceLock<Vec<String>> = OnceLock::new();

/// Harden `sup` right after start-up, before any thread or child exists: make it
/// non-dumpable (so processes of the same user cannot read its memory or
/// `/proc/PID/environ`), make it the subreaper of what it starts (orphans come back to it, so
/// they can be found and ended), and move every secret-named variable from its environment
/// into memory. Failures are kept for the trace; none stops a run.
pub fn at_start() {
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
fn git_explicit_bare(env: &[(OsString, OsString)]) -> [(String, String); 3] {
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

// ---------------------------------------------------------------------------------------
// The jail of a run.

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

/// What a bind mount of a path onto itself is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Only a mount point, which cannot be renamed or removed (EBUSY): a folder holding a
    /// read-only path, so no rename of it carries the read-only mount away.
    Pin,
    /// Read-only.
    ReadOnly,
    /// Writable again, inside a read-only one (the temp folder inside SUP_HOME).
    Writable,
}

/// A path bound onto itself in a command's mount namespace, with the flags its mount
/// already has (a remount in a user namespace must keep them).
#[derive(Clone, Debug)]
struct Bind {
    path: CString,
    flags: libc::c_ulong,
    mode: Mode,
}

/// Everything a run's processes are started with: which policy, the scrubbed environment,
/// the private temp folder; applied to each command by `Jail::apply`.
#[derive(Debug)]
pub struct Jail {
    policy: Policy,
    network: bool,
    pub(crate) keep_background: bool,
    abi: i32,
    writable: Vec<PathBuf>,
    binds: Vec<Bind>,
    /// Read-only paths inside writable folders, for the model's explanations.
    read_only: Vec<PathBuf>,
    env: Vec<(OsString, OsString)>,
    pub(crate) withheld: Vec<String>,
    /// Protections this run lacks, in words.
    pub(crate) missing: Vec<String>,
    pub(crate) tmp: PathBuf,
    run_id: String,
    /// A secret of the run in its processes' environment (`SUP_RUN_TOKEN`), which tells them
    /// from other runs' in the sweep: a sandboxed process cannot read another's environment
    /// (Landlock denies it), so it cannot claim to belong to another run.
    token: String,
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
}

/// What a command needs kept open until it has been spawned.
pub struct Armed {
    _ruleset: Option<OwnedFd>,
}

impl Jail {
    /// No sandbox, but the scrubbed environment (library use and tests).
    pub fn unconfined() -> Jail {
        let (env, withheld) = scrubbed_env(&[]);
        Jail {
            policy: Policy::Off,
            network: true,
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
            token: String::new(),
            workspace: PathBuf::new(),
            run_dir: PathBuf::new(),
            _lock: None,
            groups: None,
            protected: Vec::new(),
            pinned: Vec::new(),
            goals: None,
            own_pts: false,
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
        let policy = s.policy.unwrap_or_default();
        let held = lock(run_dir)?;
        let mut jail = Jail {
            policy,
            network: s.network.unwrap_or(true),
            keep_background: s.keep_background,
            abi: landlock_abi(),
            writable: Vec::new(),
            binds: Vec::new(),
            read_only: Vec::new(),
            env,
            withheld,
            missing: PROBLEMS.get().cloned().unwrap_or_default(),
            tmp: tmp.clone(),
            run_id: run_id.to_string(),
            token: live_run(),
            workspace: workspace.to_path_buf(),
            run_dir: run_dir.to_path_buf(),
            _lock: Some(held),
            groups: std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(run_dir.join(GROUPS))
                .ok()
                .map(Mutex::new),
            // The file tools write only beneath the workspace: a goals folder or SUP_HOME (whose
            // runs hold the frozen checks) that holds the workspace, rather than is or lies in
            // it, is out of their reach already.
            protected: s
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
                .collect(),
            pinned: Vec::new(),
            goals: s.goals.as_deref().map(lenient_canonical),
            own_pts: false,
        };
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
        jail.own_pts = true;
        if jail.abi < 3 {
            jail.missing
                .push("truncating files is not confined (needs Landlock ABI 3)".into());
        }
        if !jail.network && jail.abi < 4 {
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
            jail.own_pts = false;
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
            .env(TOKEN, &self.token)
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
            s.push_str(if self.network {
                ", network on"
            } else {
                ", network off"
            });
            let shown: Vec<String> = self
                .writable
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            s.push_str(&format!("; writable: {}", shown.join(", ")));
            if !self.read_only.is_empty() {
                let shown: Vec<String> = self
                    .read_only
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                s.push_str(&format!("; read-only: {}", shown.join(", ")));
            }
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
        if !self.token.is_empty() {
            cmd.env(TOKEN, &self.token);
        }
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
            return Ok(Armed { _ruleset: None });
        }
        let ruleset = self.ruleset().map_err(std::io::Error::other)?;
        let fd = ruleset.as_ref().map_or(-1, |f| f.as_raw_fd());
        let binds = self.binds.clone();
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let maps = (uid != 0).then(|| {
            (
                format!("{uid} {uid} 1").into_bytes(),
                format!("{gid} {gid} 1").into_bytes(),
            )
        });
        let own_pts = self.own_pts;
        let pts_access = AccessFs::from_file(ABI::from(self.abi.min(6))).bits();
        let closure = move || -> std::io::Result<()> {
            // Runs in the child between fork and exec: system calls only, no allocation.
            if !binds.is_empty() || own_pts {
                hide_behind_read_only_mounts(&binds, maps.as_ref(), own_pts)?;
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
            Ok(())
        };
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure only makes async-signal-safe system calls.
        unsafe { cmd.pre_exec(closure) };
        Ok(Armed { _ruleset: ruleset })
    }

    /// The Landlock ruleset: read everywhere, write in the writable folders and the device
    /// files, TCP only when the network is on, signals and abstract sockets scoped.
    fn ruleset(&self) -> Result<Option<OwnedFd>, landlock::RulesetError> {
        let abi = ABI::from(self.abi.min(6));
        let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi))?;
        if !self.network && self.abi >= 4 {
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

    /// When a command failed and its stderr shows a refusal, say which path the sandbox
    /// stopped and by which rule, so the model can act on it.
    pub(crate) fn explain(&self, stderr: &str) -> Option<String> {
        if self.policy == Policy::Off {
            return None;
        }
        let refused = [
            "Permission denied",
            "Read-only file system",
            "Operation not permitted",
            "Device or resource busy",
        ];
        let mut notes = Vec::new();
        for line in stderr
            .lines()
            .filter(|l| refused.iter().any(|r| l.contains(r)))
        {
            let note = if !self.network
                && (line.contains("connect") || line.contains("/dev/tcp/") || line.contains("bind"))
            {
                "the sandbox blocks TCP connections and listening (network = false)".to_string()
            } else {
                let Some(path) = path_in(line) else { continue };
                let path = self.workspace.join(path);
                format!(
                    "the sandbox stopped writing {}: {}",
                    path.display(),
                    self.rule_for(&path)
                )
            };
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
        if notes.is_empty() {
            return None;
        }
        let workspace_read_only = matches!(self.policy, Policy::ReadOnly)
            || self.goals.as_deref() == Some(self.workspace.as_path());
        let instead = if workspace_read_only {
            "Write in $TMPDIR instead (the workspace is read-only in this run)".to_string()
        } else {
            format!(
                "Write inside the workspace ({}) or $TMPDIR instead",
                self.writable
                    .first()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            )
        };
        Some(format!(
            "[sandbox {}] {}. {instead}; the sandbox cannot be turned off from inside a run.",
            self.policy.name(),
            notes.join("; "),
        ))
    }

    fn rule_for(&self, path: &Path) -> String {
        if let Some(p) = self.pinned.iter().find(|p| *p == path) {
            return format!(
                "{} holds files of sup that are read-only to you (goal, check or \
                 configuration files), so it cannot be moved or removed",
                p.display()
            );
        }
        if let Some(g) = self.goals.as_ref().filter(|g| path.starts_with(g)) {
            return format!(
                "{} is the daemon's goals folder, never writable by its runs",
                g.display()
            );
        }
        if let Some(p) = self.read_only.iter().find(|p| path.starts_with(p)) {
            if p.file_name() == Some(OsStr::new(".git")) {
                return "`.git` is read-only (a goal can allow it with writable = [\".git\"])"
                    .into();
            }
            return format!(
                "{} is a goal, check or configuration file of sup, never writable by the agent",
                p.display()
            );
        }
        match self.policy {
            Policy::ReadOnly => "policy read-only: nothing but $TMPDIR is writable".into(),
            _ => {
                let shown: Vec<String> = self
                    .writable
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                format!(
                    "policy workspace-write: only {} are writable",
                    shown.join(", ")
                )
            }
        }
    }

    /// End every process this run left behind: its orphans (background jobs, `setsid`,
    /// `nohup` and double-fork escapes, which the subreaper brought back to `sup`) and all
    /// their descendants. Processes of other live runs of this `sup` (told by their
    /// `SUP_RUN_TOKEN`), running tool processes and MCP servers are left alone.
    pub(crate) fn sweep(&self) -> usize {
        sweep(&self.token)
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
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|t| *t != self.token);
        }
        if !self.run_dir.as_os_str().is_empty() {
            let _ = std::fs::remove_file(self.run_dir.join(GROUPS));
        }
    }
}

const LOCK: &str = "lock";
/// The variable that carries a run's token.
const TOKEN: &str = "SUP_RUN_TOKEN";

/// The tokens of the runs alive in this process.
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A new run's token, registered as alive until its jail is dropped.
fn live_run() -> String {
    let token = uuid::Uuid::new_v4().simple().to_string();
    if let Ok(mut live) = LIVE.lock() {
        live.push(token.clone());
    }
    token
}
const GROUPS: &str = "process-groups";

fn lock(run_dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, SandboxError> {
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
fn start_time(pid: i32) -> Option<u64> {
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
    let procs = processes();
    let mut doomed: Vec<i32> = procs
        .iter()
        .filter(|(pid, _)| run_of(*pid).is_some_and(|r| dead(&r)))
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

/// `p` made absolute and free of links as far as it exists; the rest as written.
fn lenient_canonical(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut cur = p;
    loop {
        let here = if cur.as_os_str().is_empty() {
            Path::new(".")
        } else {
            cur
        };
        if let Ok(mut out) = std::fs::canonicalize(here) {
            out.extend(rest.iter().rev());
            return out;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

/// Mount flags that a read-only remount must keep (from `statvfs`).
fn mount_flags(f: nix::sys::statvfs::FsFlags) -> libc::c_ulong {
    use nix::sys::statvfs::FsFlags;
    let mut m = 0;
    for (st, ms) in [
        (FsFlags::ST_NOSUID, libc::MS_NOSUID),
        (FsFlags::ST_NODEV, libc::MS_NODEV),
        (FsFlags::ST_NOEXEC, libc::MS_NOEXEC),
        (FsFlags::ST_NOATIME, libc::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, libc::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if f.contains(st) {
            m |= ms;
        }
    }
    m
}

/// In the child before exec: a private mount namespace (inside a user namespace when not
/// root) in which each of `binds` is a read-only bind mount of itself.
fn hide_behind_read_only_mounts(
    binds: &[Bind],
    maps: Option<&(Vec<u8>, Vec<u8>)>,
    own_pts: bool,
) -> std::io::Result<()> {
    let err = std::io::Error::last_os_error;
    // SAFETY: system calls on NUL-terminated strings that live as long as the closure.
    unsafe {
        match maps {
            Some((uid_map, gid_map)) => {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                    return Err(err());
                }
                // A copy of the non-dumpable `sup` has its `/proc/self` owned by root, so its
                // user cannot write the maps. Dumpable again, it shows its memory to no
                // sandboxed process (Landlock keeps them from every process outside their
                // own domain), and the exec that follows replaces that memory.
                if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
                    return Err(err());
                }
                write_proc(c"/proc/self/setgroups", b"deny")?;
                write_proc(c"/proc/self/uid_map", uid_map)?;
                write_proc(c"/proc/self/gid_map", gid_map)?;
            }
            None => {
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return Err(err());
                }
            }
        }
        let none = std::ptr::null::<libc::c_char>();
        if libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(err());
        }
        for b in binds {
            let p = b.path.as_ptr();
            if libc::mount(p, p, none, libc::MS_BIND | libc::MS_REC, std::ptr::null()) != 0 {
                return Err(err());
            }
            let flags = match b.mode {
                Mode::Pin => continue,
                Mode::ReadOnly => libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | b.flags,
                Mode::Writable => libc::MS_BIND | libc::MS_REMOUNT | b.flags,
            };
            if libc::mount(none, p, none, flags, std::ptr::null()) != 0 {
                return Err(err());
            }
        }
        if own_pts {
            // A terminal folder of its own: the person's terminals are not in it, so no
            // command opens the one where sup asks for approval to draw over the question,
            // or another to read what is typed there.
            if libc::mount(
                c"devpts".as_ptr(),
                c"/dev/pts".as_ptr(),
                c"devpts".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
            ) != 0
                || libc::mount(
                    c"/dev/pts/ptmx".as_ptr(),
                    c"/dev/ptmx".as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
            {
                return Err(err());
            }
        }
        // The working folder was entered before the mounts, on the mount beneath them: enter
        // it again by its path, so that relative paths meet the mounts too (a workspace that
        // is itself read-only, such as the daemon's goals folder).
        let mut cwd = [0 as libc::c_char; libc::PATH_MAX as usize];
        if libc::getcwd(cwd.as_mut_ptr(), cwd.len()).is_null() || libc::chdir(cwd.as_ptr()) != 0 {
            return Err(err());
        }
    }
    Ok(())
}

/// In the child before exec, once the mounts are made: give up every capability, for good
/// (bounding set, ambient, permitted, effective, inheritable). A command of root would keep
/// them otherwise, and with them reach what Landlock and the read-only mounts guard:
/// `open_by_handle_at` opens a protected file through a writable mount, `mknod` makes a disk
/// device in the workspace, `TIOCSTI` types into any terminal, modules load.
fn drop_capabilities() -> std::io::Result<()> {
    // SAFETY: prctl and capset with integers and a local buffer; safe between fork and exec.
    unsafe {
        // Outside a user namespace an ordinary user cannot empty the bounding set (no
        // CAP_SETPCAP), and need not: its exec gains nothing from it (no new privileges).
        let root = libc::getuid() == 0 || libc::geteuid() == 0;
        for cap in 0..64 {
            // Capabilities past this kernel's last are EINVAL: nothing to drop.
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                match *libc::__errno_location() {
                    libc::EINVAL => break,
                    libc::EPERM if !root => break,
                    _ => return Err(std::io::Error::last_os_error()),
                }
            }
        }
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        // struct __user_cap_header_struct { version, pid } and two empty data structs
        // { effective, permitted, inheritable } (_LINUX_CAPABILITY_VERSION_3).
        let header: [u32; 2] = [0x2008_0522, 0];
        let data = [0u32; 6];
        if libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In the child before exec: add Landlock rules for the private `/dev/pts` and `/dev/ptmx`
/// to the ruleset `ruleset`, with `access` (file rights).
fn allow_own_pts(ruleset: i32, access: u64) -> std::io::Result<()> {
    /// `struct landlock_path_beneath_attr`.
    #[repr(C, packed)]
    struct Beneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    for path in [c"/dev/pts", c"/dev/ptmx"] {
        // SAFETY: open, close and landlock_add_rule on a NUL-terminated path and a local
        // struct; safe between fork and exec.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let attr = Beneath {
                allowed_access: access,
                parent_fd: fd,
            };
            // LANDLOCK_RULE_PATH_BENEATH = 1.
            let r = libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset,
                1u32,
                &attr as *const Beneath,
                0u32,
            );
            libc::close(fd);
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Write `data` to a `/proc` file with raw system calls (safe between fork and exec).
///
/// # Safety
///
/// Call it only in a forked child before exec: it allocates nothing and takes no lock.
unsafe fn write_proc(path: &std::ffi::CStr, data: &[u8]) -> std::io::Result<()> {
    // SAFETY: the caller is in the child; the path is NUL-terminated.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        libc::close(fd);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The path a refusal message names: quoted (`'x'`, `‘x’`, `"x"`), or the field before the
/// reason (`bash: line 1: x: Permission denied`).
fn path_in(line: &str) -> Option<PathBuf> {
    for (open, close) in [('\'', '\''), ('‘', '’'), ('"', '"')] {
        if let Some(start) = line.find(open) {
            let rest = &line[start + open.len_utf8()..];
            if let Some(end) = rest.find(close) {
                let p = &rest[..end];
                if !p.is_empty() {
                    return Some(PathBuf::from(p));
                }
            }
        }
    }
    let fields: Vec<&str> = line.split(": ").collect();
    fields
        .len()
        .checked_sub(2)
        .map(|i| fields[i].trim())
        .filter(|p| !p.is_empty() && !p.contains(' '))
        .map(PathBuf::from)
}

// ---------------------------------------------------------------------------------------
// Process lifetime.

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

/// See `Jail::sweep`: `token` is the sweeping run's. Returns how many processes were killed.
pub(crate) fn sweep(token: &str) -> usize {
    let me = std::process::id() as i32;
    // Only the `sup` binary, which made itself a subreaper at start-up, owns every child it
    // has; a program using the library (a test harness) has children of its own, so there
    // only processes that carry this run's token are the run's.
    let subreaper = crate::startup::kept();
    let _no_spawn = SPAWN.write().unwrap_or_else(|e| e.into_inner());
    let live: Vec<String> = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
    // An orphan is this run's unless it carries the token of another run alive here: one
    // that carries none, or a made-up one, is ended too.
    let ours = |pid: i32| match env_of(pid, TOKEN) {
        Some(t) if !token.is_empty() && t == token => true,
        Some(t) if live.contains(&t) => false,
        _ => subreaper,
    };
    let mut killed = 0;
    for _ in 0..50 {
        let procs = processes();
        let mut known: HashSet<i32> = LEADERS
            .lock()
            .map(|l| l.iter().copied().collect())
            .unwrap_or_default();
        known.extend(crate::tools::mcp::live_groups());
        let roots: Vec<i32> = procs
            .iter()
            .filter(|(pid, ppid)| *ppid == me && !known.contains(pid) && ours(*pid))
            .map(|(pid, _)| *pid)
            .collect();
        if roots.is_empty() {
            break;
        }
        let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
        for (pid, ppid) in &procs {
            children.entry(*ppid).or_default().push(*pid);
        }
        let mut doomed = roots.clone();
        let mut i = 0;
        while i < doomed.len() {
            if let Some(c) = children.get(&doomed[i]) {
                doomed.extend(c.iter().copied());
            }
            i += 1;
        }
        for pid in &doomed {
            if nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
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

//! The process runner shared by `run_command`, command tools and checks: a child in its own
//! session and process group (`Jail::apply`), stdout and stderr written to files (so no output size can flood memory and
//! the whole output is kept), a timeout and cancellation that kill the whole group, and
//! bounded reads of what it printed. Every child starts in the run's sandbox (`Jail`) with
//! the scrubbed environment.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::sandbox::Jail;

/// What to run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub program: String,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    /// Bytes for stdin; `None` closes stdin.
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// The sandbox and environment it starts in.
    pub jail: Arc<Jail>,
}

/// How the process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signaled(i32),
    TimedOut,
    Cancelled,
}

impl Ending {
    pub fn success(self) -> bool {
        self == Ending::Exited(0)
    }

    pub(crate) fn exit_code(self) -> Option<i32> {
        match self {
            Ending::Exited(c) => Some(c),
            _ => None,
        }
    }

    /// `exit 1`, `killed by signal 9`, `timed out after 5s`, `cancelled`.
    pub(crate) fn describe(self, timeout: Duration) -> String {
        match self {
            Ending::Exited(c) => format!("exit {c}"),
            Ending::Signaled(s) => format!("killed by signal {s}"),
            Ending::TimedOut => format!("timed out after {}", humantime::format_duration(timeout)),
            Ending::Cancelled => "cancelled".to_string(),
        }
    }
}

pub struct Finished {
    pub ending: Ending,
    pub(crate) duration: Duration,
}

/// Kills the process group when dropped, so that no path out of `run` — an error, a
/// cancelled future — leaves the group behind.
struct GroupGuard(Option<Pid>);

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(pid) = self.0.take() {
            // The group may be gone already; that is what we want.
            let _ = killpg(pid, Signal::SIGKILL);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot create output file {path}: {source}")]
    Output {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot sandbox `{program}`: {source}")]
    Sandbox {
        program: String,
        source: super::sandbox::SandboxError,
    },
    #[error("waiting for `{program}` failed: {source}")]
    Wait {
        program: String,
        source: std::io::Error,
    },
}

fn create(path: &Path) -> Result<std::fs::File, ProcessError> {
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::File::create(path).map_err(|source| ProcessError::Output {
        path: path.display().to_string(),
        source,
    })
}

/// Output kept per stream of one process at most (64 MB): past it the rest is read and
/// discarded, and a note at the end of the file says how much.
pub(crate) const MAX_KEPT: u64 = 64 * 1024 * 1024;

/// Copy what a child prints into `to`, keeping at most `cap` bytes. It reads to the end
/// whatever happens (a full disk included), so the child never blocks on a full pipe.
async fn pump(mut from: impl tokio::io::AsyncRead + Unpin, to: std::fs::File, cap: u64) {
    use tokio::io::AsyncReadExt;
    let mut to = tokio::fs::File::from_std(to);
    let mut buf = vec![0; 64 * 1024];
    let (mut kept, mut dropped) = (0u64, 0u64);
    let mut failed = false;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let take = usize::try_from(cap.saturating_sub(kept)).map_or(n, |room| n.min(room));
        if take > 0 && !failed {
            failed = to.write_all(&buf[..take]).await.is_err();
        }
        kept = kept.saturating_add(take as u64);
        dropped = dropped.saturating_add((n - take) as u64);
    }
    if dropped > 0 && !failed {
        let note = format!(
            "\n[sup: output cut at {} MB; {dropped} more bytes were discarded]\n",
            cap / (1024 * 1024)
        );
        let _ = to.write_all(note.as_bytes()).await;
    }
    let _ = to.flush().await;
}

/// Run `spec` to its end, its timeout, or `cancel`, whichever comes first.
pub async fn run(spec: &Spec, cancel: &CancellationToken) -> Result<Finished, ProcessError> {
    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .current_dir(&spec.cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true);
    let (out_file, err_file) = (create(&spec.stdout)?, create(&spec.stderr)?);
    let armed = spec
        .jail
        .apply(&mut cmd, &spec.env, None)
        .map_err(|source| ProcessError::Sandbox {
            program: spec.program.clone(),
            source,
        })?;
    // Registered as a running leader before any sweep can see it.
    let (mut child, _held) = spec
        .jail
        .spawn(&mut cmd)
        .map_err(|source| ProcessError::Spawn {
            program: spec.program.clone(),
            source,
        })?;
    drop(armed);
    let mut pumps = tokio::task::JoinSet::new();
    if let Some(out) = child.stdout.take() {
        pumps.spawn(pump(out, out_file, MAX_KEPT));
    }
    if let Some(err) = child.stderr.take() {
        pumps.spawn(pump(err, err_file, MAX_KEPT));
    }
    let leader = child.id().and_then(|id| i32::try_from(id).ok());
    if let Some(pid) = leader {
        spec.jail.record(pid);
    }
    let mut guard = GroupGuard(leader.map(Pid::from_raw));
    if let (Some(bytes), Some(mut stdin)) = (spec.stdin.clone(), child.stdin.take()) {
        tokio::spawn(async move {
            // A child that does not read its input closes the pipe: not an error.
            let _ = stdin.write_all(&bytes).await;
            let _ = stdin.shutdown().await;
        });
    }
    let waited = tokio::select! {
        status = child.wait() => Some(status),
        _ = tokio::time::sleep(spec.timeout) => None,
        _ = cancel.cancelled() => {
            guard.kill();
            let _ = child.wait().await;
            drain(&mut pumps).await;
            return Ok(Finished { ending: Ending::Cancelled, duration: started.elapsed() });
        }
    };
    let ending = match waited {
        None => {
            guard.kill();
            let _ = child.wait().await;
            Ending::TimedOut
        }
        Some(status) => {
            let status = status.map_err(|source| ProcessError::Wait {
                program: spec.program.clone(),
                source,
            })?;
            // The leader is gone; what it left running in its group stays (on purpose:
            // a command may start a server), so the guard lets go.
            guard.0 = None;
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(c), _) => Ending::Exited(c),
                (None, Some(s)) => Ending::Signaled(s),
                (None, None) => Ending::Exited(-1),
            }
        }
    };
    drain(&mut pumps).await;
    Ok(Finished {
        ending,
        duration: started.elapsed(),
    })
}

/// Let the output pumps finish; a process left in the background may hold the pipes open,
/// so they get a moment, then what they hold is what was printed. The pumps are detached,
/// not aborted: closing the pipes would kill a background server with SIGPIPE at its next
/// line (they end when the run's sweep ends the writer).
async fn drain(pumps: &mut tokio::task::JoinSet<()>) {
    let all = async { while pumps.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_millis(500), all)
        .await
        .is_err()
    {
        pumps.detach_all();
    }
}

/// Text read from an output file, at most `cap` bytes of it.
pub(crate) struct Capped {
    pub(crate) text: String,
    pub(crate) cut: bool,
}

/// Read `path` whole when it fits in `cap` bytes; otherwise its head and tail, half of `cap`
/// each, with a marker in between that says how much was cut and where the whole is.
pub(crate) fn read_capped(path: &Path, cap: usize) -> std::io::Result<Capped> {
    let mut file = std::fs::File::open(path)?;
    let total = file.metadata()?.len();
    if total <= cap as u64 {
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)?;
        return Ok(Capped {
            text: String::from_utf8_lossy(&buf).into_owned(),
            cut: false,
        });
    }
    let half = (cap / 2) as u64;
    let mut head = vec![0; half as usize];
    file.read_exact(&mut head)?;
    file.seek(SeekFrom::Start(total - half))?;
    let mut tail = Vec::with_capacity(half as usize);
    file.read_to_end(&mut tail)?;
    let text = format!(
        "{}\n[… {} of {} bytes cut from the middle; the whole output is in {} …]\n{}",
        String::from_utf8_lossy(&head).trim_end_matches('\u{FFFD}'),
        total - 2 * half,
        total,
        path.display(),
        String::from_utf8_lossy(&tail).trim_start_matches('\u{FFFD}'),
    );
    Ok(Capped { text, cut: true })
}

/// The last `max` bytes of `path` (whole lines where it can), for failure reports.
pub fn read_tail(path: &Path, max: usize) -> std::io::Result<(String, bool)> {
    let mut file = std::fs::File::open(path)?;
    let total = file.metadata()?.len();
    let start = total.saturating_sub(max as u64);
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    if start > 0 {
        if let Some(nl) = text.find('\n') {
            text = text[nl + 1..].to_string();
        }
        text = text.trim_start_matches('\u{FFFD}').to_string();
    }
    Ok((text, start > 0))
}

/// A file name for a call id from any provider.
pub(crate) fn safe_name(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// How to run a script: by its extension (`.js`/`.mjs` node, `.py` python3, `.sh` bash),
/// anything else executed directly.
pub(crate) fn script_command(path: &Path) -> (String, Vec<String>) {
    let shown = path.display().to_string();
    match path.extension().and_then(|e| e.to_str()) {
        Some("js" | "mjs" | "cjs") => ("node".into(), vec![shown]),
        Some("py") => ("python3".into(), vec![shown]),
        Some("sh") => ("bash".into(), vec![shown]),
        _ => (shown, vec![]),
    }
}

/// Whether `program` can be found: a path that exists, or a name on PATH.
pub(crate) fn program_exists(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

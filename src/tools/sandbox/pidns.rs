//! The PID namespace of a run, held by sup: its init is a fresh `sup` that only waits for
//! its lifeline (a pipe whose writing end only sup holds) to close, which happens when the
//! jail is dropped and when sup dies however it dies (`kill -9` included); the kernel then
//! kills every process of the namespace. Jailed processes enter it between fork and exec
//! (`enter`): the child joins the namespace (and, as an ordinary user, the user namespace
//! that owns it), forks once more, and stays outside as a relay of its child's ending, which
//! lives in the namespace. Membership (`/proc/PID/ns/pid`) is how the sweep and the console
//! tell the run's processes. The init also makes the run's mount namespace (the jail's
//! mounts, made once), which each command joins (`enter_mounts`).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// `argv[0]` of the namespace's init.
pub(super) const INIT_NAME: &str = "sup-jail-init";

/// In `at_start`: when this process is a jail's init, wait until the lifeline (stdin)
/// closes, then exit (and with it, everything in the namespace). Orphans are reaped by the
/// kernel (SIGCHLD ignored).
pub(super) fn init_if_asked() {
    if std::env::args_os().next().as_deref() != Some(std::ffi::OsStr::new(INIT_NAME)) {
        return;
    }
    // SAFETY: only system calls with integer arguments and a local buffer.
    unsafe { wait_on_lifeline() }
}

/// Ignore SIGCHLD (the kernel reaps orphans), then wait until stdin, the lifeline, closes
/// and exit.
///
/// # Safety
///
/// Only system calls: safe in a forked child of a multithreaded process, before exec.
unsafe fn wait_on_lifeline() -> ! {
    // SAFETY: signal, read and _exit with integer arguments and a local buffer.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
        let mut b = [0u8; 1];
        loop {
            let n = libc::read(0, b.as_mut_ptr().cast(), 1);
            if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                libc::_exit(0);
            }
        }
    }
}

/// A run's PID namespace while it lives.
#[derive(Debug)]
pub(super) struct PidNs {
    init: i32,
    /// The writing end of the lifeline.
    _lifeline: OwnedFd,
    pub(super) pid_ns: OwnedFd,
    /// The user namespace that owns it, when sup is not root.
    pub(super) user_ns: Option<OwnedFd>,
    /// The run's mount namespace, made by the init with the jail's mounts (read-only binds,
    /// hidden paths, its own `/proc` and `/dev/pts`), that commands join: making and ending
    /// one per command waits for RCU grace periods, many milliseconds each time.
    pub(super) mnt_ns: Option<OwnedFd>,
    /// Device and inode of the namespace: who is in it.
    pub(super) id: (u64, u64),
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 into a local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just made and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The namespace of process `pid`, as device and inode.
pub(crate) fn ns_of(pid: i32) -> Option<(u64, u64)> {
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl PidNs {
    /// The namespace and its init, which first makes a mount namespace of its own with
    /// `mounts` (system calls only) when given.
    pub(super) fn new(mounts: Option<&dyn Fn() -> std::io::Result<()>>) -> std::io::Result<PidNs> {
        let (life_r, life_w) = pipe()?;
        let (rep_r, rep_w) = pipe()?;
        let (made_r, made_w) = pipe()?;
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let maps = (uid != 0).then(|| {
            (
                format!("{uid} {uid} 1").into_bytes(),
                format!("{gid} {gid} 1").into_bytes(),
            )
        });
        let exe = CString::new("/proc/self/exe").map_err(std::io::Error::other)?;
        let name = CString::new(INIT_NAME).map_err(std::io::Error::other)?;
        let argv = [name.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null::<libc::c_char>()];
        let (lr, rw, mw) = (life_r.as_raw_fd(), rep_w.as_raw_fd(), made_w.as_raw_fd());
        // Only the `sup` binary ran `at_start`, which makes an exec'd copy an init.
        let exec_self = crate::startup::kept();
        // SAFETY: the child makes only system calls (async-signal-safe) on data made before
        // the fork, then exits or execs.
        let a = unsafe { libc::fork() };
        if a < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if a == 0 {
            // SAFETY: as above; in the single-threaded child.
            unsafe {
                let fail = |code: i32| -> ! { libc::_exit(code) };
                let flags = if maps.is_some() {
                    libc::CLONE_NEWUSER | libc::CLONE_NEWPID
                } else {
                    libc::CLONE_NEWPID
                };
                if libc::unshare(flags) != 0 {
                    fail(2);
                }
                if let Some((u, g)) = &maps
                    && (libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0
                        || super::mounts::write_proc(c"/proc/self/setgroups", b"deny").is_err()
                        || super::mounts::write_proc(c"/proc/self/uid_map", u).is_err()
                        || super::mounts::write_proc(c"/proc/self/gid_map", g).is_err())
                {
                    fail(3);
                }
                let init = libc::fork();
                if init < 0 {
                    fail(4);
                }
                if init == 0 {
                    if libc::dup2(lr, 0) < 0 {
                        libc::_exit(5);
                    }
                    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                    if null >= 0 {
                        libc::dup2(null, 1);
                        libc::dup2(null, 2);
                    }
                    if let Some(m) = mounts {
                        let made = [u8::from(m().is_ok())];
                        libc::write(mw, made.as_ptr().cast(), 1);
                    }
                    libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                    if exec_self {
                        libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
                        libc::_exit(6);
                    }
                    // Not the `sup` binary (a program using the library: a test harness, a
                    // bench), whose start-up would not stop at `init_if_asked`: the copy
                    // waits on its lifeline itself.
                    wait_on_lifeline();
                }
                let bytes = init.to_ne_bytes();
                libc::write(rw, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0);
            }
        }
        drop(rep_w);
        drop(made_w);
        drop(life_r);
        let mut status = 0;
        // SAFETY: waiting for the child just forked.
        unsafe { libc::waitpid(a, &mut status, 0) };
        let mut bytes = [0u8; 4];
        let mut rep = std::fs::File::from(rep_r);
        use std::io::Read;
        rep.read_exact(&mut bytes).map_err(|_| {
            std::io::Error::other(format!(
                "the namespace could not be made (step {})",
                libc::WEXITSTATUS(status)
            ))
        })?;
        let init = i32::from_ne_bytes(bytes);
        let open = |what: &str| -> std::io::Result<OwnedFd> {
            let f = std::fs::File::open(format!("/proc/{init}/ns/{what}"))?;
            Ok(OwnedFd::from(f))
        };
        let mut made = [0u8; 1];
        let mounted = mounts.is_some()
            && std::fs::File::from(made_r).read_exact(&mut made).is_ok()
            && made[0] == 1;
        let ns = PidNs {
            init,
            _lifeline: life_w,
            pid_ns: open("pid")?,
            user_ns: if maps.is_some() {
                Some(open("user")?)
            } else {
                None
            },
            mnt_ns: if mounted { Some(open("mnt")?) } else { None },
            id: ns_of(init).ok_or_else(|| std::io::Error::other("the namespace is gone"))?,
        };
        Ok(ns)
    }

    /// The init's pid, as sup sees it.
    pub(super) fn init(&self) -> i32 {
        self.init
    }
}

impl Drop for PidNs {
    /// Ending the init ends every process of the namespace.
    fn drop(&mut self) {
        // SAFETY: kill and waitpid on the init's pid (a reused pid is not ours: waitpid on a
        // process that is not our child fails harmlessly).
        unsafe {
            libc::kill(self.init, libc::SIGKILL);
            libc::waitpid(self.init, std::ptr::null_mut(), libc::__WALL);
        }
    }
}

/// In the child between fork and exec, in the PID namespace: join the run's mount namespace,
/// and enter the working folder again there by its path. Only system calls.
pub(super) fn enter_mounts(mnt_ns: i32) -> std::io::Result<()> {
    let err = std::io::Error::last_os_error;
    let mut cwd = [0 as libc::c_char; libc::PATH_MAX as usize];
    // SAFETY: getcwd into a local buffer, setns on an fd that lives as long as the closure,
    // chdir on that buffer.
    unsafe {
        if libc::getcwd(cwd.as_mut_ptr(), cwd.len()).is_null()
            || libc::setns(mnt_ns, libc::CLONE_NEWNS) != 0
            || libc::chdir(cwd.as_ptr()) != 0
        {
            return Err(err());
        }
    }
    Ok(())
}

/// In the child between fork and exec: join the namespace (`user` first, as an ordinary
/// user), then fork; the child goes on to exec in the namespace, this process stays outside,
/// waits for it and ends as it ended. Only system calls.
pub(super) fn enter(pid_ns: i32, user_ns: i32) -> std::io::Result<()> {
    let err = std::io::Error::last_os_error;
    // SAFETY: system calls on fds that live as long as the closure; the relay never returns.
    unsafe {
        if user_ns >= 0 && libc::setns(user_ns, libc::CLONE_NEWUSER) != 0 {
            return Err(err());
        }
        if libc::setns(pid_ns, libc::CLONE_NEWPID) != 0 {
            return Err(err());
        }
        let child = libc::fork();
        if child < 0 {
            return Err(err());
        }
        if child == 0 {
            // Dies with its relay, which dies with sup.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(err());
            }
            return Ok(());
        }
        // The relay holds nothing of sup's: not its files, not the pipe through which the
        // spawning thread learns that exec happened (the child still holds that).
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        let mut status = 0;
        while libc::waitpid(child, &mut status, 0) < 0 {
            if *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

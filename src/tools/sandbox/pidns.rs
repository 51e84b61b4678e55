//! The PID namespace of a run, held by sup: its init is a fresh `sup` that only waits for
//! its lifeline (a pipe whose writing end only sup holds) to close, which happens when the
//! jail is dropped and when sup dies however it dies (`kill -9` included); the kernel then
//! kills every process of the namespace. Jailed processes enter it between fork and exec
//! (`enter`): the child joins the namespace (and, as an ordinary user, the user namespace
//! that owns it), forks once more, and stays outside as a relay of its child's ending, which
//! lives in the namespace. Membership (`/proc/PID/ns/pid`) is how the sweep and the console
//! tell the run's processes. The init also makes the run's mount namespace (the jail's
//! mounts, made once), which each command joins (`enter_mounts`). With a network allowlist the namespace comes with a network
//! namespace of its own (only `lo`, up), which jailed processes join too, and a socket
//! listening on its loopback, passed back to sup for its proxy.

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
    /// The network namespace of its own, with a network allowlist.
    pub(super) net_ns: Option<OwnedFd>,
    /// A socket listening on that namespace's loopback, for the proxy to take.
    pub(super) listener: Option<OwnedFd>,
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

/// A pair of connected unix stream sockets: the report of the namespace's making, which can
/// carry a file descriptor.
fn socket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: socketpair into a local array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just made and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Room for one `SCM_RIGHTS` message of one fd, aligned for `cmsghdr`.
type Control = [u64; 4];

/// `struct ifreq` with the flags member (`SIOCSIFFLAGS`), padded to its size.
#[repr(C)]
struct IfReqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// In the child, in the new network namespace: bring `lo` up and listen on 127.0.0.1 (a
/// port of the kernel's choosing); the listening socket, or -1. Only system calls.
///
/// # Safety
///
/// Safe in a forked child of a multithreaded process.
unsafe fn loopback_listener() -> i32 {
    const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
    // SAFETY: socket, ioctl, bind and listen on local data.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return -1;
        }
        let mut req = IfReqFlags {
            name: [0; 16],
            flags: (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short,
            _pad: [0; 22],
        };
        req.name[..2].copy_from_slice(b"lo");
        let up = libc::ioctl(s, SIOCSIFFLAGS as _, &mut req);
        libc::close(s);
        if up != 0 {
            return -1;
        }
        let l = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if l < 0 {
            return -1;
        }
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(l, (&raw const addr).cast(), len) != 0 || libc::listen(l, 128) != 0 {
            libc::close(l);
            return -1;
        }
        l
    }
}

/// Send `bytes`, with `fd` when it is one, over the unix socket `to`. Only system calls.
///
/// # Safety
///
/// Safe in a forked child of a multithreaded process.
unsafe fn send_with_fd(to: i32, bytes: &[u8], fd: i32) {
    // SAFETY: sendmsg of local buffers.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        let mut control: Control = [0; 4];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        if fd >= 0 {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), fd);
        }
        libc::sendmsg(to, &msg, 0);
    }
}

/// The four bytes of the report, and the fd it carried, if any.
fn receive_with_fd(from: &OwnedFd) -> std::io::Result<([u8; 4], Option<OwnedFd>)> {
    let mut bytes = [0u8; 4];
    let mut control: Control = [0; 4];
    // SAFETY: recvmsg into local buffers; a received fd is ours alone.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: bytes.as_mut_ptr().cast(),
            iov_len: bytes.len(),
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of::<Control>() as _;
        let n = libc::recvmsg(from.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n != 4 {
            return Err(std::io::Error::other("no report"));
        }
        let c = libc::CMSG_FIRSTHDR(&msg);
        let fd = if !c.is_null()
            && (*c).cmsg_level == libc::SOL_SOCKET
            && (*c).cmsg_type == libc::SCM_RIGHTS
        {
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>());
            Some(OwnedFd::from_raw_fd(fd))
        } else {
            None
        };
        Ok((bytes, fd))
    }
}

impl PidNs {
    /// A new namespace and its init, which first makes a mount namespace of its own with
    /// `mounts` (system calls only) when given; with `net`, a network namespace of its own
    /// too (only `lo`, up) and a socket listening on its loopback.
    pub(super) fn new(
        mounts: Option<&dyn Fn() -> std::io::Result<()>>,
        net: bool,
    ) -> std::io::Result<PidNs> {
        let (life_r, life_w) = pipe()?;
        let (rep_r, rep_w) = socket_pair()?;
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
                let mut flags = if maps.is_some() {
                    libc::CLONE_NEWUSER | libc::CLONE_NEWPID
                } else {
                    libc::CLONE_NEWPID
                };
                if net {
                    flags |= libc::CLONE_NEWNET;
                }
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
                let listener = if net { loopback_listener() } else { -1 };
                if net && listener < 0 {
                    fail(7);
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
                send_with_fd(rw, &init.to_ne_bytes(), listener);
                libc::_exit(0);
            }
        }
        drop(rep_w);
        drop(made_w);
        drop(life_r);
        let mut status = 0;
        // SAFETY: waiting for the child just forked.
        unsafe { libc::waitpid(a, &mut status, 0) };
        let (bytes, listener) = receive_with_fd(&rep_r).map_err(|_| {
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
            && std::io::Read::read_exact(&mut std::fs::File::from(made_r), &mut made).is_ok()
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
            net_ns: if net { Some(open("net")?) } else { None },
            listener,
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
/// user, then the network namespace of an allowlist), then fork; the child goes on to exec in the namespace, this process stays outside,
/// waits for it and ends as it ended. Only system calls.
pub(super) fn enter(pid_ns: i32, user_ns: i32, net_ns: i32) -> std::io::Result<()> {
    let err = std::io::Error::last_os_error;
    // SAFETY: system calls on fds that live as long as the closure; the relay never returns.
    unsafe {
        if user_ns >= 0 && libc::setns(user_ns, libc::CLONE_NEWUSER) != 0 {
            return Err(err());
        }
        if net_ns >= 0 && libc::setns(net_ns, libc::CLONE_NEWNET) != 0 {
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

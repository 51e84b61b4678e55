//! The seccomp filter of every jailed process: a classic BPF program, built once per run and
//! installed in the child right before exec, that answers EPERM to `socket(AF_UNIX, …)`
//! (unless the goal sets `unix_sockets = true`; `socketpair` stays allowed), io_uring,
//! ptrace, `process_vm_readv`/`process_vm_writev`, `bpf`, `perf_event_open`, the kernel
//! keyring, and new mounts or namespaces; `clone3` gets ENOSYS (its flags cannot be read by
//! a filter), so the C library falls back to `clone`, whose namespace flags are refused.

/// `struct seccomp_data` offsets: the call's number, its architecture, its first argument.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0: u32 = 16;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_KILL: u32 = 0x8000_0000;

/// Every namespace flag of `clone` and `unshare`.
const NEW_NAMESPACES: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u32;

/// The calls always refused, by name for the trace.
fn denied() -> Vec<(libc::c_long, &'static str)> {
    vec![
        (libc::SYS_io_uring_setup, "io_uring"),
        (libc::SYS_io_uring_enter, "io_uring"),
        (libc::SYS_io_uring_register, "io_uring"),
        (libc::SYS_ptrace, "ptrace"),
        (libc::SYS_process_vm_readv, "process_vm_readv"),
        (libc::SYS_process_vm_writev, "process_vm_writev"),
        (libc::SYS_bpf, "bpf"),
        (libc::SYS_perf_event_open, "perf_event_open"),
        (libc::SYS_keyctl, "keyctl"),
        (libc::SYS_add_key, "add_key"),
        (libc::SYS_request_key, "request_key"),
        (libc::SYS_mount, "mount"),
        (libc::SYS_umount2, "mount"),
        (libc::SYS_pivot_root, "mount"),
        (libc::SYS_open_tree, "mount"),
        (libc::SYS_move_mount, "mount"),
        (libc::SYS_fsopen, "mount"),
        (libc::SYS_fsconfig, "mount"),
        (libc::SYS_fsmount, "mount"),
        (libc::SYS_fspick, "mount"),
        (libc::SYS_mount_setattr, "mount"),
        (libc::SYS_unshare, "new namespaces"),
        (libc::SYS_setns, "new namespaces"),
    ]
}

/// A built filter, ready to install.
#[derive(Clone, Debug)]
pub(super) struct Filter {
    program: Vec<libc::sock_filter>,
    unix_sockets: bool,
}

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

const LD_W: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const RET: u32 = libc::BPF_RET | libc::BPF_K;

impl Filter {
    pub(super) fn new(unix_sockets: bool) -> Filter {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        let mut p = vec![
            stmt(LD_W, ARCH),
            jeq(AUDIT_ARCH, 1, 0),
            stmt(RET, RET_KILL),
            stmt(LD_W, NR),
        ];
        // x32 calls on x86_64 (bit 30) would bypass the numbers below.
        #[cfg(target_arch = "x86_64")]
        p.extend([
            libc::sock_filter {
                code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
                jt: 0,
                jf: 1,
                k: 0x4000_0000,
            },
            stmt(RET, eperm),
        ]);
        for (nr, _) in denied() {
            p.push(jeq(nr as u32, 0, 1));
            p.push(stmt(RET, eperm));
        }
        p.push(jeq(libc::SYS_clone3 as u32, 0, 1));
        p.push(stmt(RET, RET_ERRNO | libc::ENOSYS as u32));
        // clone(flags, …) on x86_64 and aarch64: the flags are the first argument.
        p.extend([
            jeq(libc::SYS_clone as u32, 0, 4),
            stmt(LD_W, ARG0),
            libc::sock_filter {
                code: (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16,
                jt: 0,
                jf: 1,
                k: NEW_NAMESPACES,
            },
            stmt(RET, eperm),
            stmt(RET, RET_ALLOW),
        ]);
        if !unix_sockets {
            p.extend([
                jeq(libc::SYS_socket as u32, 0, 3),
                stmt(LD_W, ARG0),
                jeq(libc::AF_UNIX as u32, 0, 1),
                stmt(RET, eperm),
            ]);
        }
        p.push(stmt(RET, RET_ALLOW));
        Filter {
            program: p,
            unix_sockets,
        }
    }

    /// What is refused, for the first trace line.
    pub(super) fn describe(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        if !self.unix_sockets {
            names.push("socket(AF_UNIX) (unix_sockets = true allows it)");
        }
        for (_, n) in denied() {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        format!("seccomp denies {} with EPERM", names.join(", "))
    }

    /// Whether this kernel has seccomp filters: installing none is EFAULT where it does,
    /// EINVAL where it does not.
    pub(super) fn supported() -> bool {
        // SAFETY: prctl with a null program is refused before anything is installed.
        let r = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                std::ptr::null::<libc::sock_fprog>(),
                0,
                0,
            )
        };
        r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EFAULT)
    }

    /// Install the filter on the calling thread (no new privileges must be set). Only system
    /// calls: safe between fork and exec.
    pub(super) fn install(&self) -> std::io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr().cast_mut(),
        };
        // SAFETY: prctl with a pointer to a program that lives as long as `self`.
        let r = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
                0,
                0,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

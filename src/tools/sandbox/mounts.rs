//! What a jailed command does in its child between fork and exec: its private mount
//! namespace (read-only bind mounts of itself over protected paths, a `devpts` of its own),
//! the Landlock rules for that `devpts`, and giving up every capability.

use std::ffi::CString;

/// What a bind mount of a path onto itself is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
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
pub(super) struct Bind {
    pub(super) path: CString,
    pub(super) flags: libc::c_ulong,
    pub(super) mode: Mode,
}

/// Mount flags that a read-only remount must keep (from `statvfs`).
pub(super) fn mount_flags(f: nix::sys::statvfs::FsFlags) -> libc::c_ulong {
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
pub(super) fn hide_behind_read_only_mounts(
    binds: &[Bind],
    maps: Option<&(Vec<u8>, Vec<u8>)>,
    own_pts: bool,
    hides: &[Hide],
    empty: &std::ffi::CStr,
    own_proc: bool,
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
        hide_paths(hides, empty)?;
        // The jail's own processes, and no other, under `/proc` (its pids are the jail's).
        if own_proc
            && libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) != 0
        {
            return Err(err());
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
pub(super) fn drop_capabilities() -> std::io::Result<()> {
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
pub(super) fn allow_own_pts(ruleset: i32, access: u64) -> std::io::Result<()> {
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
pub(super) unsafe fn write_proc(path: &std::ffi::CStr, data: &[u8]) -> std::io::Result<()> {
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

/// At most this many paths shown again inside one hidden folder.
pub(super) const MAX_SHOWN: usize = 16;

/// A path mounted over with an empty one in a command's mount namespace: a folder with an
/// empty read-only `tmpfs`, in which `shown` (the run's own folder, the workspace, `readable`
/// paths) are bound again; a file with an empty read-only file.
#[derive(Clone, Debug)]
pub(super) struct Hide {
    pub(super) path: CString,
    pub(super) dir: bool,
    /// Folders to make in the `tmpfs`, outer first, then the paths shown again in it
    /// (`true` for a file, whose mount point is an empty file).
    pub(super) make: Vec<CString>,
    pub(super) shown: Vec<(CString, bool)>,
}

/// In the child, inside its mount namespace: mount each of `hides` over with an empty one;
/// `empty` is an empty file to bind over hidden files. Only system calls.
pub(super) fn hide_paths(hides: &[Hide], empty: &std::ffi::CStr) -> std::io::Result<()> {
    let err = std::io::Error::last_os_error;
    let none = std::ptr::null::<libc::c_char>();
    // SAFETY: system calls on NUL-terminated strings owned by `hides`, and on fds opened here.
    unsafe {
        for h in hides {
            let p = h.path.as_ptr();
            if !h.dir {
                if libc::mount(empty.as_ptr(), p, none, libc::MS_BIND, std::ptr::null()) != 0 {
                    return Err(err());
                }
                let ro = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
                if libc::mount(none, p, none, ro, std::ptr::null()) != 0 {
                    return Err(err());
                }
                continue;
            }
            // What is shown again, cloned (with its own mounts) before it is covered.
            let mut trees = [-1i32; MAX_SHOWN];
            for (i, (s, _)) in h.shown.iter().take(MAX_SHOWN).enumerate() {
                // OPEN_TREE_CLONE | AT_RECURSIVE | OPEN_TREE_CLOEXEC.
                let fd = libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    s.as_ptr(),
                    1u32 | 0x8000 | libc::O_CLOEXEC as u32,
                );
                if fd < 0 {
                    return Err(err());
                }
                trees[i] = fd as i32;
            }
            if libc::mount(
                c"tmpfs".as_ptr(),
                p,
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755,size=64k".as_ptr().cast(),
            ) != 0
            {
                return Err(err());
            }
            for m in &h.make {
                if libc::mkdir(m.as_ptr(), 0o755) != 0 && *libc::__errno_location() != libc::EEXIST
                {
                    return Err(err());
                }
            }
            for (i, (s, file)) in h.shown.iter().take(MAX_SHOWN).enumerate() {
                let made = if *file {
                    let fd = libc::open(
                        s.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    fd >= 0
                } else {
                    libc::mkdir(s.as_ptr(), 0o755) == 0 || *libc::__errno_location() == libc::EEXIST
                };
                // MOVE_MOUNT_F_EMPTY_PATH.
                if !made
                    || libc::syscall(
                        libc::SYS_move_mount,
                        trees[i],
                        c"".as_ptr(),
                        libc::AT_FDCWD,
                        s.as_ptr(),
                        4u32,
                    ) != 0
                {
                    return Err(err());
                }
                libc::close(trees[i]);
            }
            let ro = libc::MS_BIND
                | libc::MS_REMOUNT
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV;
            if libc::mount(none, p, none, ro, std::ptr::null()) != 0 {
                return Err(err());
            }
        }
    }
    Ok(())
}

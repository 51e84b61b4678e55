//! The walk that `list_files` and `search_files` share: the files under a folder of the
//! workspace in sorted order, without what the folders' `.gitignore` and `.ignore` files
//! ignore (judged as the `ignore` crate's walk judges them: the nearest folder whose rules
//! match a path decides, and in one folder an `.ignore`'s lines win over a `.gitignore`'s).
//! Folders are opened beneath the workspace's directory handle; a link is neither listed nor
//! entered (an ignore file that is one is read through it, as the crate reads it).
//!
//! What the walk reads of a folder (its entries and its ignore rules) is kept for the run with
//! the folder's stat and the stats of its ignore files, and read again only when one of them
//! has changed: a walk of a workspace that did not change costs one `stat` per folder and per
//! ignore file. A folder's change time moves with every entry added, removed or renamed in it,
//! an ignore file's with every write, and neither can be set back. A folder is only kept when
//! its times are the kernel's clock (a local file system, the workspace's device) and older
//! than that clock was at the read, so that a change after the read, even in the same clock
//! tick, shows as another time.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use cap_std::fs::Dir;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// A folder's ignore files, in the order their lines are added (the last match wins).
const IGNORE_FILES: [&str; 2] = [".gitignore", ".ignore"];

/// How much older than the clock a change time in whole seconds must be (FAT's are two).
const COARSE_GRAIN: i64 = 3;

/// File systems whose change times are the kernel's clock, stamped on every change.
const LOCAL: [nix::sys::statfs::FsType; 6] = {
    use nix::sys::statfs::*;
    [
        EXT4_SUPER_MAGIC,
        XFS_SUPER_MAGIC,
        BTRFS_SUPER_MAGIC,
        TMPFS_MAGIC,
        OVERLAYFS_SUPER_MAGIC,
        F2FS_SUPER_MAGIC,
    ]
};

/// The stat of `path` (links followed) as a `Stamp`.
fn stamp(path: &Path) -> Option<Stamp> {
    std::fs::metadata(path).ok().map(|m| Stamp::of(&m))
}

/// What a stat says of a file that changes when the file does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mode: u32,
    nlink: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            mode: m.mode(),
            nlink: m.nlink(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// Whether any change after `asked` (the kernel's coarse clock when the stat was asked
    /// for) would show as another change time, on the device `dev` whose times can be
    /// trusted. The kernel stamps a change with its coarse clock, or a finer time when the
    /// last one was asked for, never less: a change time older than the coarse clock at a
    /// stat cannot be given again after it.
    fn settled(&self, asked: Option<(i64, i64)>, dev: Option<u64>) -> bool {
        let Some(asked) = asked else {
            return false;
        };
        let old = if self.ctime.1 == 0 {
            self.ctime.0.saturating_add(COARSE_GRAIN) < asked.0
        } else {
            self.ctime < asked
        };
        dev == Some(self.dev) && old
    }
}

/// The kernel's coarse real-time clock, which stamps changes: seconds and nanoseconds.
fn coarse_now() -> Option<(i64, i64)> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    (rc == 0).then_some((ts.tv_sec, ts.tv_nsec))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    /// A link, FIFO, socket or device: neither listed nor entered.
    Other,
}

/// One folder as read: its entries by name, its rules, and the stats they were read with.
#[derive(Debug)]
struct Folder {
    stamp: Stamp,
    entries: Vec<(OsString, Kind)>,
    /// The ignore files the folder has, with their stats when read (`None`: not openable).
    ignore_files: Vec<(PathBuf, Option<Stamp>)>,
    rules: Option<Gitignore>,
}

impl Folder {
    /// Whether this folder, now of stat `now`, and its ignore files are as they were when
    /// read.
    fn unchanged(&self, now: Option<Stamp>) -> bool {
        now == Some(self.stamp) && self.ignore_files.iter().all(|(p, s)| stamp(p) == *s)
    }
}

/// The folders of one workspace a run's walks have read, kept while unchanged.
#[derive(Debug)]
pub(crate) struct Folders {
    /// The workspace's device when its change times can be trusted: folders elsewhere are
    /// read on every walk.
    dev: Option<u64>,
    kept: Mutex<HashMap<PathBuf, Arc<Folder>>>,
}

impl Folders {
    /// Nothing read yet of `workspace`.
    pub(crate) fn new(workspace: &Path) -> Folders {
        let local =
            nix::sys::statfs::statfs(workspace).is_ok_and(|s| LOCAL.contains(&s.filesystem_type()));
        let dev = std::fs::metadata(workspace)
            .ok()
            .filter(|_| local)
            .map(|m| m.dev());
        Folders {
            dev,
            kept: Mutex::default(),
        }
    }

    /// The files under `top` (absolute, in `workspace`, whose handle is `dir`) in the order of
    /// a depth-first walk with each folder's entries sorted by name, skipping `.git` and what
    /// ignore files or `ignored` (given a path and whether it is a folder) ignore. Nothing
    /// above `top` is looked at; a `top` that is a file is its own listing.
    pub(crate) fn files(
        &self,
        dir: &Dir,
        workspace: &Path,
        top: &Path,
        ignored: &dyn Fn(&Path, bool) -> bool,
    ) -> Vec<PathBuf> {
        let m = match std::fs::metadata(top) {
            Ok(m) if m.is_dir() => m,
            Ok(m) if m.is_file() => return vec![top.to_path_buf()],
            _ => return Vec::new(),
        };
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let mut walk = Walk {
            folders: self,
            dir,
            workspace,
            ignored,
            kept: &kept,
            seen: HashMap::new(),
            rules: Vec::new(),
            files: Vec::new(),
        };
        walk.visit(top, Some(Stamp::of(&m)));
        let Walk { seen, files, .. } = walk;
        // What was not seen again is gone, ignored now, or changed.
        kept.retain(|p, _| !p.starts_with(top));
        kept.extend(seen);
        files
    }
}

/// One walk: what it found, and the rules of the folders it is in.
struct Walk<'a> {
    folders: &'a Folders,
    dir: &'a Dir,
    workspace: &'a Path,
    ignored: &'a dyn Fn(&Path, bool) -> bool,
    kept: &'a HashMap<PathBuf, Arc<Folder>>,
    /// The folders read or found unchanged that can be kept.
    seen: HashMap<PathBuf, Arc<Folder>>,
    /// The rules of the folders from the top down to the one walked.
    rules: Vec<Arc<Folder>>,
    files: Vec<PathBuf>,
}

impl Walk<'_> {
    /// Walk the folder at `path`, whose stat is `stamp` when already asked for.
    fn visit(&mut self, path: &Path, stamp: Option<Stamp>) {
        let Some(folder) = self.folder(path, stamp) else {
            return;
        };
        let has_rules = folder.rules.is_some();
        if has_rules {
            self.rules.push(folder.clone());
        }
        for (name, kind) in &folder.entries {
            let entry = path.join(name);
            let is_dir = *kind == Kind::Dir;
            if name == ".git" || self.skipped(&entry, is_dir) || (self.ignored)(&entry, is_dir) {
                continue;
            }
            match kind {
                Kind::File => self.files.push(entry),
                Kind::Dir => self.visit(&entry, None),
                Kind::Other => {}
            }
        }
        if has_rules {
            self.rules.pop();
        }
    }

    /// Whether the nearest folder whose rules match `path` ignores it.
    fn skipped(&self, path: &Path, is_dir: bool) -> bool {
        self.rules
            .iter()
            .rev()
            .filter_map(|f| f.rules.as_ref())
            .map(|r| r.matched(path, is_dir))
            .find(|m| !m.is_none())
            .is_some_and(|m| m.is_ignore())
    }

    /// The folder at `path` as kept, when unchanged, or as read now; `None` when it cannot
    /// be opened.
    fn folder(&mut self, path: &Path, stamp: Option<Stamp>) -> Option<Arc<Folder>> {
        if let Some(kept) = self.kept.get(path)
            && kept.unchanged(stamp.or_else(|| self::stamp(path)))
        {
            self.seen.insert(path.to_path_buf(), kept.clone());
            return Some(kept.clone());
        }
        let (folder, settled) = self.read(path)?;
        let folder = Arc::new(folder);
        if settled {
            self.seen.insert(path.to_path_buf(), folder.clone());
        }
        Some(folder)
    }

    /// Read the folder at `path` beneath the workspace: its stat first, then its entries
    /// and ignore files; and whether what was read can be kept.
    fn read(&self, path: &Path) -> Option<(Folder, bool)> {
        let dev = self.folders.dev;
        let rel = path.strip_prefix(self.workspace).ok()?;
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let asked = coarse_now();
        let handle = self.dir.open_dir(rel).ok()?.into_std_file();
        let meta = handle.metadata().ok()?;
        let stamp = Stamp::of(&meta);
        let mut settled = meta.is_dir() && stamp.settled(asked, dev);
        let mut entries = Vec::new();
        for entry in Dir::from_std_file(handle).entries().ok()? {
            let kind = entry.and_then(|e| {
                let t = e.file_type()?;
                let t = if t.is_dir() || t.is_file() || t.is_symlink() {
                    t
                } else {
                    // Unknown to the listing, or not a file: the entry's own stat says.
                    e.metadata()?.file_type()
                };
                let kind = if t.is_dir() {
                    Kind::Dir
                } else if t.is_file() {
                    Kind::File
                } else {
                    Kind::Other
                };
                Ok((e.file_name(), kind))
            });
            match kind {
                Ok(entry) => entries.push(entry),
                Err(_) => settled = false,
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut builder = GitignoreBuilder::new(path);
        let mut ignore_files = Vec::new();
        for name in IGNORE_FILES {
            if !entries.iter().any(|(n, _)| n == name) {
                continue;
            }
            let file = path.join(name);
            let (stamp, complete) = add_rules(&mut builder, &file, dev);
            settled &= complete;
            ignore_files.push((file, stamp));
        }
        let rules = builder.build().ok().filter(|r| !r.is_empty());
        let folder = Folder {
            stamp,
            entries,
            ignore_files,
            rules,
        };
        Some((folder, settled))
    }
}

/// Add the lines of the ignore file `path` (links followed) to `builder`, as the `ignore`
/// crate reads them: lines that are not UTF-8 or do not parse are left out, and a byte-order
/// mark before the first is dropped. Only a regular file is read (opening a FIFO would wait for
/// a writer). Says the file's stat, and whether it was read whole and can be kept.
fn add_rules(
    builder: &mut GitignoreBuilder,
    path: &Path,
    dev: Option<u64>,
) -> (Option<Stamp>, bool) {
    use std::io::Read;
    let asked = coarse_now();
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
    let Ok(mut file) = opened else {
        return (None, true);
    };
    let Ok(meta) = file.metadata() else {
        return (None, false);
    };
    let stamp = Stamp::of(&meta);
    let mut bytes = Vec::new();
    let read = !meta.is_file() || file.read_to_end(&mut bytes).is_ok();
    let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    // The piece after the last newline is a line only when it is not empty.
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    // Those that ended with a newline: only they lose a `\r` before it.
    let ended = bytes.iter().filter(|b| **b == b'\n').count();
    for (i, line) in lines.into_iter().enumerate() {
        let line = match line.strip_suffix(b"\r") {
            Some(l) if i < ended => l,
            _ => line,
        };
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let line = if i == 0 {
            line.trim_start_matches('\u{feff}')
        } else {
            line
        };
        let _ = builder.add_line(Some(path.to_path_buf()), line);
    }
    (Some(stamp), read && stamp.settled(asked, dev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The walk as it was, through the `ignore` crate: what `Folders::files` must answer.
    fn reference(top: &Path) -> Vec<PathBuf> {
        ignore::WalkBuilder::new(top)
            .standard_filters(false)
            .add_custom_ignore_filename(".gitignore")
            .add_custom_ignore_filename(".ignore")
            .filter_entry(|e| e.file_name() != ".git")
            .sort_by_file_name(|a, b| a.cmp(b))
            .build()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
            .map(|e| e.into_path())
            .collect()
    }

    fn put(ws: &Path, rel: &str, text: &str) {
        let path = ws.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A workspace with nested ignore files, negations, an `.ignore` beside a `.gitignore`,
    /// links, a `.git` and names that sort around a folder's.
    fn workspace() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(tmp.path()).unwrap();
        for f in [
            "a.txt",
            "a/b.txt",
            "a.b/c.txt",
            "a-z.txt",
            "B.txt",
            "target/out.o",
            "keep/target/x.rs",
            "src/main.rs",
            "src/gen/g.rs",
            "src/gen/keep.rs",
            "src/notes.log",
            "src/important.log",
            "docs/x.md",
            "docs/deep/y.md",
            "docs/deep/z.tmp",
            "dir_only/f",
            "sub/dir_only",
            ".git/config",
            "nested/.git",
            "nested/n.txt",
            ".hidden/h.txt",
            "crlf/a",
            "crlf/b",
            "bom/x",
        ] {
            put(&ws, f, "x\n");
        }
        put(
            &ws,
            ".gitignore",
            "/target\n*.log\n!important.log\ndir_only/\nbad[\n",
        );
        put(&ws, ".ignore", "!notes.log\n");
        put(&ws, "src/.gitignore", "gen/*\n!gen/keep.rs\n");
        put(&ws, "docs/.ignore", "deep/\n");
        put(&ws, "docs/deep/.gitignore", "!*.md\n");
        put(&ws, "crlf/.gitignore", "a\r\nb\r");
        put(&ws, "bom/.gitignore", "\u{feff}x\n");
        std::os::unix::fs::symlink(ws.join("a.txt"), ws.join("link.txt")).unwrap();
        std::os::unix::fs::symlink(ws.join("src"), ws.join("srclink")).unwrap();
        std::os::unix::fs::symlink("/etc", ws.join("out")).unwrap();
        std::fs::create_dir(ws.join("lonely")).unwrap();
        std::os::unix::fs::symlink("../lonely/rules", ws.join("a/.ignore")).unwrap();
        (tmp, ws)
    }

    fn files(folders: &Folders, ws: &Path, top: &Path) -> Vec<PathBuf> {
        let dir = Dir::open_ambient_dir(ws, cap_std::ambient_authority()).unwrap();
        folders.files(&dir, ws, top, &|_, _| false)
    }

    #[test]
    fn answers_as_the_ignore_crate() {
        let (_tmp, ws) = workspace();
        let folders = Folders::new(&ws);
        for top in ["", "src", "docs", "docs/deep", "a.txt", "missing"] {
            let top = ws.join(top);
            assert_eq!(files(&folders, &ws, &top), reference(&top), "{top:?}");
        }
        let all = files(&folders, &ws, &ws);
        let rel: Vec<_> = all.iter().map(|p| p.strip_prefix(&ws).unwrap()).collect();
        assert!(rel.contains(&Path::new("src/notes.log")), "{rel:?}");
        assert!(!rel.contains(&Path::new("target/out.o")), "{rel:?}");
        assert!(!rel.iter().any(|p| p.starts_with(".git")), "{rel:?}");
    }

    #[test]
    fn a_kept_folder_is_read_again_when_it_or_its_rules_change() {
        let (_tmp, ws) = workspace();
        let folders = Folders::new(&ws);
        // Past a tick of the coarse clock, so that each change shows as a new time.
        let tick = || std::thread::sleep(Duration::from_millis(20));
        tick();
        let check = |folders: &Folders| {
            assert_eq!(files(folders, &ws, &ws), reference(&ws));
        };
        check(&folders);
        // Only a stat away when nothing changed, and kept only where the times are trusted.
        let kept = folders.kept.lock().unwrap().len();
        assert!(folders.dev.is_none() || kept > 10, "{kept}");
        tick();
        put(&ws, "docs/new.md", "x");
        check(&folders);
        tick();
        std::fs::remove_file(ws.join("a/b.txt")).unwrap();
        check(&folders);
        tick();
        // In place: the folder's stat stays, the file's does not.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(ws.join("src/.gitignore"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"main.rs\n").unwrap();
        drop(f);
        check(&folders);
        tick();
        // A link to an ignore file that did not exist: the folder with the link is unchanged.
        put(&ws, "lonely/rules", "b.txt\n");
        put(&ws, "a/b.txt", "x");
        check(&folders);
        tick();
        std::fs::remove_dir_all(ws.join("docs/deep")).unwrap();
        std::fs::create_dir(ws.join("docs/deep")).unwrap();
        put(&ws, "docs/deep/w.md", "x");
        check(&folders);
    }
}

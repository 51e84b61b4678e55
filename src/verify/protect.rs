//! Protected paths between tries: a snapshot of every path of the workspace the goal protects
//! (`protect` globs, `.git` at any depth; the files of a git object store listed with their
//! `stat`, not read), taken when the goal starts and again after each try's checks ran, and the comparison before the checks of each try, whose differences fail
//! the try as the check result `protected`. What matches is `crate::tools::Protected`'s.
//! The snapshot is kept in the run's folder (`protected.json`), so that a continued run
//! compares with what its first run started from, not with what that run left.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::tools::Protected;
use crate::trace::CheckReport;

/// The name of the check result a changed protected path gives.
pub(crate) const NAME: &str = "protected";

/// The file of a run's folder that keeps its snapshot.
pub(crate) const FILE: &str = "protected.json";

/// One protected path as it was.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Entry {
    /// File, folder, symlink (its target in `hash`) or other.
    kind: u32,
    mode: u32,
    #[serde(default, skip_serializing_if = "unhashed")]
    hash: [u8; 32],
    /// What a change of content always changes (a write moves `ctime`, which no one sets
    /// at will): while it is the same, the hash is not computed again.
    stat: (u64, u64, i64, i64, i64),
}

/// Every protected path of a workspace, workspace-relative.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Snapshot(BTreeMap<String, Entry>);

impl Snapshot {
    /// The snapshot kept in run folder `dir`, if one is.
    pub(crate) fn load(dir: &Path) -> Option<Snapshot> {
        let text = std::fs::read(dir.join(FILE)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Keep the snapshot in run folder `dir`; one that cannot be kept is said in the log.
    pub(crate) fn save(&self, dir: &Path) {
        let written = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(dir.join(FILE), b));
        if let Err(e) = written {
            tracing::warn!(
                "cannot keep the protected paths' snapshot in {}: {e}",
                dir.display()
            );
        }
    }
}

/// Take the snapshot of `workspace` (canonical); `previous` spares hashing what did not change.
pub(crate) fn take(workspace: &Path, guarded: &Protected, previous: &Snapshot) -> Snapshot {
    let mut out = BTreeMap::new();
    walk(workspace, "", false, guarded, previous, &mut out);
    Snapshot(out)
}

/// `dir` (workspace-relative `prefix`) into `out`; `in_git` when it lies in a protected
/// `.git`, where everything is protected and no glob needs asking. Only what is protected
/// is `stat`ed, and only what is protected, changed and outside an object store is read.
fn walk(
    dir: &Path,
    prefix: &str,
    in_git: bool,
    guarded: &Protected,
    previous: &Snapshot,
    out: &mut BTreeMap<String, Entry>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else {
            continue;
        };
        let name = e.file_name();
        let rel = if prefix.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{prefix}/{}", name.to_string_lossy())
        };
        let is_dir = ft.is_dir();
        // Outside a `.git`, only a path whose own name is `.git` can be one.
        let git = in_git || (name.eq_ignore_ascii_case(".git") && guarded.git_of(&rel).is_some());
        if git || guarded.glob_matches(&rel, is_dir) {
            // `DirEntry::metadata` does not follow a symlink.
            let Ok(meta) = e.metadata() else {
                continue;
            };
            let stat = (
                meta.dev(),
                meta.ino(),
                meta.size() as i64,
                meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
                meta.ctime_nsec() + meta.ctime() * 1_000_000_000,
            );
            let kind = meta.mode() & libc::S_IFMT;
            let hash = match previous.0.get(&rel) {
                _ if object_store(&rel) => UNHASHED,
                Some(p) if p.stat == stat && p.kind == kind => p.hash,
                _ => content_hash(&e.path(), &meta),
            };
            out.insert(
                rel.clone(),
                Entry {
                    kind,
                    mode: meta.mode() & 0o7777,
                    hash,
                    stat,
                },
            );
        }
        if is_dir {
            walk(&e.path(), &rel, git, guarded, previous, out);
        }
    }
}

/// The hash of what is only listed (an object store's files), and what is not kept of it.
const UNHASHED: [u8; 32] = [0; 32];

fn unhashed(hash: &[u8; 32]) -> bool {
    *hash == UNHASHED
}

fn content_hash(path: &Path, meta: &std::fs::Metadata) -> [u8; 32] {
    let mut h = Sha256::new();
    if meta.file_type().is_symlink() {
        if let Ok(t) = std::fs::read_link(path) {
            h.update(t.as_os_str().as_encoded_bytes());
        }
    } else if meta.is_file() {
        match std::fs::File::open(path) {
            Ok(mut f) => {
                use std::io::Read;
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = f.read(&mut buf) {
                    h.update(&buf[..n]);
                }
            }
            // Unreadable now: what it holds is unknown, so it counts as changed next time.
            Err(_) => h.update(fastrand::u64(..).to_le_bytes()),
        }
    }
    h.finalize().into()
}

/// The roots of what matches in `workspace` now (a match whose folder does not match): what
/// commands see read-only.
pub(crate) fn roots(workspace: &Path, guarded: &Protected) -> Vec<std::path::PathBuf> {
    let snap = take_shallow(workspace, guarded);
    snap.iter()
        .filter(|rel| {
            Path::new(rel)
                .ancestors()
                .skip(1)
                .filter(|a| !a.as_os_str().is_empty())
                .all(|a| !snap.contains(&a.display().to_string()))
        })
        .map(|rel| workspace.join(rel))
        .collect()
}

/// The protected paths of `workspace`, without hashing them.
fn take_shallow(workspace: &Path, guarded: &Protected) -> std::collections::BTreeSet<String> {
    fn go(ws: &Path, dir: &Path, g: &Protected, out: &mut std::collections::BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            let rel = crate::tools::paths::relative(ws, &path);
            if g.matches(&rel, is_dir) {
                out.insert(rel);
            } else if is_dir {
                go(ws, &path, g, out);
            }
        }
    }
    let mut out = Default::default();
    go(workspace, workspace, guarded, &mut out);
    out
}

/// What the start of the trace says about protection: a `.git` made writable on purpose, and
/// a goal whose command checks read files that nothing protects.
pub(crate) fn notices(goal: &super::Goal) -> Vec<String> {
    let mut out = Vec::new();
    for git in &goal.protect.git_writable {
        out.push(format!(
            "protect: {git} is writable on purpose (a `writable` entry names it): the agent \
             may change that repository, and the checks see what it made of it"
        ));
    }
    let commands = goal
        .checks
        .iter()
        .any(|c| matches!(c.kind, super::check::CheckKind::Command(_)));
    if commands && goal.protect.patterns.is_empty() {
        out.push(
            "protect: nothing is protected but .git, yet the checks are commands that read \
             files the agent may write (a conftest.py, a Makefile, the tests themselves); name \
             them with protect = [\"tests/**\", …] or --protect GLOB"
                .into(),
        );
    }
    out
}

/// Whether `rel` is in a git object store (`.git/objects/`, at any depth), whose files are
/// listed, not read: tens of thousands of them in a big repository, written once by git and
/// never again. Git's own housekeeping (`gc --auto` after a person's commit, detached in the
/// background) packs loose objects and prunes them, so they come and go without any change
/// to what the repository holds; a file that stays but whose `stat` moves (its bytes written
/// over, or a file moved over it) is told. The alternates (other object stores git reads)
/// are the repository's configuration, not objects: they are read and told as any file.
fn object_store(rel: &str) -> bool {
    let tail = match rel.strip_prefix(".git/objects/") {
        Some(t) => t,
        None => match rel.split_once("/.git/objects/") {
            Some((_, t)) => t,
            None => return false,
        },
    };
    !matches!(tail, "info/alternates" | "info/http-alternates")
}

/// What happened to each protected path between `before` and `after`, in path order.
pub(crate) fn compare(before: &Snapshot, after: &Snapshot) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for (rel, b) in &before.0 {
        let listed = object_store(rel);
        match after.0.get(rel) {
            None if listed => {}
            None => out.push((rel.clone(), "deleted")),
            Some(a) if a.kind != b.kind => out.push((rel.clone(), "changed")),
            Some(a) if listed => {
                if b.kind == libc::S_IFREG && a.stat != b.stat {
                    out.push((rel.clone(), "changed"))
                }
            }
            Some(a) if a.hash != b.hash => out.push((rel.clone(), "changed")),
            Some(a) if a.mode != b.mode => out.push((rel.clone(), "mode")),
            Some(_) => {}
        }
    }
    for rel in after
        .0
        .keys()
        .filter(|r| !before.0.contains_key(*r) && !object_store(r))
    {
        out.push((rel.clone(), "created"));
    }
    out.sort();
    out
}

/// The failed check result that says which protected paths changed and how.
pub(crate) fn report(changes: &[(String, &'static str)], guarded: &Protected) -> CheckReport {
    let mut tail = String::from(
        "These protected paths differ from the snapshot taken when the goal started, so no \
         check ran; put them back as they were and change the work instead:\n",
    );
    for (rel, what) in changes {
        tail.push_str(&format!("{rel} ({what})\n"));
    }
    if !guarded.patterns.is_empty() {
        tail.push_str(&format!(
            "(protect = [{}]; .git at any depth is always protected)\n",
            guarded.patterns.join(", ")
        ));
    }
    CheckReport {
        name: NAME.into(),
        passed: false,
        exit_status: None,
        outcome: format!("{} protected path(s) changed", changes.len()),
        duration_ms: 0,
        output_tail: tail,
        output_path: None,
        kind: Default::default(),
        model: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::write;

    /// The workspace taken again after `before`, and what changed since, as `path how`.
    fn again(ws: &Path, g: &Protected, before: &Snapshot) -> (Snapshot, Vec<String>) {
        let after = take(ws, g, before);
        let changes = compare(before, &after)
            .into_iter()
            .map(|(path, how)| format!("{path} {how}"))
            .collect();
        (after, changes)
    }

    #[test]
    fn created_changed_deleted_and_mode_are_told_apart() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, ws) = crate::testing::workspace();
        let g = Protected::new(&ws, &["tests/**".into(), "conftest.py".into()], &[]).unwrap();
        write(
            &ws,
            &[
                ("tests/a.py", "a"),
                ("tests/b.py", "b"),
                ("tests/c.py", "c"),
                ("src.py", "s"),
            ],
        );
        let before = take(&ws, &g, &Snapshot::default());
        assert!(again(&ws, &g, &before).1.is_empty());
        std::fs::remove_file(ws.join("tests/b.py")).unwrap();
        std::fs::set_permissions(ws.join("tests/c.py"), PermissionsExt::from_mode(0o755)).unwrap();
        write(
            &ws,
            &[
                ("tests/a.py", "A"),
                ("conftest.py", "x"),
                ("src.py", "changed freely"),
                ("app/.git", "gitdir: .g\n"),
            ],
        );
        assert_eq!(
            again(&ws, &g, &before).1,
            [
                "app/.git created",
                "conftest.py created",
                "tests/a.py changed",
                "tests/b.py deleted",
                "tests/c.py mode",
            ]
        );
        assert_eq!(roots(&ws, &g).len(), 4, "{:?}", roots(&ws, &g));
    }

    #[test]
    fn objects_packed_or_pruned_by_git_are_no_change_but_an_objects_bytes_are() {
        let (_dir, ws) = crate::testing::workspace();
        let g = Protected::new(&ws, &[], &[]).unwrap();
        std::fs::create_dir_all(ws.join(".git/objects/pack")).unwrap();
        write(
            &ws,
            &[
                (".git/objects/4e/e5c6", "loose"),
                (".git/objects/4e/e710", "kept"),
                (".git/HEAD", "ref: refs/heads/main\n"),
            ],
        );
        let before = take(&ws, &g, &Snapshot::default());
        // What `git gc --auto` does: a pack made, the loose object pruned.
        std::fs::remove_file(ws.join(".git/objects/4e/e5c6")).unwrap();
        write(&ws, &[(".git/objects/pack/pack-1.pack", "packed")]);
        assert!(again(&ws, &g, &before).1.is_empty());
        write(
            &ws,
            &[
                (".git/objects/4e/e710", "forged"),
                (".git/HEAD", "ref: refs/heads/other\n"),
                // Other object stores git would read: configuration, told when made.
                (".git/objects/info/alternates", "/elsewhere\n"),
            ],
        );
        let (after, changes) = again(&ws, &g, &before);
        assert_eq!(
            changes,
            [
                ".git/HEAD changed",
                ".git/objects/4e/e710 changed",
                ".git/objects/info/alternates created",
            ]
        );
        // Objects are listed, not read: their bytes are not kept.
        assert!(unhashed(&after.0[".git/objects/4e/e710"].hash));
        assert!(!unhashed(&after.0[".git/HEAD"].hash));
    }
}

//! Confinement of file tools to the workspace: a path that resolves outside it — through
//! `..`, as an absolute path, or through a symlink — is refused before anything is touched.
//! Files are opened beneath the workspace with `cap-std` (`openat2` with `RESOLVE_BENEATH`
//! where the kernel has it), so a symlink flipped between the check and the open cannot lead
//! out; what rules judge is the resolved path.

use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use ignore::gitignore::Gitignore;

use super::ToolError;
use super::walk::Folders;

/// What a work loop resolves once about its workspace, instead of on every tool call: the
/// directory handle that nothing opened through can escape, the ignore rules that come
/// from outside the workspace's own folders (git's global excludes file, the repository's
/// `info/exclude`), which listing and search apply as git does, and the folders their walks
/// read, kept while unchanged.
#[derive(Debug)]
pub struct Root {
    dir: Result<Dir, String>,
    global: Gitignore,
    exclude: Gitignore,
    folders: Folders,
}

impl Root {
    /// Open `workspace` (canonical) and read its outside ignore rules.
    pub fn open(workspace: &Path) -> Root {
        let dir = Dir::open_ambient_dir(workspace, ambient_authority())
            .map_err(|e| format!("cannot open the workspace {}: {e}", workspace.display()));
        // As the `ignore` crate builds it: relative to the current folder.
        let (global, _) = Gitignore::global();
        let exclude = git_common_dir(workspace)
            .map(|common| {
                let mut b = ignore::gitignore::GitignoreBuilder::new(workspace);
                b.add(common.join("info/exclude"));
                b.build().unwrap_or_else(|_| Gitignore::empty())
            })
            .unwrap_or_else(Gitignore::empty);
        Root {
            dir,
            global,
            exclude,
            folders: Folders::new(workspace),
        }
    }

    /// The workspace's directory handle.
    pub(crate) fn dir(&self) -> Result<&Dir, ToolError> {
        self.dir.as_ref().map_err(|e| ToolError::Failed(e.clone()))
    }

    /// Whether git's global excludes (and, for a walk from the workspace's top,
    /// the repository's `info/exclude`) ignore `path`.
    fn ignored(&self, path: &Path, is_dir: bool, at_top: bool) -> bool {
        (at_top && self.exclude.matched(path, is_dir).is_ignore())
            || self.global.matched(path, is_dir).is_ignore()
    }

    /// The workspace's files under `top` (absolute, in `workspace`), in sorted walk order,
    /// skipping `.git` and what `.gitignore` and `.ignore` files under `top` ignore (an
    /// `.ignore` wins over a `.gitignore` beside it), and what git's global excludes and the
    /// repository's `info/exclude` do. Nothing above `top` is looked at.
    pub(crate) fn files(&self, workspace: &Path, top: &Path) -> Result<Vec<PathBuf>, ToolError> {
        let at_top = top == workspace;
        Ok(self
            .folders
            .files(self.dir()?, workspace, top, &|path, is_dir| {
                self.ignored(path, is_dir, at_top)
            }))
    }
}

/// The common git folder of the repository whose top is `workspace`: its `.git` folder, or,
/// for a worktree (`.git` a file naming its git folder), the one its `commondir` names.
fn git_common_dir(workspace: &Path) -> Option<PathBuf> {
    let git = workspace.join(".git");
    let meta = std::fs::symlink_metadata(&git).ok()?;
    if meta.is_dir() {
        return Some(git);
    }
    let text = std::fs::read_to_string(&git).ok()?;
    let real = PathBuf::from(text.lines().next()?.strip_prefix("gitdir: ")?);
    let real = if real.is_relative() {
        workspace.join(real)
    } else {
        real
    };
    let common = std::fs::read_to_string(real.join("commondir")).ok()?;
    let common = Path::new(common.lines().next()?);
    Some(if common.is_relative() {
        real.join(common)
    } else {
        common.to_path_buf()
    })
}

/// The path an opened file really has, from the kernel (`/proc/self/fd`); what a racing
/// symlink cannot fake.
pub(crate) fn real_path(file: &std::fs::File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// The path rules judge for a typed path: where it really leads, relative to the workspace,
/// symlinks resolved; the lexically normalized typed path when it leads nowhere inside (the
/// tools refuse those anyway).
pub(crate) fn rule_path(workspace: &Path, rel: &str) -> String {
    match resolve(workspace, rel) {
        Ok(real) if real == workspace => ".".into(),
        Ok(real) => relative(workspace, &real),
        Err(_) => normalize(rel),
    }
}

/// `./a/../b//c` → `b/c`, so a pattern sees one spelling of a path.
pub(crate) fn normalize(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if out.pop().is_none() {
                    out.push("..");
                }
            }
            p => out.push(p),
        }
    }
    if out.is_empty() {
        ".".into()
    } else {
        out.join("/")
    }
}

/// Whether a workspace-relative path is inside a `.git` folder (the workspace's, a nested
/// repository's or a submodule's), which only git writes.
pub(crate) fn in_git(rel: &str) -> bool {
    Path::new(rel)
        .components()
        .any(|c| c.as_os_str().eq_ignore_ascii_case(".git"))
}

/// What a goal protects from the agent (`protect = [globs]`): gitignore-style globs
/// relative to the workspace (a pattern without `/` matches at any depth, a folder's match
/// covers what is in it), and `.git` at any depth, file or folder, unless a `writable` entry
/// names that `.git` on purpose.
#[derive(Clone, Debug, Default)]
pub struct Protected {
    globs: Option<ignore::gitignore::Gitignore>,
    /// The globs as written.
    pub(crate) patterns: Vec<String>,
    /// Workspace-relative `.git` paths that a `writable` entry names.
    pub(crate) git_writable: Vec<String>,
}

/// Names no glob that protects only part of a workspace matches all of.
const PROBES: [(&str, bool); 3] = [
    ("sup-probe-q7x", false),
    ("sup-probe-q7x", true),
    (".sup-probe-q7x.d/x.y", false),
];

impl Protected {
    /// Check one glob: it parses, and it does not protect the whole workspace (the agent could
    /// change nothing then).
    pub(crate) fn check_glob(glob: &str) -> Result<(), String> {
        globset::GlobBuilder::new(glob.trim_start_matches('!'))
            .literal_separator(true)
            .build()
            .map_err(|e| format!("protect glob `{glob}` does not parse: {e}"))?;
        let mut b = ignore::gitignore::GitignoreBuilder::new("/");
        b.add_line(None, glob)
            .map_err(|e| format!("protect glob `{glob}` does not parse: {e}"))?;
        let g = b
            .build()
            .map_err(|e| format!("protect glob `{glob}` does not parse: {e}"))?;
        if g.num_ignores() == 0 {
            return Err(format!(
                "protect glob `{glob}` protects nothing (empty, a comment or a negation)"
            ));
        }
        if PROBES
            .iter()
            .all(|(p, dir)| g.matched_path_or_any_parents(p, *dir).is_ignore())
        {
            return Err(format!(
                "protect glob `{glob}` matches the whole workspace, so the agent could change \
                 nothing; name the files the checks read, e.g. [\"tests/**\", \"conftest.py\"]"
            ));
        }
        Ok(())
    }

    /// The protection of `workspace` (canonical): `globs`, and every `.git` but those the
    /// `writable` folders (absolute) name.
    pub(crate) fn new(
        workspace: &Path,
        globs: &[String],
        writable: &[PathBuf],
    ) -> Result<Protected, String> {
        let built = if globs.is_empty() {
            None
        } else {
            let mut b = ignore::gitignore::GitignoreBuilder::new(workspace);
            for g in globs {
                Self::check_glob(g)?;
                b.add_line(None, g)
                    .map_err(|e| format!("protect glob `{g}` does not parse: {e}"))?;
            }
            Some(b.build().map_err(|e| format!("protect globs: {e}"))?)
        };
        let git_writable = writable
            .iter()
            .filter(|w| {
                w.file_name()
                    .is_some_and(|n| n.eq_ignore_ascii_case(".git"))
            })
            .filter_map(|w| w.strip_prefix(workspace).ok())
            .map(|r| r.display().to_string())
            .collect();
        Ok(Protected {
            globs: built,
            patterns: globs.to_vec(),
            git_writable,
        })
    }

    /// Whether a glob matches this workspace-relative path (or a folder it is in).
    pub(crate) fn glob_matches(&self, rel: &str, is_dir: bool) -> bool {
        let rel = rel.trim_start_matches("./");
        if rel.is_empty() || rel == "." {
            return false;
        }
        self.globs
            .as_ref()
            .is_some_and(|g| g.matched_path_or_any_parents(rel, is_dir).is_ignore())
    }

    /// The `.git` this workspace-relative path is or lies in, unless `writable` names it.
    pub(crate) fn git_of(&self, rel: &str) -> Option<String> {
        let mut prefix = PathBuf::new();
        for c in Path::new(rel).components() {
            prefix.push(c);
            if c.as_os_str().eq_ignore_ascii_case(".git") {
                let p = prefix.display().to_string();
                return (!self.git_writable.contains(&p)).then_some(p);
            }
        }
        None
    }

    /// Whether the agent may not change this workspace-relative path.
    pub(crate) fn matches(&self, rel: &str, is_dir: bool) -> bool {
        self.git_of(rel).is_some() || self.glob_matches(rel, is_dir)
    }
}

/// Resolve `rel` inside `workspace` (which must be canonical). The result is the real path
/// of the deepest existing ancestor joined with the components that do not exist yet.
pub(crate) fn resolve(workspace: &Path, rel: &str) -> Result<PathBuf, ToolError> {
    let given = Path::new(rel);
    if given.is_absolute() {
        return Err(ToolError::Invalid(format!(
            "`{rel}` is an absolute path; paths are relative to the workspace, and nothing \
             outside it can be read or written"
        )));
    }
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in given.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(ToolError::Invalid(format!(
                        "`{rel}` leads outside the workspace; nothing outside it can be read \
                         or written"
                    )));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(ToolError::Invalid(format!(
                    "`{rel}` is not a relative path"
                )));
            }
        }
    }
    // Walk down from the workspace, resolving symlinks as they are met.
    let mut real = workspace.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        let next = real.join(part);
        match std::fs::symlink_metadata(&next) {
            // `real` is already resolved, so a component that is no symlink adds nothing to
            // resolve: no `canonicalize` (a `readlink` per component of the whole path).
            Ok(meta) if !meta.file_type().is_symlink() => real = next,
            Ok(_) => {
                let canon = std::fs::canonicalize(&next).map_err(|_| {
                    ToolError::Invalid(format!(
                        "`{rel}` goes through a symlink that points nowhere; refused"
                    ))
                })?;
                if !canon.starts_with(workspace) {
                    return Err(ToolError::Invalid(format!(
                        "`{rel}` goes through a symlink to {} outside the workspace; refused",
                        canon.display()
                    )));
                }
                real = canon;
            }
            Err(_) => {
                for rest in &parts[i..] {
                    real.push(rest);
                }
                return Ok(real);
            }
        }
    }
    Ok(real)
}

/// `path` relative to the workspace, for messages.
pub(crate) fn relative(workspace: &Path, path: &Path) -> String {
    path.strip_prefix(workspace)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_escapes() {
        let (_dir, ws) = crate::testing::workspace();
        std::fs::create_dir(ws.join("a")).unwrap();
        assert!(resolve(&ws, "../x").is_err());
        assert!(resolve(&ws, "a/../../x").is_err());
        assert!(resolve(&ws, "/etc/passwd").is_err());
        assert_eq!(resolve(&ws, "a/../b/c").unwrap(), ws.join("b/c"));
        std::os::unix::fs::symlink("/tmp", ws.join("out")).unwrap();
        assert!(resolve(&ws, "out/x").is_err());
        std::os::unix::fs::symlink(ws.join("a"), ws.join("in")).unwrap();
        assert_eq!(resolve(&ws, "in/f").unwrap(), ws.join("a/f"));
        assert_eq!(rule_path(&ws, "./in/../in/f"), "a/f");
        assert_eq!(rule_path(&ws, "."), ".");
        assert_eq!(rule_path(&ws, "../x"), "../x");
        assert!(in_git(".git/hooks/pre-commit") && in_git("sub/.git/config"));
        assert!(!in_git("src/.gitignore") && !in_git("a.git/x"));
    }

    #[test]
    fn protected_globs_are_gitignore_style() {
        let ws = Path::new("/w");
        let p = Protected::new(
            ws,
            &["conftest.py".into(), "tests/**".into(), "/Makefile".into()],
            &[ws.join("vendor/.git")],
        )
        .unwrap();
        assert!(p.matches("conftest.py", false) && p.matches("a/b/conftest.py", false));
        assert!(p.matches("tests/test_x.py", false) && p.matches("tests/d/e.py", false));
        assert!(p.matches("Makefile", false) && !p.matches("src/Makefile", false));
        assert!(!p.matches("src/app.py", false) && !p.matches("tests", true));
        assert!(p.matches(".git", true) && p.matches("app/.git", false));
        assert!(p.matches("a/.GIT/config", false) && !p.matches("vendor/.git/config", false));
        for whole in ["*", "**", "/*", "**/*", "?*"] {
            assert!(Protected::check_glob(whole).is_err(), "{whole}");
        }
        assert!(Protected::check_glob("tests/[").is_err());
        assert!(Protected::check_glob("*.py").is_ok() && Protected::check_glob(".*").is_ok());
    }
}

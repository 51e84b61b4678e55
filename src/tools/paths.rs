//! Confinement of file tools to the workspace: a path that resolves outside it — through
//! `..`, as an absolute path, or through a symlink — is refused before anything is touched.
//! Files are opened beneath the workspace with `cap-std` (`openat2` with `RESOLVE_BENEATH`
//! where the kernel has it), so a symlink flipped between the check and the open cannot lead
//! out; what rules judge is the resolved path.

use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use super::ToolError;

/// The workspace as a directory handle that nothing opened through can escape.
pub(crate) fn workspace_dir(workspace: &Path) -> Result<Dir, ToolError> {
    Dir::open_ambient_dir(workspace, ambient_authority()).map_err(|e| {
        ToolError::Failed(format!(
            "cannot open the workspace {}: {e}",
            workspace.display()
        ))
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
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
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
}

//! The git the agent's processes run: pinned to the repository sup protects, with the
//! configuration keys that run programs neutralised.
//!
//! `GIT_DIR` and `GIT_WORK_TREE` name the repository the workspace is in when the run starts
//! (its own or one above it, found as git finds it), so a repository the agent makes below
//! (`git init --separate-git-dir`, a `.git` file holding `gitdir: …`, a folder filled to look
//! like one) is never used; where the workspace is in none, `GIT_DIR` names nothing, so git
//! finds no repository at all. Command-line configuration (`GIT_CONFIG_COUNT`), which wins
//! over every configuration file, turns off what runs programs (`core.fsmonitor`, hooks, the
//! pager, editors, credential helpers, `diff.external`, gpg), and `GIT_ATTR_SOURCE` reads
//! attributes from the empty tree, so no `.gitattributes` the agent writes selects a diff,
//! merge or filter driver.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// What `GIT_DIR` is where the workspace is in no repository: git then finds none.
const NO_REPOSITORY: &str = "/dev/null";

/// The empty tree, by object format: attributes read from it are none.
const EMPTY_TREE_SHA1: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
const EMPTY_TREE_SHA256: &str = "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321";

/// An external diff program is replaced by git's own diff of the same two files (git calls
/// it with the path, then the old file, hex and mode, then the new), the temporary files'
/// names in its header replaced by the path.
const OWN_DIFF: &str = r#"f() { git --no-pager diff --no-ext-diff --no-index -- "$2" "$5" | awk -v o="${2#/}" -v w="${5#/}" -v n="$1" 'NR <= 4 { for (k = 0; k < 2; k++) { s = k ? w : o; i = index($0, s); if (i && s != n && s != "dev/null") $0 = substr($0, 1, i - 1) n substr($0, i + length(s)) } } { print }'; true; }; f"#;

/// Configuration that turns off what runs programs, as command-line settings.
const NEUTRAL: &[(&str, &str)] = &[
    ("core.fsmonitor", "false"),
    ("core.hooksPath", NO_REPOSITORY),
    ("core.sshCommand", "false"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("core.askPass", ""),
    ("core.attributesFile", NO_REPOSITORY),
    ("credential.helper", ""),
    ("diff.external", OWN_DIFF),
    ("gpg.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    ("sequence.editor", "false"),
    ("protocol.ext.allow", "never"),
];

/// A repository: its git folder and its work tree.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Repository {
    git_dir: PathBuf,
    work_tree: PathBuf,
}

/// The repository `workspace` is in, as git would find it: the nearest folder at or above it
/// with a `.git` folder holding `HEAD`, or a `.git` file naming one (`gitdir: …`, a worktree
/// or a submodule). Bare repositories are not looked for (`safe.bareRepository=explicit`).
pub(crate) fn repository_of(workspace: &Path) -> Option<Repository> {
    let start = std::fs::canonicalize(workspace).ok()?;
    for dir in start.ancestors() {
        let dot_git = dir.join(".git");
        let Ok(meta) = std::fs::metadata(&dot_git) else {
            continue;
        };
        let git_dir = if meta.is_dir() {
            dot_git
        } else if meta.is_file() {
            let text = std::fs::read_to_string(&dot_git).ok()?;
            let named = text.lines().next()?.strip_prefix("gitdir:")?.trim();
            dir.join(named)
        } else {
            continue;
        };
        let git_dir = std::fs::canonicalize(&git_dir).ok()?;
        if !git_dir.join("HEAD").is_file() {
            return None;
        }
        return Some(Repository {
            git_dir,
            work_tree: dir.to_path_buf(),
        });
    }
    None
}

/// Whether the repository's objects are named by SHA-256.
fn sha256(git_dir: &Path) -> bool {
    let common = std::fs::read_to_string(git_dir.join("commondir"))
        .map(|c| git_dir.join(c.trim()))
        .unwrap_or_else(|_| git_dir.to_path_buf());
    std::fs::read_to_string(common.join("config")).is_ok_and(|c| {
        c.lines().any(|l| {
            let l = l.trim().to_ascii_lowercase().replace(' ', "");
            l == "objectformat=sha256"
        })
    })
}

/// `env` with git pinned to the repository `workspace` is in (none where it is in none) and
/// its program-running configuration neutralised, after any `GIT_CONFIG_COUNT` settings
/// already there.
pub(crate) fn pin(
    mut env: Vec<(OsString, OsString)>,
    workspace: &Path,
) -> Vec<(OsString, OsString)> {
    let repo = repository_of(workspace);
    let n: usize = env
        .iter()
        .find(|(k, _)| k == "GIT_CONFIG_COUNT")
        .and_then(|(_, v)| v.to_str()?.parse().ok())
        .unwrap_or(0);
    env.retain(|(k, _)| {
        ![
            "GIT_DIR",
            "GIT_WORK_TREE",
            "GIT_COMMON_DIR",
            "GIT_CONFIG_COUNT",
            "GIT_ATTR_SOURCE",
        ]
        .iter()
        .any(|g| k == g)
    });
    let mut add = |k: String, v: OsString| env.push((k.into(), v));
    match &repo {
        Some(r) => {
            add("GIT_DIR".into(), r.git_dir.clone().into());
            add("GIT_WORK_TREE".into(), r.work_tree.clone().into());
        }
        None => add("GIT_DIR".into(), NO_REPOSITORY.into()),
    }
    let empty = match &repo {
        Some(r) if sha256(&r.git_dir) => EMPTY_TREE_SHA256,
        _ => EMPTY_TREE_SHA1,
    };
    add("GIT_ATTR_SOURCE".into(), empty.into());
    for (i, (key, value)) in NEUTRAL.iter().enumerate() {
        add(format!("GIT_CONFIG_KEY_{}", n + i), (*key).into());
        add(format!("GIT_CONFIG_VALUE_{}", n + i), (*value).into());
    }
    add(
        "GIT_CONFIG_COUNT".into(),
        (n + NEUTRAL.len()).to_string().into(),
    );
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_below_a_repository_is_in_it() {
        let (_dir, top) =
            crate::testing::workspace_with(&[(".git/HEAD", "ref: refs/heads/main\n")]);
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        let found = repository_of(&top.join("a/b")).unwrap();
        assert_eq!(found.git_dir, top.join(".git"));
        assert_eq!(found.work_tree, top);
    }

    #[test]
    fn a_git_file_names_the_folder() {
        let (_dir, top) = crate::testing::workspace_with(&[
            ("gd/HEAD", "ref: refs/heads/main\n"),
            (".git", "gitdir: gd\n"),
        ]);
        assert_eq!(repository_of(&top).unwrap().git_dir, top.join("gd"));
    }

    #[test]
    fn settings_come_after_those_already_there() {
        let env = vec![
            ("GIT_CONFIG_COUNT".into(), "1".into()),
            ("GIT_DIR".into(), "/elsewhere".into()),
        ];
        let out = pin(env, Path::new("/nonexistent-sup-workspace"));
        let get = |k: &str| out.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("GIT_DIR"), Some(NO_REPOSITORY.into()));
        assert_eq!(get("GIT_CONFIG_KEY_1"), Some("core.fsmonitor".into()));
        assert_eq!(
            get("GIT_CONFIG_COUNT"),
            Some((1 + NEUTRAL.len()).to_string().into())
        );
        assert_eq!(out.iter().filter(|(k, _)| k == "GIT_DIR").count(), 1);
    }
}

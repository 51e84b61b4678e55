//! The hidden files of a jail: SUP_HOME (but for the run's own folder, the workspace and the
//! goal's folder), `/etc/sup`, the key file and the common credential stores, and `hidden`,
//! apart from `readable`: which paths are mounted over with empty ones (`mounts::Hide`),
//! and what is shown again inside each.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::mounts::{Hide, MAX_SHOWN};
use super::policy::Sandbox;

/// Credential stores hidden from every jailed process, relative to the home folder.
const CREDENTIALS: &[&str] = &[
    ".config/sup/env",
    ".ssh",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker/config.json",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    ".config/gh",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials.toml",
];

/// `~/…` under the home folder sup was started with; other paths as they are.
fn expand_home(p: &Path) -> PathBuf {
    match (p.strip_prefix("~"), crate::startup::var("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => p.to_path_buf(),
    }
}

fn c_path(p: &Path) -> Option<CString> {
    CString::new(p.as_os_str().as_bytes()).ok()
}

/// What to mount over, the paths for the trace, and the empty file bound over hidden files.
pub(super) fn plan(
    s: &Sandbox,
    home: &Path,
    writable: &[PathBuf],
    run_dir: &Path,
    workspace: &Path,
) -> Result<(Vec<Hide>, Vec<PathBuf>, CString), String> {
    let mut hides = Vec::new();
    let mut hidden_out = Vec::new();
    let readable: Vec<PathBuf> = s
        .readable
        .iter()
        .map(|r| lenient_canonical(&expand_home(r)))
        .collect();
    let mut list: Vec<PathBuf> = vec![PathBuf::from("/etc/sup"), home.to_path_buf()];
    list.extend(
        CREDENTIALS
            .iter()
            .map(|c| expand_home(&Path::new("~").join(c))),
    );
    list.extend(s.hidden.iter().map(|h| expand_home(h)));
    let mut hidden: Vec<PathBuf> = list
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| !readable.iter().any(|r| p.starts_with(r)))
        .collect();
    hidden.sort_by_key(|p| p.components().count());
    hidden.dedup();
    let mut keep: Vec<PathBuf> = writable.to_vec();
    keep.extend([run_dir.to_path_buf(), workspace.to_path_buf()]);
    // The goal's own folder (its command tools and check data) and the daemon's goals
    // folder stay visible, wherever SUP_HOME is.
    keep.extend(
        s.protect
            .iter()
            .filter_map(|p| p.parent().map(Path::to_path_buf)),
    );
    keep.extend(s.goals.iter().cloned());
    keep.extend(readable);
    let keep: Vec<PathBuf> = keep.iter().map(|k| lenient_canonical(k)).collect();
    let empty = run_dir.join("empty");
    if std::fs::write(&empty, b"").is_err() {
        return Err(format!(
            "cannot create {}: no file is hidden",
            empty.display()
        ));
    }
    let empty = c_path(&lenient_canonical(&empty)).unwrap_or_default();
    let mut done: Vec<(PathBuf, Vec<PathBuf>)> = Vec::new();
    for p in hidden {
        // Within a folder hidden already, only what is shown again in it needs hiding.
        if done
            .iter()
            .any(|(d, shown)| p.starts_with(d) && !shown.iter().any(|k| p.starts_with(k)))
        {
            continue;
        }
        // The workspace itself, or a folder holding it that is not SUP_HOME, stays.
        if workspace.starts_with(&p) && p != home {
            continue;
        }
        let dir = p.is_dir();
        let mut shown: Vec<PathBuf> = keep
            .iter()
            .filter(|k| k.starts_with(&p) && **k != p && k.exists())
            .cloned()
            .collect();
        shown.sort_by_key(|k| k.components().count());
        let mut outer: Vec<PathBuf> = Vec::new();
        for k in shown {
            if !outer.iter().any(|o| k.starts_with(o)) {
                outer.push(k);
            }
        }
        outer.truncate(MAX_SHOWN);
        let mut make: Vec<PathBuf> = Vec::new();
        for k in &outer {
            let mut ancestors: Vec<PathBuf> = k
                .ancestors()
                .skip(1)
                .take_while(|a| *a != p)
                .map(Path::to_path_buf)
                .collect();
            ancestors.reverse();
            for a in ancestors {
                if !make.contains(&a) {
                    make.push(a);
                }
            }
        }
        let (Some(path), Some(make), Some(shown_c)) = (
            c_path(&p),
            make.iter().map(|m| c_path(m)).collect::<Option<Vec<_>>>(),
            outer
                .iter()
                .map(|k| Some((c_path(k)?, !k.is_dir())))
                .collect::<Option<Vec<_>>>(),
        ) else {
            continue;
        };
        hides.push(Hide {
            path,
            dir,
            make,
            shown: shown_c,
        });
        hidden_out.push(p.clone());
        done.push((p, outer));
    }
    Ok((hides, hidden_out, empty))
}

/// `p` made absolute and free of links as far as it exists; the rest as written.
pub(super) fn lenient_canonical(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut cur = p;
    loop {
        let here = if cur.as_os_str().is_empty() {
            Path::new(".")
        } else {
            cur
        };
        if let Ok(mut out) = std::fs::canonicalize(here) {
            out.extend(rest.iter().rev());
            return out;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

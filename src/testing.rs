//! Helpers of the unit tests: a workspace in a temporary folder, and files written into it.

use std::path::{Path, PathBuf};

/// A temporary folder and its canonical path, which is what the code under test compares
/// paths with. The folder goes when the `TempDir` is dropped.
pub(crate) fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}

/// A workspace (as `workspace`) holding `files` (as `write`).
pub(crate) fn workspace_with(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let (dir, path) = workspace();
    write(&path, files);
    (dir, path)
}

/// Write each `(path, text)` beneath `root`, making the folders it lies in.
pub(crate) fn write(root: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = root.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, text).unwrap();
    }
}

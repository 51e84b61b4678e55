//! Gitignore-style glob sets relative to a folder (`watch = ["src/**"]`): checked when a goal
//! file is read, matched against paths under the folder. A leaf: it uses nothing of the
//! crate, so config and the daemon both use it.

use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// Globs as gitignore reads them: a pattern without `/` matches at any depth, a folder's
/// match covers what is in it, `!` takes a path back out.
#[derive(Clone, Debug)]
pub(crate) struct Globs(Gitignore);

impl Globs {
    /// The globs of `root`; an error names the glob that does not parse, or says the list
    /// matches nothing.
    pub(crate) fn new(root: &Path, globs: &[String]) -> Result<Globs, String> {
        let mut b = GitignoreBuilder::new(root);
        for g in globs {
            globset::GlobBuilder::new(g.trim_start_matches('!'))
                .literal_separator(true)
                .build()
                .map_err(|e| format!("key `watch`: glob `{g}` does not parse: {e}"))?;
            b.add_line(None, g)
                .map_err(|e| format!("key `watch`: glob `{g}` does not parse: {e}"))?;
        }
        let built = b.build().map_err(|e| format!("key `watch`: {e}"))?;
        if !globs.is_empty() && built.num_ignores() == 0 {
            return Err(
                "key `watch`: the globs watch nothing (all empty, comments or negations)".into(),
            );
        }
        Ok(Globs(built))
    }

    /// Whether a path relative to the root (a file, or in a folder) matches.
    pub(crate) fn matches(&self, rel: &Path) -> bool {
        !rel.as_os_str().is_empty()
            && rel.is_relative()
            && self.0.matched_path_or_any_parents(rel, false).is_ignore()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn globs(g: &[&str]) -> Result<Globs, String> {
        let g: Vec<String> = g.iter().map(|s| s.to_string()).collect();
        Globs::new(Path::new("/ws"), &g)
    }

    #[test]
    fn globs_match_as_gitignore_does() {
        let g = globs(&["src/**", "*.py", "!src/gen/**"]).unwrap();
        assert!(g.matches(Path::new("src/main.rs")));
        assert!(g.matches(Path::new("src/a/b.rs")));
        assert!(g.matches(Path::new("tools/x.py")));
        assert!(!g.matches(Path::new("src/gen/out.rs")));
        assert!(!g.matches(Path::new("README.md")));
        assert!(!g.matches(Path::new("")));
    }

    #[test]
    fn a_bad_glob_is_named() {
        let e = globs(&["src/[x"]).unwrap_err();
        assert!(e.contains("src/[x"), "{e}");
        assert!(globs(&["!x", "#y"]).unwrap_err().contains("nothing"));
    }
}

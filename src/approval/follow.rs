//! What a file runs in turn, as far as its text says: the files a shell script sources or
//! runs, the workspace modules a Python file imports (by a literal name too), the relative
//! modules a JavaScript or TypeScript file requires or imports, the files a makefile includes
//! and its recipes run.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;

use super::words::{Lang, commands, operands, packages};

/// `import a.b`, `import a, b as c` (the modules), on a line or after `;` or `:`.
static PY_IMPORT: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"(?m)(?:^|[;:])\s*import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)",
    )
    .ok()
});
/// `from .a.b import c, d`, `from a import (c,\n d)` (the dots, the module, the names).
static PY_FROM: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?m)(?:^|[;:])\s*from\s+(\.*)([\w.]*)\s+import\s+(?:\(([^)]*)\)|([\w \t,]+))").ok()
});
/// `importlib.import_module('a.b')`, `__import__("a")` (the module).
static PY_BY_NAME: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r#"\b(?:__import__|import_module)\(\s*['"]([\w.]+)['"]"#).ok());
/// `require('./x')`, `import x from "../y"`, `import "./z"`, `import('./w')`, `export … from './v'`.
static JS_RELATIVE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r#"(?:\brequire\s*\(\s*|\bimport\s*\(?\s*|\bfrom\s*)['"`](\.{1,2}/[^'"`$]+)['"`]"#)
        .ok()
});
/// `include a.mk b.mk`, `-include`, `sinclude`.
static MAKE_INCLUDE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?m)^\s*(?:-|s)?include\s+(.+)$").ok());

/// The workspace files that `text`, a file in `dir` read as `lang`, runs: as named, and
/// where they are.
pub(super) fn runs_in(lang: Lang, text: &str, dir: &Path, workspace: &Path) -> Vec<PathBuf> {
    let mut names: Vec<PathBuf> = Vec::new();
    match lang {
        Lang::Shell => {
            for words in text.lines().flat_map(commands) {
                for f in operands(&words) {
                    if !f.contains('$') {
                        names.push(workspace.join(&f));
                        names.push(dir.join(&f));
                        continue;
                    }
                    // A path made at run time (`"$(dirname "$0")/lib.sh"`,
                    // `${BASH_SOURCE%/*}/x.sh`, `$DIR/x.sh`): what follows its last expansion,
                    // beside the script.
                    let parts: Vec<&str> = f.split('/').collect();
                    let expanded = |p: &&str| p.contains(['$', '}', ')']);
                    if let Some(last) = parts.iter().rposition(expanded)
                        && last + 1 < parts.len()
                    {
                        names.push(dir.join(parts[last + 1..].join("/")));
                    }
                }
            }
        }
        Lang::Python => {
            let mut modules: Vec<(usize, String)> = Vec::new();
            if let Some(re) = PY_IMPORT.as_ref() {
                for c in re.captures_iter(text) {
                    for m in c[1].split(',') {
                        let m = m.split_whitespace().next().unwrap_or("");
                        modules.push((0, m.to_string()));
                    }
                }
            }
            if let Some(re) = PY_BY_NAME.as_ref() {
                modules.extend(re.captures_iter(text).map(|c| (0, c[1].to_string())));
            }
            if let Some(re) = PY_FROM.as_ref() {
                for c in re.captures_iter(text) {
                    let (dots, module) = (c[1].len(), &c[2]);
                    modules.push((dots, module.to_string()));
                    // `from pkg import mod` may name a module of the package.
                    let listed = c.get(3).or(c.get(4)).map_or("", |m| m.as_str());
                    for n in listed.split([',', '\n']) {
                        let n = n.split_whitespace().next().unwrap_or("");
                        if n.is_empty() || n.starts_with('#') {
                            continue;
                        }
                        let joined = if module.is_empty() {
                            n.to_string()
                        } else {
                            format!("{module}.{n}")
                        };
                        modules.push((dots, joined));
                    }
                }
            }
            for (dots, m) in modules {
                let roots: Vec<PathBuf> = if dots == 0 {
                    // The script's folder leads `sys.path`; the working folder under `-m`.
                    vec![dir.to_path_buf(), workspace.to_path_buf()]
                } else {
                    dir.ancestors()
                        .nth(dots - 1)
                        .map(Path::to_path_buf)
                        .into_iter()
                        .collect()
                };
                let rel = m.replace('.', "/");
                for root in roots {
                    if rel.is_empty() {
                        names.push(root.join("__init__.py"));
                        continue;
                    }
                    // `a.b.c` runs `a` and `a.b` first.
                    names.extend(packages(&rel).map(|p| root.join(p)));
                    names.push(root.join(format!("{rel}.py")));
                    names.push(root.join(&rel).join("__init__.py"));
                }
            }
        }
        Lang::JavaScript => {
            if let Some(re) = JS_RELATIVE.as_ref() {
                for c in re.captures_iter(text) {
                    let base = dir.join(&c[1]);
                    names.push(base.clone());
                    for ext in ["js", "mjs", "cjs", "ts", "mts", "cts", "jsx", "tsx", "json"] {
                        names.push(PathBuf::from(format!("{}.{ext}", base.display())));
                    }
                    names.push(base.join("index.js"));
                    names.push(base.join("index.ts"));
                    // TypeScript names its `x.ts` as `x.js`.
                    for (js, ts) in [("js", "ts"), ("js", "tsx"), ("mjs", "mts"), ("cjs", "cts")] {
                        if let Some(stem) = c[1].strip_suffix(js).filter(|s| s.ends_with('.')) {
                            names.push(dir.join(format!("{stem}{ts}")));
                        }
                    }
                }
            }
        }
        Lang::Make => {
            if let Some(re) = MAKE_INCLUDE.as_ref() {
                for c in re.captures_iter(text) {
                    names.extend(
                        c[1].split_whitespace()
                            .filter(|w| !w.contains('$'))
                            .map(|w| workspace.join(w)),
                    );
                }
            }
            // A recipe's lines are shell command lines (`@` and `-` before them say how make
            // runs them).
            let recipes: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix('\t'))
                .map(|l| l.trim_start_matches(['@', '-', '+']))
                .collect();
            names.extend(runs_in(Lang::Shell, &recipes.join("\n"), dir, workspace));
        }
        Lang::Other => {}
    }
    names
}

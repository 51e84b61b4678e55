//! What a person approves of a command line that runs a file of the workspace (`bash
//! ./fix.sh`, `python3 x.py`, `python3 -m mod`, `./run.sh`, `make -f x.mk`): the file is
//! named with its first lines in the request, its hash is taken when the request is made,
//! and the call is refused when the file changed by the time it runs. An interpreter's
//! operands that are files of the workspace are all taken (its script and its data), and so
//! is what those files run in turn: the files a shell script sources or runs, the workspace
//! modules a Python file imports (by a literal name too), the relative modules a JavaScript
//! or TypeScript file requires or imports, the files a makefile includes and its recipes
//! run. A file is read again by the name it runs by, so a link pointed elsewhere is a
//! change; where a module is looked for before the one found, and none was, one made there
//! after is a change too.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::follow::runs_in;
use super::words::{Lang, commands, operands, program, reads_input};
use crate::rules::basename;

/// Lines of a file shown with the request.
const FIRST_LINES: usize = 10;

/// Files taken at most for one line, the ones it runs and what they run in turn.
const MAX_FILES: usize = 64;

/// Paths watched at most for one line where no file was, and a file would run first.
const MAX_ABSENT: usize = 1024;

/// A file larger than this is taken but not read for what it runs.
const MAX_READ: usize = 1 << 20;

/// A workspace file a command line runs, as it was when the request was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunFile {
    /// Workspace-relative.
    path: String,
    hash: [u8; 32],
    first_lines: String,
    /// The path as it was named: a link in it may be pointed elsewhere after the request.
    named: PathBuf,
}

impl RunFile {
    /// The request's view of it, for the queue and the console.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({"file": self.path, "first_lines": self.first_lines})
    }
}

/// What a command line runs, as it was when the request was made.
#[derive(Clone, Debug, Default)]
pub(crate) struct Runs {
    pub(crate) files: Vec<RunFile>,
    /// Where no file was and a file would run before, or instead of, what was approved: a
    /// `json.py` beside a script that imports `json`, `a` beside the `a.js` of
    /// `require('./a')`. Workspace-relative, and full.
    absent: Vec<(String, PathBuf)>,
}

impl Runs {
    pub(crate) fn is_empty(&self) -> bool {
        self.files.is_empty() && self.absent.is_empty()
    }
}

/// The workspace files `line` runs, read now, and the files they run in turn.
pub(crate) fn run_files(line: &str, workspace: &Path) -> Runs {
    let mut out = Files::default();
    let commands = commands(line);
    // An interpreter given no script reads it from its input (`cat fix.sh | bash`): any
    // file the line names may be what it runs.
    let from_input = commands.iter().any(|w| reads_input(w));
    for words in &commands {
        let mut files = operands(words);
        if from_input {
            files.extend(words.iter().map(|w| w.trim_start_matches('<').to_string()));
        }
        let w = program(words);
        let by = w.first().map(|p| Lang::of_program(basename(p)));
        // `python3 -c CODE`, `node -e CODE`: the code imports as a file of the working folder.
        if let Some(lang) = by.filter(|l| matches!(l, Lang::Python | Lang::JavaScript))
            && let Some(code) = w
                .iter()
                .position(|a| ["-c", "-e", "-p", "--eval", "--print"].contains(&a.as_str()))
                .and_then(|i| w.get(i + 1))
        {
            for n in runs_in(lang, code, workspace, workspace) {
                out.found(workspace, &n, true, Lang::Other);
            }
        }
        for f in files {
            // A Python script or module that is not there yet may be made after the request.
            let watch = by == Some(Lang::Python) && f.ends_with(".py");
            out.found(workspace, Path::new(&f), watch, by.unwrap_or(Lang::Other));
        }
    }
    // What the files run, breadth first: a file is read once.
    let mut next = 0;
    while next < out.taken.len() {
        let (full, lang) = (out.taken[next].0.clone(), out.taken[next].1);
        let text = out.taken[next].2.take();
        next += 1;
        let Some(text) = text else {
            continue;
        };
        let lang = Lang::of_file(&full, &text).unwrap_or(lang);
        let dir = full.parent().unwrap_or(workspace).to_path_buf();
        // Modules are looked for along a path: one made earlier on it runs instead.
        let watch = matches!(lang, Lang::Python | Lang::JavaScript);
        for n in runs_in(lang, &text, &dir, workspace) {
            out.found(workspace, &n, watch, Lang::Other);
        }
    }
    Runs {
        files: out.files,
        absent: out.absent,
    }
}

/// The files taken so far: each with where it is, how it is read, and its text until it is
/// read for what it runs.
#[derive(Default)]
struct Files {
    files: Vec<RunFile>,
    taken: Vec<(PathBuf, Lang, Option<String>)>,
    absent: Vec<(String, PathBuf)>,
}

impl Files {
    /// Take the file at `path` (relative to the workspace, or full) when it is in the
    /// workspace, or, when `watch`, remember that there is none.
    fn found(&mut self, workspace: &Path, path: &Path, watch: bool, lang: Lang) {
        if let Some((named, full)) = inside(workspace, path) {
            return self.take(workspace, named, full, lang);
        }
        let path = workspace.join(path);
        if watch
            && named_inside(workspace, &path)
            && self.absent.len() < MAX_ABSENT
            && path.symlink_metadata().is_err()
            && !self.absent.iter().any(|(_, p)| *p == path)
        {
            let rel = crate::tools::paths::relative(workspace, &path);
            self.absent.push((rel, path));
        }
    }

    /// Take `full`, named `named` (the paths that `inside` gave), unless it is taken already
    /// or there are `MAX_FILES`.
    fn take(&mut self, workspace: &Path, named: PathBuf, full: PathBuf, lang: Lang) {
        if self.files.len() >= MAX_FILES || self.taken.iter().any(|(p, ..)| *p == full) {
            return;
        }
        let Ok(bytes) = std::fs::read(&full) else {
            return;
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut first_lines = text
            .lines()
            .take(FIRST_LINES)
            .collect::<Vec<_>>()
            .join("\n");
        // The person is told what is not held.
        if bytes.len() > MAX_READ {
            first_lines.push_str("\n[sup: larger than 1 MiB; the files it runs are not shown]");
        }
        self.files.push(RunFile {
            path: crate::tools::paths::relative(workspace, &full),
            hash: Sha256::digest(&bytes).into(),
            first_lines,
            named,
        });
        let text = (bytes.len() <= MAX_READ).then(|| text.into_owned());
        self.taken.push((full, lang, text));
    }
}

/// The first of what a line runs that is not as it was, with what became of it.
pub(crate) fn changed(runs: &Runs) -> Option<String> {
    let appeared = || {
        runs.absent
            .iter()
            .find(|(_, p)| p.symlink_metadata().is_ok())
            .map(|(rel, _)| format!("{rel} appeared since it was approved"))
    };
    runs.files
        .iter()
        .find_map(|f| {
            // Read by its name: what runs is what the name leads to now.
            let now = std::fs::read(&f.named).ok();
            match now {
                Some(b) if <[u8; 32]>::from(Sha256::digest(&b)) == f.hash => None,
                Some(_) => Some(format!("{} changed since it was approved", f.path)),
                None => Some(format!("{} is gone since it was approved", f.path)),
            }
        })
        .or_else(appeared)
}

/// A path a command names, when it is a regular file inside the workspace or named there
/// (a link to a file outside is what runs, and the agent may rewrite it): as named, and
/// where it is.
fn inside(workspace: &Path, path: &Path) -> Option<(PathBuf, PathBuf)> {
    let named = workspace.join(path);
    let full = std::fs::canonicalize(&named).ok()?;
    ((full.starts_with(workspace) || named_inside(workspace, &named)) && full.is_file())
        .then_some((named, full))
}

/// Whether `path` is in the workspace by its name, without going up with `..`.
fn named_inside(workspace: &Path, path: &Path) -> bool {
    path.starts_with(workspace)
        && !path
            .components()
            .any(|c| c == std::path::Component::ParentDir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_a_line_runs() {
        let (_dir, ws) = crate::testing::workspace();
        for f in ["fix.sh", "x.py", "run.sh", "x.mk", "Makefile", "notes.txt"] {
            std::fs::write(ws.join(f), format!("# {f}\nline 2\n")).unwrap();
        }
        let names = |line: &str| -> Vec<String> {
            run_files(line, &ws)
                .files
                .into_iter()
                .map(|f| f.path)
                .collect()
        };
        assert_eq!(names("bash ./fix.sh"), ["fix.sh"]);
        assert_eq!(names("cd . && python3 -u x.py arg"), ["x.py"]);
        assert_eq!(
            names("FOO=1 ./run.sh; make -f x.mk all"),
            ["run.sh", "x.mk"]
        );
        assert_eq!(names("nohup make test"), ["Makefile"]);
        assert_eq!(
            names("cat notes.txt | bash -c 'echo hi'"),
            Vec::<String>::new()
        );
        assert_eq!(
            names("python3 -m pytest; bash ../outside.sh"),
            Vec::<String>::new()
        );
        // An option's value is not the script; a module of the workspace is what `-m` runs.
        assert_eq!(names("python3 -W ignore x.py"), ["x.py"]);
        crate::testing::write(&ws, &[("pkg/__main__.py", "")]);
        assert_eq!(names("python3 -m x"), ["x.py"]);
        assert_eq!(names("python3 -I -m pkg arg"), ["pkg/__main__.py"]);
        // A script on the interpreter's input.
        assert_eq!(names("cat x.py | python3"), ["x.py"]);
        assert_eq!(names("bash <fix.sh"), ["fix.sh"]);
        assert_eq!(names("bash -s < fix.sh"), ["fix.sh"]);
        let runs = run_files("bash 'fix.sh'", &ws);
        assert_eq!(runs.files[0].first_lines, "# fix.sh\nline 2");
        assert_eq!(changed(&runs), None);
        std::fs::write(ws.join("fix.sh"), "rm -rf ~\n").unwrap();
        assert!(changed(&runs).unwrap().contains("changed since"));
    }

    #[test]
    fn what_the_files_a_line_runs_run_in_turn() {
        let (_dir, ws) = crate::testing::workspace_with(&[
            // Shell: a literal source, one beside the script made at run time, a script
            // it runs, and a cycle.
            (
                "fix.sh",
                "#!/bin/sh\n. ./lib.sh\nsource \"$(dirname \"$0\")/tools/x.sh\"\n",
            ),
            ("lib.sh", "bash steps/one.sh\n. ./fix.sh\n"),
            ("steps/one.sh", "echo one\n"),
            ("tools/x.sh", "echo x\n"),
            // Python: a module beside the script, a package's module, a relative import,
            // and the standard library (not in the workspace).
            (
                "app/main.py",
                "import os, helper\nfrom pkg import mod\nfrom .rel import f\n",
            ),
            ("app/helper.py", ""),
            ("app/pkg/__init__.py", ""),
            ("app/pkg/mod.py", ""),
            ("app/rel.py", ""),
            // JavaScript: require and import of relative modules, with and without ends.
            (
                "web/run.js",
                "const a = require('./a');\nimport b from \"../b.mjs\";\nimport('./c');\n",
            ),
            ("web/a.js", ""),
            ("b.mjs", ""),
            ("web/c/index.js", ""),
            // Make: an included makefile.
            ("Makefile", "include rules.mk\n"),
            ("rules.mk", ""),
            // No extension: its `#!` line says what it is.
            ("run", "#!/usr/bin/env bash\nsource ./lib.sh\n"),
        ]);
        let names = |line: &str| -> Vec<String> {
            let mut n: Vec<String> = run_files(line, &ws)
                .files
                .into_iter()
                .map(|f| f.path)
                .collect();
            n.sort();
            n
        };
        assert_eq!(
            names("bash fix.sh"),
            ["fix.sh", "lib.sh", "steps/one.sh", "tools/x.sh"]
        );
        assert_eq!(
            names("python3 app/main.py"),
            [
                "app/helper.py",
                "app/main.py",
                "app/pkg/__init__.py",
                "app/pkg/mod.py",
                "app/rel.py"
            ]
        );
        assert_eq!(
            names("node web/run.js"),
            ["b.mjs", "web/a.js", "web/c/index.js", "web/run.js"]
        );
        assert_eq!(names("make"), ["Makefile", "rules.mk"]);
        assert_eq!(
            names("./run"),
            ["fix.sh", "lib.sh", "run", "steps/one.sh", "tools/x.sh"]
        );
        // A change to a sourced file is a change to what was approved.
        let files = run_files("bash fix.sh", &ws);
        std::fs::write(ws.join("steps/one.sh"), "rm -rf ~\n").unwrap();
        assert!(changed(&files).unwrap().contains("steps/one.sh changed"));
    }

    #[test]
    fn what_a_line_runs_is_bounded_and_stays_in_the_workspace() {
        let (_dir, ws) = crate::testing::workspace();
        let chain: Vec<(String, String)> = (0..100)
            .map(|i| (format!("s{i}.sh"), format!(". ./s{}.sh\n", i + 1)))
            .collect();
        let chain: Vec<(&str, &str)> = chain
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        crate::testing::write(&ws, &chain);
        assert_eq!(run_files("bash s0.sh", &ws).files.len(), MAX_FILES);
        crate::testing::write(&ws, &[("out.sh", ". /etc/profile\n. ../elsewhere.sh\n")]);
        let names: Vec<String> = run_files("sh out.sh", &ws)
            .files
            .into_iter()
            .map(|f| f.path)
            .collect();
        assert_eq!(names, ["out.sh"]);
    }

    fn sorted(line: &str, ws: &Path) -> Vec<String> {
        let mut n: Vec<String> = run_files(line, ws)
            .files
            .into_iter()
            .map(|f| f.path)
            .collect();
        n.sort();
        n
    }

    #[test]
    fn a_script_link_pointed_elsewhere_after_the_request_is_a_change() {
        let (_dir, ws) = crate::testing::workspace_with(&[
            ("good.sh", "echo fixed\n"),
            ("evil.sh", "rm -rf ~\n"),
        ]);
        std::os::unix::fs::symlink("good.sh", ws.join("fix.sh")).unwrap();
        let files = run_files("bash fix.sh", &ws);
        assert_eq!(changed(&files), None);
        std::fs::remove_file(ws.join("fix.sh")).unwrap();
        std::os::unix::fs::symlink("evil.sh", ws.join("fix.sh")).unwrap();
        assert!(changed(&files).is_some());
    }

    #[test]
    fn a_python_import_runs_its_parent_packages_too() {
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(
            &ws,
            &[
                ("x.py", "import a.b.c\nfrom pkg.sub import m\n"),
                ("a/__init__.py", ""),
                ("a/b/__init__.py", ""),
                ("a/b/c.py", ""),
                ("pkg/__init__.py", ""),
                ("pkg/sub/__init__.py", ""),
                ("pkg/sub/m.py", ""),
                ("run/__init__.py", ""),
                ("run/main/__main__.py", ""),
            ],
        );
        assert_eq!(
            sorted("python3 x.py", &ws),
            [
                "a/__init__.py",
                "a/b/__init__.py",
                "a/b/c.py",
                "pkg/__init__.py",
                "pkg/sub/__init__.py",
                "pkg/sub/m.py",
                "x.py"
            ]
        );
        assert_eq!(
            sorted("python3 -m run.main", &ws),
            ["run/__init__.py", "run/main/__main__.py"]
        );
    }

    #[test]
    fn a_python_import_over_lines_or_after_a_semicolon_is_taken() {
        let (_dir, ws) = crate::testing::workspace_with(&[
            (
                "x.py",
                "from pkg import (\n    one,\n    two,\n)\nimport os; import h\n",
            ),
            ("pkg/__init__.py", ""),
            ("pkg/one.py", ""),
            ("pkg/two.py", ""),
            ("h.py", ""),
        ]);
        assert_eq!(
            sorted("python3 x.py", &ws),
            [
                "h.py",
                "pkg/__init__.py",
                "pkg/one.py",
                "pkg/two.py",
                "x.py"
            ]
        );
    }

    #[test]
    fn a_script_run_by_a_wrapper_with_an_operand_is_taken() {
        let (_dir, ws) = crate::testing::workspace_with(&[("fix.sh", "")]);
        for line in [
            "timeout 60 bash fix.sh",
            "timeout -k 5 -s KILL 1m ./fix.sh",
            "nice -n 5 bash fix.sh",
            "env -u HOME bash fix.sh",
            "stdbuf -oL bash fix.sh",
        ] {
            assert_eq!(sorted(line, &ws), ["fix.sh"], "{line}");
        }
    }

    #[test]
    fn the_code_a_shell_is_given_is_read_for_what_it_runs() {
        let (_dir, ws) = crate::testing::workspace_with(&[
            (
                "fix.sh",
                "echo \"$(./gen.sh)\"\nv=\"`bash tick.sh`\"\nsh -c 'bash ./in.sh'\n",
            ),
            ("gen.sh", ""),
            ("tick.sh", ""),
            ("in.sh", ""),
            ("top.sh", ""),
        ]);
        assert_eq!(
            sorted("bash -c 'bash fix.sh && ./top.sh'", &ws),
            ["fix.sh", "gen.sh", "in.sh", "tick.sh", "top.sh"]
        );
    }

    #[test]
    fn a_javascript_specifier_ending_in_js_may_be_a_typescript_file() {
        let (_dir, ws) = crate::testing::workspace_with(&[
            (
                "run.ts",
                "import { a } from './a.js';\nconst b = await import(`./b`);\n",
            ),
            ("a.ts", ""),
            ("b.ts", ""),
        ]);
        assert_eq!(sorted("bun run.ts", &ws), ["a.ts", "b.ts", "run.ts"]);
    }

    #[test]
    fn a_module_made_after_the_request_where_it_would_run_first_is_a_change() {
        let (_dir, ws) = crate::testing::workspace_with(&[
            ("app/main.py", "import json\nimport helper\n"),
            ("helper.py", ""),
            ("run.js", "require('./a');\n"),
            ("a.js", ""),
        ]);
        for (line, planted) in [
            ("python3 app/main.py", "app/json.py"),
            ("python3 app/main.py", "app/helper.py"),
            ("python3 app/main.py", "app/helper/__init__.py"),
            ("python3 -m pytest", "pytest.py"),
            ("node run.js", "a"),
        ] {
            let runs = run_files(line, &ws);
            assert_eq!(changed(&runs), None, "{line}");
            crate::testing::write(&ws, &[(planted, "")]);
            assert_eq!(
                changed(&runs),
                Some(format!("{planted} appeared since it was approved")),
                "{line}"
            );
            std::fs::remove_file(ws.join(planted)).unwrap();
        }
    }

    #[test]
    fn a_makefiles_recipes_are_read_for_what_they_run() {
        let (_dir, ws) = crate::testing::workspace_with(&[
            (
                "Makefile",
                "test:\n\t@./run_tests.sh\nlint:\n\t-python3 tools/lint.py\n",
            ),
            ("run_tests.sh", ""),
            ("tools/lint.py", ""),
        ]);
        assert_eq!(
            sorted("make test", &ws),
            ["Makefile", "run_tests.sh", "tools/lint.py"]
        );
    }

    #[test]
    fn a_python_module_imported_by_a_literal_name_is_taken() {
        let (_dir, ws) = crate::testing::workspace_with(&[
            (
                "x.py",
                "import importlib\nm = importlib.import_module('plug.one')\nh = __import__(\"h\")\n",
            ),
            ("plug/__init__.py", ""),
            ("plug/one.py", ""),
            ("h.py", ""),
        ]);
        assert_eq!(
            sorted("python3 x.py", &ws),
            ["h.py", "plug/__init__.py", "plug/one.py", "x.py"]
        );
    }

    #[test]
    fn a_link_in_the_workspace_to_a_file_outside_it_is_taken() {
        let (_dir, ws) = crate::testing::workspace();
        let (_out, outside) = crate::testing::workspace_with(&[("x.sh", "echo x\n")]);
        std::os::unix::fs::symlink(outside.join("x.sh"), ws.join("fix.sh")).unwrap();
        let runs = run_files("bash fix.sh", &ws);
        assert_eq!(runs.files.len(), 1);
        assert_eq!(runs.files[0].first_lines, "echo x");
        crate::testing::write(&outside, &[("x.sh", "rm -rf ~\n")]);
        assert!(changed(&runs).is_some());
    }

    #[test]
    fn the_code_an_interpreter_is_given_is_read_for_what_it_runs() {
        let (_dir, ws) = crate::testing::workspace_with(&[("fix.py", ""), ("a.js", "")]);
        assert_eq!(
            sorted("python3 -c 'import fix; fix.main()'", &ws),
            ["fix.py"]
        );
        assert_eq!(sorted("node -e \"require('./a')\"", &ws), ["a.js"]);
    }

    #[test]
    fn a_file_too_large_to_read_for_what_it_runs_says_so() {
        let (_dir, ws) = crate::testing::workspace();
        let big = format!("echo big\n{}. ./lib.sh\n", "#\n".repeat(MAX_READ));
        crate::testing::write(&ws, &[("fix.sh", big.as_str()), ("lib.sh", "")]);
        let runs = run_files("bash fix.sh", &ws);
        assert_eq!(runs.files.len(), 1);
        assert!(runs.files[0].first_lines.contains("not shown"));
        crate::testing::write(&ws, &[("fix.sh", "echo small\n. ./lib.sh\n")]);
        let runs = run_files("bash fix.sh", &ws);
        assert_eq!(runs.files.len(), 2);
        assert!(!runs.files[0].first_lines.contains("not shown"));
    }
}

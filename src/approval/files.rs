//! What a person approves of a command line that runs a file of the workspace (`bash
//! ./fix.sh`, `python3 x.py`, `python3 -m mod`, `./run.sh`, `make -f x.mk`): the file is
//! named with its first lines in the request, its hash is taken when the request is made,
//! and the call is refused when the file changed by the time it runs. An interpreter's
//! operands that are files of the workspace are all taken (its script and its data).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Lines of a file shown with the request.
const FIRST_LINES: usize = 10;

/// Interpreters whose first operand is the file they run.
const INTERPRETERS: &[&str] = &[
    "bash", "sh", "dash", "zsh", "ksh", "fish", "python", "python2", "python3", "node", "deno",
    "bun", "ruby", "perl", "php", "lua", "Rscript", "tclsh", "source", ".",
];

/// Words that run the command after them.
const WRAPPERS: &[&str] = &["env", "nohup", "time", "exec", "command", "nice", "setsid"];

/// A workspace file a command line runs, as it was when the request was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunFile {
    /// Workspace-relative.
    pub(crate) path: String,
    pub(crate) hash: [u8; 32],
    pub(crate) first_lines: String,
}

impl RunFile {
    /// The request's view of it, for the queue and the console.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({"file": self.path, "first_lines": self.first_lines})
    }
}

/// The workspace files `line` runs, read now.
pub(crate) fn run_files(line: &str, workspace: &Path) -> Vec<RunFile> {
    let mut out: Vec<RunFile> = Vec::new();
    let commands = commands(line);
    // An interpreter given no script reads it from its input (`cat fix.sh | bash`): any
    // file the line names may be what it runs.
    let from_input = commands.iter().any(|w| reads_input(w));
    for words in &commands {
        let mut files = operands(words);
        if from_input {
            files.extend(words.iter().map(|w| w.trim_start_matches('<').to_string()));
        }
        for f in files {
            let Some(full) = inside(workspace, &f) else {
                continue;
            };
            let Ok(bytes) = std::fs::read(&full) else {
                continue;
            };
            let path = crate::tools::paths::relative(workspace, &full);
            if out.iter().any(|r| r.path == path) {
                continue;
            }
            let text = String::from_utf8_lossy(&bytes);
            out.push(RunFile {
                path,
                hash: Sha256::digest(&bytes).into(),
                first_lines: text
                    .lines()
                    .take(FIRST_LINES)
                    .collect::<Vec<_>>()
                    .join("\n"),
            });
        }
    }
    out
}

/// The first of `files` that is not as it was, with what became of it.
pub(crate) fn changed(files: &[RunFile], workspace: &Path) -> Option<String> {
    files.iter().find_map(|f| {
        let now = std::fs::read(workspace.join(&f.path)).ok();
        match now {
            Some(b) if <[u8; 32]>::from(Sha256::digest(&b)) == f.hash => None,
            Some(_) => Some(format!("{} changed since it was approved", f.path)),
            None => Some(format!("{} is gone since it was approved", f.path)),
        }
    })
}

/// A path a command names, when it is a regular file inside the workspace.
fn inside(workspace: &Path, word: &str) -> Option<PathBuf> {
    let full = std::fs::canonicalize(workspace.join(word)).ok()?;
    (full.starts_with(workspace) && full.is_file()).then_some(full)
}

/// A simple command from its program on: variable assignments and wrappers (`env`,
/// `nohup`, with their options) left out.
fn program(words: &[String]) -> &[String] {
    let mut w: &[String] = words;
    loop {
        match w.first().map(String::as_str) {
            Some(first) if first.contains('=') && !first.starts_with('-') => w = &w[1..],
            Some(first) if WRAPPERS.contains(&basename(first)) => {
                w = &w[1..];
                while w
                    .first()
                    .is_some_and(|a| a.starts_with('-') || a.contains('='))
                {
                    w = &w[1..];
                }
            }
            _ => break,
        }
    }
    w
}

/// Whether a simple command is an interpreter that reads its program from its input: it
/// has no operand, and no `-c`, `-e` or `-m`.
fn reads_input(words: &[String]) -> bool {
    let w = program(words);
    w.first()
        .is_some_and(|p| INTERPRETERS.contains(&basename(p)))
        && !w[1..]
            .iter()
            .any(|a| !a.starts_with('-') || ["-c", "-e", "-m"].contains(&a.as_str()))
}

/// The files a simple command runs: its program when it is a path, an interpreter's script,
/// `make`'s makefile.
fn operands(words: &[String]) -> Vec<String> {
    let w = program(words);
    let Some(program) = w.first() else {
        return Vec::new();
    };
    let args = &w[1..];
    let name = basename(program);
    let mut out = Vec::new();
    if program.contains('/') {
        out.push(program.clone());
    }
    if INTERPRETERS.contains(&name) {
        // `-c CODE` runs no file.
        if args.iter().any(|a| a == "-c" || a == "-e") {
            return out;
        }
        // `python -m MODULE` runs the workspace's module of that name first, when there is
        // one (the working folder leads `sys.path`): a planted `pytest.py` is what
        // `python3 -m pytest` runs.
        if let Some(m) = args
            .iter()
            .position(|a| a == "-m")
            .and_then(|i| args.get(i + 1))
        {
            let m = m.replace('.', "/");
            out.extend([
                format!("{m}.py"),
                format!("{m}/__main__.py"),
                format!("{m}/__init__.py"),
            ]);
            return out;
        }
        // Every operand that is a file: an option's value (`-W ignore x.py`) is not the
        // script, and the agent could name a file like it; what is not a file of the
        // workspace is left out later. `<fix.sh` is the script too.
        out.extend(
            args.iter()
                .filter(|a| !a.starts_with('-'))
                .map(|a| a.trim_start_matches('<').to_string()),
        );
    }
    if name == "make" || name == "gmake" {
        let mut named = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let file = if a == "-f" || a == "--file" || a == "--makefile" {
                it.next().cloned()
            } else if let Some(f) = a.strip_prefix("--file=").or(a.strip_prefix("--makefile=")) {
                Some(f.to_string())
            } else {
                a.strip_prefix("-f")
                    .filter(|f| !f.is_empty() && !a.starts_with("--"))
                    .map(str::to_string)
            };
            if let Some(f) = file {
                out.push(f);
                named = true;
            }
        }
        if !named {
            out.extend(["GNUmakefile", "makefile", "Makefile"].map(String::from));
        }
    }
    out
}

fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// The simple commands of a line, as words: split at `;`, `&`, `|` and newlines outside
/// quotes, quotes and backslashes resolved. A reading for showing and hashing files, not
/// for judging the line (the rules parse it for that).
fn commands(line: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(n) = chars.next() {
                    word.get_or_insert_default().push(n);
                }
            }
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, '\\') => {
                if let Some(n) = chars.next() {
                    word.get_or_insert_default().push(n);
                }
            }
            (None, ';' | '&' | '|' | '\n' | '(' | ')') => {
                words.extend(word.take());
                if !words.is_empty() {
                    out.push(std::mem::take(&mut words));
                }
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word.take());
    if !words.is_empty() {
        out.push(words);
    }
    out
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
            run_files(line, &ws).into_iter().map(|f| f.path).collect()
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
        let f = &run_files("bash 'fix.sh'", &ws)[0];
        assert_eq!(f.first_lines, "# fix.sh\nline 2");
        assert_eq!(changed(std::slice::from_ref(f), &ws), None);
        std::fs::write(ws.join("fix.sh"), "rm -rf ~\n").unwrap();
        assert!(
            changed(std::slice::from_ref(f), &ws)
                .unwrap()
                .contains("changed since")
        );
    }
}

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
use std::sync::LazyLock;

use regex::Regex;
use sha2::{Digest, Sha256};

/// Lines of a file shown with the request.
const FIRST_LINES: usize = 10;

/// Files taken at most for one line, the ones it runs and what they run in turn.
const MAX_FILES: usize = 64;

/// Paths watched at most for one line where no file was, and a file would run first.
const MAX_ABSENT: usize = 1024;

/// A file larger than this is taken but not read for what it runs.
const MAX_READ: usize = 1 << 20;

/// Interpreters whose first operand is the file they run.
const INTERPRETERS: &[&str] = &[
    "bash", "sh", "dash", "zsh", "ksh", "fish", "python", "python2", "python3", "node", "deno",
    "bun", "ruby", "perl", "php", "lua", "Rscript", "tclsh", "source", ".",
];

/// Words that run the command after them.
const WRAPPERS: &[&str] = &[
    "env", "nohup", "time", "exec", "command", "nice", "setsid", "timeout", "stdbuf",
];

/// Wrappers' options that take the next word as their value.
const WRAPPER_VALUES: &[(&str, &str)] = &[
    ("env", "-u"),
    ("env", "-C"),
    ("nice", "-n"),
    ("timeout", "-k"),
    ("timeout", "-s"),
    ("stdbuf", "-i"),
    ("stdbuf", "-o"),
    ("stdbuf", "-e"),
];

/// A workspace file a command line runs, as it was when the request was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunFile {
    /// Workspace-relative.
    pub(crate) path: String,
    pub(crate) hash: [u8; 32],
    pub(crate) first_lines: String,
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
        let by = program(words)
            .first()
            .map(|p| Lang::of_program(basename(p)));
        // `python3 -c CODE`, `node -e CODE`: the code imports as a file of the working folder.
        let w = program(words);
        if let Some(lang) = by.filter(|l| matches!(l, Lang::Python | Lang::JavaScript))
            && let Some(code) = w
                .iter()
                .position(|a| ["-c", "-e", "-p", "--eval", "--print"].contains(&a.as_str()))
                .and_then(|i| w.get(i + 1))
        {
            for n in runs_in(lang, code, workspace, workspace) {
                out.found(workspace, &n.to_string_lossy(), true, Lang::Other);
            }
        }
        for f in files {
            // A Python script or module that is not there yet may be made after the request.
            let watch = by == Some(Lang::Python) && f.ends_with(".py");
            out.found(workspace, &f, watch, by.unwrap_or(Lang::Other));
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
            out.found(workspace, &n.to_string_lossy(), watch, Lang::Other);
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
    /// Take the file `word` names when it is in the workspace, or, when `watch`, remember
    /// that there is none.
    fn found(&mut self, workspace: &Path, word: &str, watch: bool, lang: Lang) {
        if let Some((named, full)) = inside(workspace, word) {
            return self.take(workspace, named, full, lang);
        }
        let path = workspace.join(word);
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

/// How a file is read for what it runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lang {
    Shell,
    Python,
    JavaScript,
    Make,
    Other,
}

impl Lang {
    /// What an interpreter runs its file as.
    fn of_program(name: &str) -> Lang {
        match name {
            "bash" | "sh" | "dash" | "zsh" | "ksh" | "source" | "." => Lang::Shell,
            n if n.starts_with("python") => Lang::Python,
            "node" | "deno" | "bun" => Lang::JavaScript,
            "make" | "gmake" => Lang::Make,
            _ => Lang::Other,
        }
    }

    /// What a file is, by its name or its `#!` line.
    fn of_file(path: &Path, text: &str) -> Option<Lang> {
        let name = path.file_name()?.to_str()?;
        let by_name = match name.rsplit_once('.').map(|(_, e)| e) {
            Some("sh" | "bash" | "zsh" | "ksh") => Some(Lang::Shell),
            Some("py") => Some(Lang::Python),
            Some("js" | "mjs" | "cjs" | "ts" | "mts" | "cts" | "jsx" | "tsx") => {
                Some(Lang::JavaScript)
            }
            Some("mk") => Some(Lang::Make),
            _ if ["GNUmakefile", "makefile", "Makefile"].contains(&name) => Some(Lang::Make),
            _ => None,
        };
        by_name.or_else(|| {
            let shebang = text.lines().next()?.strip_prefix("#!")?;
            let mut words = shebang.split_whitespace();
            let first = basename(words.next()?);
            let program = if first == "env" {
                words.find(|w| !w.starts_with('-'))?
            } else {
                first
            };
            Some(Lang::of_program(basename(program))).filter(|l| *l != Lang::Other)
        })
    }
}

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
fn runs_in(lang: Lang, text: &str, dir: &Path, workspace: &Path) -> Vec<PathBuf> {
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
fn inside(workspace: &Path, word: &str) -> Option<(PathBuf, PathBuf)> {
    let named = workspace.join(word);
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

/// A simple command from its program on: variable assignments and wrappers (`env`,
/// `nohup`, with their options) left out.
fn program(words: &[String]) -> &[String] {
    let mut w: &[String] = words;
    loop {
        match w.first().map(String::as_str) {
            Some(first) if first.contains('=') && !first.starts_with('-') => w = &w[1..],
            Some(first) if WRAPPERS.contains(&basename(first)) => {
                let wrapper = basename(first);
                w = &w[1..];
                while let Some(a) = w.first().filter(|a| a.starts_with('-') || a.contains('=')) {
                    let skip = if WRAPPER_VALUES.contains(&(wrapper, a.as_str())) {
                        2
                    } else {
                        1
                    };
                    w = w.get(skip..).unwrap_or_default();
                }
                // `timeout DURATION COMMAND`.
                if wrapper == "timeout" {
                    w = w.get(1..).unwrap_or_default();
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
        // `-c CODE` runs no file, but a shell's code may run some (`bash -lc './x.sh'`).
        let shell = Lang::of_program(name) == Lang::Shell;
        let code = |a: &String| {
            a == "-c"
                || a == "-e"
                || (shell && a.starts_with('-') && !a.starts_with("--") && a.contains('c'))
        };
        if let Some(i) = args.iter().position(code) {
            if shell && let Some(code) = args.get(i + 1) {
                out.extend(commands(code).iter().flat_map(|c| operands(c)));
            }
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
            out.extend(packages(&m).map(|p| p.display().to_string()));
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

/// The `__init__.py` of the packages above module `rel` (`a/b/c`: `a`'s and `a/b`'s).
fn packages(rel: &str) -> impl Iterator<Item = PathBuf> + '_ {
    rel.match_indices('/')
        .map(|(i, _)| Path::new(&rel[..i]).join("__init__.py"))
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
    // A command substitution runs too, in double quotes as well (`"$(./gen.sh)"`).
    if let Some(re) = SUBSTITUTION.as_ref() {
        for c in re.captures_iter(line) {
            if let Some(inner) = c.get(1).or(c.get(2)) {
                out.extend(commands(inner.as_str()));
            }
        }
    }
    out
}

/// `$(…)` without a `(` inside, and `` `…` ``.
static SUBSTITUTION: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\$\(([^()]*)\)|`([^`]*)`").ok());

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
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(
            &ws,
            &[
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
            ],
        );
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
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(
            &ws,
            &[("good.sh", "echo fixed\n"), ("evil.sh", "rm -rf ~\n")],
        );
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
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(
            &ws,
            &[
                (
                    "x.py",
                    "from pkg import (\n    one,\n    two,\n)\nimport os; import h\n",
                ),
                ("pkg/__init__.py", ""),
                ("pkg/one.py", ""),
                ("pkg/two.py", ""),
                ("h.py", ""),
            ],
        );
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
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(&ws, &[("fix.sh", "")]);
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
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(
            &ws,
            &[
                (
                    "fix.sh",
                    "echo \"$(./gen.sh)\"\nv=\"`bash tick.sh`\"\nsh -c 'bash ./in.sh'\n",
                ),
                ("gen.sh", ""),
                ("tick.sh", ""),
                ("in.sh", ""),
                ("top.sh", ""),
            ],
        );
        assert_eq!(
            sorted("bash -c 'bash fix.sh && ./top.sh'", &ws),
            ["fix.sh", "gen.sh", "in.sh", "tick.sh", "top.sh"]
        );
    }

    #[test]
    fn a_javascript_specifier_ending_in_js_may_be_a_typescript_file() {
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(
            &ws,
            &[
                (
                    "run.ts",
                    "import { a } from './a.js';\nconst b = await import(`./b`);\n",
                ),
                ("a.ts", ""),
                ("b.ts", ""),
            ],
        );
        assert_eq!(sorted("bun run.ts", &ws), ["a.ts", "b.ts", "run.ts"]);
    }

    #[test]
    fn a_module_made_after_the_request_where_it_would_run_first_is_a_change() {
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(
            &ws,
            &[
                ("app/main.py", "import json\nimport helper\n"),
                ("helper.py", ""),
                ("run.js", "require('./a');\n"),
                ("a.js", ""),
            ],
        );
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
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(
            &ws,
            &[
                (
                    "Makefile",
                    "test:\n\t@./run_tests.sh\nlint:\n\t-python3 tools/lint.py\n",
                ),
                ("run_tests.sh", ""),
                ("tools/lint.py", ""),
            ],
        );
        assert_eq!(
            sorted("make test", &ws),
            ["Makefile", "run_tests.sh", "tools/lint.py"]
        );
    }

    #[test]
    fn a_python_module_imported_by_a_literal_name_is_taken() {
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(
            &ws,
            &[
                (
                    "x.py",
                    "import importlib\nm = importlib.import_module('plug.one')\nh = __import__(\"h\")\n",
                ),
                ("plug/__init__.py", ""),
                ("plug/one.py", ""),
                ("h.py", ""),
            ],
        );
        assert_eq!(
            sorted("python3 x.py", &ws),
            ["h.py", "plug/__init__.py", "plug/one.py", "x.py"]
        );
    }

    #[test]
    fn a_link_in_the_workspace_to_a_file_outside_it_is_taken() {
        let (_dir, ws) = crate::testing::workspace();
        let (_out, outside) = crate::testing::workspace();
        crate::testing::write(&outside, &[("x.sh", "echo x\n")]);
        std::os::unix::fs::symlink(outside.join("x.sh"), ws.join("fix.sh")).unwrap();
        let runs = run_files("bash fix.sh", &ws);
        assert_eq!(runs.files.len(), 1);
        assert_eq!(runs.files[0].first_lines, "echo x");
        crate::testing::write(&outside, &[("x.sh", "rm -rf ~\n")]);
        assert!(changed(&runs).is_some());
    }

    #[test]
    fn the_code_an_interpreter_is_given_is_read_for_what_it_runs() {
        let (_dir, ws) = crate::testing::workspace();
        crate::testing::write(&ws, &[("fix.py", ""), ("a.js", "")]);
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

//! A command line read as words, for the approval of what it runs: its simple commands
//! (command substitutions too), the program each runs past assignments and wrappers, the
//! files it names to run (an interpreter's script, a path program, `make`'s makefile), and
//! what language a program or a file is. A reading for showing and hashing files, not for
//! judging the line (the rules parse it for that).

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;

use crate::rules::basename;

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

/// How a file is read for what it runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Lang {
    Shell,
    Python,
    JavaScript,
    Make,
    Other,
}

impl Lang {
    /// What an interpreter runs its file as.
    pub(super) fn of_program(name: &str) -> Lang {
        match name {
            "bash" | "sh" | "dash" | "zsh" | "ksh" | "source" | "." => Lang::Shell,
            n if n.starts_with("python") => Lang::Python,
            "node" | "deno" | "bun" => Lang::JavaScript,
            "make" | "gmake" => Lang::Make,
            _ => Lang::Other,
        }
    }

    /// What a file is, by its name or its `#!` line.
    pub(super) fn of_file(path: &Path, text: &str) -> Option<Lang> {
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

/// A simple command from its program on: variable assignments and wrappers (`env`,
/// `nohup`, with their options) left out.
pub(super) fn program(words: &[String]) -> &[String] {
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
pub(super) fn reads_input(words: &[String]) -> bool {
    let w = program(words);
    w.first()
        .is_some_and(|p| INTERPRETERS.contains(&basename(p)))
        && !w[1..]
            .iter()
            .any(|a| !a.starts_with('-') || ["-c", "-e", "-m"].contains(&a.as_str()))
}

/// The files a simple command runs: its program when it is a path, an interpreter's script,
/// `make`'s makefile.
pub(super) fn operands(words: &[String]) -> Vec<String> {
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
pub(super) fn packages(rel: &str) -> impl Iterator<Item = PathBuf> + '_ {
    rel.match_indices('/')
        .map(|(i, _)| Path::new(&rel[..i]).join("__init__.py"))
}

/// The simple commands of a line, as words: split at `;`, `&`, `|` and newlines outside
/// quotes, quotes and backslashes resolved. A reading for showing and hashing files, not
/// for judging the line (the rules parse it for that).
pub(super) fn commands(line: &str) -> Vec<Vec<String>> {
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

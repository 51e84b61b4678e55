//! Approval rules: `tool` or `tool(pattern)`, the pattern a glob on the call's main argument
//! (the command line for `run_command`, the resolved workspace-relative path for file tools,
//! the compact JSON input otherwise).
//!
//! Command lines are judged on a real shell parse (`brush-parser`). An allow rule allows a
//! line only when every command in it is a plain command of literal words (quotes resolved)
//! joined by `&&`, `||`, `;`, `|` or newlines, and a rule allows each. Redirection (except to
//! `/dev/null`), substitutions, expanding heredocs, assignment prefixes, subshells and groups,
//! `&`, and commands that run commands are never allowed by a rule: the approval mode decides.
//! Deny and ask rules match each command's normalized name (basename, quotes and escapes
//! resolved) with its arguments, also behind wrappers (`command`, `env`, `xargs`, …),
//! assignments and inside `bash -c '…'` or `eval`. When a line runs something such rules
//! cannot see (a computed command name, code for an interpreter, `find -delete`, a line that
//! does not parse), a deny or ask rule on the tool makes the line ask. Deny rules on commands
//! are a tripwire; the sandbox is the guarantee.
//!
//! Below both `approval` (which decides with the rules) and `tools` (whose built-ins refuse
//! what a deny rule names).

use brush_parser::ast;
use brush_parser::word::WordPiece;
use globset::{GlobBuilder, GlobMatcher};

#[derive(Clone, Debug)]
pub(crate) struct Rule {
    /// As written, for messages.
    pub(crate) text: String,
    tool: GlobMatcher,
    pattern: Option<GlobMatcher>,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "approval rule `{rule}`: {why}; write `tool` or `tool(pattern)`, e.g. `run_command(cargo test*)`"
)]
pub struct RuleError {
    pub(crate) rule: String,
    pub(crate) why: String,
}

fn glob(text: &str, rule: &str) -> Result<GlobMatcher, RuleError> {
    GlobBuilder::new(text)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| RuleError {
            rule: rule.to_string(),
            why: e.to_string(),
        })
}

impl Rule {
    pub(crate) fn parse(text: &str) -> Result<Rule, RuleError> {
        let t = text.trim();
        let (tool, pattern) = match t.find('(') {
            Some(open) => {
                let Some(inner) = t[open + 1..].strip_suffix(')') else {
                    return Err(RuleError {
                        rule: text.into(),
                        why: "the pattern does not end with `)`".into(),
                    });
                };
                (&t[..open], Some(inner))
            }
            None => (t, None),
        };
        if tool.trim().is_empty() {
            return Err(RuleError {
                rule: text.into(),
                why: "no tool name".into(),
            });
        }
        Ok(Rule {
            text: t.to_string(),
            tool: glob(tool.trim(), text)?,
            pattern: pattern.map(|p| glob(p, text)).transpose()?,
        })
    }

    fn matches(&self, tool: &str, part: &str) -> bool {
        self.tool.is_match(tool) && self.pattern.as_ref().is_none_or(|p| p.is_match(part))
    }
}

/// The allow, ask and deny rules of a run, from every source.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub(crate) allow: Vec<Rule>,
    pub(crate) ask: Vec<Rule>,
    pub(crate) deny: Vec<Rule>,
}

impl Rules {
    pub fn parse(allow: &[String], ask: &[String], deny: &[String]) -> Result<Rules, RuleError> {
        let all = |v: &[String]| {
            v.iter()
                .map(|r| Rule::parse(r))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Rules {
            allow: all(allow)?,
            ask: all(ask)?,
            deny: all(deny)?,
        })
    }

    /// What the rules say of a call: deny beats ask beats allow; `None` when no rule decides.
    /// A command line that runs what the rules cannot see counts as matching every deny and
    /// ask rule on `run_command`.
    pub(crate) fn judge(&self, tool: &str, arg: &str) -> Option<(Verdict, &Rule)> {
        if tool != "run_command" {
            let any = |r: &Rule| r.matches(tool, arg);
            if let Some(r) = self.deny.iter().find(|r| any(r)) {
                return Some((Verdict::Deny, r));
            }
            if let Some(r) = self.ask.iter().find(|r| any(r)) {
                return Some((Verdict::Ask, r));
            }
            return self
                .allow
                .iter()
                .find(|r| any(r))
                .map(|r| (Verdict::Allow, r));
        }
        let line = Line::of(arg);
        let tripwire = |r: &Rule| {
            r.tool.is_match(tool)
                && match &r.pattern {
                    None => true,
                    Some(p) => line.seen.iter().any(|s| p.is_match(s)),
                }
        };
        // A line that runs what the rules cannot see matches every rule on the tool.
        let hidden = |r: &Rule| line.hidden.is_some() && r.tool.is_match(tool);
        if let Some(r) = self.deny.iter().find(|r| tripwire(r) || hidden(r)) {
            return Some((Verdict::Deny, r));
        }
        if let Some(r) = self.ask.iter().find(|r| tripwire(r) || hidden(r)) {
            return Some((Verdict::Ask, r));
        }
        if line.never.is_some() {
            return None;
        }
        let mut last = None;
        for p in &line.plain {
            last = Some(self.allow.iter().find(|r| r.matches(tool, p))?);
        }
        last.map(|r| (Verdict::Allow, r))
    }

    /// What keeps a call from being allowed by a rule, for telling the model which part was
    /// the problem: each command no allow rule covers, or why no rule can allow the line.
    /// Empty when there is nothing finer to say than the whole call.
    pub(crate) fn unallowed(&self, tool: &str, arg: &str) -> Vec<String> {
        if tool != "run_command" {
            return Vec::new();
        }
        let line = Line::of(arg);
        if let Some(why) = line.never {
            return vec![format!("`{arg}`: it has {why}, and no rule can allow that")];
        }
        let missing: Vec<String> = line
            .plain
            .iter()
            .filter(|p| !self.allow.iter().any(|r| r.matches(tool, p)))
            .map(|p| format!("`{p}`"))
            .collect();
        if line.plain.len() > 1 {
            missing
                .into_iter()
                .map(|m| format!("{m} (a part of the command line `{arg}`)"))
                .collect()
        } else {
            Vec::new()
        }
    }

    /// What a command line runs that the rules cannot see, if anything: why a deny rule
    /// counts as matching it.
    pub(crate) fn unseen(&self, tool: &str, arg: &str) -> Option<String> {
        (tool == "run_command")
            .then(|| Line::of(arg).hidden)
            .flatten()
    }

    /// Whether an allow rule names this call explicitly (and no deny rule matches): what
    /// writes under `.git/` and to files with other hard links need.
    pub(crate) fn allows(&self, tool: &str, arg: &str) -> bool {
        matches!(self.judge(tool, arg), Some((Verdict::Allow, _)))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allow,
    Ask,
    Deny,
}

/// Lines longer than this, or nested deeper, are not judged: no rule allows them, and every
/// deny rule on `run_command` counts as matching.
const MAX_LEN: usize = 32 * 1024;
/// Code inside code (`bash -c`, `eval`, substitutions), levels deep.
const MAX_DEPTH: usize = 6;
const MAX_NESTING: usize = 64;
/// Compound commands (`if`, `while`, `(`, `case`, …) in one line, nested or not: the parser
/// recurses on them, and backtracks exponentially on some unclosed ones (`( ( ( …`).
const MAX_COMPOUND: usize = 12;
/// How many commands behind wrappers one line may make the rules read.
const MAX_RUNS: usize = 256;
/// The stack of the thread that parses: what the parser's recursion (built without
/// optimization) needs for the deepest line the bounds let through, with room to spare.
const PARSE_STACK: usize = 64 * 1024 * 1024;

/// What the rules see of a command line.
#[derive(Debug, Default)]
struct Line {
    /// Each plain command with its literal words, shell-quoted where needed: what allow
    /// rules judge.
    plain: Vec<String>,
    /// Why no rule can allow the line, if so.
    never: Option<String>,
    /// Every command the line would run, by normalized name and as written, with its
    /// arguments: what deny and ask rules judge.
    seen: Vec<String>,
    /// What runs that deny rules cannot see, if anything.
    hidden: Option<String>,
    /// Commands read so far, against `MAX_RUNS`.
    runs: usize,
    /// Whether the command being read gets its standard input from a pipe or a redirection.
    fed: bool,
}

/// One word of a command: its literal value when it has one, and a best reading for deny
/// rules (quotes resolved, expansions left as written).
#[derive(Clone, Debug)]
struct Arg {
    literal: Option<String>,
    loose: String,
}

impl Arg {
    fn plain(s: &str) -> Arg {
        Arg {
            literal: Some(s.to_string()),
            loose: s.to_string(),
        }
    }
}

fn options() -> brush_parser::ParserOptions {
    brush_parser::ParserOptions::default()
}

/// How many compound commands a line opens, from its tokens (quotes, heredocs and
/// substitutions are inside tokens): a bound on the parser's recursion and backtracking.
/// `None` when the line does not tokenize.
fn compounds(text: &str) -> Option<usize> {
    let tokens =
        brush_parser::uncached_tokenize_str(text, &brush_parser::TokenizerOptions::default())
            .ok()?;
    Some(
        tokens
            .iter()
            .filter(|t| match t {
                brush_parser::Token::Operator(o, _) => o == "(" || o == "((",
                brush_parser::Token::Word(w, _) => [
                    "if", "while", "until", "for", "select", "case", "function", "{", "[[",
                ]
                .contains(&w.as_str()),
            })
            .count(),
    )
}

/// How deeply brackets nest, a bound on the parser's recursion.
fn nesting(text: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for c in text.chars() {
        match c {
            '(' | '{' | '[' | '`' => {
                depth += 1;
                max = max.max(depth);
            }
            ')' | '}' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Whether a redirection gives a command its standard input.
fn feeds_stdin(r: &ast::IoRedirect) -> bool {
    use ast::IoFileRedirectKind as K;
    let stdin = |fd: &Option<ast::IoFd>| fd.is_none_or(|f| f == 0);
    match r {
        ast::IoRedirect::File(fd, K::Read | K::ReadAndWrite | K::DuplicateInput, _) => stdin(fd),
        ast::IoRedirect::HereDocument(fd, _) | ast::IoRedirect::HereString(fd, _) => stdin(fd),
        _ => false,
    }
}

/// Shell-quote a word when it holds anything but plain characters.
fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_alphanumeric() || "-_./=:,+@%^".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Up to `max` digits of `radix` from `it`, as a character.
fn number(
    it: &mut std::iter::Peekable<std::str::Chars<'_>>,
    radix: u32,
    max: usize,
) -> Option<char> {
    let mut digits = String::new();
    while digits.len() < max
        && let Some(c) = it.peek().copied().filter(|c| c.is_digit(radix))
    {
        digits.push(c);
        it.next();
    }
    u32::from_str_radix(&digits, radix)
        .ok()
        .and_then(char::from_u32)
}

/// Decode the inside of `$'…'`.
fn ansi_c(raw: &str) -> String {
    let mut out = String::new();
    let mut it = raw.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(e) = it.next() else {
            out.push('\\');
            break;
        };
        let decoded = match e {
            'a' => Some('\x07'),
            'b' => Some('\x08'),
            'e' | 'E' => Some('\x1b'),
            'f' => Some('\x0c'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'v' => Some('\x0b'),
            'x' => number(&mut it, 16, 2),
            'u' => number(&mut it, 16, 4),
            'U' => number(&mut it, 16, 8),
            'c' => it.next().map(|c| char::from((c as u8) & 0x1f)),
            '0'..='7' => {
                let mut digits = e.to_string();
                while digits.len() < 3
                    && let Some(d) = it.peek().copied().filter(|c| c.is_digit(8))
                {
                    digits.push(d);
                    it.next();
                }
                u32::from_str_radix(&digits, 8)
                    .ok()
                    .and_then(char::from_u32)
            }
            other => Some(other),
        };
        if let Some(d) = decoded {
            out.push(d);
        }
    }
    out
}

/// Commands that run the command in their arguments, with the options that take a value
/// and how many operands come before the command.
fn wrapper(name: &str) -> Option<(&'static [&'static str], usize)> {
    let found: (&'static [&'static str], usize) = match name {
        "command" | "builtin" | "nohup" | "setsid" | "unbuffer" | "busybox" | "toybox" => (&[], 0),
        "pkexec" => (&["--user"], 0),
        "strace" | "ltrace" => (
            &[
                "-o", "-e", "-p", "-s", "-u", "-a", "-b", "-E", "-I", "-P", "-X", "-O", "-S", "-U",
                "-n", "-A", "-D", "-F", "-l", "-w", "-x",
            ],
            0,
        ),
        "unshare" => (
            &[
                "-S",
                "-G",
                "-R",
                "-w",
                "--setuid",
                "--setgid",
                "--root",
                "--wd",
                "--propagation",
                "--map-user",
                "--map-group",
                "--map-users",
                "--map-groups",
            ],
            0,
        ),
        "nsenter" => (&["-t", "-S", "-G", "--target", "--setuid", "--setgid"], 0),
        "exec" => (&["-a"], 0),
        "nice" => (&["-n", "--adjustment"], 0),
        "ionice" => (&["-c", "-n", "-p", "-t"], 0),
        "time" => (&["-f", "-o", "--format", "--output"], 0),
        "timeout" => (&["-s", "-k", "--signal", "--kill-after"], 1),
        "sudo" | "doas" => (
            &[
                "-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "-R",
            ],
            0,
        ),
        "xargs" => (
            &[
                "-a",
                "-d",
                "-E",
                "-I",
                "-L",
                "-n",
                "-P",
                "-s",
                "--arg-file",
                "--delimiter",
                "--max-args",
                "--max-procs",
                "--max-chars",
                "--max-lines",
                "--replace",
            ],
            0,
        ),
        "stdbuf" => (&["-i", "-o", "-e"], 0),
        "chrt" | "taskset" | "flock" | "chroot" | "sg" => (&["-c", "-w", "-E"], 1),
        "watch" => (&["-n", "-d", "--interval"], 0),
        "runuser" | "su" => (&["-u", "-g", "-G", "-s", "--shell", "--group"], 0),
        _ => return None,
    };
    Some(found)
}

/// Where the command behind a wrapper may start: as the table of options that take a value
/// says, as if no option took one, and as if every option took one. A table can be wrong or
/// out of date; deny rules read every reading.
fn starts(argv: &[Arg], with_value: &[&str]) -> Vec<usize> {
    let mut out = Vec::new();
    for reading in 0..3 {
        let mut i = 1;
        while let Some(a) = argv.get(i).map(|a| a.loose.as_str()) {
            if a == "--" {
                i += 1;
                break;
            }
            if !a.starts_with('-') || a == "-" {
                break;
            }
            let takes = match reading {
                0 => with_value.contains(&a),
                1 => false,
                _ => !a.contains('='),
            };
            i += if takes { 2 } else { 1 };
        }
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "ash"];
const INTERPRETERS: &[&str] = &[
    "python",
    "perl",
    "ruby",
    "node",
    "nodejs",
    "deno",
    "bun",
    "php",
    "lua",
    "luajit",
    "tclsh",
    "wish",
    "Rscript",
    "pwsh",
    "osascript",
    "jshell",
    "groovy",
    "julia",
    "awk",
    "gawk",
    "mawk",
    "nawk",
    "irb",
];

/// Programs that run commands they are given elsewhere: on a schedule, another host, a
/// terminal multiplexer's server or a container, in a form the rules do not read.
const ELSEWHERE: &[&str] = &[
    "parallel",
    "systemd-run",
    "cgexec",
    "firejail",
    "bwrap",
    "at",
    "batch",
    "ssh",
    "tmux",
    "screen",
    "dtach",
    "expect",
];

/// Whether `arg` is a short option cluster holding `-c` (`-p`, `-rp`).
fn short_flag(arg: &str, c: char) -> bool {
    arg.len() > 1 && arg.starts_with('-') && !arg.starts_with("--") && arg[1..].contains(c)
}

/// Whether one of `args` of `name` is an option that makes it run a program it names
/// (long options also abbreviated, as getopt takes them; short ones also bundled).
fn runs_with_option(name: &str, args: &[&str]) -> bool {
    let opts: &[&str] = match name {
        "tar" => &[
            "--checkpoint-action",
            "--to-command",
            "--use-compress-program",
            "--info-script",
            "--new-volume-script",
            "--rsh-command",
            "-I",
            "-F",
        ],
        "sort" => &["--compress-program"],
        "rg" => &["--pre"],
        "man" => &["--pager", "--html", "-P", "-H"],
        _ => return false,
    };
    // tar's first word may be a cluster of short options without a dash (`tar xIf id x`).
    let old_style = (name == "tar")
        .then(|| args.first().filter(|a| !a.starts_with('-')))
        .flatten()
        .is_some_and(|a| a.contains(['I', 'F']));
    old_style || args.iter().any(|a| opts.iter().any(|o| git_names(a, o)))
}

fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

impl Line {
    /// Judge a line on a thread of its own, with a stack that the parser's recursion cannot
    /// overflow within the bounds; a panic there leaves the line unjudged, not `sup` down.
    fn of(text: &str) -> Line {
        let owned = text.to_string();
        let judged = std::thread::Builder::new()
            .name("sup-rules".into())
            .stack_size(PARSE_STACK)
            .spawn(move || {
                let mut line = Line::default();
                line.parse(&owned, 0);
                line
            })
            .ok()
            .and_then(|t| t.join().ok());
        let mut line = judged.unwrap_or_else(|| {
            let mut line = Line::default();
            line.hide("a line the rules could not read");
            line
        });
        if line.plain.is_empty() {
            line.never("an empty command line");
        }
        line
    }

    fn never(&mut self, why: impl Into<String>) {
        if self.never.is_none() {
            self.never = Some(why.into());
        }
    }

    fn hide(&mut self, why: impl Into<String>) {
        let why = why.into();
        self.never(why.clone());
        if self.hidden.is_none() {
            self.hidden = Some(why);
        }
    }

    fn parse(&mut self, text: &str, depth: usize) {
        if depth > MAX_DEPTH
            || text.len() > MAX_LEN
            || nesting(text) > MAX_NESTING
            || compounds(text).is_some_and(|n| n > MAX_COMPOUND)
        {
            self.hide("a line too long or too deeply nested to judge");
            return;
        }
        match brush_parser::Parser::new(text.as_bytes(), &options()).parse_program() {
            Ok(program) => {
                for list in &program.complete_commands {
                    self.list(list, depth);
                }
            }
            _ => self.hide("a line that does not parse"),
        }
    }

    fn list(&mut self, list: &ast::CompoundList, depth: usize) {
        for ast::CompoundListItem(and_or, sep) in &list.0 {
            if matches!(sep, ast::SeparatorOperator::Async) {
                self.never("`&` (a background job)");
            }
            for (_, pipeline) in and_or.iter() {
                if pipeline.timed.is_some() {
                    self.never("`time`, which runs a command");
                }
                let outer = self.fed;
                for (k, command) in pipeline.seq.iter().enumerate() {
                    self.fed = outer || k > 0;
                    self.command(command, depth);
                }
                self.fed = outer;
            }
        }
    }

    fn command(&mut self, command: &ast::Command, depth: usize) {
        match command {
            ast::Command::Simple(s) => self.simple(s, depth),
            ast::Command::Compound(c, redirects) => {
                self.never("a subshell, group or compound command");
                let fed = self.fed;
                for r in redirects.iter().flat_map(|r| &r.0) {
                    self.redirect(r, depth);
                }
                self.fed = fed || redirects.iter().flat_map(|r| &r.0).any(feeds_stdin);
                self.compound(c, depth);
                self.fed = fed;
            }
            ast::Command::Function(_) => self.hide("a function definition"),
            ast::Command::ExtendedTest(test, redirects) => {
                self.never("`[[ … ]]`");
                self.opaque_text(&test.to_string());
                for r in redirects.iter().flat_map(|r| &r.0) {
                    self.redirect(r, depth);
                }
            }
        }
    }

    /// Text whose parts the rules do not walk: hidden when it can run a command.
    fn opaque_text(&mut self, text: &str) {
        if text.contains("$(") || text.contains('`') || text.contains("<(") || text.contains(">(") {
            self.hide("a substitution inside an expression");
        }
    }

    fn compound(&mut self, c: &ast::CompoundCommand, depth: usize) {
        use ast::CompoundCommand as C;
        match c {
            C::BraceGroup(b) => self.list(&b.list, depth),
            C::Subshell(s) => self.list(&s.list, depth),
            C::ForClause(f) => {
                for w in f.values.iter().flatten() {
                    self.word(w, depth);
                }
                self.list(&f.body.list, depth);
            }
            C::WhileClause(w) | C::UntilClause(w) => {
                self.list(&w.0, depth);
                self.list(&w.1.list, depth);
            }
            C::IfClause(i) => {
                self.list(&i.condition, depth);
                self.list(&i.then, depth);
                for e in i.elses.iter().flatten() {
                    if let Some(c) = &e.condition {
                        self.list(c, depth);
                    }
                    self.list(&e.body, depth);
                }
            }
            C::CaseClause(c) => {
                self.word(&c.value, depth);
                for item in &c.cases {
                    if let Some(l) = &item.cmd {
                        self.list(l, depth);
                    }
                }
            }
            C::Arithmetic(_) | C::ArithmeticForClause(_) => self.opaque_text(&c.to_string()),
            C::Coprocess(_) => self.hide("a coprocess"),
        }
    }

    fn redirect(&mut self, r: &ast::IoRedirect, depth: usize) {
        use ast::IoFileRedirectTarget as T;
        match r {
            ast::IoRedirect::File(_, _, target) => match target {
                T::Filename(w) => {
                    if self.word(w, depth).literal.as_deref() != Some("/dev/null") {
                        self.never("a redirection to a file");
                    }
                }
                T::Fd(_) => {}
                T::Duplicate(w) => {
                    let to = self.word(w, depth).literal;
                    if !to.is_some_and(|t| t == "-" || t.chars().all(|c| c.is_ascii_digit())) {
                        self.never("a redirection to a file");
                    }
                }
                T::ProcessSubstitution(_, sub) => {
                    self.never("a process substitution");
                    self.list(&sub.list, depth);
                }
            },
            ast::IoRedirect::OutputAndError(w, _) => {
                if self.word(w, depth).literal.as_deref() != Some("/dev/null") {
                    self.never("a redirection to a file");
                }
            }
            ast::IoRedirect::HereString(_, w) => {
                self.word(w, depth);
            }
            ast::IoRedirect::HereDocument(_, doc) => {
                if doc.requires_expansion {
                    self.never("a heredoc that expands");
                    self.opaque_text(&doc.doc.value);
                }
            }
        }
    }

    /// Read one word: record what its substitutions run, and give its literal value when it
    /// has one.
    fn word(&mut self, w: &ast::Word, depth: usize) -> Arg {
        let Ok(pieces) = brush_parser::word::parse(&w.value, &options()) else {
            self.hide("a word that does not parse");
            return Arg {
                literal: None,
                loose: w.value.clone(),
            };
        };
        let mut literal = Some(String::new());
        let mut loose = String::new();
        let mut stack: Vec<_> = pieces.into_iter().rev().collect();
        while let Some(p) = stack.pop() {
            let raw = w.value.get(p.start_index..p.end_index).unwrap_or("");
            let text = match p.piece {
                WordPiece::Text(t) => {
                    if t.contains(['*', '?', '[', '{']) {
                        literal = None;
                    }
                    Some(t)
                }
                WordPiece::SingleQuotedText(t) => Some(t),
                WordPiece::AnsiCQuotedText(t) => Some(ansi_c(&t)),
                WordPiece::EscapeSequence(e) => Some(e.chars().skip(1).collect()),
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    stack.extend(inner.into_iter().rev());
                    continue;
                }
                WordPiece::CommandSubstitution(inner)
                | WordPiece::BackquotedCommandSubstitution(inner) => {
                    self.never("a command substitution");
                    self.parse(&inner, depth + 1);
                    None
                }
                WordPiece::ArithmeticExpression(e) => {
                    self.opaque_text(&e.value);
                    None
                }
                WordPiece::TildeExpansion(_) | WordPiece::ParameterExpansion(_) => {
                    self.opaque_text(raw);
                    None
                }
            };
            match text {
                Some(t) => {
                    loose.push_str(&t);
                    if let Some(l) = &mut literal {
                        l.push_str(&t);
                    }
                }
                None => {
                    loose.push_str(raw);
                    literal = None;
                }
            }
        }
        Arg { literal, loose }
    }

    fn simple(&mut self, s: &ast::SimpleCommand, depth: usize) {
        use ast::CommandPrefixOrSuffixItem as I;
        let mut argv = Vec::new();
        let prefix = s
            .prefix
            .iter()
            .flat_map(|p| &p.0)
            .map(|i| (true, i.clone()));
        let name = s.word_or_name.clone().map(|w| (false, I::Word(w)));
        let suffix = s
            .suffix
            .iter()
            .flat_map(|p| &p.0)
            .map(|i| (false, i.clone()));
        let items: Vec<(bool, I)> = prefix.chain(name).chain(suffix).collect();
        let fed = self.fed
            || items
                .iter()
                .any(|(_, i)| matches!(i, I::IoRedirect(r) if feeds_stdin(r)));
        for (in_prefix, item) in &items {
            match item {
                I::IoRedirect(r) => self.redirect(r, depth),
                I::Word(w) => argv.push(self.word(w, depth)),
                I::AssignmentWord(_, w) => {
                    if *in_prefix {
                        self.never("an assignment prefix (`NAME=…`)");
                        self.assignment(&w.value);
                        let value = w.value.split_once('=').map_or("", |(_, v)| v);
                        self.word(&ast::Word::new(value), depth);
                    } else {
                        argv.push(self.word(w, depth));
                    }
                }
                I::ProcessSubstitution(_, sub) => {
                    self.never("a process substitution");
                    self.list(&sub.list, depth);
                }
            }
        }
        if argv.is_empty() {
            return;
        }
        if argv.iter().all(|a| a.literal.is_some()) {
            let words: Vec<String> = argv
                .iter()
                .map(|a| quote(a.literal.as_deref().unwrap_or_default()))
                .collect();
            self.plain.push(words.join(" "));
        } else {
            self.never("an expansion (`$…`, `~`, a glob or braces)");
        }
        self.fed = fed;
        self.run(&argv, depth);
    }

    /// A command about to run with these words: what deny rules see, and what it runs.
    fn run(&mut self, argv: &[Arg], depth: usize) {
        let Some(first) = argv.first() else {
            return;
        };
        self.runs += 1;
        if self.runs > MAX_RUNS {
            self.hide("more commands behind wrappers than the rules read");
            return;
        }
        let Some(written) = first.literal.as_deref() else {
            self.hide(format!("a computed command name (`{}`)", first.loose));
            return;
        };
        let name = basename(written);
        let args: Vec<&str> = argv[1..].iter().map(|a| a.loose.as_str()).collect();
        let rest = |head: &str| {
            std::iter::once(head)
                .chain(args.iter().copied())
                .collect::<Vec<_>>()
                .join(" ")
        };
        self.seen.push(rest(name));
        if written != name {
            self.seen.push(rest(written));
        }
        if name.is_empty() {
            return;
        }
        if name == "env" {
            self.never("`env`, which runs a command");
            let mut i = 1;
            while i < argv.len() {
                let a = argv[i].loose.as_str();
                if a == "-S" || a == "--split-string" {
                    if let Some(s) = argv.get(i + 1) {
                        self.parse(&s.loose, depth + 1);
                    }
                    return;
                } else if let Some(s) = a.strip_prefix("--split-string=") {
                    self.parse(s, depth + 1);
                    return;
                } else if ["-u", "-C", "--unset", "--chdir"].contains(&a) {
                    i += 2;
                } else if a.starts_with('-') || a.contains('=') {
                    self.assignment(a);
                    i += 1;
                } else {
                    break;
                }
            }
            return self.run(&argv[i.min(argv.len())..], depth);
        }
        if name == "eval" || name == "source" || name == "." || name == "trap" {
            let what = format!("`{name}`, which runs code");
            if name == "eval" || name == "trap" {
                self.never(what);
                let code: Vec<&str> = args.iter().copied().filter(|a| *a != "--").collect();
                let code = if name == "trap" {
                    code.first().copied().unwrap_or_default().to_string()
                } else {
                    code.join(" ")
                };
                self.parse(&code, depth + 1);
            } else {
                self.hide(what);
            }
            return;
        }
        if name == "script" {
            // util-linux `script [-c CMD] [FILE]`: without a command it runs a shell that
            // reads its standard input.
            self.never("`script`, which runs a command");
            let code = argv.iter().enumerate().skip(1).find_map(|(k, a)| {
                let a = a.loose.as_str();
                if a == "-c" || a == "--command" {
                    argv.get(k + 1).map(|c| c.loose.clone())
                } else {
                    a.strip_prefix("--command=").map(str::to_string)
                }
            });
            match code {
                Some(code) => self.parse(&code, depth + 1),
                None => self.hide("`script`, which runs a shell that reads its input"),
            }
            return;
        }
        if let Some((with_value, operands)) = wrapper(name) {
            self.never(format!("`{name}`, which runs a command"));
            if name == "watch" {
                return self.parse(&args.join(" "), depth + 1);
            }
            if ["su", "runuser", "flock", "sg"].contains(&name)
                && let Some(k) = argv.iter().position(|a| a.loose == "-c")
            {
                match argv.get(k + 1) {
                    Some(code) => self.parse(&code.loose, depth + 1),
                    None => self.hide(format!("`{name} -c` with no code")),
                }
                return;
            }
            for start in starts(argv, with_value) {
                let inner = argv.get(start + operands..).unwrap_or_default();
                if name == "xargs" {
                    // The arguments come from stdin: deny rules see that there are some.
                    let mut inner = inner.to_vec();
                    if inner.is_empty() {
                        inner.push(Arg::plain("echo"));
                    }
                    inner.push(Arg::plain("…"));
                    self.run(&inner, depth);
                } else {
                    self.run(inner, depth);
                }
            }
            return;
        }
        if SHELLS.contains(&name) {
            let (mut i, mut code, mut stdin) = (1, false, false);
            while let Some(a) = argv.get(i).map(|a| a.loose.as_str()) {
                if a == "--" || a == "-" {
                    i += 1;
                    break;
                }
                if !a.starts_with(['-', '+']) {
                    break;
                }
                if a.starts_with("--") {
                    let valued = ["--rcfile", "--init-file"].contains(&a);
                    i += if valued { 2 } else { 1 };
                    continue;
                }
                let letters = &a[1..];
                code |= a.starts_with('-') && letters.contains('c');
                stdin |= letters.contains('s');
                // `-o OPTION` and `-O SHOPT` take the next word, also in a cluster (`-eo`).
                i += 1 + letters.chars().filter(|c| *c == 'o' || *c == 'O').count();
            }
            if code {
                self.never(format!("`{name} -c`, a shell given code"));
                match argv.get(i) {
                    Some(c) => match &c.literal {
                        Some(l) => self.parse(l, depth + 1),
                        None => self.hide("code for a shell that is computed"),
                    },
                    None => self.hide("a shell with code it reads elsewhere"),
                }
            } else if stdin || argv.get(i).is_none() {
                self.hide(format!("`{name}` reading code from its standard input"));
            }
            return;
        }
        let interpreter = INTERPRETERS.iter().any(|i| {
            name == *i
                || name.strip_prefix(i).is_some_and(|v| {
                    v.starts_with(['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '.', '-'])
                })
        });
        if interpreter {
            let gives_code = name.ends_with("awk")
                || args.iter().any(|a| {
                    ["--eval", "--exec", "--command", "-r", "-p", "--print"].contains(a)
                        || (a.starts_with('-')
                            && !a.starts_with("--")
                            && a.contains(['c', 'e', 'E']))
                });
            if gives_code {
                self.hide(format!("`{name}` given code to run"));
            } else if args.contains(&"-") || (self.fed && args.iter().all(|a| a.starts_with('-'))) {
                self.hide(format!("`{name}` reading code from its standard input"));
            }
            return;
        }
        match name {
            "export" | "declare" | "typeset" | "readonly" | "local" => {
                for a in &args {
                    self.assignment(a);
                }
            }
            "find" => {
                let mut i = 1;
                while i < argv.len() {
                    let a = argv[i].loose.as_str();
                    if ["-exec", "-execdir", "-ok", "-okdir"].contains(&a) {
                        self.never(format!("`find {a}`, which runs a command"));
                        let end = argv[i + 1..]
                            .iter()
                            .position(|w| w.loose == ";" || w.loose == "+")
                            .map_or(argv.len(), |p| i + 1 + p);
                        self.run(&argv[i + 1..end], depth);
                        i = end;
                    } else if a == "-delete" {
                        self.hide("`find -delete`, which deletes files");
                    } else if ["-fprint", "-fprint0", "-fprintf", "-fls"].contains(&a) {
                        self.never(format!("`find {a}`, which writes a file"));
                    }
                    i += 1;
                }
            }
            "git" => self.git(&args),
            // `hash -p PATH NAME` and an alias give a name another program; `mapfile -C` and
            // `enable -f` run code of their own.
            "hash" if args.iter().any(|a| short_flag(a, 'p')) => {
                self.hide("`hash -p`, which gives a command name another program")
            }
            "alias" => self.hide("`alias`, which gives a command name other code"),
            "mapfile" | "readarray" if args.iter().any(|a| short_flag(a, 'C')) => {
                self.hide(format!("`{name} -C`, which runs a callback"))
            }
            "enable" if args.iter().any(|a| short_flag(a, 'f')) => {
                self.hide("`enable -f`, which loads code")
            }
            _ if runs_with_option(name, &args) => {
                self.hide(format!("`{name}` with an option that runs a program"))
            }
            _ if ELSEWHERE.contains(&name) => self.hide(format!(
                "`{name}`, which runs commands the rules cannot read (possibly outside the \
                 sandbox)"
            )),
            _ => {}
        }
    }

    /// `NAME=value` for a variable that makes programs run other code (a library, a start-up
    /// file, a pager, a search path): what then runs, the rules cannot see.
    fn assignment(&mut self, word: &str) {
        let Some((name, _)) = word.split_once('=') else {
            return;
        };
        let name = name.trim_end_matches('+');
        let code = [
            "PATH",
            "LD_PRELOAD",
            "LD_AUDIT",
            "LD_LIBRARY_PATH",
            "BASH_ENV",
            "ENV",
            "PROMPT_COMMAND",
            "SHELLOPTS",
            "BASHOPTS",
            "PS4",
            "IFS",
            "PAGER",
            "MANPAGER",
            "EDITOR",
            "VISUAL",
            "LESSOPEN",
            "LESSCLOSE",
            "SSH_ASKPASS",
            "SUDO_ASKPASS",
            "PYTHONSTARTUP",
            "PYTHONPATH",
            "PYTHONHOME",
            "PERL5OPT",
            "PERL5LIB",
            "PERLLIB",
            "RUBYOPT",
            "RUBYLIB",
            "NODE_OPTIONS",
            "NODE_PATH",
            "RUSTC",
            "RUSTC_WRAPPER",
            "MAKEFLAGS",
        ]
        .contains(&name)
            || name.starts_with("GIT_")
            || (name.starts_with("CARGO_")
                && (name.ends_with("RUNNER")
                    || name.ends_with("WRAPPER")
                    || name.ends_with("RUSTC")));
        if code {
            self.hide(format!(
                "`{name}=…`, which can make a command run other code"
            ));
        }
    }

    /// `git`: its global options (some take a value: `-C DIR -c NAME=VALUE` hides nothing),
    /// then the subcommand. Configuration, a git folder elsewhere, an exec path and the
    /// subcommands that run a command they are given run what the rules cannot see.
    fn git(&mut self, args: &[&str]) {
        const VALUED: &[&str] = &[
            "-C",
            "-c",
            "--git-dir",
            "--work-tree",
            "--namespace",
            "--config-env",
            "--super-prefix",
            "--attr-source",
        ];
        let mut i = 0;
        while let Some(a) = args.get(i) {
            if !a.starts_with('-') {
                break;
            }
            let flag = a.split_once('=').map_or(*a, |(f, _)| f);
            if flag.starts_with("-c")
                || ["--config-env", "--exec-path", "--git-dir"].contains(&flag)
            {
                self.hide(format!("`git {a}`, which can run any command"));
            }
            i += if VALUED.contains(a) { 2 } else { 1 };
        }
        let sub = args.get(i).copied().unwrap_or_default();
        let rest = args.get(i + 1..).unwrap_or_default();
        let has = |opts: &[&str]| rest.iter().any(|a| opts.iter().any(|o| git_names(a, o)));
        let runs = match sub {
            // send-email runs `--sendmail-cmd`, `--smtp-server=PROGRAM`, `--to-cmd` …;
            // instaweb its `--httpd`.
            "config" | "filter-branch" | "send-email" | "instaweb" => true,
            "submodule" => rest.contains(&"foreach"),
            "bisect" => rest.contains(&"run"),
            "rebase" => has(&["-x", "--exec"]),
            "grep" => {
                has(&["-O", "--open-files-in-pager"]) || rest.iter().any(|a| a.starts_with("-O"))
            }
            "difftool" | "mergetool" => has(&["-x", "--extcmd", "-t", "--tool"]),
            "clone" => has(&["-u", "-c", "--config", "--template"]),
            // A template folder's `config` and `hooks/` become the new repository's.
            "init" => has(&["--template"]),
            _ => false,
        } || has(&[
            "--upload-pack",
            "--receive-pack",
            "--exec",
            "--exec-path",
            "--config-env",
        ]);
        if runs {
            self.hide(format!(
                "`git {sub}` as called here, which can run any command"
            ));
        }
    }
}

/// Whether `arg` of a git subcommand names `opt`: a long option as written or abbreviated
/// (git takes any unambiguous prefix: `--templ=t` is `--template=t`), a short one alone or
/// bundled with others (`-ix` holds `-x`).
fn git_names(arg: &str, opt: &str) -> bool {
    if let Some(long) = opt.strip_prefix("--") {
        let flag = arg.split_once('=').map_or(arg, |(f, _)| f);
        flag.strip_prefix("--")
            .is_some_and(|f| !f.is_empty() && long.starts_with(f))
    } else {
        let short = opt.trim_start_matches('-');
        !arg.starts_with("--") && arg.len() > 1 && arg.starts_with('-') && arg[1..].contains(short)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], ask: &[&str], deny: &[&str]) -> Rules {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Rules::parse(&v(allow), &v(ask), &v(deny)).unwrap()
    }

    fn verdict(r: &Rules, line: &str) -> &'static str {
        match r.judge("run_command", line) {
            Some((Verdict::Allow, _)) => "allow",
            Some((Verdict::Ask, _)) => "ask",
            Some((Verdict::Deny, _)) => "deny",
            None => "mode",
        }
    }

    /// Every command line of issue 11 with what the rules say of it. `mode` means no rule
    /// decides: the approval mode does (`never` denies, `auto` allows).
    #[test]
    fn the_attack_table() {
        let cat = rules(&["run_command(cat *)"], &[], &[]);
        let find = rules(&["run_command(find *)"], &[], &[]);
        let git = rules(&["run_command(git status*)"], &[], &[]);
        let rm = rules(&[], &[], &["run_command(rm *)"]);
        let ask = rules(&[], &["run_command(rm *)"], &[]);
        let git_any = rules(&["run_command(git *)"], &[], &[]);
        let tools = rules(
            &[
                "run_command(tar *)",
                "run_command(sort *)",
                "run_command(rg *)",
                "run_command(man *)",
            ],
            &[],
            &[],
        );
        let table: &[(&Rules, &str, &str)] = &[
            (&cat, "cat payload", "allow"),
            (&cat, "cat 'a b' \"c\"", "allow"),
            (&cat, "cat x > /dev/null 2>&1", "allow"),
            (&cat, "cat payload > ~/.profile", "mode"),
            (&cat, "cat /etc/hostname > /dev/tcp/127.0.0.1/9", "mode"),
            (&cat, "cat 1<>f", "mode"),
            (&cat, "cat x 2>f", "mode"),
            (&cat, "cat x >> f", "mode"),
            (&cat, "cat x &> f", "mode"),
            (&cat, "cat x && cat y", "allow"),
            (&cat, "cat x | cat -n", "allow"),
            (&cat, "cat x; rm y", "mode"),
            (&cat, "cat $(rm y)", "mode"),
            (&cat, "cat `rm y`", "mode"),
            (&cat, "cat <(rm y)", "mode"),
            (&cat, "cat $HOME/x", "mode"),
            (&cat, "cat *", "mode"),
            (&cat, "cat x &", "mode"),
            (&cat, "(cat x)", "mode"),
            (&cat, "{ cat x; }", "mode"),
            (&cat, "FOO=1 cat x", "mode"),
            (&cat, "cat - <<EOF\n$(rm y)\nEOF\n", "mode"),
            (&cat, "cat - <<'EOF'\n$(rm y)\nEOF\n", "allow"),
            (&cat, "cat 'unterminated", "mode"),
            (&find, "find . -name x", "allow"),
            (&find, "find . -exec sh -c 'id > F' \\;", "mode"),
            (&find, "find . -execdir id ;", "mode"),
            (&find, "find . -ok id ;", "mode"),
            (&find, "find . -delete", "mode"),
            (&git, "git status", "allow"),
            (&git, "git status > F", "mode"),
            (&git, "git status -c core.pager=id", "allow"),
            (&git, "git -c core.fsmonitor=id status", "mode"),
            (&rm, "rm x", "deny"),
            (&rm, "/bin/rm x", "deny"),
            (&rm, "\\rm x", "deny"),
            (&rm, "r''m x", "deny"),
            (&rm, "\"rm\" x", "deny"),
            (&rm, "$'\\x72m' x", "deny"),
            (&rm, "command rm x", "deny"),
            (&rm, "env rm x", "deny"),
            (&rm, "env -i FOO=1 rm x", "deny"),
            (&rm, "eval rm x", "deny"),
            (&rm, "FOO=1 rm x", "deny"),
            (&rm, "rm\tx", "deny"),
            (&rm, "bash -c 'rm x'", "deny"),
            (&rm, "sh -ec 'echo; rm x'", "deny"),
            (&rm, "echo x | xargs rm", "deny"),
            (&rm, "xargs -n 1 rm < list", "deny"),
            (&rm, "find . -delete", "deny"),
            (&rm, "find . -exec rm {} ;", "deny"),
            (&rm, "timeout 5 rm x", "deny"),
            (&rm, "sudo -u me rm x", "deny"),
            (&rm, "nohup nice -n 5 rm x", "deny"),
            (&rm, "(rm x)", "deny"),
            (&rm, "if true; then rm x; fi", "deny"),
            (&rm, "echo $(rm x)", "deny"),
            (&rm, "$CMD x", "deny"),
            (&rm, "python3 -c 'import os; os.remove(\"x\")'", "deny"),
            (&rm, "bash -c 'unterminated", "deny"),
            // Option values that hid what follows them.
            (&git_any, "git status", "allow"),
            (&git_any, "git -C . status", "allow"),
            (&git_any, "git -C . -c core.fsmonitor=id status", "mode"),
            (&git_any, "git --git-dir .git -c core.pager=id log", "mode"),
            (
                &git_any,
                "git --work-tree . --namespace n -c x=y status",
                "mode",
            ),
            (&git_any, "git -C . config core.fsmonitor id", "mode"),
            (&git_any, "git --git-dir=elsewhere status", "mode"),
            (&git_any, "git submodule foreach id", "mode"),
            (&git_any, "git rebase -x id main", "mode"),
            (&git_any, "git rebase -ix id main", "mode"),
            (&git_any, "git rebase --exe=id main", "mode"),
            (&git_any, "git init --template=t sub", "mode"),
            (&git_any, "git init --templ=t sub", "mode"),
            (&git_any, "git clone --templa=t a b", "mode"),
            (&git_any, "git fetch --upload-pa=id origin", "mode"),
            (&git_any, "git init sub", "allow"),
            (&git_any, "git send-email --smtp-server=./x p.patch", "mode"),
            (&git_any, "git log --exit-code", "allow"),
            (&rm, "git -C . -c alias.x='!rm x' x", "deny"),
            (&rm, "command -p rm x", "deny"),
            (&rm, "unshare -p rm x", "deny"),
            (&rm, "sudo -E -u root rm x", "deny"),
            (&rm, "strace -f -o log rm x", "deny"),
            (&rm, "bash -o posix -c 'rm x'", "deny"),
            (&rm, "bash -O extglob -c 'rm x'", "deny"),
            (&rm, "bash -eo pipefail -c 'rm x'", "deny"),
            (&rm, "bash --rcfile r -c 'rm x'", "deny"),
            // What runs a command the rules cannot see matches every deny rule.
            (&rm, "busybox rm x", "deny"),
            (&rm, "echo 'rm x' | bash", "deny"),
            (&rm, "bash < script", "deny"),
            (&rm, "echo 'rm x' | sh -s", "deny"),
            (&rm, "echo 'import os' | python3", "deny"),
            (&rm, "script -c 'rm x'", "deny"),
            (&rm, "script -q log", "deny"),
            (&rm, "bash build.sh", "mode"),
            (&rm, "PATH=. ls", "deny"),
            (&rm, "GIT_DIR=elsewhere git status", "deny"),
            (&rm, "env LD_PRELOAD=./x.so ls", "deny"),
            (&rm, "export BASH_ENV=x; bash build.sh", "deny"),
            (&rm, "RUST_LOG=debug cargo test", "mode"),
            (&rm, "export FOO=1", "mode"),
            (&rm, "python3 build.py", "mode"),
            (&ask, "$CMD x", "ask"),
            (&cat, "busybox cat x", "mode"),
            (&cat, "echo 'cat x' | bash", "mode"),
            (&cat, "script -c 'cat x'", "mode"),
            (&cat, "command -p cat x", "mode"),
            (&rm, "ls", "mode"),
            (&rm, "cat rm", "mode"),
            (&rm, "hash -p /bin/rm ls; ls x", "deny"),
            (&rm, "shopt -s expand_aliases\nalias r=rm\nr x", "deny"),
            (&rm, "mapfile -C rm -c 1 < l", "deny"),
            (
                &rm,
                "tar cf /dev/null f --checkpoint-action=exec='rm x'",
                "deny",
            ),
            (&rm, "tmux run-shell 'rm x'", "deny"),
            (&rm, "parallel rm ::: x", "deny"),
            (&rm, "hash", "mode"),
            (&rm, "tar xf a.tar", "mode"),
            (
                &tools,
                "tar cf a.tar --checkpoint=1 --checkpoint-act=exec=id f",
                "mode",
            ),
            (&tools, "tar -I id -cf x f", "mode"),
            (&tools, "tar -xIid -f x", "mode"),
            (&tools, "tar czf a.tgz src", "allow"),
            (&tools, "tar xIf id a.tar", "mode"),
            (&tools, "sort --compress-prog=id f", "mode"),
            (&tools, "sort -u f", "allow"),
            (&tools, "rg --pre id x", "mode"),
            (&tools, "rg --pre=id x", "mode"),
            (&tools, "rg -n x", "allow"),
            (&tools, "man -P id ls", "mode"),
            (&tools, "man ls", "allow"),
        ];
        assert!(table.len() >= 30);
        let wrong: Vec<String> = table
            .iter()
            .filter(|(r, line, want)| verdict(r, line) != *want)
            .map(|(r, line, want)| format!("{line:?}: want {want}, got {}", verdict(r, line)))
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn ansi_c_quotes_decode() {
        assert_eq!(ansi_c(r"\x72m"), "rm");
        assert_eq!(ansi_c(r"\162m"), "rm");
        assert_eq!(ansi_c(r"a\tb\\"), "a\tb\\");
        assert_eq!(ansi_c(r"\u00e9"), "é");
    }

    #[test]
    fn deny_beats_ask_beats_allow() {
        let r = rules(
            &["run_command"],
            &["run_command(git push*)"],
            &["run_command(rm -rf*)"],
        );
        assert_eq!(verdict(&r, "ls && rm -rf /"), "deny");
        assert_eq!(verdict(&r, "git push origin"), "ask");
        assert_eq!(verdict(&r, "ls"), "allow");
        assert_eq!(verdict(&r, "ls > f"), "mode");
    }

    #[test]
    fn file_rules_judge_the_path() {
        let r = rules(&["write_file(src/**)"], &[], &["write_file(*.env)"]);
        assert_eq!(r.judge("write_file", "src/a.rs").unwrap().0, Verdict::Allow);
        assert_eq!(r.judge("write_file", "prod.env").unwrap().0, Verdict::Deny);
        assert!(r.judge("write_file", "README.md").is_none());
        assert!(r.allows("write_file", "src/a.rs"));
    }

    #[test]
    fn the_model_hears_what_no_rule_can_allow() {
        let r = rules(&["run_command(cat *)"], &[], &[]);
        let why = r.unallowed("run_command", "cat x > f").join(" ");
        assert!(why.contains("redirection"), "{why}");
        let why = r.unallowed("run_command", "cat x && ls").join(" ");
        assert!(why.starts_with("`ls` (a part"), "{why}");
    }

    #[test]
    fn bad_rules_say_how_to_write_one() {
        let e = Rule::parse("run_command(cargo").unwrap_err().to_string();
        assert!(e.contains("tool(pattern)"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
        #[test]
        fn no_line_panics_the_matcher(line in r#"[ -~\t\n$'"`\\(){}<>|&;*]{0,80}"#) {
            let r = rules(&["run_command(cat *)"], &["run_command(git *)"], &["run_command(rm *)"]);
            let _ = r.judge("run_command", &line);
            let _ = r.unallowed("run_command", &line);
        }

        #[test]
        fn no_deep_or_long_line_crashes_or_stalls_the_matcher(
            unit in proptest::sample::select(vec![
                "if true; then ", "while :; do ", "( ", "{ ", "$(", "\"$(", "case x in x) ",
                "case x in (x) ", "until :; do ", "for a in b; do ", "f() { ", "[[ $(", "${a:-",
                "$(( (", "`", "echo ')' ( ", "x=( ", "! ", "a && ", "a | ", "<(",
                "$( echo ')' ", "\"$( echo ')' ", "${a:-'}' ", "case x in x) ( ",
            ]),
            close in proptest::sample::select(vec!["", "fi; ", "done; ", ")", "}", " ;; esac; "]),
            times in 1usize..12_000,
            closed in proptest::bool::ANY,
        ) {
            let mut line = unit.repeat(times);
            if closed {
                line.push_str(&close.repeat(times));
            }
            line.truncate(MAX_LEN + 8);
            let r = rules(&["run_command(cat *)"], &[], &["run_command(rm *)"]);
            // A stack overflow aborts the test binary; exponential backtracking stalls it.
            let verdict = r.judge("run_command", &line).map(|(v, _)| v);
            let opens = ["if", "while", "until", "for", "case", "(", "{", "f()", "echo", "$(", "\"$(", "<("];
            if times > MAX_NESTING + 1 && opens.iter().any(|o| unit.starts_with(o)) {
                proptest::prop_assert_eq!(verdict, Some(Verdict::Deny));
            }
        }

        #[test]
        fn no_bytes_panic_the_matcher(line in proptest::string::string_regex("(?s).{0,60}").unwrap()) {
            let r = rules(&["run_command(cat *)"], &[], &["run_command(rm *)"]);
            let _ = r.judge("run_command", &line);
        }
    }
}

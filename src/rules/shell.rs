//! The shell analyzer: what a command line runs, read on a real shell parse
//! (`brush-parser`): the plain commands allow rules judge, every command deny and ask rules
//! see (behind wrappers, assignments, `bash -c`, `eval`, substitutions), and why no rule can
//! allow a line or what in it the rules cannot see.

use brush_parser::ast;
use brush_parser::word::WordPiece;

use super::line::{Arg, Line, basename};
use super::scripts::{Danger, interpreter, scripted, versioned};
use super::wrappers::{
    ELSEWHERE, INTERPRETERS, SHELLS, runs_with_option, short_flag, starts, wrapper,
};

/// Lines longer than this, or nested deeper, are not judged: no rule allows them, and every
/// deny rule on `run_command` counts as matching.
pub(super) const MAX_LEN: usize = 32 * 1024;
/// Code inside code (`bash -c`, `eval`, substitutions), levels deep.
const MAX_DEPTH: usize = 6;
pub(super) const MAX_NESTING: usize = 64;
/// Compound commands (`if`, `while`, `(`, `case`, …) in one line, nested or not: the parser
/// recurses on them, and backtracks exponentially on some unclosed ones (`( ( ( …`).
const MAX_COMPOUND: usize = 12;
/// How many commands behind wrappers one line may make the rules read.
const MAX_RUNS: usize = 256;
/// The stack of the thread that parses: what the parser's recursion (built without
/// optimization) needs for the deepest line the bounds let through, with room to spare.
const PARSE_STACK: usize = 64 * 1024 * 1024;

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
pub(super) fn ansi_c(raw: &str) -> String {
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

impl Line {
    /// Judge a line on a thread of its own, with a stack that the parser's recursion cannot
    /// overflow within the bounds; a panic there leaves the line unjudged, not `sup` down.
    pub(super) fn of(text: &str) -> Line {
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
            let gdb_commands = ["-ex", "-x", "-iex", "-ix", "--eval-command", "--command"];
            if name == "gdb"
                && args.iter().any(|a| {
                    let flag = a.split_once('=').map_or(*a, |(f, _)| f);
                    gdb_commands.contains(&flag)
                })
            {
                self.hide("`gdb` given commands, which can run any command");
            }
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
        if let Some(s) = scripted(name) {
            match s.judge(name, &args, self.fed) {
                Some(Danger::Runs(why)) => self.hide(why),
                Some(Danger::Writes(why)) => self.never(why),
                None => {}
            }
            return;
        }
        if INTERPRETERS.iter().any(|i| versioned(name, i)) {
            if let Some(Danger::Runs(why) | Danger::Writes(why)) =
                interpreter(name, &args, self.fed)
            {
                self.hide(why);
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
            _ => self.unknown_wrapper(name, &args),
        }
    }
}

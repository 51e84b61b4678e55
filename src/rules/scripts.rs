//! Programs whose scripts run code or write files: `sed`, `awk`, the interpreters given
//! code, `vim`, `less`, `ed`. Whatever a rule says, such a call is not a plain command: one
//! that runs code counts as unseen (it matches every deny rule), one that writes or reads a
//! file a script names is never allowed by a rule. Kept as a table, each entry with a line it
//! catches (the tests run every one).

/// What a program's arguments make it do beyond a plain command.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Danger {
    /// It runs code the rules cannot read.
    Runs(String),
    /// It writes (or reads) a file its script names.
    Writes(String),
}

/// One entry of the table.
pub(super) struct Scripted {
    /// The program's names (also with a version suffix: `python3.12`, `perl5`).
    pub(super) names: &'static [&'static str],
    /// What its arguments make it do, given whether its standard input is fed.
    judge: fn(&str, &[&str], bool) -> Option<Danger>,
    /// A line the entry keeps from being a plain command, for the tests.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) example: &'static str,
}

pub(super) const SCRIPTED: &[Scripted] = &[
    Scripted {
        names: &["sed", "gsed"],
        judge: sed,
        example: "sed -n '1e id > F' f",
    },
    Scripted {
        names: &["awk", "gawk", "mawk", "nawk"],
        judge: awk,
        example: "awk 'BEGIN{system(\"id\")}'",
    },
    Scripted {
        names: &["perl"],
        judge: interpreter,
        example: "perl -e 'unlink \"x\"'",
    },
    Scripted {
        names: &["ruby", "irb"],
        judge: interpreter,
        example: "ruby -e 'File.delete(\"x\")'",
    },
    Scripted {
        names: &["python", "pypy"],
        judge: interpreter,
        example: "python3 -c 'import os'",
    },
    Scripted {
        names: &["node", "nodejs", "deno", "bun"],
        judge: interpreter,
        example: "node -e 'require(\"fs\").rmSync(\"x\")'",
    },
    Scripted {
        names: &["php"],
        judge: interpreter,
        example: "php -r 'unlink(\"x\");'",
    },
    Scripted {
        names: &["vim", "vi", "nvim", "view", "vimdiff", "rvim", "gvim"],
        judge: vim,
        example: "vim -c '!id' -c q f",
    },
    Scripted {
        names: &["less", "more", "most"],
        judge: less,
        example: "less '+!id' f",
    },
    Scripted {
        names: &["ed", "red", "ex"],
        judge: ed,
        example: "ed -s f",
    },
];

/// The entry for a program name, also with a version suffix (`python3`, `python3.12`).
pub(super) fn scripted(name: &str) -> Option<&'static Scripted> {
    SCRIPTED
        .iter()
        .find(|s| s.names.iter().any(|n| versioned(name, n)))
}

/// Whether `name` is `base` or `base` with a version suffix.
pub(super) fn versioned(name: &str, base: &str) -> bool {
    name == base
        || name
            .strip_prefix(base)
            .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit() || c == '.' || c == '-'))
}

impl Scripted {
    pub(super) fn judge(&self, name: &str, args: &[&str], fed: bool) -> Option<Danger> {
        (self.judge)(name, args, fed)
    }
}

fn runs(name: &str, what: &str) -> Option<Danger> {
    Some(Danger::Runs(format!("`{name}` {what}")))
}

fn writes(name: &str, what: &str) -> Option<Danger> {
    Some(Danger::Writes(format!("`{name}` {what}")))
}

/// `sed`: `-i` edits in place, `-f` reads a script the rules cannot see; in the script, `e`
/// (and `s///e`) runs a command, `w`, `W` (and `s///w`) write a file, `r`, `R` read one.
fn sed(name: &str, args: &[&str], _fed: bool) -> Option<Danger> {
    let mut scripts = Vec::new();
    let mut i = 0;
    let mut operands = Vec::new();
    while let Some(a) = args.get(i).copied() {
        i += 1;
        if a == "--" {
            operands.extend(args.get(i..).unwrap_or_default().iter().copied());
            break;
        }
        if let Some(long) = a.strip_prefix("--") {
            let (flag, value) = long
                .split_once('=')
                .map_or((long, None), |(f, v)| (f, Some(v)));
            match flag {
                f if "in-place".starts_with(f) && f.len() >= 2 => {
                    return writes(name, "`-i`, which rewrites files");
                }
                f if "expression".starts_with(f) && f.len() >= 2 => match value {
                    Some(v) => scripts.push(v.to_string()),
                    None => {
                        scripts.push(args.get(i).copied().unwrap_or_default().into());
                        i += 1;
                    }
                },
                f if "file".starts_with(f) && f.len() >= 2 => {
                    return runs(name, "with a script file the rules cannot read");
                }
                "line-length" if value.is_none() => i += 1,
                _ => {}
            }
            continue;
        }
        if a.len() > 1 && a.starts_with('-') {
            for (k, c) in a[1..].char_indices() {
                let tail = &a[1 + k + c.len_utf8()..];
                match c {
                    'i' => return writes(name, "`-i`, which rewrites files"),
                    'f' => return runs(name, "with a script file the rules cannot read"),
                    'e' | 'l' => {
                        let value = if tail.is_empty() {
                            i += 1;
                            args.get(i - 1).copied().unwrap_or_default()
                        } else {
                            tail
                        };
                        if c == 'e' {
                            scripts.push(value.to_string());
                        }
                        break;
                    }
                    _ => {}
                }
            }
            continue;
        }
        operands.push(a);
    }
    if scripts.is_empty()
        && let Some(first) = operands.first()
    {
        scripts.push(first.to_string());
    }
    scripts.iter().find_map(|s| sed_script(name, s))
}

/// Read a sed script command by command: what it would do beyond printing.
fn sed_script(name: &str, script: &str) -> Option<Danger> {
    let chars: Vec<char> = script.chars().collect();
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied();
    // Skip to the end of the line (labels, comments, text of `a`, `i`, `c`).
    let to_eol = |mut i: usize| {
        while let Some(c) = chars.get(i) {
            if *c == '\n' {
                break;
            }
            i += 1;
        }
        i
    };
    // Past a delimited part (`/re/`, the parts of `s` and `y`), from just after its opener.
    let delimited = |mut i: usize, d: char| {
        while let Some(c) = chars.get(i).copied() {
            if c == '\\' {
                i += 2;
                continue;
            }
            if c == d {
                return Some(i + 1);
            }
            i += 1;
        }
        None
    };
    let unread = || runs(name, "with a script sup cannot read");
    while i < chars.len() {
        // Separators and addresses.
        while let Some(c) = at(i) {
            if c.is_whitespace() || c == ';' || c.is_ascii_digit() || ",$!~+{}".contains(c) {
                i += 1;
            } else if c == '/' {
                i = delimited(i + 1, '/')?;
            } else if c == '\\' {
                let d = at(i + 1)?;
                i = delimited(i + 2, d)?;
            } else {
                break;
            }
        }
        let Some(c) = at(i) else {
            break;
        };
        i += 1;
        match c {
            'e' => return runs(name, "with `e`, which runs a command"),
            'w' | 'W' => return writes(name, "with `w`, which writes a file"),
            'r' | 'R' => return writes(name, "with `r`, which reads a file into its output"),
            '#' | ':' | 'a' | 'i' | 'c' => i = to_eol(i),
            'b' | 't' | 'T' => {
                while let Some(c) = at(i) {
                    if c == ';' || c == '\n' || c == '}' {
                        break;
                    }
                    i += 1;
                }
            }
            's' | 'y' => {
                let Some(d) = at(i).filter(|d| *d != '\n' && *d != '\\') else {
                    return unread();
                };
                let Some(end) = delimited(i + 1, d).and_then(|j| delimited(j, d)) else {
                    return unread();
                };
                i = end;
                if c == 's' {
                    while let Some(f) = at(i) {
                        match f {
                            'e' => return runs(name, "with `s///e`, which runs a command"),
                            'w' => return writes(name, "with `s///w`, which writes a file"),
                            'g' | 'p' | 'i' | 'I' | 'm' | 'M' => i += 1,
                            f if f.is_ascii_digit() => i += 1,
                            _ => break,
                        }
                    }
                }
            }
            'p' | 'P' | 'd' | 'D' | 'n' | 'N' | 'g' | 'G' | 'h' | 'H' | 'x' | 'z' | 'l' | '='
            | 'F' | 'q' | 'Q' | 'v' => {
                // `l`, `q`, `Q` take a number, `v` a version.
                while at(i).is_some_and(|c| c.is_ascii_alphanumeric() || c == '.') {
                    i += 1;
                }
            }
            _ => return unread(),
        }
    }
    None
}

/// `awk`: `system`, pipes (`|`, `getline` from a command) and `@load`/`@include` run code,
/// `>` writes a file; options that load program files or write profiles are not read.
fn awk(name: &str, args: &[&str], _fed: bool) -> Option<Danger> {
    let mut programs = Vec::new();
    let mut i = 0;
    while let Some(a) = args.get(i).copied() {
        i += 1;
        if a == "--" {
            break;
        }
        if !a.starts_with('-') || a == "-" {
            i -= 1;
            break;
        }
        let valued = |long: &str, short: char| {
            a == format!("-{short}")
                || a.strip_prefix("--")
                    .is_some_and(|f| !f.contains('=') && long.starts_with(f) && f.len() > 1)
        };
        if valued("source", 'e') {
            programs.push(args.get(i).copied().unwrap_or_default());
            i += 1;
        } else if let Some(p) = a.strip_prefix("--source=") {
            programs.push(p);
        } else if valued("field-separator", 'F') || valued("assign", 'v') {
            i += 1;
        } else if a.starts_with("-F")
            || a.starts_with("-v")
            || a.starts_with("--field-separator=")
            || a.starts_with("--assign=")
        {
        } else {
            return runs(
                name,
                &format!("with `{a}`, an option that loads code or writes a file"),
            );
        }
    }
    if programs.is_empty() {
        match args.get(i) {
            Some(p) => programs.push(p),
            None => return runs(name, "with no program"),
        }
    }
    for p in programs {
        if p.contains("system") || p.contains('|') || p.contains('@') {
            return runs(name, "with a program that runs commands");
        }
        if p.contains('>') {
            return writes(name, "with a program that may write a file (`>`)");
        }
    }
    None
}

/// The options by which each interpreter is given code (or a module or library to load,
/// or settings that run code), besides any short cluster holding `-c`, `-e` or `-E`.
fn code_options(name: &str) -> &'static [&'static str] {
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-');
    match base {
        "perl" => &["-M", "-m", "-i", "-x"],
        "ruby" | "irb" => &["-r", "-i", "-x", "--require"],
        "node" | "nodejs" | "deno" | "bun" => &[
            "-p",
            "-r",
            "--eval",
            "--print",
            "--require",
            "--import",
            "--loader",
            "--experimental-loader",
            "eval",
        ],
        "php" => &["-r", "-R", "-B", "-F", "-d", "-a"],
        _ => &[],
    }
}

/// An interpreter given code (`-c`, `-e`, `-r`, …), a module to run, or code on its
/// standard input.
pub(super) fn interpreter(name: &str, args: &[&str], fed: bool) -> Option<Danger> {
    let extra = code_options(name);
    let given = args.iter().any(|a| {
        ["--eval", "--exec", "--command"].contains(a)
            || extra
                .iter()
                .any(|o| a == o || (o.len() == 2 && !a.starts_with("--") && a.starts_with(o)))
            || (a.starts_with('-') && !a.starts_with("--") && a.contains(['c', 'e', 'E']))
    });
    if given {
        return runs(name, "given code to run");
    }
    if args.contains(&"-") || (fed && args.iter().all(|a| a.starts_with('-'))) {
        return runs(name, "reading code from its standard input");
    }
    None
}

/// `vim`: `-c`, `+CMD`, `--cmd`, `-S`, `-s`, ex mode and a vimrc run editor commands, `:!`
/// among them.
fn vim(name: &str, args: &[&str], _fed: bool) -> Option<Danger> {
    let quiet = ["-R", "-n", "-N", "-M", "-m", "--noplugin", "--"];
    args.iter()
        .find(|a| a.starts_with('+') || (a.starts_with('-') && **a != "-" && !quiet.contains(a)))
        .and_then(|a| runs(name, &format!("with `{a}`, which runs editor commands")))
}

/// `less`: a `+` command or a `!` runs a shell; a lesskey file binds keys to commands.
fn less(name: &str, args: &[&str], _fed: bool) -> Option<Danger> {
    args.iter()
        .find(|a| {
            a.starts_with('+')
                || a.contains('!')
                || **a == "-k"
                || a.starts_with("--lesskey")
                || a.starts_with("-k")
        })
        .and_then(|a| runs(name, &format!("with `{a}`, which can run a shell")))
}

/// `ed` reads its commands from its standard input: `!` runs a shell, `w` writes.
fn ed(name: &str, _args: &[&str], _fed: bool) -> Option<Danger> {
    runs(
        name,
        "which runs the commands on its standard input (`!` a shell)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sed_scripts_are_read_command_by_command() {
        let d = |s: &str| sed_script("sed", s);
        assert_eq!(d("s/hello/world/"), None);
        assert_eq!(d("/re/d; 2,5p; $!N; y/abc/xyz/; s,a,b,g"), None);
        assert_eq!(d(":a;N;ba"), None);
        assert!(matches!(d("1e id"), Some(Danger::Runs(_))));
        assert!(matches!(d("s/x/y/e"), Some(Danger::Runs(_))));
        assert!(matches!(d("s/x/y/gw out"), Some(Danger::Writes(_))));
        assert!(matches!(d("w out"), Some(Danger::Writes(_))));
        assert!(matches!(d("/x/W out"), Some(Danger::Writes(_))));
        assert!(matches!(d("1r /etc/passwd"), Some(Danger::Writes(_))));
        assert!(matches!(d("$R f"), Some(Danger::Writes(_))));
        assert!(matches!(d("s/a"), Some(Danger::Runs(_))));
        assert!(matches!(
            sed("sed", &["-ni", "p", "f"], false),
            Some(Danger::Writes(_))
        ));
        assert!(matches!(
            sed("sed", &["-n", "-e", "p", "--expression=1e id"], false),
            Some(Danger::Runs(_))
        ));
        assert_eq!(sed("sed", &["-n", "s/a/b/p", "f"], false), None);
    }

    #[test]
    fn awk_programs_that_print_are_plain() {
        assert_eq!(awk("awk", &["-F:", "{print $1}", "f"], false), None);
        assert_eq!(awk("awk", &["-v", "x=1", "NR==1"], false), None);
        assert!(matches!(
            awk("awk", &["{print > \"f\"}"], false),
            Some(Danger::Writes(_))
        ));
        assert!(matches!(
            awk("gawk", &["BEGIN{\"id\" | getline x}"], false),
            Some(Danger::Runs(_))
        ));
        assert!(matches!(
            awk("gawk", &["-f", "prog.awk"], false),
            Some(Danger::Runs(_))
        ));
    }
}

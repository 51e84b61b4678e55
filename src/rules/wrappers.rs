//! The wrappers table: programs that run the program in their arguments (with the options
//! that take a value), shells and interpreters, programs that run commands elsewhere or
//! through an option, variables that make programs run other code, and git's options and
//! subcommands that run commands.

use super::line::{Arg, Line, basename};

/// Commands that run the command in their arguments, with the options that take a value
/// and how many operands come before the command.
pub(super) fn wrapper(name: &str) -> Option<(&'static [&'static str], usize)> {
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
        "setarch" => (&[], 1),
        "linux32" | "linux64" | "i386" | "x86_64" | "catchsegv" | "valgrind" => (&[], 0),
        "prlimit" => (&["-p", "--pid", "-o", "--output"], 0),
        "gdb" => (&["-ex", "-x", "-iex", "-ix", "-p", "--pid", "-cd", "-d"], 0),
        "numactl" => (
            &[
                "-i",
                "-m",
                "-N",
                "-C",
                "-p",
                "-P",
                "--interleave",
                "--membind",
                "--cpunodebind",
                "--physcpubind",
                "--preferred",
            ],
            0,
        ),
        "xvfb-run" => (
            &[
                "-n",
                "-s",
                "-f",
                "-e",
                "-p",
                "-w",
                "--server-num",
                "--server-args",
                "--auth-file",
                "--error-file",
                "--xauth-protocol",
                "--wait",
            ],
            0,
        ),
        "runuser" | "su" => (&["-u", "-g", "-G", "-s", "--shell", "--group"], 0),
        _ => return None,
    };
    Some(found)
}

/// Where the command behind a wrapper may start: as the table of options that take a value
/// says, as if no option took one, and as if every option took one. A table can be wrong or
/// out of date; deny rules read every reading.
pub(super) fn starts(argv: &[Arg], with_value: &[&str]) -> Vec<usize> {
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

pub(super) const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "ash"];
pub(super) const INTERPRETERS: &[&str] = &[
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
pub(super) const ELSEWHERE: &[&str] = &[
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
pub(super) fn short_flag(arg: &str, c: char) -> bool {
    arg.len() > 1 && arg.starts_with('-') && !arg.starts_with("--") && arg[1..].contains(c)
}

/// Whether one of `args` of `name` is an option that makes it run a program it names
/// (long options also abbreviated, as getopt takes them; short ones also bundled).
pub(super) fn runs_with_option(name: &str, args: &[&str]) -> bool {
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

impl Line {
    /// `NAME=value` for a variable that makes programs run other code (a library, a start-up
    /// file, a pager, a search path): what then runs, the rules cannot see.
    pub(super) fn assignment(&mut self, word: &str) {
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
    pub(super) fn git(&mut self, args: &[&str]) {
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
            if flag == "--bare" {
                self.hide(
                    "`git --bare`, which takes a folder the agent may have filled for a repository",
                );
            }
            i += if VALUED.contains(a) { 2 } else { 1 };
        }
        let sub = args.get(i).copied().unwrap_or_default();
        let rest = args.get(i + 1..).unwrap_or_default();
        // Deny rules see the subcommand without the global options before it.
        if i > 0 {
            self.seen.push(
                std::iter::once("git")
                    .chain(args.get(i..).unwrap_or_default().iter().copied())
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
        // A repository other than the one sup protects is never made by a rule's leave.
        let makes = ["init", "clone", "submodule"].contains(&sub)
            || (sub == "worktree" && rest.first() == Some(&"add"))
            || args.iter().any(|a| git_names(a, "--separate-git-dir"));
        if makes {
            self.never(format!("`git {sub}`, which makes a repository"));
        }
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

/// Programs known not to run the programs their arguments name: in front of anything else,
/// a word naming a program may be a command it runs (an unknown wrapper).
const PLAIN: &[&str] = &[
    "cat",
    "ls",
    "echo",
    "printf",
    "grep",
    "egrep",
    "fgrep",
    "rg",
    "ag",
    "head",
    "tail",
    "wc",
    "sort",
    "uniq",
    "cut",
    "tr",
    "paste",
    "join",
    "comm",
    "fold",
    "fmt",
    "nl",
    "tac",
    "rev",
    "diff",
    "cmp",
    "file",
    "stat",
    "which",
    "whereis",
    "type",
    "man",
    "info",
    "whatis",
    "apropos",
    "touch",
    "mkdir",
    "rmdir",
    "rm",
    "cp",
    "mv",
    "ln",
    "chmod",
    "chown",
    "chgrp",
    "install",
    "readlink",
    "realpath",
    "basename",
    "dirname",
    "pwd",
    "cd",
    "date",
    "sleep",
    "true",
    "false",
    "test",
    "[",
    "expr",
    "seq",
    "yes",
    "tee",
    "du",
    "df",
    "tar",
    "gzip",
    "gunzip",
    "zcat",
    "bzip2",
    "xz",
    "unzip",
    "zip",
    "sha256sum",
    "sha1sum",
    "md5sum",
    "base64",
    "od",
    "hexdump",
    "xxd",
    "strings",
    "jq",
    "git",
    "cargo",
    "rustc",
    "rustup",
    "rustfmt",
    "npm",
    "yarn",
    "pnpm",
    "go",
    "make",
    "cmake",
    "ninja",
    "pip",
    "pip3",
    "mkfifo",
    "kill",
    "pkill",
    "pgrep",
    "killall",
    "ps",
    "id",
    "whoami",
    "uname",
    "hostname",
    "mktemp",
    "truncate",
    "dd",
    "sync",
    "shuf",
    "split",
    "column",
    "printenv",
    "tree",
    "curl",
    "wget",
    "patch",
    "wait",
    "read",
    "exit",
    "return",
    "set",
    "unset",
    "shift",
    "help",
    "jobs",
    "umask",
    "ulimit",
    "shopt",
    "hash",
    "apt",
    "apt-get",
    "dpkg",
    "apt-cache",
    "mkfs",
    "sha512sum",
    "cksum",
];

/// Whether `word` names a program: one of the tables', or an executable on `PATH` (or at the
/// path it names).
fn names_a_program(word: &str) -> bool {
    let base = basename(word);
    let plain = !base.is_empty()
        && base
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c));
    if !plain {
        return false;
    }
    if SHELLS.contains(&base)
        || ELSEWHERE.contains(&base)
        || wrapper(base).is_some()
        || super::scripts::scripted(base).is_some()
        || INTERPRETERS
            .iter()
            .any(|i| super::scripts::versioned(base, i))
    {
        return true;
    }
    let executable = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if word.contains('/') {
        return executable(std::path::Path::new(word));
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| executable(&dir.join(base))))
}

impl Line {
    /// A program sup does not know with a word naming a program among its arguments: it may
    /// be a wrapper that runs it, so it counts as unseen code (every deny rule matches). An
    /// allow rule that names the program still allows it.
    pub(super) fn unknown_wrapper(&mut self, name: &str, args: &[&str]) {
        if PLAIN.contains(&name) {
            return;
        }
        if let Some(a) = args
            .iter()
            .find(|a| !a.starts_with('-') && names_a_program(a))
            && self.hidden.is_none()
        {
            self.hidden = Some(format!(
                "`{name}`, a program sup does not know, in front of `{a}`, which it may run"
            ));
        }
    }
}

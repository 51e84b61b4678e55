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
//! This module holds the rule grammar (a rule that can never match is refused) and the
//! verdict; `shell` reads a command line on a real parse into what the rules see of it
//! (`line`), `wrappers` holds the tables of programs that run other programs (an unknown one
//! in front of a program's name counts as unseen code), `scripts` the programs whose scripts
//! run code or write files (`sed`, `awk`, interpreters given code, `vim`, `less`, `ed`).
//!
//! Below both `approval` (which decides with the rules) and `tools` (whose built-ins refuse
//! what a deny rule names).

mod line;
mod scripts;
mod shell;
mod wrappers;

use globset::{GlobBuilder, GlobMatcher};
use line::Line;
pub(crate) use line::basename;

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
    rule: String,
    why: String,
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
        if let Some(why) = pattern.and_then(|p| never_matches(tool.trim(), p)) {
            return Err(RuleError {
                rule: text.into(),
                why: format!("it can never match: {why}"),
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

/// The tools whose rules match a workspace-relative path.
const FILE_TOOLS: &[&str] = &[
    "read_file",
    "write_file",
    "edit_file",
    "list_files",
    "search_files",
];

/// Why a pattern can match no argument of `tool`, if so.
fn never_matches(tool: &str, pattern: &str) -> Option<String> {
    if pattern.is_empty() {
        return Some(
            "the pattern is empty, and no call's argument is; write `tool` alone to match \
             every call of it"
                .into(),
        );
    }
    if pattern.starts_with(char::is_whitespace) {
        return Some("the pattern starts with a space, and no argument does".into());
    }
    let path_rule = FILE_TOOLS.contains(&tool);
    if path_rule
        && (pattern.starts_with('/')
            || pattern.starts_with("./")
            || pattern.split('/').any(|c| c == ".."))
    {
        return Some(
            "paths are matched relative to the workspace and normalized, so none starts \
             with `/` or `./` or holds `..`"
                .into(),
        );
    }
    None
}

/// The allow, ask and deny rules of a run, from every source.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    allow: Vec<Rule>,
    ask: Vec<Rule>,
    deny: Vec<Rule>,
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

#[cfg(test)]
mod tests {
    use super::shell::{MAX_LEN, MAX_NESTING, ansi_c};
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
        let push = rules(&[], &[], &["run_command(git push*)"]);
        let scripts = rules(
            &[
                "run_command(sed *)",
                "run_command(awk *)",
                "run_command(gawk *)",
                "run_command(mawk *)",
                "run_command(perl *)",
                "run_command(ruby *)",
                "run_command(python3 *)",
                "run_command(node *)",
                "run_command(php *)",
                "run_command(vim *)",
                "run_command(less *)",
                "run_command(ed *)",
            ],
            &[],
            &[],
        );
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
            (&git_any, "git init sub", "mode"),
            // Issue 25: what makes a repository, and git's global options.
            (&git_any, "git init -q --separate-git-dir gd sub", "mode"),
            (&git_any, "git clone a b", "mode"),
            (&git_any, "git worktree add ../w", "mode"),
            (&git_any, "git worktree list", "allow"),
            (&git_any, "git submodule update --init", "mode"),
            (&git_any, "git --bare status", "mode"),
            (&git_any, "git -C sub status", "allow"),
            (&push, "git push origin", "deny"),
            (&push, "git -C . push", "deny"),
            (&push, "git --no-pager push", "deny"),
            (&push, "git -P push", "deny"),
            (&push, "git -p push", "deny"),
            (&push, "git --git-dir .git push", "deny"),
            (&push, "git --work-tree . push", "deny"),
            (&push, "git --namespace n push", "deny"),
            (&push, "git --bare push", "deny"),
            (&push, "git -c a.b=c push", "deny"),
            (&push, "git -C . status", "mode"),
            // Issue 25: wrappers.
            (&rm, "setarch x86_64 rm x", "deny"),
            (&rm, "setarch x86_64 -R rm x", "deny"),
            (&rm, "linux64 rm x", "deny"),
            (&rm, "prlimit --nofile=10 rm x", "deny"),
            (&rm, "valgrind --tool=none rm x", "deny"),
            (&rm, "strace rm x", "deny"),
            (&rm, "ltrace -f rm x", "deny"),
            (&rm, "gdb --args rm x", "deny"),
            (&rm, "gdb -batch -ex 'shell id'", "deny"),
            (&rm, "chroot / rm x", "deny"),
            (&rm, "flock /tmp/l rm x", "deny"),
            (&rm, "stdbuf -oL rm x", "deny"),
            (&rm, "taskset -c 0 rm x", "deny"),
            (&rm, "taskset 1 rm x", "deny"),
            (&rm, "ionice -c 3 rm x", "deny"),
            (&rm, "chrt -f 1 rm x", "deny"),
            (&rm, "numactl -C 0 rm x", "deny"),
            (&rm, "nsenter -t 1 -m rm x", "deny"),
            (&rm, "unshare -r rm x", "deny"),
            (&rm, "firejail rm x", "deny"),
            (&rm, "bwrap --bind / / rm x", "deny"),
            (&rm, "doas -u root rm x", "deny"),
            (&rm, "pkexec rm x", "deny"),
            (&rm, "xvfb-run -a rm x", "deny"),
            (&rm, "catchsegv rm x", "deny"),
            (&rm, "sup-no-such-wrapper -q rm x", "deny"),
            (&rm, "./run.sh rm x", "deny"),
            (&rm, "echo rm x", "mode"),
            // Issue 25: programs whose scripts run code or write files.
            (&scripts, "sed -n '1e id > F' f", "mode"),
            (&scripts, "sed 's/a/b/' f", "allow"),
            (&scripts, "sed -n '/x/p; s,a,b,g' f", "allow"),
            (&scripts, "sed 'w out' f", "mode"),
            (&scripts, "sed -n 'W out' f", "mode"),
            (&scripts, "sed '1r /etc/passwd' f", "mode"),
            (&scripts, "sed 1R f", "mode"),
            (&scripts, "sed 's/x/y/e' f", "mode"),
            (&scripts, "sed 's/x/y/w out' f", "mode"),
            (&scripts, "sed -i 's/a/b/' f", "mode"),
            (&scripts, "sed --in-place=.bak 's/a/b/' f", "mode"),
            (&scripts, "sed -f s.sed f", "mode"),
            (&scripts, "awk '{print $1}' f", "allow"),
            (&scripts, "awk 'BEGIN{system(\"id\")}'", "mode"),
            (&scripts, "awk '{print > \"f\"}' x", "mode"),
            (&scripts, "awk '{print | \"sh\"}' x", "mode"),
            (&scripts, "gawk 'BEGIN{\"id\" | getline x}'", "mode"),
            (&scripts, "mawk 'BEGIN{system(\"id\")}'", "mode"),
            (&scripts, "gawk -f p.awk f", "mode"),
            (&scripts, "perl x.pl", "allow"),
            (&scripts, "perl -e 'print 1'", "mode"),
            (&scripts, "perl -pi -e 's/a/b/' f", "mode"),
            (&scripts, "ruby -e 'puts 1'", "mode"),
            (&scripts, "python3 -c 'print(1)'", "mode"),
            (&scripts, "python3 -m http.server", "allow"),
            (&scripts, "node -e 1", "mode"),
            (&scripts, "node --require ./x.js y.js", "mode"),
            (&scripts, "php -r 'echo 1;'", "mode"),
            (&scripts, "php -R 'echo 1;'", "mode"),
            (&scripts, "vim -c '!id' -c q f", "mode"),
            (&scripts, "vim '+!id' f", "mode"),
            (&scripts, "less '+!id' f", "mode"),
            (&scripts, "less f", "allow"),
            (&scripts, "ed -s f", "mode"),
            (&rm, "sed -n '1e rm x' f", "deny"),
            (&rm, "awk 'BEGIN{system(\"rm x\")}'", "deny"),
            (&rm, "sed 's/a/b/' f", "mode"),
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
        for never in [
            "run_command()",
            "run_command( rm *)",
            "write_file(/etc/*)",
            "read_file(./src/*)",
            "edit_file(src/../x)",
        ] {
            let e = Rule::parse(never).unwrap_err().to_string();
            assert!(e.contains("can never match"), "{never}: {e}");
        }
        assert!(Rule::parse("run_command(git push*)").is_ok());
    }

    /// Every entry of the table of programs whose scripts run code or write files keeps its
    /// example from being allowed by a rule that names the program.
    #[test]
    fn every_scripted_program_has_a_line_no_rule_allows() {
        for s in scripts::SCRIPTED {
            let name = s.example.split(' ').next().unwrap();
            assert!(
                s.names.iter().any(|n| scripts::versioned(name, n)),
                "{}",
                s.example
            );
            let allow = rules(&[&format!("run_command({name} *)")], &[], &[]);
            assert_eq!(verdict(&allow, s.example), "mode", "{}", s.example);
        }
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

//! Approval rules: `tool` or `tool(pattern)`, the pattern a glob on the call's main argument
//! (the command line for `run_command`, the workspace-relative path for file tools, the
//! compact JSON input otherwise). A command line is split at `&&`, `||`, `;`, `|`, `&`,
//! newlines, `$(…)`, backticks and brackets, and every part is judged: an allow rule must
//! allow every part; one part that a deny or ask rule matches is enough.

use globset::{GlobBuilder, GlobMatcher};
use serde_json::Value;

#[derive(Clone, Debug)]
pub struct Rule {
    /// As written, for messages.
    pub text: String,
    tool: GlobMatcher,
    pattern: Option<GlobMatcher>,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "approval rule `{rule}`: {why}; write `tool` or `tool(pattern)`, e.g. `run_command(cargo test*)`"
)]
pub struct RuleError {
    pub rule: String,
    pub why: String,
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
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
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
    pub allow: Vec<Rule>,
    pub ask: Vec<Rule>,
    pub deny: Vec<Rule>,
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

    pub fn extend(&mut self, other: Rules) {
        self.allow.extend(other.allow);
        self.ask.extend(other.ask);
        self.deny.extend(other.deny);
    }

    /// What the rules say of a call: deny beats ask beats allow; `None` when no rule decides.
    pub fn judge(&self, tool: &str, arg: &str) -> Option<(Verdict, &Rule)> {
        let parts = parts(tool, arg);
        fn any<'r>(rules: &'r [Rule], tool: &str, parts: &[String]) -> Option<&'r Rule> {
            rules
                .iter()
                .find(|r| parts.iter().any(|p| r.matches(tool, p)))
        }
        if let Some(r) = any(&self.deny, tool, &parts) {
            return Some((Verdict::Deny, r));
        }
        if let Some(r) = any(&self.ask, tool, &parts) {
            return Some((Verdict::Ask, r));
        }
        let mut last = None;
        for p in &parts {
            last = Some(self.allow.iter().find(|r| r.matches(tool, p))?);
        }
        last.map(|r| (Verdict::Allow, r))
    }
}

impl Rules {
    /// The parts of a call's argument that no allow rule covers, for telling the model
    /// which part of a command line was the problem.
    pub fn unallowed(&self, tool: &str, arg: &str) -> Vec<String> {
        parts(tool, arg)
            .into_iter()
            .filter(|p| !self.allow.iter().any(|r| r.matches(tool, p)))
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Ask,
    Deny,
}

/// The parts of a command line that each must pass: split at every operator that starts
/// another command. Quotes are not honoured, which can only make a part stricter.
pub fn split_command(line: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
        let sep = match two.as_str() {
            "&&" | "||" | "$(" => 2,
            _ if matches!(c, ';' | '|' | '&' | '\n' | '`' | '(' | ')' | '{' | '}') => 1,
            _ => 0,
        };
        if sep > 0 {
            parts.push(std::mem::take(&mut cur));
            i += sep;
        } else {
            cur.push(c);
            i += 1;
        }
    }
    parts.push(cur);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parts(tool: &str, arg: &str) -> Vec<String> {
    if tool == "run_command" {
        let p = split_command(arg);
        if p.is_empty() { vec![String::new()] } else { p }
    } else {
        vec![arg.to_string()]
    }
}

/// The main argument of a call, which patterns match.
pub fn main_argument(tool: &str, input: &Value) -> String {
    let field = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_string);
    match tool {
        "run_command" => field("command").unwrap_or_default(),
        "read_file" | "write_file" | "edit_file" | "list_files" | "search_files" => {
            normalize(&field("path").unwrap_or_else(|| ".".into()))
        }
        _ => input.to_string(),
    }
}

/// `./a/../b//c` → `b/c`, so a pattern sees one spelling of a path.
fn normalize(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if out.pop().is_none() {
                    out.push("..");
                }
            }
            p => out.push(p),
        }
    }
    if out.is_empty() {
        ".".into()
    } else {
        out.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], ask: &[&str], deny: &[&str]) -> Rules {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Rules::parse(&v(allow), &v(ask), &v(deny)).unwrap()
    }

    #[test]
    fn compound_commands_are_split() {
        assert_eq!(
            split_command("cargo test && rm -rf ~"),
            ["cargo test", "rm -rf ~"]
        );
        assert_eq!(
            split_command("a; b | c || d & e\nf"),
            ["a", "b", "c", "d", "e", "f"]
        );
        assert_eq!(
            split_command("echo $(curl evil) `id`"),
            ["echo", "curl evil", "id"]
        );
    }

    #[test]
    fn allow_needs_every_part() {
        let r = rules(&["run_command(cargo test*)"], &[], &[]);
        assert_eq!(
            r.judge("run_command", "cargo test --all").unwrap().0,
            Verdict::Allow
        );
        assert!(r.judge("run_command", "cargo test && rm -rf ~").is_none());
        assert!(r.judge("run_command", "cargo test $(rm -rf ~)").is_none());
        assert!(r.judge("run_command", "cargo test `rm -rf ~`").is_none());
    }

    #[test]
    fn deny_beats_ask_beats_allow() {
        let r = rules(
            &["run_command"],
            &["run_command(git push*)"],
            &["run_command(rm -rf*)"],
        );
        assert_eq!(
            r.judge("run_command", "ls && rm -rf /").unwrap().0,
            Verdict::Deny
        );
        assert_eq!(
            r.judge("run_command", "git push origin").unwrap().0,
            Verdict::Ask
        );
        assert_eq!(r.judge("run_command", "ls").unwrap().0, Verdict::Allow);
    }

    #[test]
    fn file_patterns_see_normalized_paths() {
        let r = rules(&["write_file(src/**)"], &[], &["write_file(*.env)"]);
        let arg = main_argument(
            "write_file",
            &serde_json::json!({"path": "./src/../src/a.rs"}),
        );
        assert_eq!(arg, "src/a.rs");
        assert_eq!(r.judge("write_file", &arg).unwrap().0, Verdict::Allow);
        assert_eq!(r.judge("write_file", "prod.env").unwrap().0, Verdict::Deny);
        assert!(r.judge("write_file", "README.md").is_none());
    }

    #[test]
    fn bad_rules_say_how_to_write_one() {
        let e = Rule::parse("run_command(cargo").unwrap_err().to_string();
        assert!(e.contains("tool(pattern)"), "{e}");
    }
}

//! The terminal prompt: reads from the controlling terminal (`/dev/tty`), not stdin, one
//! question at a time. For `write_file` and `edit_file` it shows a diff of what would change.
//! Everything shown came from the model or a file, so it is shown escaped: a control
//! character cannot move the cursor or erase what the person should see, and a command that
//! holds control characters or invisible Unicode is flagged.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use serde_json::Value;

use super::Judgement;
use crate::trace::{escape, has_hidden};

/// The controlling terminal, when a person is there.
pub(crate) struct Terminal {
    one_at_a_time: tokio::sync::Mutex<()>,
}

pub(crate) enum CallAnswer {
    Yes,
    Always,
    No(Option<String>),
    Quit,
}

impl Terminal {
    /// A terminal, if this process has one and a person can be at it: stdin or stderr is a
    /// terminal and `/dev/tty` opens.
    pub(crate) fn detect() -> Option<Terminal> {
        use std::io::IsTerminal;
        let interactive = std::io::stdin().is_terminal() || std::io::stderr().is_terminal();
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .is_ok();
        (interactive && tty).then(|| Terminal {
            one_at_a_time: tokio::sync::Mutex::new(()),
        })
    }

    /// Ask until an answer parses; `None` when the terminal closes.
    async fn ask<T: Send + 'static>(
        &self,
        text: String,
        again: &'static str,
        parse: fn(&str) -> Option<T>,
        wants_reason: fn(&T) -> bool,
        with_reason: fn(T, &str) -> T,
    ) -> Option<T> {
        let _one = self.one_at_a_time.lock().await;
        tokio::task::spawn_blocking(move || {
            let tty = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/tty")
                .ok()?;
            let mut out = tty.try_clone().ok()?;
            let mut input = BufReader::new(tty);
            let _ = write!(out, "{text}");
            let _ = out.flush();
            loop {
                let mut line = String::new();
                if input.read_line(&mut line).ok()? == 0 {
                    return None;
                }
                if let Some(t) = parse(line.trim()) {
                    if !wants_reason(&t) {
                        return Some(t);
                    }
                    // `n` (or `r`) alone: the reason may come on the next line.
                    let _ = write!(out, "reason (the model reads it; Enter for none): ");
                    let _ = out.flush();
                    let mut reason = String::new();
                    let _ = input.read_line(&mut reason);
                    return Some(with_reason(t, reason.trim()));
                }
                let _ = write!(out, "{again}");
                let _ = out.flush();
            }
        })
        .await
        .ok()
        .flatten()
    }

    pub(crate) async fn ask_call(&self, text: String) -> CallAnswer {
        let text =
            format!("{text}\nAllow? [y]es · [a]lways · [n]o (a reason may follow) · [q]uit: ");
        self.ask(
            text,
            "answer y, a, n [reason] or q: ",
            parse_call,
            |a| matches!(a, CallAnswer::No(None)),
            |a, reason| match a {
                CallAnswer::No(None) if !reason.is_empty() => {
                    CallAnswer::No(Some(reason.to_string()))
                }
                a => a,
            },
        )
        .await
        .unwrap_or(CallAnswer::No(Some(
            "no answer: the terminal closed".into(),
        )))
    }

    pub(crate) async fn ask_check(&self, question: String) -> Judgement {
        let text = format!("\n? {question}\n[a]ccept · [r]eject with a reason: ");
        self.ask(
            text,
            "answer a, or r and a reason: ",
            parse_check,
            |j| matches!(j, Judgement::Rejected(r) if r == NO_REASON),
            |j, reason| match j {
                Judgement::Rejected(_) if !reason.is_empty() => {
                    Judgement::Rejected(reason.to_string())
                }
                j => j,
            },
        )
        .await
        .unwrap_or(Judgement::Rejected("no answer: the terminal closed".into()))
    }
}

/// A rejection of a human check that gave no reason.
const NO_REASON: &str = "rejected without a reason";

fn split_word(s: &str) -> (String, Option<String>) {
    let mut it = s.splitn(2, char::is_whitespace);
    let word = it.next().unwrap_or("").to_lowercase();
    let rest = it
        .next()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_string);
    (word, rest)
}

fn parse_call(s: &str) -> Option<CallAnswer> {
    let (word, rest) = split_word(s);
    match word.as_str() {
        "y" | "yes" => Some(CallAnswer::Yes),
        "a" | "always" => Some(CallAnswer::Always),
        "n" | "no" => Some(CallAnswer::No(rest)),
        "q" | "quit" => Some(CallAnswer::Quit),
        _ => None,
    }
}

fn parse_check(s: &str) -> Option<Judgement> {
    let (word, rest) = split_word(s);
    match word.as_str() {
        "a" | "accept" | "y" | "yes" => Some(Judgement::Accepted),
        "r" | "reject" | "n" | "no" => Some(Judgement::Rejected(
            rest.unwrap_or_else(|| NO_REASON.into()),
        )),
        _ => None,
    }
}

/// What the person is asked about: the tool and its input, or for file edits the diff;
/// escaped for the terminal, with a warning when something was hidden in it.
pub(crate) fn describe(tool: &str, input: &Value, workspace: &Path) -> String {
    let text = raw_description(tool, input, workspace);
    let warning = if has_hidden(&text) {
        "\n⚠ WARNING: this call contains control characters or invisible Unicode; they are \
         shown escaped below. Read it with care."
    } else {
        ""
    };
    format!("{warning}{}", escape(&text))
}

/// Where a file tool's call really leads, workspace-relative with symlinks resolved; `None`
/// for calls without a path.
pub(crate) fn target(tool: &str, input: &Value, workspace: &Path) -> Option<String> {
    if !["write_file", "edit_file", "read_file"].contains(&tool) {
        return None;
    }
    let path = input.get("path")?.as_str()?;
    Some(crate::tools::paths::rule_path(workspace, path))
}

/// A path as a person must see it: `notes.txt → ci/deploy.sh` when it is, or passes through,
/// a symlink; else as typed.
pub(crate) fn shown_path(path: &str, workspace: &Path) -> String {
    let real = crate::tools::paths::rule_path(workspace, path);
    if real == crate::tools::paths::normalize(path) {
        path.to_string()
    } else {
        format!("{path} → {real}")
    }
}

fn raw_description(tool: &str, input: &Value, workspace: &Path) -> String {
    let field = |k: &str| input.get(k).and_then(Value::as_str).unwrap_or("");
    let current = |p: &str| {
        crate::tools::paths::resolve(workspace, p)
            .ok()
            .and_then(|full| std::fs::read_to_string(full).ok())
    };
    match tool {
        "write_file" => {
            let path = field("path");
            let old = current(path);
            let what = if old.is_some() { "overwrite" } else { "create" };
            format!(
                "\n⚠ write_file wants to {what} {}:\n{}",
                shown_path(path, workspace),
                crate::tools::unified_diff(
                    &crate::tools::paths::rule_path(workspace, path),
                    &old.unwrap_or_default(),
                    field("content")
                )
            )
        }
        "edit_file" => {
            let path = field("path");
            let old = current(path).unwrap_or_default();
            let new = old.replacen(field("old_string"), field("new_string"), 1);
            format!(
                "\n⚠ edit_file wants to change {}:\n{}",
                shown_path(path, workspace),
                crate::tools::unified_diff(
                    &crate::tools::paths::rule_path(workspace, path),
                    &old,
                    &new
                )
            )
        }
        "run_command" => {
            let mut s = format!(
                "\n⚠ run_command wants to run:\n  {}",
                field("command").replace('\n', "\n  ")
            );
            for f in input
                .get("runs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let get = |k: &str| f.get(k).and_then(Value::as_str).unwrap_or("");
                s.push_str(&format!(
                    "\n  which runs {} of the workspace, beginning:\n    {}",
                    get("file"),
                    get("first_lines").replace('\n', "\n    ")
                ));
            }
            s
        }
        _ => format!(
            "\n⚠ {tool} wants to run with:\n  {}",
            serde_json::to_string_pretty(input)
                .unwrap_or_default()
                .replace('\n', "\n  ")
        ),
    }
}

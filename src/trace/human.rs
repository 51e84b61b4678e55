//! The human trace: one line per event on stderr, icons ▶ (model) ⚙ (tool call) ✓/✗ (result)
//! ◆ (outcome). Streamed text is shown as it arrives. Whatever came from a model, a tool or
//! a file reaches the terminal with its control characters and invisible Unicode escaped
//! (`escape`), so it cannot move the cursor, erase lines or hide text.

use std::io::Write;
use std::sync::Mutex;

use super::event::{CheckKind, Event, EventSink, Status, StopReason};

pub(crate) struct HumanTrace {
    /// Word the outcome as a goal (checks and tries) rather than a plain run.
    goal: bool,
    /// How much of each tool result shows under its line.
    results: Results,
    state: Mutex<State>,
}

/// How much of each tool result the trace shows under the result's line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Results {
    /// None (`--quiet`, and the console, which folds the whole result under the line).
    Hidden,
    /// The first `HEAD_LINES` lines, each cut at `HEAD_WIDTH` characters (the live trace).
    Head,
    /// All of it, as the model was given it (`sup show`).
    Whole,
}

/// Lines of a tool result the live trace shows…
const HEAD_LINES: usize = 5;
/// …and characters of each.
const HEAD_WIDTH: usize = 200;

struct State {
    /// Streamed text was printed in this step and its line is still open.
    streaming: bool,
    /// The model error the work loop's end showed, so the outcome need not say it again.
    error_shown: Option<String>,
    out: Box<dyn Write + Send>,
    /// Lines of a step's events not written yet (`Event::batched`)…
    held: String,
    /// …in the live trace only: a rendered transcript (`sup show`) is written as it goes.
    batch: bool,
}

impl HumanTrace {
    /// The live trace, on stderr: a step's lines are written together (`Event::batched`).
    pub(crate) fn new(goal: bool) -> Self {
        let trace = Self::to(goal, Box::new(std::io::stderr()));
        if let Ok(mut state) = trace.state.lock() {
            state.batch = true;
        }
        trace
    }

    /// The trace on any writer (`sup show` renders a transcript on stdout).
    pub(crate) fn to(goal: bool, out: Box<dyn Write + Send>) -> Self {
        HumanTrace {
            goal,
            results: Results::Hidden,
            state: Mutex::new(State {
                streaming: false,
                error_shown: None,
                out,
                held: String::new(),
                batch: false,
            }),
        }
    }
}

impl HumanTrace {
    /// The same trace, showing `results` of each tool result.
    pub(crate) fn with_results(mut self, results: Results) -> Self {
        self.results = results;
        self
    }

    /// The lines shown under a tool result's line, indented: none, its head with how many
    /// lines were left out, or all of it.
    fn result_lines(&self, content: &str) -> Option<String> {
        let mut lines = content.trim_end().lines();
        let shown = match self.results {
            Results::Hidden => return None,
            Results::Head => HEAD_LINES,
            Results::Whole => usize::MAX,
        };
        let mut out = String::new();
        for l in lines.by_ref().take(shown) {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str("    ");
            match l.char_indices().nth(HEAD_WIDTH) {
                Some((cut, _)) if self.results == Results::Head => {
                    out.push_str(&l[..cut]);
                    out.push_str(" …");
                }
                _ => out.push_str(l),
            }
        }
        if out.is_empty() {
            return None;
        }
        let left = lines.count();
        if left > 0 {
            out.push_str(&format!(
                "\n    … {left} more line{} (`sup show RUN_ID` shows them)",
                if left == 1 { "" } else { "s" }
            ));
        }
        Some(out)
    }
}

/// Characters that change what a terminal shows without showing themselves, or look blank
/// while being letters or odd spaces: bidirectional controls, zero-width and format
/// characters, the Hangul fillers, the Braille blank, the Khmer inherent vowels, the
/// combining grapheme joiner, variation selectors, the spaces U+2000–U+200A, U+3000 and the
/// like, and the tag characters.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00a0}' | '\u{00ad}' | '\u{034f}' | '\u{061c}' | '\u{115f}' | '\u{1160}'
        | '\u{1680}' | '\u{17b4}' | '\u{17b5}' | '\u{180b}'..='\u{180f}'
        | '\u{2000}'..='\u{200f}' | '\u{2028}'..='\u{202f}' | '\u{205f}'..='\u{206f}'
        | '\u{2800}' | '\u{3000}' | '\u{3164}' | '\u{fe00}'..='\u{fe0f}' | '\u{feff}'
        | '\u{ffa0}' | '\u{fff9}'..='\u{fffb}' | '\u{1d159}' | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0000}'..='\u{e007f}' | '\u{e0100}'..='\u{e01ef}')
}

/// Whether text holds control characters (other than newline and tab) or invisible Unicode.
pub(crate) fn has_hidden(text: &str) -> bool {
    text.chars()
        .any(|c| (c.is_control() && c != '\n' && c != '\t') || invisible(c))
}

/// `text` safe for a terminal: control characters other than newline and tab, and invisible
/// Unicode, written as escapes (`\r`, `\x1b`, `\u{202e}`).
pub(crate) fn escape(text: &str) -> String {
    // Printable ASCII, the most of what a trace shows, is told byte by byte and copied in runs.
    let plain = |b: u8| matches!(b, b' '..=b'~' | b'\n' | b'\t');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let run = rest.bytes().position(|b| !plain(b)).unwrap_or(rest.len());
        out.push_str(&rest[..run]);
        rest = &rest[run..];
        let Some(c) = rest.chars().next() else {
            return out;
        };
        rest = &rest[c.len_utf8()..];
        match c {
            '\r' => out.push_str("\\r"),
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() || invisible(c) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
}

/// The first line of `text`, at most `max` characters, with a mark when cut.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let first = text.lines().next().unwrap_or("");
    let more_lines = text.trim_end().lines().nth(1).is_some();
    let mut out: String = first.chars().take(max).collect();
    if first.chars().count() > max || more_lines {
        out.push_str(" …");
    }
    out
}

fn count(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn n_steps(n: u32) -> String {
    count(n, "step", "steps")
}

fn n_tries(n: u32) -> String {
    count(n, "try", "tries")
}

impl HumanTrace {
    /// The line (or lines) this event shows as, without streamed text.
    pub(crate) fn line(&self, event: &Event) -> Option<String> {
        Some(match event {
            Event::RunStarted {
                run_id,
                model,
                workspace,
                ..
            } => format!("sup · run {run_id} · {model} · {workspace}"),
            Event::Notice { text } => format!("· {text}"),
            Event::TryStarted { r#try, tries } => format!("── try {try}/{tries}"),
            Event::StepStarted { step } => format!("▶ step {step}"),
            Event::TextDelta { .. } | Event::Message { .. } | Event::TryFinished { .. } => {
                return None;
            }
            Event::ModelText { text, .. } => {
                let lines: Vec<String> = text.lines().map(|l| format!("  {l}")).collect();
                lines.join("\n")
            }
            Event::ToolCall { name, input, .. } => {
                format!("⚙ {name} {}", one_line(&input.to_string(), 160))
            }
            Event::ToolResult {
                name,
                content,
                is_error,
                started_ms,
                finished_ms,
                ..
            } => {
                let icon = if *is_error { '✗' } else { '✓' };
                let ms = (finished_ms - started_ms).max(0.0);
                format!("{icon} {name} · {} · {ms:.0}ms", one_line(content, 120))
            }
            Event::StepFinished {
                usage,
                cost,
                total_cost,
                ..
            } => {
                let mut s = format!(
                    "  tokens: {} in · {} out",
                    usage.input_tokens, usage.output_tokens
                );
                if usage.cache_read_tokens + usage.cache_write_tokens > 0 {
                    s.push_str(&format!(
                        " · cache {} read · {} written",
                        usage.cache_read_tokens, usage.cache_write_tokens
                    ));
                }
                if let (Some(c), Some(t)) = (cost, total_cost) {
                    s.push_str(&format!(" · {} (run {})", usd(*c), usd(*t)));
                }
                s
            }
            Event::ApprovalRequested {
                request,
                tool,
                input,
                deadline,
                ..
            } => format!(
                "⏸ {tool} waits for approval {request} (until {deadline}): {}\n  answer with `sup approve {request}` or `sup deny {request} --reason …`",
                one_line(input, 120)
            ),
            Event::Approval {
                tool,
                decision,
                by,
                reason,
                ..
            } => {
                let icon = if decision.granted() { '✓' } else { '✗' };
                let mut s = format!("{icon} {tool} {decision} by {by}");
                if let Some(r) = reason {
                    s.push_str(&format!(": {r}"));
                }
                s
            }
            Event::WorkFinished {
                stop_reason,
                steps,
                error,
            } => match stop_reason {
                StopReason::Final => return None,
                StopReason::Error => format!(
                    "✗ model error after {}: {}",
                    n_steps(*steps),
                    error.as_deref().unwrap_or("unknown")
                ),
                StopReason::Cancelled => format!("✗ cancelled after {}", n_steps(*steps)),
                StopReason::Context => format!(
                    "· stopped by context after {}: {}",
                    n_steps(*steps),
                    error
                        .as_deref()
                        .unwrap_or("the conversation no longer fits")
                ),
                other => format!(
                    "· stopped by {} after {}: the work is unfinished",
                    other.as_str(),
                    n_steps(*steps)
                ),
            },
            Event::Compacted {
                step,
                how,
                before_tokens,
                after_tokens,
                usage,
                ..
            } => {
                let what = if how == "summary" {
                    "the older part replaced by the model's summary"
                } else {
                    "old tool results cut to stubs"
                };
                let mut s = format!(
                    "↻ compacted before step {step}: {what} · about {before_tokens} → \
                     {after_tokens} tokens"
                );
                if let Some(u) = usage {
                    s.push_str(&format!(" · the summary took {}", tokens(u)));
                }
                s
            }
            Event::Partial {
                step,
                text,
                tool_calls,
                why,
                ..
            } => format!(
                "… step {step} ended without its answer ({why}); what arrived is kept in the \
                 transcript: {} characters of text, {} unfinished tool call(s), not run",
                text.chars().count(),
                tool_calls.len()
            ),
            Event::Check { report, .. } => {
                let icon = if report.passed { '✓' } else { '✗' };
                let by = report
                    .model
                    .as_ref()
                    .map(|m| format!(" · judge {m}"))
                    .unwrap_or_default();
                let mut s = format!(
                    "{icon} check {} · {}{by} · {}ms",
                    report.name, report.outcome, report.duration_ms
                );
                if !report.passed {
                    let tail: Vec<&str> = report.output_tail.trim_end().lines().collect();
                    for l in &tail[tail.len().saturating_sub(6)..] {
                        s.push_str(&format!("\n    {l}"));
                    }
                }
                s
            }
            Event::Result {
                status,
                stop_reason,
                tries,
                steps,
                error,
                run_id,
                checks,
                cost,
                ..
            } => {
                let what = match status {
                    Status::Achieved if self.goal => {
                        let mut judges: Vec<&str> = checks
                            .last()
                            .into_iter()
                            .flatten()
                            .filter(|r| r.passed && r.kind == CheckKind::Judge)
                            .filter_map(|r| r.model.as_deref())
                            .collect();
                        judges.dedup();
                        let mut s = format!("◆ Goal achieved · {}", n_tries(*tries));
                        if !judges.is_empty() {
                            s.push_str(&format!(" · judged by {}", judges.join(", ")));
                        }
                        s
                    }
                    Status::Achieved => format!("◆ Done · {}", n_steps(*steps)),
                    Status::Failed => {
                        let failing: Vec<&str> = checks
                            .last()
                            .map(|c| {
                                c.iter()
                                    .filter(|r| !r.passed)
                                    .map(|r| r.name.as_str())
                                    .collect()
                            })
                            .unwrap_or_default();
                        let why = match stop_reason {
                            StopReason::NoProgress => "no progress: the same checks failed the \
                                                       same way three tries in a row"
                                .to_string(),
                            StopReason::CheckChanged => error
                                .clone()
                                .unwrap_or_else(|| "a check was changed during the run".into()),
                            StopReason::Impossible => error
                                .clone()
                                .unwrap_or_else(|| "a judge said it cannot be done".into()),
                            _ => format!("checks still failing: {}", failing.join(", ")),
                        };
                        format!("◆ Goal not achieved · {} · {why}", n_tries(*tries))
                    }
                    Status::Unfinished => format!(
                        "◆ Unfinished · stopped by {} after {} · the work is not done",
                        stop_reason.as_str(),
                        n_steps(*steps)
                    ),
                    Status::Error => {
                        format!("◆ Error · {}", error.as_deref().unwrap_or("the run failed"))
                    }
                    Status::Interrupted => {
                        "◆ Interrupted · what happened so far is kept".to_string()
                    }
                };
                let cost = cost.map(|c| format!(" · {}", usd(c))).unwrap_or_default();
                format!("{what}\n  run {run_id}{cost}")
            }
        })
    }
}

/// A token count as the trace and `sup show` give it: input and output, then what was read
/// from or written to the provider's cache, apart.
pub(crate) fn tokens(u: &crate::model::Usage) -> String {
    let mut s = format!("{} in / {} out tokens", u.input_tokens, u.output_tokens);
    if u.cache_read_tokens + u.cache_write_tokens > 0 {
        s.push_str(&format!(
            " (+ cache: {} read, {} written)",
            u.cache_read_tokens, u.cache_write_tokens
        ));
    }
    s
}

/// Whether streamed text left the live trace's line open.
static LINE_OPEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A notice on stderr outside the event stream (the interrupt): on a line of its own, after
/// streamed text too.
pub(crate) fn notice(text: &str) {
    let open = LINE_OPEN.swap(false, std::sync::atomic::Ordering::Relaxed);
    eprintln!("{}{text}", if open { "\n" } else { "" });
}

/// US dollars as the trace shows them: `$0.0123`.
pub(crate) fn usd(c: f64) -> String {
    format!("${c:.4}")
}

impl EventSink for HumanTrace {
    fn emit(&self, event: &Event) {
        let Ok(mut guard) = self.state.lock() else {
            return;
        };
        let state = &mut *guard;
        // What this event shows, written with what is held in one write (stderr is
        // unbuffered): a step's lines wait for the next other event or flush.
        let mut out = std::mem::take(&mut state.held);
        if let Event::TextDelta { text } = event {
            if !state.streaming {
                out.push_str("  ");
                state.streaming = true;
            }
            LINE_OPEN.store(true, std::sync::atomic::Ordering::Relaxed);
            out.push_str(&escape(text).replace('\n', "\n  "));
            let _ = state.out.write_all(out.as_bytes());
            let _ = state.out.flush();
            return;
        }
        self.show(state, event, &mut out);
        if state.batch && event.batched() {
            state.held = out;
        } else if !out.is_empty() {
            let _ = state.out.write_all(out.as_bytes());
        }
    }

    fn flush(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.write_held();
        }
    }
}

impl State {
    fn write_held(&mut self) {
        if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            let _ = self.out.write_all(held.as_bytes());
        }
    }
}

impl Drop for HumanTrace {
    /// Lines still held (a live run that ends without a last event) go out.
    fn drop(&mut self) {
        if let Ok(state) = self.state.get_mut() {
            state.write_held();
        }
    }
}

impl HumanTrace {
    /// Add what `event` shows to `out`.
    fn show(&self, state: &mut State, event: &Event, out: &mut String) {
        // A partial answer not streamed here (`sup show`) shows its text.
        if let Event::Partial { text, .. } = event
            && !state.streaming
            && !text.is_empty()
        {
            let lines: Vec<String> = text.lines().map(|l| format!("  {l}")).collect();
            out.push_str(&escape(&lines.join("\n")));
            out.push('\n');
        }
        if let Event::ModelText { .. } = event {
            if state.streaming {
                state.streaming = false;
                out.push('\n');
                return;
            }
        } else if state.streaming && !matches!(event, Event::Message { .. }) {
            state.streaming = false;
            out.push('\n');
        }
        LINE_OPEN.store(state.streaming, std::sync::atomic::Ordering::Relaxed);
        if let Some(mut line) = self.line(event) {
            match event {
                Event::WorkFinished {
                    error: Some(e),
                    stop_reason: StopReason::Error,
                    ..
                } => state.error_shown = Some(e.clone()),
                Event::Result {
                    status: Status::Error,
                    error: Some(e),
                    ..
                } if state.error_shown.as_ref() == Some(e) => {
                    line = line.replacen(e.as_str(), "the model error above", 1);
                }
                _ => {}
            }
            out.push_str(&escape(&line));
            out.push('\n');
        }
        if let Event::ToolResult { content, .. } = event
            && let Some(lines) = self.result_lines(content)
        {
            out.push_str(&escape(&lines));
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_what_a_terminal_would_obey() {
        let text = "a\r\x1b[2K\u{202e}b\nc\t\u{7f}";
        assert_eq!(super::escape(text), "a\\r\\x1b[2K\\u{202e}b\nc\t\\x7f");
        assert!(super::has_hidden(text));
        assert!(!super::has_hidden("plain\ttext\n"));
    }

    #[test]
    fn blank_looking_letters_and_odd_spaces_are_escaped() {
        for c in [
            '\u{3164}',
            '\u{115f}',
            '\u{ffa0}',
            '\u{2800}',
            '\u{17b4}',
            '\u{17b5}',
            '\u{034f}',
            '\u{2000}',
            '\u{2005}',
            '\u{200a}',
            '\u{200b}',
            '\u{3000}',
            '\u{e0041}',
            '\u{2066}',
        ] {
            let text = format!("a{c}b");
            assert!(super::has_hidden(&text), "{:x}", c as u32);
            assert_eq!(super::escape(&text), format!("a\\u{{{:x}}}b", c as u32));
        }
        assert!(!super::has_hidden("循环 é ü"));
    }

    #[test]
    fn a_result_shows_its_head_cut_to_width_and_counts_the_rest() {
        use super::{HEAD_WIDTH, HumanTrace, Results};
        let trace =
            |results| HumanTrace::to(false, Box::new(std::io::sink())).with_results(results);
        let long = "x".repeat(HEAD_WIDTH + 5);
        let content = format!("one\n{long}\n\nfour\nfive\nsix\nseven\n\n");
        let head = trace(Results::Head).result_lines(&content).unwrap();
        let cut = format!("    {} …", "x".repeat(HEAD_WIDTH));
        assert_eq!(
            head,
            format!(
                "    one\n{cut}\n    \n    four\n    five\n    … 2 more lines (`sup show RUN_ID` shows them)"
            )
        );
        let whole = trace(Results::Whole).result_lines(&content).unwrap();
        assert_eq!(whole.lines().count(), 7);
        assert!(whole.contains(&long));
        assert_eq!(
            trace(Results::Head).result_lines("one\ntwo"),
            Some("    one\n    two".into())
        );
        assert_eq!(trace(Results::Head).result_lines(" \n\n"), None);
        assert_eq!(trace(Results::Hidden).result_lines("one"), None);
        assert_eq!(super::escape("plain ✓ · é\u{3164}"), "plain ✓ · é\\u{3164}");
    }
}

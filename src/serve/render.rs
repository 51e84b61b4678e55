//! A transcript as HTML: each event as the terminal trace shows it (the same renderer), with
//! what the trace cuts short — arguments, whole results, check output, the answer — folded
//! under it, and what a file tool changed as its diff. Control characters are made visible
//! and everything is escaped by maud.

use maud::{Markup, html};

use crate::trace::{Event, HumanTrace};

/// The most of one detail shown on the page (the whole output stays in the run folder).
const DETAIL_CAP: usize = 64 * 1024;

/// Control characters (but newline and tab), bidirectional controls and invisible or
/// blank-looking Unicode as visible escapes: the terminal's own escaping.
pub(crate) fn clean(s: &str) -> String {
    crate::trace::escape(s)
}

/// The flag beside text that held what `clean` escaped.
const FLAGGED: &str = "⚠ holds control characters or invisible Unicode, shown escaped";

fn capped(s: &str) -> String {
    if s.len() <= DETAIL_CAP {
        return clean(s);
    }
    let mut end = DETAIL_CAP;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n… (cut here; the whole text is in the run folder)",
        clean(&s[..end])
    )
}

/// The CSS class of an event and what is folded under its line.
fn parts(event: &Event) -> (&'static str, Option<(&'static str, String)>) {
    match event {
        Event::RunStarted { prompt, .. } => ("start", Some(("prompt", prompt.clone()))),
        Event::Notice { .. } => ("notice", None),
        Event::TryStarted { .. } => ("try", None),
        Event::StepStarted { .. } => ("step", None),
        Event::ModelText { .. } => ("model", None),
        Event::ToolCall { input, .. } => (
            "call",
            Some((
                "arguments",
                serde_json::to_string_pretty(input).unwrap_or_default(),
            )),
        ),
        Event::ToolResult {
            content, is_error, ..
        } => {
            let class = if *is_error { "result err" } else { "result ok" };
            let long = content.trim_end().lines().nth(1).is_some() || content.chars().count() > 120;
            (class, long.then(|| ("whole result", content.clone())))
        }
        Event::StepFinished { .. } => ("tokens", None),
        Event::Compacted { summary, .. } => ("notice", summary.clone().map(|s| ("summary", s))),
        Event::Partial { text, .. } => ("model", Some(("partial answer", text.clone()))),
        Event::ApprovalRequested { input, .. } => ("wait", Some(("request", input.clone()))),
        Event::Approval { decision, .. } => {
            if decision.granted() {
                ("approval ok", None)
            } else {
                ("approval err", None)
            }
        }
        Event::WorkFinished { .. } => ("stop", None),
        Event::Check { report, .. } => (
            if report.passed {
                "check ok"
            } else {
                "check err"
            },
            (!report.output_tail.trim().is_empty())
                .then(|| ("output (last part)", report.output_tail.clone())),
        ),
        Event::Result { answer, .. } => ("outcome", answer.as_ref().map(|a| ("answer", a.clone()))),
        Event::TextDelta { .. } | Event::Message { .. } | Event::TryFinished { .. } => ("", None),
    }
}

/// One event as HTML, or nothing for events the trace does not show.
pub(crate) fn event(trace: &HumanTrace, event: &Event) -> Option<Markup> {
    let line = trace.line(event)?;
    let (class, detail) = parts(event);
    let diff = match event {
        Event::ToolResult { diff, .. } => diff.as_deref(),
        _ => None,
    };
    let hidden = crate::trace::has_hidden(&line)
        || detail
            .iter()
            .map(|(_, t)| t.as_str())
            .chain(diff)
            .any(crate::trace::has_hidden);
    Some(html! {
        div class={ "ev " (class) } {
            @if hidden { p.flagged { (FLAGGED) } }
            pre.line { (clean(&line)) }
            @if let Some((label, text)) = detail {
                details { summary { (label) } pre { (capped(&text)) } }
            }
            @if let Some(diff) = diff {
                details.diff open { summary { "diff" } pre {
                    @for l in diff.lines() {
                        span class=(diff_class(l)) { (clean(l)) } "\n"
                    }
                } }
            }
        }
    })
}

/// The CSS class of a line of a unified diff.
fn diff_class(line: &str) -> &'static str {
    if line.starts_with("+++") || line.starts_with("---") || line.starts_with("@@") {
        "hunk"
    } else if line.starts_with('+') {
        "add"
    } else if line.starts_with('-') {
        "del"
    } else {
        "same"
    }
}

/// The events of a transcript's text; lines that do not parse are left out.
pub(crate) fn events(text: &str) -> impl Iterator<Item = Event> + '_ {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Event>(l).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `e` as the console shows it.
    fn html(e: &Event) -> String {
        let trace = HumanTrace::to(false, Box::new(std::io::sink()));
        event(&trace, e).unwrap().into_string()
    }

    #[test]
    fn markup_and_control_characters_from_a_run_are_escaped() {
        let html = html(&Event::ModelText {
            step: 1,
            text: "<script>alert(1)</script>\u{1b}[2J".into(),
        });
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(!html.contains('\u{1b}'), "{html}");
        assert!(html.contains("\\x1b"), "{html}");
        assert!(html.contains("invisible Unicode"), "{html}");
    }

    #[test]
    fn a_file_tools_diff_shows_its_lines_marked_and_escaped() {
        let html = html(&Event::ToolResult {
            step: 1,
            id: "w".into(),
            name: "write_file".into(),
            content: "overwrote a.txt (4 bytes)".into(),
            is_error: false,
            started_ms: 0.0,
            finished_ms: 1.0,
            diff: Some("--- a.txt\n+++ a.txt\n@@ -1 +1 @@\n-old\n+<b>new</b>\n".into()),
        });
        assert!(html.contains(r#"<span class="del">-old</span>"#), "{html}");
        assert!(
            html.contains(r#"<span class="add">+&lt;b&gt;new&lt;/b&gt;</span>"#),
            "{html}"
        );
    }
}

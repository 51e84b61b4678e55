//! Compaction of a conversation that outgrows the model's context window. First old tool
//! results become stubs that say what was cut and where the whole of it is kept; if that is
//! not enough, the model writes a handoff summary (no tools offered) and the conversation is
//! rebuilt from the system prompt, the goal prompt verbatim, the summary behind a fixed
//! prefix, the latest check failures verbatim, and the newest turns within a budget, a tool
//! call never parted from its result. Each rewrite gives the conversation a new generation,
//! so the kept request body is written anew.

use std::path::Path;

use super::{Compactions, MAX_COMPACTION_FAILURES, MAX_SUMMARY_TOKENS, Outcome, StopReason, Work};
use crate::model::prices::InputEstimate;
use crate::model::{Conversation, Message, ModelRequest, ToolResult, Usage};
use crate::trace::Event;

/// Where a compaction is asked for.
pub(super) struct Room {
    pub(super) step: u32,
    /// Bytes of the tool specs every request carries.
    pub(super) tool_bytes: usize,
    /// The provider said the request did not fit: compact whatever the estimate says.
    pub(super) forced: bool,
}

/// What opens the summary in a rebuilt conversation.
pub(crate) const SUMMARY_PREFIX: &str = "[sup: the conversation outgrew the model's context \
window. What came between the goal above and the newest turns below was replaced by this \
summary, which the model wrote as a handoff to itself.]\n\n";

/// The system prompt of a summary request.
pub(crate) const SUMMARY_SYSTEM: &str = "You write handoff summaries of an agent's work so far, \
for the agent itself to continue from. No tools are available: answer with the summary only.";

/// What a summary request asks for.
pub(crate) const SUMMARY_ASK: &str = "The conversation above has grown too long for the \
context window and will be replaced by your summary. Write a handoff summary of at most {words} \
words with these headings: Goal (in one line), Progress (what was done, files changed, \
commands run and their results), Decisions and constraints, Open problems (errors and failing \
checks, verbatim where short), Next steps. Be concrete: name files, functions and values.";

/// Results shorter than this stay as they are.
const STUB_MIN: usize = 400;

/// How a compaction made room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    Results,
    Summary,
}

impl How {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            How::Results => "results",
            How::Summary => "summary",
        }
    }
}

impl Work<'_> {
    /// Compact `messages` when the next request would pass `compact_at` of the window, or
    /// when `room.forced`: shrink old results, then summarise, until the estimate is under
    /// the target. `Err` is the loop's end: three failures in a row (`context`), or Ctrl-C.
    pub(super) async fn make_room(
        &self,
        room: &Room,
        messages: &mut Conversation,
        estimate: &mut InputEstimate,
        usage: &mut Usage,
        state: &mut Compactions,
    ) -> Result<(), Outcome> {
        let size = |m: &Conversation, e: &InputEstimate| e.scaled(m.bytes() + room.tool_bytes);
        let before = size(messages, estimate);
        let window = self.window();
        let limit = window.map(|w| (w as f64 * self.limits.compact_at) as u64);
        if !room.forced && limit.is_none_or(|l| before <= l) {
            return Ok(());
        }
        // Past an unknown window: the request that did not fit was about `before` tokens.
        let limit = limit.unwrap_or(before / 2).max(1);
        loop {
            if state.failures >= MAX_COMPACTION_FAILURES {
                let steps = if room.forced {
                    room.step
                } else {
                    room.step - 1
                };
                return Err(self.out_of_context(steps, *usage, state));
            }
            let before = size(messages, estimate);
            // Each failure asks for less.
            let scale = 1.0 / f64::from(state.failures + 1);
            if compact_results(messages, &self.output_dir) > 0 {
                let after = self.compacted(room, messages, estimate, (How::Results, before), None);
                if (after as f64) <= limit as f64 * 0.7 * scale {
                    state.fresh = true;
                    return Ok(());
                }
            }
            let before = size(messages, estimate);
            let per_byte = estimate.per_byte().max(1e-6);
            let base = window.unwrap_or(limit) as f64;
            let summary_tokens = ((base * 0.15) as u64).clamp(64, MAX_SUMMARY_TOKENS);
            let input_bytes = (base * 0.5 * scale / per_byte) as usize;
            let tail_bytes = (base * 0.25 * scale / per_byte) as usize;
            match self
                .summarise(messages, input_bytes, summary_tokens, per_byte)
                .await
            {
                Err(Failed::Cancelled(spent)) => {
                    *usage += spent;
                    return Err(self.finish(StopReason::Cancelled, room.step - 1, *usage));
                }
                Err(Failed::Summary(why, spent)) => {
                    *usage += spent;
                    state.failures += 1;
                    state.why = why.clone();
                    self.agent.events.emit(Event::Notice {
                        text: format!(
                            "compaction {} of {MAX_COMPACTION_FAILURES} failed: {why}",
                            state.failures
                        ),
                    });
                }
                Ok((summary, spent)) => {
                    *usage += spent;
                    rebuild(messages, &summary, tail_bytes);
                    let after = self.compacted(
                        room,
                        messages,
                        estimate,
                        (How::Summary, before),
                        Some((summary, spent)),
                    );
                    if after <= limit {
                        state.fresh = true;
                        return Ok(());
                    }
                    state.failures += 1;
                    state.why = format!(
                        "the conversation is still about {after} tokens after the summary, past \
                         {limit}"
                    );
                }
            }
        }
    }

    /// Ask the model for a handoff summary of `messages`, no tools offered.
    async fn summarise(
        &self,
        messages: &Conversation,
        input_bytes: usize,
        max_tokens: u64,
        per_byte: f64,
    ) -> Result<(String, Usage), Failed> {
        let goal = match messages.get(1) {
            Some(Message::User { content }) => content.as_str(),
            _ => "",
        };
        let words = max_tokens * 3 / 4;
        let ask = Conversation::from(vec![
            Message::System {
                content: SUMMARY_SYSTEM.into(),
            },
            Message::User {
                content: format!(
                    "The goal, verbatim:\n{goal}\n\nThe work so far:\n{}\n\n{}",
                    as_text(messages, input_bytes),
                    SUMMARY_ASK.replace("{words}", &words.to_string())
                ),
            },
        ]);
        let request = ModelRequest {
            messages: &ask,
            tools: &[],
            on_text: &|_| {},
            json_schema: None,
            max_output: Some(u32::try_from(max_tokens).unwrap_or(u32::MAX)),
            partial: None,
        };
        // The steps done are on disk before the wait.
        self.agent.events.flush();
        let answer = tokio::select! {
            r = self.agent.model.step(request) => r,
            _ = self.agent.cancel.cancelled() => return Err(Failed::Cancelled(Usage::default())),
        };
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                return Err(Failed::Summary(
                    format!("the summary request failed: {e}"),
                    Usage::default(),
                ));
            }
        };
        let spent = if answer.usage.total() == 0 {
            Usage {
                input_tokens: (ask.bytes() as f64 * per_byte).ceil() as u64,
                output_tokens: (answer.text.len() as u64).div_ceil(4),
                ..Usage::default()
            }
        } else {
            answer.usage
        };
        let text = crate::redact::text(answer.text.trim()).into_owned();
        if text.is_empty() {
            return Err(Failed::Summary("the summary came back empty".into(), spent));
        }
        let tokens = (text.len() as f64 * per_byte).ceil() as u64;
        if tokens > max_tokens.saturating_mul(5) / 4 {
            return Err(Failed::Summary(
                format!("the summary is too long (about {tokens} tokens, asked for {max_tokens})"),
                spent,
            ));
        }
        Ok((text, spent))
    }

    /// Tell that `how` rewrote the conversation of `before` tokens (with the summary and
    /// what it cost, when one did it); the conversation's size now, in tokens.
    fn compacted(
        &self,
        room: &Room,
        messages: &Conversation,
        estimate: &mut InputEstimate,
        (how, before): (How, u64),
        summary: Option<(String, Usage)>,
    ) -> u64 {
        let bytes = messages.bytes() + room.tool_bytes;
        estimate.rewritten(bytes);
        let after = estimate.scaled(bytes);
        let (summary, usage) = summary.unzip();
        self.agent.events.emit(Event::Compacted {
            step: room.step,
            how: how.as_str().into(),
            before_tokens: before,
            after_tokens: after,
            usage,
            summary,
        });
        after
    }

    /// The end of a loop whose conversation cannot be made to fit.
    fn out_of_context(&self, steps: u32, usage: Usage, state: &Compactions) -> Outcome {
        let mut error = format!(
            "the conversation no longer fits the model's context window{}: \
             {MAX_COMPACTION_FAILURES} compactions in a row failed (the last: {})",
            self.window()
                .map(|n| format!(" of {n} tokens"))
                .unwrap_or_default(),
            state.why
        );
        if !state.server.is_empty() {
            error.push_str(&format!(". The server said: {}", state.server));
        }
        self.agent.events.emit(Event::WorkFinished {
            stop_reason: StopReason::Context,
            steps,
            error: Some(error.clone()),
        });
        Outcome {
            stop_reason: StopReason::Context,
            steps,
            usage,
            answer: None,
            error: Some(error),
        }
    }
}

/// Why a summary did not come.
enum Failed {
    Cancelled(Usage),
    Summary(String, Usage),
}

/// Shrink old results: all but the newest step's.
fn compact_results(messages: &mut Conversation, output_dir: &Path) -> usize {
    shrink(messages, 1, output_dir)
}

/// Where a capped result says its whole output is kept.
fn kept_path(content: &str) -> Option<&str> {
    const MARK: &str = "; the whole result is in ";
    let at = content.find(MARK)? + MARK.len();
    let rest = &content[at..];
    let end = rest.find(" …]")?;
    Some(&rest[..end]).filter(|p| !p.starts_with("nowhere"))
}

/// The stub of a result: what was cut and where the whole of it is.
fn stub(r: &ToolResult, saved: &str) -> String {
    format!(
        "[sup: this result of {} ({} bytes) was cut to keep the conversation within the \
         context window; the whole of it is in {saved}]",
        r.name,
        r.content.len()
    )
}

/// Shrink every tool result but those of the newest `keep` tool messages to a stub, keeping
/// the whole of each in `output_dir` (a capped result's own file, when it has one). Returns
/// how many results were cut; a conversation with none to cut is left as it is.
pub(crate) fn shrink(messages: &mut Conversation, keep: usize, output_dir: &Path) -> usize {
    let tools: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, Message::Tool { .. }))
        .map(|(i, _)| i)
        .collect();
    let old = &tools[..tools.len().saturating_sub(keep)];
    let long = |r: &ToolResult| r.content.len() >= STUB_MIN && !r.content.starts_with("[sup: ");
    let any = old.iter().any(|&i| match &messages[i] {
        Message::Tool { results } => results.iter().any(long),
        _ => false,
    });
    if !any {
        return 0;
    }
    let mut cut = 0;
    messages.rewrite(|all| {
        for &i in old {
            let Some(Message::Tool { results }) = all.get_mut(i) else {
                continue;
            };
            for r in results.iter_mut().filter(|r| long(r)) {
                let saved = match kept_path(&r.content) {
                    Some(p) => p.to_string(),
                    None => save(output_dir, &r.call_id, &r.content),
                };
                r.content = stub(r, &saved);
                cut += 1;
            }
        }
    });
    cut
}

/// Keep `content` in a file of `output_dir`; the file's path, or why it could not be kept.
fn save(output_dir: &Path, call_id: &str, content: &str) -> String {
    let path = output_dir.join(format!(
        "compacted-{}.result.txt",
        crate::tools::process::safe_name(call_id)
    ));
    std::fs::create_dir_all(output_dir)
        .and_then(|_| std::fs::write(&path, content))
        .map(|_| path.display().to_string())
        .unwrap_or_else(|e| format!("the run's transcript only (saving it failed: {e})"))
}

/// The conversation as text for a summary request: everything after the goal prompt, the
/// oldest part cut when it is longer than `max` bytes.
pub(crate) fn as_text(messages: &[Message], max: usize) -> String {
    let mut parts: Vec<String> = Vec::new();
    for m in messages.iter().skip(2) {
        parts.push(match m {
            Message::System { content } => format!("[system]\n{content}"),
            Message::User { content } => format!("[user]\n{content}"),
            Message::Assistant {
                text, tool_calls, ..
            } => {
                let mut s = format!("[assistant]\n{text}");
                for c in tool_calls {
                    s.push_str(&format!("\n(call {} {})", c.name, c.arguments));
                }
                s
            }
            Message::Tool { results } => results
                .iter()
                .map(|r| {
                    format!(
                        "[result of {}{}]\n{}",
                        r.name,
                        if r.is_error { ", an error" } else { "" },
                        r.content
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
        });
    }
    let mut text = parts.join("\n\n");
    if text.len() > max {
        let mut start = text.len() - max;
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text = format!("[… the oldest part is cut …]\n{}", &text[start..]);
    }
    text
}

/// The conversation rebuilt around `summary`: system prompt, goal prompt, summary, the
/// latest check failures, then the newest whole turns whose bytes fit `tail_budget`.
pub(crate) fn rebuild(messages: &mut Conversation, summary: &str, tail_budget: usize) {
    let all: &[Message] = messages;
    let head = all
        .iter()
        .take(2)
        .take_while(|m| matches!(m, Message::System { .. } | Message::User { .. }))
        .count();
    // The newest turns: back from the end, a tool message always with the call before it.
    let mut start = all.len();
    let mut bytes = 0;
    while start > head {
        let mut from = start - 1;
        if matches!(all[from], Message::Tool { .. }) {
            while from > head && matches!(all[from], Message::Tool { .. }) {
                from -= 1;
            }
        }
        if matches!(all[from], Message::Tool { .. }) {
            break;
        }
        let size: usize = all[from..start]
            .iter()
            .map(crate::model::prices::message_bytes)
            .sum();
        if bytes + size > tail_budget {
            break;
        }
        bytes += size;
        start = from;
    }
    // A kept tail starts with the model's turn or a person's message, never with results.
    while start < all.len() && matches!(all[start], Message::Tool { .. }) {
        start += 1;
    }
    let failures = all[head..]
        .iter()
        .rposition(
            |m| matches!(m, Message::User { content } if !content.starts_with(SUMMARY_PREFIX)),
        )
        .map(|i| head + i)
        .filter(|&i| i < start)
        .map(|i| all[i].clone());
    let tail: Vec<Message> = all[start..].to_vec();
    messages.rewrite(|m| {
        m.truncate(head);
        m.push(Message::User {
            content: format!("{SUMMARY_PREFIX}{}", summary.trim()),
        });
        m.extend(failures);
        m.extend(tail);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ToolCall, sample};

    fn calls_have_results(m: &[Message]) {
        for (i, msg) in m.iter().enumerate() {
            if let Message::Assistant { tool_calls, .. } = msg
                && !tool_calls.is_empty()
            {
                let Some(Message::Tool { results }) = m.get(i + 1) else {
                    panic!("call without its results at {i}: {m:?}");
                };
                let ids: Vec<&str> = results.iter().map(|r| r.call_id.as_str()).collect();
                let want: Vec<&str> = tool_calls.iter().map(|c| c.id.as_str()).collect();
                assert_eq!(ids, want);
            }
            if matches!(msg, Message::Tool { results } if !results.is_empty()) {
                assert!(
                    matches!(m.get(i.wrapping_sub(1)), Some(Message::Assistant { .. })),
                    "results without their call at {i}"
                );
            }
        }
    }

    #[test]
    fn the_rebuilt_conversation_keeps_head_failures_and_whole_turns() {
        let mut c = Conversation::from(sample::conversation(8));
        let goal = c[1].clone();
        let generation = c.generation();
        for budget in [0, 100, 1000, 3000, 100_000] {
            let mut c2 = c.clone();
            rebuild(&mut c2, "did things", budget);
            assert_ne!(c2.generation(), generation);
            assert!(matches!(c2[0], Message::System { .. }));
            assert_eq!(c2[1], goal, "the goal prompt verbatim");
            assert!(
                matches!(&c2[2], Message::User { content } if content == &format!("{SUMMARY_PREFIX}did things"))
            );
            let tail_failures = c2[3..].iter().any(
                |m| matches!(m, Message::User { content } if content.starts_with("checks failed")),
            );
            assert!(tail_failures, "the latest failures are kept ({budget})");
            calls_have_results(&c2[3..]);
        }
        rebuild(&mut c, "s", 0);
        assert_eq!(c.len(), 4, "head, summary, failures: {c:?}");
    }

    #[test]
    fn old_results_become_stubs_naming_where_they_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = sample::conversation(4);
        m.push(Message::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: "x".into(),
                name: "run".into(),
                arguments: "{}".into(),
            }],
            reasoning: None,
        });
        let whole = "y".repeat(5000);
        m.push(Message::Tool {
            results: vec![ToolResult {
                call_id: "x".into(),
                name: "run".into(),
                content: whole.clone(),
                is_error: false,
            }],
        });
        let mut c = Conversation::from(m);
        let cut = shrink(&mut c, 1, dir.path());
        assert_eq!(cut, 4, "the long result of each old step");
        let Some(Message::Tool { results }) = c.get(3) else {
            panic!()
        };
        assert!(
            results[0]
                .content
                .starts_with("[sup: this result of read_file")
        );
        let path = results[0].content.rsplit("is in ").next().unwrap();
        let kept = std::fs::read_to_string(path.trim_end_matches(']')).unwrap();
        assert!(kept.starts_with("line \"0\""), "{kept}");
        assert!(
            matches!(c.last(), Some(Message::Tool { results }) if results[0].content == whole),
            "the newest results stay whole"
        );
        assert_eq!(shrink(&mut c, 1, dir.path()), 0, "nothing more to cut");
    }
}

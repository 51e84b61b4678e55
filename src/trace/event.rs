//! The vocabulary of the event stream: what happened in a run, layer by layer, and how it
//! ended. Stop reasons and run statuses live here because every layer and every renderer
//! speaks them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{Message, Usage};
use crate::words::words;

words! {
    /// Why a work loop stopped.
    pub enum StopReason {
        /// The model answered without calling tools.
        Final = "final",
        MaxSteps = "max_steps",
        /// The token budget is spent.
        Budget = "budget",
        /// The next model call would pass the cost cap (`--max-cost`, `max_cost_per_day`).
        Cost = "cost",
        /// The same call with the same result again and again.
        RepeatedCalls = "repeated_calls",
        /// The model ran out of output tokens.
        Length = "length",
        Cancelled = "cancelled",
        Error = "error",
        /// Verify loop: the same failure report try after try.
        NoProgress = "no_progress",
        /// Verify loop: checks still fail after the last try.
        ChecksFailed = "checks_failed",
        /// Verify loop: a check script was changed during the run.
        CheckChanged = "check_changed",
        /// Verify loop: a judge said the goal cannot be achieved.
        Impossible = "impossible",
        /// The conversation no longer fits the model's context window: three compactions in a
        /// row failed.
        Context = "context",
    }
}

words! {
    /// How a decision about a call is reported in events.
    pub enum Decided {
        /// By a rule or the mode.
        Allowed = "allowed",
        /// By a person.
        Approved = "approved",
        Denied = "denied",
        /// Nobody answered in time.
        TimedOut = "timed_out",
    }
}

impl Decided {
    /// Whether the call may run.
    pub(crate) fn granted(self) -> bool {
        matches!(self, Decided::Allowed | Decided::Approved)
    }
}

words! {
    /// How a whole run ended, as reported upward and in the `result` event.
    pub enum Status {
        /// The model answered (`sup run`) or every check passed (`sup goal`).
        Achieved = "achieved",
        /// Checks still fail after every try.
        Failed = "failed",
        /// A limit stopped the work: never success.
        Unfinished = "unfinished",
        /// The model, the provider or the setup failed.
        Error = "error",
        /// Cancelled by a person or a shutdown.
        Interrupted = "interrupted",
    }
}

/// How a goal run ended: reported upward by the verify loop, recorded by the store (kept in
/// the run folder as JSON when the store cannot take it), told as the `result` event.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    pub status: Status,
    pub stop_reason: StopReason,
    pub tries: u32,
    pub steps: u32,
    pub usage: Usage,
    /// US dollars, when the model's price is known.
    #[serde(default)]
    pub cost: Option<f64>,
    #[serde(default)]
    pub answer: Option<String>,
    pub error: Option<String>,
    /// Each try's check results.
    pub checks: Vec<Vec<CheckReport>>,
}

impl Outcome {
    /// An error before any try, saying what went wrong.
    pub(crate) fn error(error: Option<String>) -> Outcome {
        Outcome {
            status: Status::Error,
            stop_reason: StopReason::Error,
            tries: 0,
            steps: 0,
            usage: Usage::default(),
            cost: None,
            answer: None,
            error,
            checks: Vec::new(),
        }
    }

    /// The `result` event of this outcome, with what ties the run to others.
    pub(crate) fn event(&self, run_id: &str, thread: Thread) -> Event {
        Event::Result {
            status: self.status,
            stop_reason: self.stop_reason,
            tries: self.tries,
            steps: self.steps,
            usage: self.usage,
            cost: self.cost,
            run_id: run_id.to_string(),
            answer: self.answer.clone(),
            error: self.error.clone(),
            checks: self.checks.clone(),
            verified_by: match (self.status, self.checks.last()) {
                (Status::Achieved, Some(last)) => verified_by(last),
                _ => Vec::new(),
            },
            thread,
        }
    }
}

/// How a judge check's name begins: `judge: CRITERIA`.
pub(crate) const JUDGE_PREFIX: &str = "judge: ";

words! {
    /// What kind of check gave a report: what its yes is worth.
    #[derive(Default)]
    pub enum CheckKind {
        #[default]
        Script = "script",
        Command = "command",
        Human = "human",
        /// A model that read the evidence: its yes is a judge's, never a script's.
        Judge = "judge",
    }
}

impl CheckKind {
    /// The kind of a check by the name it is reported under (the store keeps only names):
    /// `human: …` and `judge: …` say theirs; scripts and commands are told apart by no name.
    pub(crate) fn of_name(name: &str) -> CheckKind {
        if name.starts_with(JUDGE_PREFIX) {
            CheckKind::Judge
        } else if name.starts_with("human: ") {
            CheckKind::Human
        } else {
            CheckKind::Script
        }
    }
}

/// The kinds of the checks of `reports` that passed, each once, in the order of `CheckKind`.
pub(crate) fn verified_by(reports: &[CheckReport]) -> Vec<CheckKind> {
    let mut kinds: Vec<CheckKind> = reports
        .iter()
        .filter(|r| r.passed)
        .map(|r| r.kind)
        .collect();
    kinds.sort_by_key(|k| *k as u8);
    kinds.dedup();
    kinds
}

/// One check's outcome in one try.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    pub(crate) name: String,
    /// Reports read back from the store, which keeps no kind, say `script`.
    #[serde(default)]
    pub(crate) kind: CheckKind,
    /// The model of a judge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    pub passed: bool,
    /// The exit status, when the check exited on its own.
    pub exit_status: Option<i32>,
    /// `exit 1`, `timed out after 5s`, `killed by signal 9`, `rejected: …`.
    pub(crate) outcome: String,
    pub(crate) duration_ms: u64,
    /// The tail of what it printed (bounded).
    pub(crate) output_tail: String,
    /// Where its whole output is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) output_path: Option<String>,
}

impl CheckReport {
    /// The files its whole output is kept in (stdout, then stderr): `output_path` holds them
    /// one a line, as a path may hold spaces.
    pub(crate) fn output_paths(&self) -> impl Iterator<Item = &str> {
        self.output_path
            .iter()
            .flat_map(|p| p.lines())
            .filter(|p| !p.is_empty())
    }
}

/// One thing that happened in a run.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    RunStarted {
        run_id: String,
        model: String,
        workspace: String,
        prompt: String,
    },
    /// Something the person should know that is not a step (a setting, a warning).
    Notice {
        text: String,
    },
    TryStarted {
        r#try: u32,
        tries: u32,
    },
    StepStarted {
        step: u32,
    },
    /// A piece of streamed model text (trace only).
    TextDelta {
        text: String,
    },
    ModelText {
        step: u32,
        text: String,
    },
    ToolCall {
        step: u32,
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        step: u32,
        id: String,
        name: String,
        content: String,
        is_error: bool,
        /// Milliseconds since the run started.
        started_ms: f64,
        finished_ms: f64,
        /// What a file tool changed, as a unified diff (cut when long); none for the others.
        diff: Option<String>,
    },
    StepFinished {
        step: u32,
        usage: Usage,
        total_usage: Usage,
        /// US dollars, when the model's price is known.
        cost: Option<f64>,
        total_cost: Option<f64>,
    },
    /// A call waits for a person: `sup approve REQUEST` / `sup deny REQUEST --reason …`.
    ApprovalRequested {
        id: String,
        request: String,
        tool: String,
        input: String,
        deadline: String,
    },
    /// What the approval gate decided about a call: `allowed`, `approved`, `denied` or
    /// `timed_out`, by which rule or person, and why.
    Approval {
        id: String,
        tool: String,
        decision: Decided,
        by: String,
        reason: Option<String>,
    },
    WorkFinished {
        stop_reason: StopReason,
        steps: u32,
        error: Option<String>,
    },
    Check {
        r#try: u32,
        #[serde(flatten)]
        report: CheckReport,
    },
    TryFinished {
        r#try: u32,
        passed: bool,
        stop_reason: StopReason,
    },
    /// A message added to the conversation (transcript only).
    Message {
        message: Message,
    },
    /// The conversation was compacted to fit the context window: old tool results cut to
    /// stubs (`results`), or the older part replaced by the model's summary (`summary`).
    /// Tokens are estimates of the request before and after.
    Compacted {
        step: u32,
        how: String,
        before_tokens: u64,
        after_tokens: u64,
        /// What the summary request spent.
        usage: Option<Usage>,
        summary: Option<String>,
    },
    /// What arrived of an answer that did not finish (Ctrl-C, a timeout, a broken stream):
    /// partial text and tool calls (their arguments perhaps cut), never run.
    Partial {
        step: u32,
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<crate::model::ToolCall>,
        usage: Usage,
        why: String,
    },
    Result {
        status: Status,
        stop_reason: StopReason,
        tries: u32,
        steps: u32,
        usage: Usage,
        /// US dollars, when the model's price is known (`cost_usd`, as in every output).
        #[serde(rename = "cost_usd", alias = "cost")]
        cost: Option<f64>,
        run_id: String,
        answer: Option<String>,
        error: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        checks: Vec<Vec<CheckReport>>,
        /// The kinds of the checks that passed in the try that achieved the goal.
        #[serde(default)]
        verified_by: Vec<CheckKind>,
        /// What an isolated run left, how runs are tied together, a parallel run's attempts.
        #[serde(flatten)]
        thread: Thread,
    },
}

impl Event {
    /// Whether a sink may hold this event's output back for its next write: the events of
    /// a step, which another event or a flush (`Events::flush`, before every wait) follows.
    pub(crate) fn batched(&self) -> bool {
        matches!(
            self,
            Event::StepStarted { .. }
                | Event::ModelText { .. }
                | Event::Message { .. }
                | Event::StepFinished { .. }
                | Event::ToolCall { .. }
                | Event::ToolResult { .. }
        )
    }
}

/// The parts of a result that isolation, `sup continue` and `parallel` add.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Thread {
    /// The worktree branch, when it stays.
    pub branch: Option<String>,
    /// The commit holding the agent's work.
    pub commit: Option<String>,
    /// `git diff --stat` of that commit.
    pub diff_stat: Option<String>,
    /// The run this one continued.
    pub continued_from: Option<String>,
    /// This attempt's number; in a parallel run's result, the winning attempt's.
    pub attempt: Option<u32>,
    /// A parallel run's attempts, by number.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptReport>,
}

/// How one attempt of a parallel run ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptReport {
    pub attempt: u32,
    pub run_id: String,
    pub status: Status,
    pub stop_reason: StopReason,
    /// `cancelled` for an attempt stopped because another won.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Anything that takes events: a renderer, the transcript writer.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: &Event);

    /// Write out what the sink holds back: the stream is about to wait (a model request,
    /// tools running, a person).
    fn flush(&self) {}
}

/// The one stream of a run: every event goes to every sink, in order.
#[derive(Clone, Default)]
pub struct Events {
    sinks: Vec<Arc<dyn EventSink>>,
}

impl Events {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Send `event` to every sink, with every known secret redacted.
    pub(crate) fn emit(&self, event: Event) {
        let event = crate::redact::serde(&event).unwrap_or(event);
        for sink in &self.sinks {
            sink.emit(&event);
        }
    }

    /// Tell every sink to write out what it holds: the caller is about to wait.
    pub(crate) fn flush(&self) {
        for sink in &self.sinks {
            sink.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolCall;

    /// Each kind's number: exhaustive, so a new kind must be numbered here, and the test
    /// below then fails until it has an example.
    fn kind(e: &Event) -> usize {
        match e {
            Event::RunStarted { .. } => 0,
            Event::Notice { .. } => 1,
            Event::TryStarted { .. } => 2,
            Event::StepStarted { .. } => 3,
            Event::TextDelta { .. } => 4,
            Event::ModelText { .. } => 5,
            Event::ToolCall { .. } => 6,
            Event::ToolResult { .. } => 7,
            Event::StepFinished { .. } => 8,
            Event::ApprovalRequested { .. } => 9,
            Event::Approval { .. } => 10,
            Event::WorkFinished { .. } => 11,
            Event::Check { .. } => 12,
            Event::TryFinished { .. } => 13,
            Event::Message { .. } => 14,
            Event::Result { .. } => 15,
            Event::Compacted { .. } => 16,
            Event::Partial { .. } => 17,
        }
    }
    const KINDS: usize = 18;

    fn report() -> CheckReport {
        CheckReport {
            name: "judge: c".into(),
            kind: CheckKind::Judge,
            model: Some("openai:m".into()),
            passed: false,
            exit_status: Some(1),
            outcome: "exit 1".into(),
            duration_ms: 3,
            output_tail: "x".into(),
            output_path: Some("/runs/r/try-1/c.log".into()),
        }
    }

    fn usage() -> Usage {
        Usage {
            input_tokens: 10,
            output_tokens: 5,
            cache_read_tokens: 2,
            cache_write_tokens: 1,
        }
    }

    #[test]
    fn every_event_reads_back_from_its_json() {
        let events = vec![
            Event::RunStarted {
                run_id: "r".into(),
                model: "script:x".into(),
                workspace: "/w".into(),
                prompt: "p".into(),
            },
            Event::Notice { text: "n".into() },
            Event::TryStarted { r#try: 1, tries: 3 },
            Event::StepStarted { step: 2 },
            Event::TextDelta { text: "par".into() },
            Event::ModelText {
                step: 2,
                text: "partial".into(),
            },
            Event::ToolCall {
                step: 2,
                id: "c1".into(),
                name: "read_file".into(),
                input: serde_json::json!({"path": "a.txt"}),
            },
            Event::ToolResult {
                step: 2,
                id: "c1".into(),
                name: "read_file".into(),
                content: "alpha".into(),
                is_error: true,
                started_ms: 1.5,
                finished_ms: 2.25,
                diff: Some("--- a.txt\n+++ a.txt\n@@ -1 +1 @@\n-a\n+b\n".into()),
            },
            Event::StepFinished {
                step: 2,
                usage: usage(),
                total_usage: usage(),
                cost: Some(0.25),
                total_cost: Some(0.5),
            },
            Event::ApprovalRequested {
                id: "c1".into(),
                request: "a-1".into(),
                tool: "run_command".into(),
                input: "{}".into(),
                deadline: "2026-01-01T00:00:00Z".into(),
            },
            Event::Approval {
                id: "c1".into(),
                tool: "run_command".into(),
                decision: Decided::Denied,
                by: "rule deny `x`".into(),
                reason: Some("no".into()),
            },
            Event::WorkFinished {
                stop_reason: StopReason::Error,
                steps: 1,
                error: Some("boom".into()),
            },
            Event::Check {
                r#try: 1,
                report: report(),
            },
            Event::TryFinished {
                r#try: 1,
                passed: false,
                stop_reason: StopReason::Final,
            },
            Event::Message {
                message: Message::Assistant {
                    text: "t".into(),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "read_file".into(),
                        arguments: "{}".into(),
                    }],
                    reasoning: Some("because".into()),
                },
            },
            Event::Result {
                status: Status::Unfinished,
                stop_reason: StopReason::MaxSteps,
                tries: 1,
                steps: 3,
                usage: usage(),
                cost: Some(0.5),
                run_id: "r".into(),
                answer: Some("a".into()),
                error: Some("e".into()),
                checks: vec![vec![report()]],
                verified_by: vec![CheckKind::Script, CheckKind::Judge],
                thread: Thread {
                    branch: Some("sup/g/r".into()),
                    attempt: Some(2),
                    ..Thread::default()
                },
            },
            Event::Compacted {
                step: 7,
                how: "summary".into(),
                before_tokens: 9000,
                after_tokens: 2000,
                usage: Some(usage()),
                summary: Some("s".into()),
            },
            Event::Partial {
                step: 2,
                text: "half".into(),
                tool_calls: vec![ToolCall {
                    id: "c2".into(),
                    name: "write_file".into(),
                    arguments: "{\"pa".into(),
                }],
                usage: usage(),
                why: "cancelled".into(),
            },
        ];
        let mut covered = [false; KINDS];
        for e in &events {
            covered[kind(e)] = true;
            let json = serde_json::to_string(e).unwrap();
            let back: Event = serde_json::from_str(&json).unwrap();
            assert_eq!(kind(&back), kind(e), "{json}");
            assert_eq!(serde_json::to_string(&back).unwrap(), json);
        }
        let missing: Vec<usize> = (0..KINDS).filter(|k| !covered[*k]).collect();
        assert!(
            missing.is_empty(),
            "event kinds without an example: {missing:?}"
        );
    }
}

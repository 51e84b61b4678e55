//! The vocabulary of the event stream: what happened in a run, layer by layer, and how it
//! ended. Stop reasons and run statuses live here because every layer and every renderer
//! speaks them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{Message, Usage};

/// Why a work loop stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model answered without calling tools.
    Final,
    MaxSteps,
    /// The token budget is spent.
    Budget,
    /// The same call with the same result again and again.
    RepeatedCalls,
    /// The model ran out of output tokens.
    Length,
    Cancelled,
    Error,
    /// Verify loop: the same failure report try after try.
    NoProgress,
    /// Verify loop: checks still fail after the last try.
    ChecksFailed,
    /// Verify loop: a check script was changed during the run.
    CheckChanged,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Final => "final",
            StopReason::MaxSteps => "max_steps",
            StopReason::Budget => "budget",
            StopReason::RepeatedCalls => "repeated_calls",
            StopReason::Length => "length",
            StopReason::Cancelled => "cancelled",
            StopReason::Error => "error",
            StopReason::NoProgress => "no_progress",
            StopReason::ChecksFailed => "checks_failed",
            StopReason::CheckChanged => "check_changed",
        }
    }
}

/// How a whole run ended, as reported upward and in the `result` event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The model answered (`sup run`) or every check passed (`sup goal`).
    Achieved,
    /// Checks still fail after every try.
    Failed,
    /// A limit stopped the work: never success.
    Unfinished,
    /// The model, the provider or the setup failed.
    Error,
    /// Cancelled by a person or a shutdown.
    Interrupted,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Achieved => "achieved",
            Status::Failed => "failed",
            Status::Unfinished => "unfinished",
            Status::Error => "error",
            Status::Interrupted => "interrupted",
        }
    }
}

/// One check's outcome in one try.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    pub name: String,
    pub passed: bool,
    /// The exit status, when the check exited on its own.
    pub exit_status: Option<i32>,
    /// `exit 1`, `timed out after 5s`, `killed by signal 9`, `rejected: …`.
    pub outcome: String,
    pub duration_ms: u64,
    /// The tail of what it printed (bounded).
    pub output_tail: String,
    /// Where its whole output is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_path: Option<String>,
}

/// One thing that happened in a run.
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
    },
    StepFinished {
        step: u32,
        usage: Usage,
        total_usage: Usage,
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
        decision: String,
        by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    WorkFinished {
        stop_reason: StopReason,
        steps: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
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
    Result {
        status: Status,
        stop_reason: StopReason,
        tries: u32,
        steps: u32,
        usage: Usage,
        run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        checks: Vec<Vec<CheckReport>>,
    },
}

/// Anything that takes events: a renderer, the transcript writer.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: &Event);
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
    pub fn emit(&self, event: Event) {
        let event = crate::redact::serde(&event).unwrap_or(event);
        for sink in &self.sinks {
            sink.emit(&event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_reads_back_from_its_json() {
        let events = vec![
            Event::Result {
                status: Status::Unfinished,
                stop_reason: StopReason::MaxSteps,
                tries: 1,
                steps: 3,
                usage: Usage::default(),
                run_id: "r".into(),
                answer: None,
                error: None,
                checks: Vec::new(),
            },
            Event::Check {
                r#try: 1,
                report: CheckReport {
                    name: "c".into(),
                    passed: false,
                    exit_status: Some(1),
                    outcome: "exit 1".into(),
                    duration_ms: 3,
                    output_tail: "x".into(),
                    output_path: None,
                },
            },
            Event::WorkFinished {
                stop_reason: StopReason::Final,
                steps: 1,
                error: None,
            },
        ];
        for e in events {
            let json = serde_json::to_string(&e).unwrap();
            let back: Event = serde_json::from_str(&json).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), json);
        }
    }
}

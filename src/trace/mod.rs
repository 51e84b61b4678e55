//! The event stream every layer reports through, and its renderers: the human trace on
//! stderr (one line per event, icons ▶ ⚙ ✓ ✗ ◆) and JSON lines on stdout (`--json`).
//! The transcript writer in `store` is one more sink on the same stream, and so are the
//! OpenTelemetry spans (`otel`, on the OTLP wire of `otlp`).

mod event;
mod human;
pub mod otel;
mod otlp;

pub use event::{
    AttemptReport, CheckKind, CheckReport, Decided, Event, EventSink, Events, Outcome, Status,
    StopReason, Thread,
};
pub(crate) use event::{JUDGE_PREFIX, verified_by};
pub(crate) use human::{HumanTrace, Results, escape, has_hidden, notice, one_line, tokens, usd};

use std::io::Write;
use std::sync::Mutex;

/// `--json`: one JSON object per event on stdout. Streaming deltas and transcript-only
/// messages are left out; the last object is the `result`.
pub(crate) struct JsonLines {
    out: Mutex<std::io::Stdout>,
}

impl JsonLines {
    pub(crate) fn new() -> Self {
        JsonLines {
            out: Mutex::new(std::io::stdout()),
        }
    }
}

impl Default for JsonLines {
    fn default() -> Self {
        Self::new()
    }
}

impl EventSink for JsonLines {
    fn emit(&self, event: &Event) {
        if matches!(event, Event::TextDelta { .. } | Event::Message { .. }) {
            return;
        }
        let Ok(line) = serde_json::to_string(event) else {
            return;
        };
        if let Ok(mut out) = self.out.lock() {
            // A closed stdout (a pipe whose reader left) must not stop the run.
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

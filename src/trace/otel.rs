//! OpenTelemetry: with `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! set, every run's event stream becomes spans that follow the GenAI semantic conventions,
//! exported over OTLP/HTTP (`http/protobuf`, or `http/json` when
//! `OTEL_EXPORTER_OTLP_PROTOCOL` asks for it) from a background thread, so that a slow or
//! unreachable collector never slows or fails a run.
//!
//! Spans: `invoke_agent GOAL` per run; `try N` per try and `check NAME` per check under it;
//! `chat MODEL` per model call and `execute_tool NAME` per tool call. No prompt, answer or
//! tool content is exported unless `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`,
//! and what is exported has passed through the event stream's redaction.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use super::otlp::{Exporter, Ids, Kind, Protocol, Span, Value};
use super::{Event, EventSink};

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const CAPTURE: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

/// How long one export may take, and how long the end of the process waits for the last.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error(
        "{var} = `{value}` is not a URL: write http://HOST:PORT (the collector's OTLP/HTTP \
         endpoint, e.g. http://127.0.0.1:4318), or unset it"
    )]
    Endpoint { var: &'static str, value: String },
    #[error(
        "{var} = `{value}`: sup exports over OTLP/HTTP only; write `http/protobuf` (the \
         default) or `http/json`"
    )]
    Protocol { var: &'static str, value: String },
    #[error("cannot set up the OpenTelemetry exporter: {0}")]
    Build(String),
}

struct Exporting {
    exporter: Exporter,
    capture: bool,
}

static EXPORTING: OnceLock<Option<Exporting>> = OnceLock::new();

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// What the environment asks for: `None` when no endpoint is set.
fn endpoint_and_protocol() -> Result<Option<(reqwest::Url, Protocol)>, OtelError> {
    let endpoint = match (var(TRACES_ENDPOINT), var(ENDPOINT)) {
        (Some(url), _) => Some((TRACES_ENDPOINT, url.clone(), url)),
        (None, Some(base)) => {
            let full = format!("{}/v1/traces", base.trim_end_matches('/'));
            Some((ENDPOINT, base, full))
        }
        (None, None) => None,
    };
    let Some((name, given, url)) = endpoint else {
        return Ok(None);
    };
    let url = reqwest::Url::parse(&url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        .ok_or(OtelError::Endpoint {
            var: name,
            value: given,
        })?;
    let (pvar, protocol) = match (var(TRACES_PROTOCOL), var(PROTOCOL)) {
        (Some(p), _) => (TRACES_PROTOCOL, p),
        (None, Some(p)) => (PROTOCOL, p),
        (None, None) => (PROTOCOL, "http/protobuf".to_string()),
    };
    let protocol = match protocol.trim() {
        "http/protobuf" => Protocol::Protobuf,
        "http/json" => Protocol::Json,
        _ => {
            return Err(OtelError::Protocol {
                var: pvar,
                value: protocol,
            });
        }
    };
    Ok(Some((url, protocol)))
}

/// Check the environment and, when it names a collector, start the exporter. Call once,
/// before the async runtime starts; a bad endpoint or protocol is an error of the
/// command line's kind (exit 2).
pub fn init() -> Result<(), OtelError> {
    let Some((url, protocol)) = endpoint_and_protocol()? else {
        let _ = EXPORTING.set(None);
        return Ok(());
    };
    let exporter = Exporter::start(url, protocol, EXPORT_TIMEOUT).map_err(OtelError::Build)?;
    let capture = var(CAPTURE).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let _ = EXPORTING.set(Some(Exporting { exporter, capture }));
    Ok(())
}

/// Export what is left and stop, waiting at most the export timeout: at the end of the
/// process, after the runtime is gone.
pub fn shutdown() {
    if let Some(Some(exporting)) = EXPORTING.get() {
        exporting
            .exporter
            .shutdown(EXPORT_TIMEOUT + Duration::from_millis(500));
    }
}

/// The span sink of one run of `goal`, when a collector is configured.
pub(crate) fn sink(goal: &str) -> Option<Arc<dyn EventSink>> {
    let exporting = EXPORTING.get()?.as_ref()?;
    Some(Arc::new(RunSpans {
        goal: goal.to_string(),
        exporter: exporting.exporter.clone(),
        capture: exporting.capture,
        state: Mutex::new(State::default()),
    }))
}

/// `openai:gpt-4o-mini` → (`openai`, `gpt-4o-mini`).
fn provider_and_model(model: &str) -> (String, String) {
    match model.split_once(':') {
        Some((p, m)) => (p.to_string(), m.to_string()),
        None => (String::new(), model.to_string()),
    }
}

/// A model call whose span ends when the step's tool calls (if any) have been counted.
struct Chat {
    span: Span,
    ended: SystemTime,
    tool_calls: usize,
}

#[derive(Default)]
struct State {
    started: Option<SystemTime>,
    provider: String,
    model: String,
    run: Option<Span>,
    r#try: Option<Span>,
    chat: Option<Chat>,
    inputs: HashMap<String, String>,
}

impl State {
    /// Where new children go: under the open try, else the run.
    fn parent(&self) -> Option<Ids> {
        self.r#try.as_ref().or(self.run.as_ref()).map(|s| s.ids)
    }

    fn at(&self, ms: f64) -> SystemTime {
        let start = self.started.unwrap_or_else(SystemTime::now);
        start + Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }
}

/// Turns one run's events into spans.
struct RunSpans {
    goal: String,
    exporter: Exporter,
    capture: bool,
    state: Mutex<State>,
}

impl RunSpans {
    fn end(&self, mut span: Span, at: SystemTime) {
        span.end = at;
        self.exporter.export(span);
    }

    /// End the pending model call, with the finish reason `length` when the work stopped
    /// on it.
    fn end_chat(&self, state: &mut State, length: bool) {
        if let Some(mut chat) = state.chat.take() {
            let reason = if length {
                "length"
            } else if chat.tool_calls > 0 {
                "tool_calls"
            } else {
                "stop"
            };
            chat.span.set(
                "gen_ai.response.finish_reasons",
                Value::Texts(vec![reason.to_string()]),
            );
            self.end(chat.span, chat.ended);
        }
    }

    fn on(&self, state: &mut State, event: &Event) {
        let now = SystemTime::now();
        // Events of the model call itself leave its span open; anything later ends it.
        if !matches!(
            event,
            Event::ToolCall { .. }
                | Event::TextDelta { .. }
                | Event::ModelText { .. }
                | Event::Message { .. }
                | Event::Notice { .. }
        ) {
            let length = matches!(
                event,
                Event::WorkFinished {
                    stop_reason: super::StopReason::Length,
                    ..
                }
            );
            self.end_chat(state, length);
        }
        match event {
            Event::RunStarted { run_id, model, .. } => {
                let (provider, model) = provider_and_model(model);
                state.started = Some(now);
                let name = format!("invoke_agent {}", self.goal);
                let mut span = Span::start(None, name, Kind::Internal, now);
                span.set("gen_ai.operation.name", "invoke_agent");
                span.set("gen_ai.agent.name", self.goal.clone());
                span.set("gen_ai.provider.name", provider.clone());
                span.set("gen_ai.request.model", model.clone());
                span.set("sup.run_id", run_id.clone());
                state.provider = provider;
                state.model = model;
                state.run = Some(span);
            }
            Event::TryStarted { r#try, tries } => {
                let parent = state.run.as_ref().map(|s| s.ids);
                let mut span = Span::start(parent, format!("try {try}"), Kind::Internal, now);
                span.set("sup.try", i64::from(*r#try));
                span.set("sup.tries", i64::from(*tries));
                state.r#try = Some(span);
            }
            Event::StepStarted { step } => {
                let name = format!("chat {}", state.model);
                let mut span = Span::start(state.parent(), name, Kind::Client, now);
                span.set("gen_ai.operation.name", "chat");
                span.set("gen_ai.provider.name", state.provider.clone());
                span.set("gen_ai.request.model", state.model.clone());
                span.set("sup.step", i64::from(*step));
                state.chat = Some(Chat {
                    span,
                    ended: now,
                    tool_calls: 0,
                });
            }
            Event::ModelText { text, .. } => {
                // The call's span is still open until the step finishes.
                if self.capture
                    && let Some(chat) = &mut state.chat
                {
                    chat.span.set("gen_ai.output.text", text.clone());
                }
            }
            Event::ToolCall { id, input, .. } => {
                if let Some(chat) = &mut state.chat {
                    chat.tool_calls += 1;
                }
                if self.capture {
                    state.inputs.insert(id.clone(), input.to_string());
                }
            }
            Event::ToolResult {
                id,
                name,
                content,
                is_error,
                started_ms,
                finished_ms,
                ..
            } => {
                let start = state.at(*started_ms);
                let span_name = format!("execute_tool {name}");
                let mut span = Span::start(state.parent(), span_name, Kind::Internal, start);
                span.set("gen_ai.operation.name", "execute_tool");
                span.set("gen_ai.tool.name", name.clone());
                span.set("gen_ai.tool.call.id", id.clone());
                if let Some(input) = state.inputs.remove(id) {
                    span.set("gen_ai.tool.call.arguments", input);
                }
                if self.capture {
                    span.set("gen_ai.tool.call.result", content.clone());
                }
                if *is_error {
                    span.set("error.type", "tool_error");
                    span.error = Some("the tool call failed".into());
                }
                self.end(span, state.at(*finished_ms).max(start));
            }
            Event::Check { report, .. } => {
                let took = Duration::from_millis(report.duration_ms);
                let start = now.checked_sub(took).unwrap_or(now);
                let name = format!("check {}", report.name);
                let mut span = Span::start(state.parent(), name, Kind::Internal, start);
                span.set("sup.check.name", report.name.clone());
                span.set("sup.check.kind", report.kind.as_str());
                span.set("sup.check.passed", report.passed);
                span.set("sup.check.outcome", report.outcome.clone());
                if let Some(model) = &report.model {
                    span.set("sup.check.model", model.clone());
                }
                if !report.passed {
                    span.error = Some(report.outcome.clone());
                }
                self.end(span, now);
            }
            Event::TryFinished {
                passed,
                stop_reason,
                ..
            } => {
                if let Some(mut span) = state.r#try.take() {
                    span.set("sup.try.passed", *passed);
                    span.set("sup.stop_reason", stop_reason.as_str());
                    self.end(span, now);
                }
            }
            Event::Result {
                status,
                stop_reason,
                usage,
                cost,
                answer,
                error,
                ..
            } => {
                if let Some(span) = state.r#try.take() {
                    self.end(span, now);
                }
                if let Some(mut span) = state.run.take() {
                    span.set("sup.status", status.as_str());
                    span.set("sup.stop_reason", stop_reason.as_str());
                    span.set("gen_ai.usage.input_tokens", usage.input_tokens as i64);
                    span.set("gen_ai.usage.output_tokens", usage.output_tokens as i64);
                    if let Some(cost) = cost {
                        span.set("sup.cost_usd", *cost);
                    }
                    if self.capture
                        && let Some(answer) = answer
                    {
                        span.set("gen_ai.output.text", answer.clone());
                    }
                    if let Some(error) = error {
                        span.set("error.type", "run_error");
                        span.error = Some(error.clone());
                    }
                    self.end(span, now);
                }
                // The daemon goes on: this run's spans leave now, off the run's path.
                self.exporter.flush();
            }
            _ => {}
        }
    }
}

impl EventSink for RunSpans {
    fn emit(&self, event: &Event) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        // A finished step: its usage lands on the model call's span, which stays open
        // until the step's tool calls are counted.
        if let Event::StepFinished { usage, .. } = event {
            let model = state.model.clone();
            if let Some(chat) = &mut state.chat {
                chat.span.set("gen_ai.response.model", model);
                chat.span
                    .set("gen_ai.usage.input_tokens", usage.input_tokens as i64);
                chat.span
                    .set("gen_ai.usage.output_tokens", usage.output_tokens as i64);
                chat.ended = SystemTime::now();
            }
            return;
        }
        self.on(&mut state, event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_string_splits_into_provider_and_model() {
        assert_eq!(
            provider_and_model("openai:gpt-4o-mini"),
            ("openai".into(), "gpt-4o-mini".into())
        );
        assert_eq!(
            provider_and_model("script:/a/b.json"),
            ("script".into(), "/a/b.json".into())
        );
    }
}

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

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue, StringValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

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
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    capture: bool,
}

static EXPORTING: OnceLock<Option<Exporting>> = OnceLock::new();

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// What the environment asks for: `None` when no endpoint is set.
fn endpoint_and_protocol() -> Result<Option<(String, Protocol)>, OtelError> {
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
    let parsed = reqwest::Url::parse(&url).ok();
    if !parsed.is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some()) {
        return Err(OtelError::Endpoint {
            var: name,
            value: given,
        });
    }
    let (pvar, protocol) = match (var(TRACES_PROTOCOL), var(PROTOCOL)) {
        (Some(p), _) => (TRACES_PROTOCOL, p),
        (None, Some(p)) => (PROTOCOL, p),
        (None, None) => (PROTOCOL, "http/protobuf".to_string()),
    };
    let protocol = match protocol.trim() {
        "http/protobuf" => Protocol::HttpBinary,
        "http/json" => Protocol::HttpJson,
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
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .with_endpoint(url)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| OtelError::Build(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("sup").build())
        .build();
    let tracer = provider.tracer("sup");
    let capture = var(CAPTURE).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let _ = EXPORTING.set(Some(Exporting {
        provider,
        tracer,
        capture,
    }));
    Ok(())
}

/// Export what is left and stop, waiting at most the export timeout: at the end of the
/// process, after the runtime is gone.
pub fn shutdown() {
    let Some(Some(exporting)) = EXPORTING.get() else {
        return;
    };
    let provider = exporting.provider.clone();
    let (done, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = provider.shutdown_with_timeout(EXPORT_TIMEOUT);
        let _ = done.send(());
    });
    let _ = wait.recv_timeout(EXPORT_TIMEOUT + Duration::from_millis(500));
}

/// The span sink of one run of `goal`, when a collector is configured.
pub(crate) fn sink(goal: &str) -> Option<Arc<dyn EventSink>> {
    let exporting = EXPORTING.get()?.as_ref()?;
    Some(Arc::new(RunSpans {
        goal: goal.to_string(),
        tracer: exporting.tracer.clone(),
        provider: exporting.provider.clone(),
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
    cx: Context,
    ended: SystemTime,
    tool_calls: usize,
}

#[derive(Default)]
struct State {
    started: Option<SystemTime>,
    provider: String,
    model: String,
    run: Option<Context>,
    r#try: Option<Context>,
    chat: Option<Chat>,
    inputs: HashMap<String, String>,
}

impl State {
    /// The span new children go under: the open try, else the run.
    fn parent(&self) -> Context {
        self.r#try
            .clone()
            .or_else(|| self.run.clone())
            .unwrap_or_default()
    }

    fn at(&self, ms: f64) -> SystemTime {
        let start = self.started.unwrap_or_else(SystemTime::now);
        start + Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }

    /// End the pending model call, with the finish reason `length` when the work stopped
    /// on it.
    fn end_chat(&mut self, length: bool) {
        if let Some(chat) = self.chat.take() {
            let reason = if length {
                "length"
            } else if chat.tool_calls > 0 {
                "tool_calls"
            } else {
                "stop"
            };
            let span = chat.cx.span();
            span.set_attribute(KeyValue::new(
                "gen_ai.response.finish_reasons",
                Value::Array(vec![StringValue::from(reason)].into()),
            ));
            span.end_with_timestamp(chat.ended);
        }
    }
}

/// Turns one run's events into spans.
struct RunSpans {
    goal: String,
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    capture: bool,
    state: Mutex<State>,
}

impl RunSpans {
    fn child(&self, parent: &Context, name: String, kind: SpanKind, start: SystemTime) -> Context {
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_start_time(start)
            .start_with_context(&self.tracer, parent);
        parent.with_span(span)
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
            state.end_chat(length);
        }
        match event {
            Event::RunStarted { run_id, model, .. } => {
                let (provider, model) = provider_and_model(model);
                state.started = Some(now);
                let cx = self.child(
                    &Context::new(),
                    format!("invoke_agent {}", self.goal),
                    SpanKind::Internal,
                    now,
                );
                cx.span().set_attributes([
                    KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                    KeyValue::new("gen_ai.agent.name", self.goal.clone()),
                    KeyValue::new("gen_ai.provider.name", provider.clone()),
                    KeyValue::new("gen_ai.request.model", model.clone()),
                    KeyValue::new("sup.run_id", run_id.clone()),
                ]);
                state.provider = provider;
                state.model = model;
                state.run = Some(cx);
            }
            Event::TryStarted { r#try, tries } => {
                let parent = state.run.clone().unwrap_or_default();
                let cx = self.child(&parent, format!("try {try}"), SpanKind::Internal, now);
                cx.span().set_attributes([
                    KeyValue::new("sup.try", i64::from(*r#try)),
                    KeyValue::new("sup.tries", i64::from(*tries)),
                ]);
                state.r#try = Some(cx);
            }
            Event::StepStarted { step } => {
                let cx = self.child(
                    &state.parent(),
                    format!("chat {}", state.model),
                    SpanKind::Client,
                    now,
                );
                cx.span().set_attributes([
                    KeyValue::new("gen_ai.operation.name", "chat"),
                    KeyValue::new("gen_ai.provider.name", state.provider.clone()),
                    KeyValue::new("gen_ai.request.model", state.model.clone()),
                    KeyValue::new("sup.step", i64::from(*step)),
                ]);
                state.chat = Some(Chat {
                    cx,
                    ended: now,
                    tool_calls: 0,
                });
            }
            Event::ModelText { text, .. } => {
                // The call's span is still open until the step finishes.
                if self.capture
                    && let Some(chat) = &state.chat
                {
                    chat.cx
                        .span()
                        .set_attribute(KeyValue::new("gen_ai.output.text", text.clone()));
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
                let cx = self.child(
                    &state.parent(),
                    format!("execute_tool {name}"),
                    SpanKind::Internal,
                    start,
                );
                let span = cx.span();
                span.set_attributes([
                    KeyValue::new("gen_ai.operation.name", "execute_tool"),
                    KeyValue::new("gen_ai.tool.name", name.clone()),
                    KeyValue::new("gen_ai.tool.call.id", id.clone()),
                ]);
                if let Some(input) = state.inputs.remove(id) {
                    span.set_attribute(KeyValue::new("gen_ai.tool.call.arguments", input));
                }
                if self.capture {
                    span.set_attribute(KeyValue::new("gen_ai.tool.call.result", content.clone()));
                }
                if *is_error {
                    span.set_attribute(KeyValue::new("error.type", "tool_error"));
                    span.set_status(Status::error("the tool call failed"));
                }
                span.end_with_timestamp(state.at(*finished_ms).max(start));
            }
            Event::Check { report, .. } => {
                let took = Duration::from_millis(report.duration_ms);
                let start = now.checked_sub(took).unwrap_or(now);
                let cx = self.child(
                    &state.parent(),
                    format!("check {}", report.name),
                    SpanKind::Internal,
                    start,
                );
                let span = cx.span();
                span.set_attributes([
                    KeyValue::new("sup.check.name", report.name.clone()),
                    KeyValue::new("sup.check.kind", report.kind.as_str()),
                    KeyValue::new("sup.check.passed", report.passed),
                    KeyValue::new("sup.check.outcome", report.outcome.clone()),
                ]);
                if let Some(model) = &report.model {
                    span.set_attribute(KeyValue::new("sup.check.model", model.clone()));
                }
                if !report.passed {
                    span.set_status(Status::error(report.outcome.clone()));
                }
                span.end_with_timestamp(now);
            }
            Event::TryFinished {
                passed,
                stop_reason,
                ..
            } => {
                if let Some(cx) = state.r#try.take() {
                    let span = cx.span();
                    span.set_attributes([
                        KeyValue::new("sup.try.passed", *passed),
                        KeyValue::new("sup.stop_reason", stop_reason.as_str()),
                    ]);
                    span.end_with_timestamp(now);
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
                if let Some(cx) = state.r#try.take() {
                    cx.span().end_with_timestamp(now);
                }
                if let Some(cx) = state.run.take() {
                    let span = cx.span();
                    span.set_attributes([
                        KeyValue::new("sup.status", status.as_str()),
                        KeyValue::new("sup.stop_reason", stop_reason.as_str()),
                        KeyValue::new("gen_ai.usage.input_tokens", usage.input_tokens as i64),
                        KeyValue::new("gen_ai.usage.output_tokens", usage.output_tokens as i64),
                    ]);
                    if let Some(cost) = cost {
                        span.set_attribute(KeyValue::new("sup.cost_usd", *cost));
                    }
                    if self.capture
                        && let Some(answer) = answer
                    {
                        span.set_attribute(KeyValue::new("gen_ai.output.text", answer.clone()));
                    }
                    if let Some(error) = error {
                        span.set_attribute(KeyValue::new("error.type", "run_error"));
                        span.set_status(Status::error(error.clone()));
                    }
                    span.end_with_timestamp(now);
                }
                // The daemon goes on: this run's spans leave now, off the run's path.
                let provider = self.provider.clone();
                std::thread::spawn(move || {
                    let _ = provider.force_flush();
                });
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
                let span = chat.cx.span();
                span.set_attributes([
                    KeyValue::new("gen_ai.response.model", model),
                    KeyValue::new("gen_ai.usage.input_tokens", usage.input_tokens as i64),
                    KeyValue::new("gen_ai.usage.output_tokens", usage.output_tokens as i64),
                ]);
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

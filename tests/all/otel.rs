//! OpenTelemetry through the binary: a collector on loopback takes what `sup` exports over
//! OTLP/HTTP, decodes the real protobuf (and JSON) messages, and the spans of a run with two
//! tries, a tool call and a check carry the GenAI names and attributes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;

use crate::common::{Env, Killed, eventually, stop};

/// One POST the collector took: its path, content type and body.
#[derive(Clone)]
pub(crate) struct Export {
    path: String,
    content_type: String,
    pub(crate) body: Vec<u8>,
}

/// An OTLP/HTTP collector on 127.0.0.1: it answers 200 to every request (keep-alive
/// included) and keeps what it was sent.
pub(crate) struct Collector {
    pub(crate) url: String,
    pub(crate) exports: Arc<Mutex<Vec<Export>>>,
}

impl Collector {
    pub(crate) fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let exports = Arc::new(Mutex::new(Vec::new()));
        let kept = exports.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let mut writer = stream.try_clone().unwrap();
                    let mut reader = BufReader::new(stream);
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                        let (mut len, mut content_type) = (0usize, String::new());
                        loop {
                            line.clear();
                            reader.read_line(&mut line).unwrap();
                            let l = line.trim_end();
                            if l.is_empty() {
                                break;
                            }
                            if let Some((k, v)) = l.split_once(':') {
                                match k.trim().to_ascii_lowercase().as_str() {
                                    "content-length" => len = v.trim().parse().unwrap(),
                                    "content-type" => content_type = v.trim().to_string(),
                                    _ => {}
                                }
                            }
                        }
                        let mut body = vec![0; len];
                        reader.read_exact(&mut body).unwrap();
                        kept.lock().unwrap().push(Export {
                            path,
                            content_type,
                            body,
                        });
                        let _ = writer.write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                              content-length: 0\r\n\r\n",
                        );
                    }
                });
            }
        });
        Collector { url, exports }
    }

    /// Every span received so far, decoded by the body's content type.
    pub(crate) fn spans(&self) -> Vec<Span> {
        let exports = self.exports.lock().unwrap().clone();
        let mut spans = Vec::new();
        for e in exports {
            assert_eq!(e.path, "/v1/traces");
            let request = if e.content_type.contains("json") {
                serde_json::from_slice::<ExportTraceServiceRequest>(&e.body).unwrap()
            } else {
                assert_eq!(e.content_type, "application/x-protobuf");
                ExportTraceServiceRequest::decode(e.body.as_slice()).unwrap()
            };
            for r in request.resource_spans {
                for s in r.scope_spans {
                    spans.extend(s.spans);
                }
            }
        }
        spans
    }

    fn content_types(&self) -> Vec<String> {
        let exports = self.exports.lock().unwrap();
        exports.iter().map(|e| e.content_type.clone()).collect()
    }
}

fn attr(span: &Span, key: &str) -> Option<any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|v| v.value)
}

fn text(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(any_value::Value::StringValue(s)) => s,
        other => panic!("{} has no string {key}: {other:?}", span.name),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(any_value::Value::IntValue(n)) => n,
        other => panic!("{} has no integer {key}: {other:?}", span.name),
    }
}

fn boolean(span: &Span, key: &str) -> bool {
    match attr(span, key) {
        Some(any_value::Value::BoolValue(b)) => b,
        other => panic!("{} has no bool {key}: {other:?}", span.name),
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// A goal that writes a file, fails its check once, fixes it and passes: two tries, a tool
/// call per try, a check per try. Returns the collector's spans and the run's JSON result.
fn two_tries(protocol: Option<&str>, capture: bool) -> (Collector, Vec<Span>, serde_json::Value) {
    let collector = Collector::start();
    let env = Env::new();
    let turns = json!([
        {"tool_calls": [{"name": "write_file", "input": {"path": "out.txt", "content": "one\n"}}]},
        {"text": "done"},
        {"tool_calls": [{"name": "write_file", "input": {"path": "out.txt", "content": "two\n"}}]},
        {"text": "fixed"}
    ]);
    let script = env.script(turns);
    let mut cmd = env.sup();
    cmd.args([
        "goal",
        "write two into out.txt",
        "--json",
        "--name",
        "otel-goal",
    ])
    .args(["--check-cmd", "grep -q two out.txt", "--tries", "2"])
    .arg("--model")
    .arg(format!("script:{}", script.display()))
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url);
    if let Some(p) = protocol {
        cmd.env("OTEL_EXPORTER_OTLP_PROTOCOL", p);
    }
    if capture {
        cmd.env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true");
    }
    let run = crate::common::Run::new(cmd.output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let result = run.result().clone();
    // The exporter sends from its own thread; the process waits for it before it exits,
    // so the spans are in by now — the wait only absorbs a slow machine.
    let spans = eventually(Duration::from_secs(10), "the run's span", || {
        let spans = collector.spans();
        spans
            .iter()
            .any(|s| s.name == "invoke_agent otel-goal")
            .then_some(spans)
    });
    (collector, spans, result)
}

#[test]
fn a_run_with_two_tries_a_tool_call_and_a_check_is_exported_as_genai_spans() {
    let (collector, spans, result) = two_tries(None, false);
    assert!(
        collector
            .content_types()
            .iter()
            .all(|t| t == "application/x-protobuf"),
        "http/protobuf is the default"
    );
    let run = named(&spans, "invoke_agent otel-goal");
    assert_eq!(run.len(), 1);
    let run = run[0];
    assert_eq!(text(run, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(text(run, "gen_ai.agent.name"), "otel-goal");
    assert_eq!(text(run, "sup.run_id"), result["run_id"].as_str().unwrap());
    assert_eq!(text(run, "sup.status"), "achieved");
    assert_eq!(text(run, "sup.stop_reason"), "final");
    assert!(run.parent_span_id.is_empty(), "the run's span is the root");

    let tries: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("try "))
        .collect();
    assert_eq!(tries.len(), 2, "one span per try");
    for t in &tries {
        assert_eq!(t.parent_span_id, run.span_id);
        assert_eq!(t.trace_id, run.trace_id);
    }
    let try_ids: Vec<&Vec<u8>> = tries.iter().map(|t| &t.span_id).collect();

    let checks = named(&spans, "check grep -q two out.txt");
    assert_eq!(checks.len(), 2, "one span per check, per try");
    let passed: Vec<bool> = checks
        .iter()
        .map(|c| boolean(c, "sup.check.passed"))
        .collect();
    assert!(
        passed.contains(&false) && passed.contains(&true),
        "{passed:?}"
    );
    for c in &checks {
        assert_eq!(text(c, "sup.check.name"), "grep -q two out.txt");
        assert_eq!(text(c, "sup.check.kind"), "command");
        assert!(
            try_ids.contains(&&c.parent_span_id),
            "a check is in its try"
        );
    }

    let chats: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert_eq!(chats.len(), 4, "one span per model call");
    for c in &chats {
        assert_eq!(text(c, "gen_ai.operation.name"), "chat");
        assert_eq!(text(c, "gen_ai.provider.name"), "script");
        assert!(text(c, "gen_ai.request.model").ends_with(".json"));
        assert_eq!(
            text(c, "gen_ai.response.model"),
            text(c, "gen_ai.request.model")
        );
        assert!(int(c, "gen_ai.usage.input_tokens") > 0);
        assert!(int(c, "gen_ai.usage.output_tokens") >= 0);
        assert!(try_ids.contains(&&c.parent_span_id));
        let Some(any_value::Value::ArrayValue(reasons)) = attr(c, "gen_ai.response.finish_reasons")
        else {
            panic!("{} has no finish reasons", c.name)
        };
        assert_eq!(reasons.values.len(), 1);
    }

    let tools = named(&spans, "execute_tool write_file");
    assert_eq!(tools.len(), 2, "one span per tool call");
    for t in &tools {
        assert_eq!(text(t, "gen_ai.operation.name"), "execute_tool");
        assert_eq!(text(t, "gen_ai.tool.name"), "write_file");
        assert!(!text(t, "gen_ai.tool.call.id").is_empty());
        assert!(attr(t, "error.type").is_none(), "the write succeeded");
        assert!(t.end_time_unix_nano >= t.start_time_unix_nano);
    }
    // No content leaves without being asked for.
    for s in &spans {
        for kv in &s.attributes {
            assert!(
                !matches!(
                    kv.key.as_str(),
                    "gen_ai.output.text" | "gen_ai.tool.call.arguments" | "gen_ai.tool.call.result"
                ),
                "{} exported {} unasked",
                s.name,
                kv.key
            );
        }
    }
}

#[test]
fn http_json_is_sent_when_asked_for_and_content_only_when_capture_is_on() {
    let (collector, spans, _) = two_tries(Some("http/json"), true);
    assert!(
        collector
            .content_types()
            .iter()
            .all(|t| t == "application/json"),
        "{:?}",
        collector.content_types()
    );
    let tools = named(&spans, "execute_tool write_file");
    assert_eq!(tools.len(), 2);
    assert!(text(tools[0], "gen_ai.tool.call.arguments").contains("out.txt"));
    assert!(named(&spans, "invoke_agent otel-goal").len() == 1);
}

#[test]
fn a_failing_tool_call_carries_its_error_type() {
    let collector = Collector::start();
    let env = Env::new();
    let run = {
        let script = env.script(json!([
            {"tool_calls": [{"name": "read_file", "input": {"path": "missing.txt"}}]},
            {"text": "gave up"}
        ]));
        let mut cmd = env.sup();
        cmd.args(["run", "read it", "--json"])
            .arg("--model")
            .arg(format!("script:{}", script.display()))
            .env(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                format!("{}/v1/traces", collector.url),
            );
        crate::common::Run::new(cmd.output().unwrap())
    };
    assert_eq!(run.code, 0, "{}", run.stderr);
    let spans = eventually(Duration::from_secs(10), "the tool's span", || {
        let spans = collector.spans();
        spans
            .iter()
            .any(|s| s.name == "execute_tool read_file")
            .then_some(spans)
    });
    let tool = named(&spans, "execute_tool read_file")[0];
    assert_eq!(text(tool, "error.type"), "tool_error");
    // `sup run` has no tries: the call is under the run's span.
    let run_span = spans
        .iter()
        .find(|s| s.name.starts_with("invoke_agent "))
        .unwrap();
    assert_eq!(tool.parent_span_id, run_span.span_id);
}

#[test]
fn an_unreachable_collector_fails_nothing() {
    // A port nobody listens on: the run is achieved all the same.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = Env::new();
    let script = env.script(json!([{"text": "hello"}]));
    let mut cmd = env.sup();
    cmd.args(["run", "say hello", "--json"])
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        );
    let run = crate::common::Run::new(cmd.output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["status"], "achieved");
}

#[test]
fn an_endpoint_that_is_not_a_url_or_a_grpc_protocol_is_exit_2() {
    let env = Env::new();
    let script = env.script(json!([{"text": "hello"}]));
    for (var, value, says) in [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "not a url",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "http/protobuf"),
    ] {
        let mut cmd = env.sup();
        cmd.args(["run", "say hello"])
            .arg("--model")
            .arg(format!("script:{}", script.display()))
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
            .env(var, value);
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

#[test]
fn a_daemons_runs_are_exported_while_it_keeps_running() {
    let collector = Collector::start();
    let env = Env::new();
    let goals = env.home.path().join("goals");
    std::fs::create_dir_all(&goals).unwrap();
    std::fs::write(goals.join("tick.json"), r#"[{"text": "done"}]"#).unwrap();
    std::fs::write(
        goals.join("tick.toml"),
        "prompt = \"work\"\nmodel = \"script:tick.json\"\nworkspace = \"work-tick\"\n\
         schedule = \"* * * * * *\"\ntimezone = \"UTC\"\n",
    )
    .unwrap();
    let mut cmd = env.sup();
    cmd.arg("daemon")
        .arg("--goals")
        .arg(&goals)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut daemon = Killed::spawn(&mut cmd);
    eventually(Duration::from_secs(15), "a run's span", || {
        named(&collector.spans(), "invoke_agent tick")
            .first()
            .map(|s| text(s, "sup.status"))
    });
    // Not the exit's flush: each run's spans leave as it ends.
    assert!(
        daemon.try_wait().unwrap().is_none(),
        "the daemon still runs"
    );
    assert_eq!(stop(daemon), 0);
}

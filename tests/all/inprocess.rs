//! The loops in-process: the work loop, the verify loop and the approval gate driven by the
//! scripted model, without the binary, so a failure points at the loop itself.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use sup::approval::{Approver, Gate, Judgement, Mode, Reply, Request, Rules};
use sup::model::script::ScriptModel;
use sup::model::{Conversation, Message};
use sup::store::RunDir;
use sup::tools::{Registry, builtin};
use sup::trace::{Event, EventSink, Events, Status, StopReason};
use sup::verify::{Check, Goal, Runtime};
use sup::work::{Limits, Work};
use tokio_util::sync::CancellationToken;

/// Keeps every event.
#[derive(Default)]
struct Kept(Mutex<Vec<Event>>);

impl EventSink for Kept {
    fn emit(&self, event: &Event) {
        self.0.lock().unwrap().push(event.clone());
    }
}

impl Kept {
    fn json(&self) -> Vec<Value> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }
}

fn model(dir: &Path, turns: Value) -> ScriptModel {
    let path = dir.join(format!("script-{}.json", fastrand::u32(..)));
    std::fs::write(&path, turns.to_string()).unwrap();
    ScriptModel::load(&path).unwrap()
}

fn tools() -> Registry {
    let mut r = Registry::new();
    builtin::register_all(&mut r).unwrap();
    r
}

fn call(id: &str, name: &str, input: Value) -> Value {
    json!({"tool_calls": [{"id": id, "name": name, "input": input}]})
}

/// An approver that answers yes or no from a list and records what it was asked.
struct Scripted {
    yes: Mutex<Vec<bool>>,
    asked: Mutex<Vec<String>>,
}

#[async_trait]
impl Approver for Scripted {
    async fn approve(&self, req: &Request<'_>, _: &Events, _: &CancellationToken) -> Reply {
        self.asked.lock().unwrap().push(req.subject.to_string());
        if self.yes.lock().unwrap().remove(0) {
            Reply::Yes {
                by: "the test".into(),
                always: false,
            }
        } else {
            Reply::No {
                by: "the test".into(),
                reason: Some("not today".into()),
                why: "the test said no: not today".into(),
                decided: sup::approval::Decided::Denied,
            }
        }
    }
    async fn judge(&self, _: &str, _: &Events, _: &CancellationToken) -> Judgement {
        Judgement::Rejected("no".into())
    }
}

struct Fixture {
    ws: tempfile::TempDir,
    kept: Arc<Kept>,
    events: Events,
    cancel: CancellationToken,
    limits: Limits,
    tools: Registry,
}

impl Fixture {
    fn new() -> Self {
        let kept = Arc::new(Kept::default());
        Fixture {
            ws: tempfile::tempdir().unwrap(),
            events: Events::new().with(kept.clone()),
            kept,
            cancel: CancellationToken::new(),
            limits: Limits::default(),
            tools: tools(),
        }
    }

    fn ws(&self) -> std::path::PathBuf {
        std::fs::canonicalize(self.ws.path()).unwrap()
    }

    fn work<'a>(&'a self, model: &'a ScriptModel, gate: Option<&'a Gate>) -> Work<'a> {
        Work {
            model,
            tools: &self.tools,
            events: &self.events,
            cancel: &self.cancel,
            limits: &self.limits,
            workspace: self.ws(),
            root: std::sync::Arc::new(sup::tools::Root::open(&self.ws())),
            output_dir: self.ws().join(".outputs"),
            jail: std::sync::Arc::new(sup::tools::sandbox::Jail::unconfined()),
            protected: Arc::new(Vec::new()),
            guarded: Default::default(),
            env: Arc::new(Vec::new()),
            started: Instant::now(),
            gate,
        }
    }
}

#[tokio::test]
async fn the_work_loop_acts_observes_and_stops_on_a_final_answer() {
    let f = Fixture::new();
    let m = model(
        f.ws.path(),
        json!([
            call("w", "write_file", json!({"path": "a.txt", "content": "alpha"})),
            {"tool_calls": [
                {"id": "r", "name": "read_file", "input": {"path": "a.txt"}},
                {"id": "u", "name": "no_such_tool", "input": {}},
                {"id": "b", "name": "read_file", "arguments": "{not json"}
            ]},
            {"text": "done"}
        ]),
    );
    let mut messages = Conversation::from(vec![Message::User {
        content: "work".into(),
    }]);
    let out = f
        .work(&m, None)
        .run(&mut messages, Default::default())
        .await;
    assert_eq!(out.stop_reason, StopReason::Final);
    assert_eq!(out.steps, 3);
    assert_eq!(out.answer.as_deref(), Some("done"));
    assert_eq!(
        std::fs::read_to_string(f.ws().join("a.txt")).unwrap(),
        "alpha"
    );
    // Every call id got one result, in the order of the calls.
    let Message::Tool { results } = &messages[4] else {
        panic!("tool results after the second turn: {messages:?}")
    };
    let ids: Vec<&str> = results.iter().map(|r| r.call_id.as_str()).collect();
    assert_eq!(ids, ["r", "u", "b"]);
    assert!(!results[0].is_error && results[0].content.contains("alpha"));
    assert!(results[1].is_error && results[1].content.contains("unknown tool"));
    assert!(results[2].is_error && results[2].content.contains("not valid JSON"));
    let kinds: Vec<String> = f
        .kept
        .json()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .filter(|t| t == "tool_result" || t == "work_finished")
        .collect();
    assert_eq!(
        kinds,
        [
            "tool_result",
            "tool_result",
            "tool_result",
            "tool_result",
            "work_finished"
        ]
    );
}

#[tokio::test]
async fn the_work_loop_stops_at_max_steps_and_never_calls_it_success() {
    let mut f = Fixture::new();
    f.limits.max_steps = 2;
    let m = model(
        f.ws.path(),
        json!([
            call("1", "list_files", json!({"path": "."})),
            call("2", "list_files", json!({"path": "sub"})),
            {"text": "never reached"}
        ]),
    );
    let mut messages = Conversation::new();
    let out = f
        .work(&m, None)
        .run(&mut messages, Default::default())
        .await;
    assert_eq!(out.stop_reason, StopReason::MaxSteps);
    assert_eq!(out.steps, 2);
    assert_eq!(out.answer, None);
}

#[tokio::test]
async fn the_gate_asks_the_injected_approver_and_a_denial_is_the_result() {
    let f = Fixture::new();
    let asker = Arc::new(Scripted {
        yes: Mutex::new(vec![false, true]),
        asked: Mutex::new(Vec::new()),
    });
    let rules = Rules::parse(&["run_command(echo *)".into()], &[], &[]).unwrap();
    let gate = Gate::new(Mode::Ask, rules, asker.clone(), asker.clone());
    let m = model(
        f.ws.path(),
        json!([
            {"tool_calls": [
                {"id": "a", "name": "run_command", "input": {"command": "echo allowed by rule"}},
                {"id": "b", "name": "write_file", "input": {"path": "no.txt", "content": "x"}},
                {"id": "c", "name": "write_file", "input": {"path": "yes.txt", "content": "y"}},
                {"id": "d", "name": "read_file", "input": {"path": "yes.txt"}}
            ]},
            {"text": "done"}
        ]),
    );
    let mut messages = Conversation::new();
    let out = f
        .work(&m, Some(&gate))
        .run(&mut messages, Default::default())
        .await;
    assert_eq!(out.stop_reason, StopReason::Final);
    // Only the write calls were put to the person; the rule and the read needed nobody.
    assert_eq!(*asker.asked.lock().unwrap(), ["no.txt", "yes.txt"]);
    assert!(!f.ws().join("no.txt").exists());
    assert!(f.ws().join("yes.txt").exists());
    let Message::Tool { results } = &messages[1] else {
        panic!("{messages:?}")
    };
    assert!(results[0].content.contains("allowed by rule"));
    assert!(results[1].is_error && results[1].content.contains("not today"));
    assert!(!results[2].is_error);
    let decisions: Vec<(String, String)> = f
        .kept
        .json()
        .iter()
        .filter(|e| e["type"] == "approval")
        .map(|e| {
            (
                e["id"].as_str().unwrap().into(),
                e["decision"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            ("a".to_string(), "allowed".to_string()),
            ("b".into(), "denied".into()),
            ("c".into(), "approved".into())
        ]
    );
}

#[tokio::test]
async fn the_verify_loop_retries_with_the_failure_report_until_the_check_passes() {
    let f = Fixture::new();
    let home = tempfile::tempdir().unwrap();
    let run = RunDir::create(home.path()).unwrap();
    let m = model(
        f.ws.path(),
        json!([
            {"text": "done, I think"},
            call("w", "write_file", json!({"path": "done.txt", "content": "yes"})),
            {"text": "done now"}
        ]),
    );
    let goal = Goal {
        name: "g".into(),
        prompt: "make done.txt".into(),
        system: "system".into(),
        checks: vec![Check::command(
            "test -f done.txt".into(),
            Duration::from_secs(30),
        )],
        tries: 3,
        fresh: false,
        limits: Limits::default(),
        workspace: f.ws(),
        feedback_cap: 1024,
        protect: Default::default(),
        workspace_toolchain: false,
    };
    let rt = Runtime {
        model: &m,
        tools: &f.tools,
        events: &f.events,
        cancel: &f.cancel,
        run: &run,
        gate: None,
        jail: std::sync::Arc::new(sup::tools::sandbox::Jail::unconfined()),
    };
    let out = sup::verify::run(&goal, &rt).await;
    assert_eq!(out.status, Status::Achieved, "{out:?}");
    assert_eq!(out.tries, 2);
    assert_eq!(out.checks.len(), 2);
    assert!(!out.checks[0][0].passed && out.checks[1][0].passed);
    // The second try was told what failed.
    let told: Vec<String> = f
        .kept
        .json()
        .iter()
        .filter(|e| e["type"] == "message" && e["message"]["role"] == "user")
        .map(|e| e["message"]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(told.len(), 2);
    assert!(told[1].contains("test -f done.txt"), "{}", told[1]);
}

#[tokio::test]
async fn the_verify_loop_stops_after_the_last_try_as_failed() {
    let f = Fixture::new();
    let home = tempfile::tempdir().unwrap();
    let run = RunDir::create(home.path()).unwrap();
    let m = model(f.ws.path(), json!([{"text": "a"}, {"text": "b"}]));
    let goal = Goal {
        name: "g".into(),
        prompt: "p".into(),
        system: "s".into(),
        checks: vec![Check::command("exit 3".into(), Duration::from_secs(30))],
        tries: 2,
        fresh: true,
        limits: Limits::default(),
        workspace: f.ws(),
        feedback_cap: 1024,
        protect: Default::default(),
        workspace_toolchain: false,
    };
    let rt = Runtime {
        model: &m,
        tools: &f.tools,
        events: &f.events,
        cancel: &f.cancel,
        run: &run,
        gate: None,
        jail: std::sync::Arc::new(sup::tools::sandbox::Jail::unconfined()),
    };
    let out = sup::verify::run(&goal, &rt).await;
    assert_eq!(out.status, Status::Failed);
    assert_eq!(out.stop_reason, StopReason::ChecksFailed);
    assert_eq!(out.tries, 2);
    assert_eq!(out.checks[1][0].exit_status, Some(3));
}

/// One step against a fake OpenAI-compatible server that answers `reply`, without retries.
async fn provider_error(reply: crate::common::fake_server::Reply) -> sup::model::ModelError {
    let server = crate::common::fake_server::FakeServer::start(vec![reply]);
    let mut opts = sup::model::ProviderOptions {
        base_url: Some(server.url.clone()),
        ..Default::default()
    };
    opts.http.max_attempts = 1;
    let model = sup::model::from_spec("openai:m", Path::new("."), &opts).unwrap();
    let messages = Conversation::from(vec![Message::User {
        content: "hi".into(),
    }]);
    let request = sup::model::ModelRequest {
        messages: &messages,
        tools: &[],
        on_text: &|_| {},
        json_schema: None,
        max_output: None,
        partial: None,
    };
    model.step(request).await.unwrap_err()
}

#[tokio::test]
async fn provider_failures_are_typed() {
    use crate::common::fake_server::Reply as R;
    use sup::model::ModelError;
    let e = provider_error(R::json(401, json!({"error": {"message": "bad key"}}))).await;
    assert!(matches!(e, ModelError::Authentication { .. }), "{e:?}");
    let e = provider_error(
        R::json(429, json!({"error": {"message": "slow down"}})).header("retry-after", "7"),
    )
    .await;
    assert!(
        matches!(e, ModelError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(7)),
        "{e:?}"
    );
    let e = provider_error(R::json(
        400,
        json!({"error": {"message": "This model's maximum context length is 8192 tokens", "code": "context_length_exceeded"}}),
    ))
    .await;
    assert!(matches!(e, ModelError::ContextOverflow { .. }), "{e:?}");
    let e = provider_error(R::json(404, json!({"error": {"message": "no such model"}}))).await;
    assert!(matches!(e, ModelError::Provider { .. }), "{e:?}");
}

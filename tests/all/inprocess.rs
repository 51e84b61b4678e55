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
use sup::work::{Agent, Limits, Work};
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
            agent: self.agent(model, gate),
            limits: &self.limits,
            workspace: self.ws(),
            root: std::sync::Arc::new(sup::tools::Root::open(&self.ws())),
            output_dir: self.ws().join(".outputs"),
            protected: Arc::new(Vec::new()),
            guarded: Default::default(),
            env: Arc::new(Vec::new()),
            started: Instant::now(),
        }
    }

    /// The fixture's tools, events and cancel token, unconfined, driving `model`.
    fn agent<'a>(&'a self, model: &'a ScriptModel, gate: Option<&'a Gate>) -> Agent<'a> {
        Agent {
            model,
            tools: &self.tools,
            events: &self.events,
            cancel: &self.cancel,
            gate,
            jail: std::sync::Arc::new(sup::tools::sandbox::Jail::unconfined()),
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
async fn the_work_loop_stops_on_the_same_call_with_the_same_result_again_and_again() {
    let mut f = Fixture::new();
    f.limits.repeat_limit = 3;
    let same = call("s", "list_files", json!({"path": "."}));
    let m = model(
        f.ws.path(),
        json!([same, same, same, same, same, {"text": "never reached"}]),
    );
    let mut messages = Conversation::new();
    let out = f
        .work(&m, None)
        .run(&mut messages, Default::default())
        .await;
    assert_eq!(out.stop_reason, StopReason::RepeatedCalls);
    assert_eq!(out.steps, 3);
    assert_eq!(out.answer, None);
}

#[tokio::test]
async fn the_work_loop_stops_when_the_token_budget_is_spent() {
    let mut f = Fixture::new();
    f.limits.token_budget = Some(100);
    let spend = |id: &str| {
        json!({"tool_calls": [{"id": id, "name": "list_files", "input": {}}],
               "usage": {"input_tokens": 60, "output_tokens": 0}})
    };
    let m = model(
        f.ws.path(),
        json!([spend("1"), spend("2"), spend("3"), {"text": "never reached"}]),
    );
    let mut messages = Conversation::new();
    let out = f
        .work(&m, None)
        .run(&mut messages, Default::default())
        .await;
    assert_eq!(out.stop_reason, StopReason::Budget);
    assert_eq!(out.steps, 2, "the step that passed the budget is the last");
    assert_eq!(out.answer, None);
}

#[tokio::test]
async fn the_work_loop_cancelled_while_the_model_thinks_stops_at_once() {
    let f = Fixture::new();
    let m = model(
        f.ws.path(),
        json!([{"text": "too late", "delay_ms": 60_000}]),
    );
    // Cancelled once the step has started (the model is asked), not before.
    let cancel = f.cancel.clone();
    let kept = f.kept.clone();
    tokio::spawn(async move {
        crate::common::eventually_async(Duration::from_secs(10), "the step to start", || {
            kept.json()
                .iter()
                .any(|e| e["type"] == "step_started")
                .then_some(())
        })
        .await;
        cancel.cancel();
    });
    let started = Instant::now();
    let mut messages = Conversation::new();
    let out = f
        .work(&m, None)
        .run(&mut messages, Default::default())
        .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out.stop_reason, StopReason::Cancelled);
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
        agent: f.agent(&m, None),
        run: &run,
        mcp: None,
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
        agent: f.agent(&m, None),
        run: &run,
        mcp: None,
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

/// The console's router in-process (`tower::ServiceExt::oneshot`), beside the browser test
/// in web.rs: pages, the sign-in they need, the CSRF, origin and peer checks, and 404s.
mod console {
    use std::net::SocketAddr;

    use axum::Router;
    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use tempfile::TempDir;
    use tower::ServiceExt;

    struct Console {
        home: TempDir,
        goals: TempDir,
    }

    /// One reply: its status, headers and body as text.
    struct Got {
        status: StatusCode,
        headers: axum::http::HeaderMap,
        body: String,
    }

    impl Got {
        /// The value a `Set-Cookie` gives `name`.
        fn cookie(&self, name: &str) -> Option<String> {
            self.headers
                .get_all(header::SET_COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(|v| v.strip_prefix(&format!("{name}=")))
                .map(|v| v.split(';').next().unwrap_or("").to_string())
        }
    }

    impl Console {
        fn new() -> Console {
            Console {
                home: tempfile::tempdir().unwrap(),
                goals: tempfile::tempdir().unwrap(),
            }
        }

        fn app(&self, token: Option<&str>, conn: Option<(SocketAddr, SocketAddr)>) -> Router {
            sup::serve::app(
                self.home.path().to_path_buf(),
                self.goals.path().to_path_buf(),
                token.map(str::to_string),
                conn,
            )
        }
    }

    async fn send(app: &Router, req: Request<Body>) -> Got {
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24)
            .await
            .unwrap();
        Got {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    async fn get(app: &Router, path: &str, cookie: Option<&str>) -> Got {
        let mut req = Request::get(path).header(header::HOST, "localhost");
        if let Some(c) = cookie {
            req = req.header(header::COOKIE, c);
        }
        send(app, req.body(Body::empty()).unwrap()).await
    }

    async fn post(app: &Router, path: &str, headers: &[(&str, &str)], form: &str) -> Got {
        let mut req = Request::post(path)
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        send(app, req.body(Body::from(form.to_string())).unwrap()).await
    }

    fn csrf_of(page: &str) -> String {
        let i = page
            .find("name=\"csrf\" value=\"")
            .expect("a form with a CSRF token")
            + 19;
        page[i..i + page[i..].find('"').unwrap()].to_string()
    }

    /// Sign in as `name`; the session cookie and the session's CSRF token (from a page).
    async fn sign_in(app: &Router, name: &str, token: Option<&str>) -> (String, String) {
        let page = get(app, "/signin", None).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let pre = page.cookie("sup_signin").expect("a sign-in cookie");
        assert_eq!(csrf_of(&page.body), pre);
        let mut form = format!("name={name}&csrf={pre}&next=/approvals");
        if let Some(t) = token {
            form.push_str(&format!("&token={t}"));
        }
        let cookie = format!("sup_signin={pre}");
        let r = post(app, "/signin", &[("cookie", &cookie)], &form).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
        assert_eq!(r.headers["location"], "/approvals");
        let session = format!("sup_session={}", r.cookie("sup_session").unwrap());
        let page = get(app, "/approvals", Some(&session)).await;
        assert!(
            page.body.contains(name),
            "signed in as {name}: {}",
            page.body
        );
        let csrf = csrf_of(&page.body);
        (session, csrf)
    }

    /// A real loopback connection whose client end this test process holds: the console's
    /// own binary, as a run's commands would be.
    fn own_conn() -> (
        (SocketAddr, SocketAddr),
        std::net::TcpStream,
        std::net::TcpStream,
    ) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        ((peer, server.local_addr().unwrap()), client, server)
    }

    #[tokio::test]
    async fn pages_answer_on_localhost_with_the_security_headers_and_404_what_is_not_there() {
        let c = Console::new();
        let app = c.app(None, None);
        let index = get(&app, "/", None).await;
        assert_eq!(index.status, StatusCode::SEE_OTHER, "{}", index.body);
        assert_eq!(index.headers["location"], "/runs");
        for path in ["/runs", "/approvals", "/goals", "/signin"] {
            let r = get(&app, path, None).await;
            assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
            assert!(
                r.headers["content-security-policy"]
                    .to_str()
                    .unwrap()
                    .contains("default-src 'none'"),
                "{path}"
            );
            assert_eq!(r.headers["x-frame-options"], "DENY", "{path}");
        }
        let css = get(&app, "/static/style.css", None).await;
        assert_eq!(css.status, StatusCode::OK);
        assert!(!css.body.is_empty());
        assert_eq!(
            get(&app, "/nowhere", None).await.status,
            StatusCode::NOT_FOUND
        );
        let run = get(&app, "/runs/20260101-000000-none", None).await;
        assert_eq!(run.status, StatusCode::NOT_FOUND, "{}", run.body);
        // Another host name (DNS rebinding) is refused on loopback.
        let req = Request::get("/runs")
            .header(header::HOST, "evil.example:8080")
            .body(Body::empty())
            .unwrap();
        let r = send(&app, req).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert!(r.body.contains("only to localhost"), "{}", r.body);
    }

    #[tokio::test]
    async fn with_a_token_every_page_but_the_sign_in_needs_a_session() {
        let c = Console::new();
        let token = "a-long-random-console-token";
        let app = c.app(Some(token), None);
        let r = get(&app, "/runs?status=failed", None).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
        assert_eq!(
            r.headers["location"],
            "/signin?next=/runs%3Fstatus%3Dfailed"
        );
        assert_eq!(get(&app, "/signin", None).await.status, StatusCode::OK);
        assert_eq!(
            get(&app, "/static/live.js", None).await.status,
            StatusCode::OK
        );
        let r = post(&app, "/approvals/x/approve", &[], "csrf=x").await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.body);
        // A wrong token is refused; the right one signs in and opens the pages.
        let page = get(&app, "/signin", None).await;
        let pre = page.cookie("sup_signin").unwrap();
        let cookie = format!("sup_signin={pre}");
        let wrong = post(
            &app,
            "/signin",
            &[("cookie", &cookie)],
            &format!("name=ann&csrf={pre}&token=not-the-token-at-all"),
        )
        .await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{}", wrong.body);
        assert!(wrong.cookie("sup_session").is_none());
        let (session, _) = sign_in(&app, "ann", Some(token)).await;
        assert_eq!(
            get(&app, "/runs", Some(&session)).await.status,
            StatusCode::OK
        );
        // A session made up by the client is none.
        let r = get(&app, "/runs", Some("sup_session=made-up")).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER);
    }

    #[tokio::test]
    async fn a_post_needs_the_sessions_csrf_token_and_no_other_sites_origin() {
        let c = Console::new();
        // A token, so that requests whose sender cannot be told are let through.
        let token = "a-long-random-console-token";
        let app = c.app(Some(token), None);
        // The sign-in form's own token, from its cookie, and nothing else.
        let page = get(&app, "/signin", None).await;
        let pre = page.cookie("sup_signin").unwrap();
        let r = post(
            &app,
            "/signin",
            &[("cookie", &format!("sup_signin={pre}"))],
            &format!("name=ann&csrf=forged&token={token}"),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert!(r.body.contains("CSRF"), "{}", r.body);
        let (session, csrf) = sign_in(&app, "ann", Some(token)).await;
        let answer = |headers: Vec<(&'static str, String)>, form: String| {
            let app = app.clone();
            let session = session.clone();
            async move {
                let mut all: Vec<(&str, &str)> = vec![("cookie", session.as_str())];
                all.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
                post(&app, "/approvals/no-such-request/approve", &all, &form).await
            }
        };
        let forged = answer(vec![], "csrf=forged".into()).await;
        assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.body);
        assert!(forged.body.contains("CSRF"), "{}", forged.body);
        let cross = answer(
            vec![("origin", "http://evil.example".into())],
            format!("csrf={csrf}"),
        )
        .await;
        assert_eq!(cross.status, StatusCode::FORBIDDEN, "{}", cross.body);
        let fetched = answer(
            vec![("sec-fetch-site", "cross-site".into())],
            format!("csrf={csrf}"),
        )
        .await;
        assert_eq!(fetched.status, StatusCode::FORBIDDEN, "{}", fetched.body);
        // With the token and this site's origin the answer gets through to the store, which
        // has no such request.
        let through = answer(
            vec![("origin", "http://localhost".into())],
            format!("csrf={csrf}"),
        )
        .await;
        assert_eq!(through.status, StatusCode::NOT_FOUND, "{}", through.body);
        let verb = post(
            &app,
            "/approvals/no-such-request/maybe",
            &[("cookie", &session)],
            &format!("csrf={csrf}"),
        )
        .await;
        assert_eq!(verb.status, StatusCode::NOT_FOUND, "{}", verb.body);
        // Every other state-changing post takes the same check: a goal's action and the
        // sign-out refuse a forged token, and the session stays.
        for path in ["/goals/any/pause", "/signout"] {
            let r = post(&app, path, &[("cookie", &session)], "csrf=forged").await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {}", r.body);
            assert!(r.body.contains("CSRF"), "{path}: {}", r.body);
        }
        let r = get(&app, "/runs", Some(&session)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }

    #[tokio::test]
    async fn a_post_from_sups_own_binary_or_an_unknown_process_without_a_token_is_refused() {
        let c = Console::new();
        // No connection's addresses: the sender cannot be identified.
        let app = c.app(None, None);
        let page = get(&app, "/signin", None).await;
        let pre = page.cookie("sup_signin").unwrap();
        let form = format!("name=ann&csrf={pre}");
        let cookie = format!("sup_signin={pre}");
        let r = post(&app, "/signin", &[("cookie", &cookie)], &form).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert!(r.body.contains("cannot tell which process"), "{}", r.body);
        assert!(r.cookie("sup_session").is_none());
        // With a token, a sign-in that carries it stands for a person.
        let token = "a-long-random-console-token";
        let app = c.app(Some(token), None);
        sign_in(&app, "bob", Some(token)).await;
        // A connection from a process that runs the console's own binary (as a run's
        // commands may) is refused, token or not; a page may still be looked at.
        let (conn, _client, _server) = own_conn();
        let app = c.app(Some(token), Some(conn));
        let form = format!("name=eve&csrf={pre}&token={token}");
        let r = post(&app, "/signin", &[("cookie", &cookie)], &form).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert!(r.body.contains("which sup started"), "{}", r.body);
        assert!(r.cookie("sup_session").is_none());
        let r = get(&app, "/signin", None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
}

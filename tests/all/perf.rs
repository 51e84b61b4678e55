//! What the speed-ups of issue 16 must not change: request bodies written from the kept
//! wire JSON still carry the whole conversation step after step, with the Anthropic cache
//! breakpoint on the latest block only, and a `--fresh` try sends a new conversation (through
//! the binary, against fake servers); and scheduled runs recorded in the claim's transaction
//! are complete records, also when a run cannot start (in-process daemon on a manual clock).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Env;
use common::fake_server::{FakeServer, Indexing, Turn, anthropic_stream, openai_stream};
use serde_json::Value;
use sup::schedule::daemon::{self, ManualClock};
use sup::store::db::{Db, parse_stamp};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Protocol {
    OpenAi,
    Anthropic,
}

/// A fake server that streams `turns` in the wire format of `protocol`.
fn streaming(protocol: Protocol, turns: &[Turn]) -> FakeServer {
    FakeServer::start(
        turns
            .iter()
            .map(|t| match protocol {
                Protocol::OpenAi => openai_stream(t, Indexing::Standard),
                Protocol::Anthropic => anthropic_stream(t),
            })
            .collect(),
    )
}

/// The model of `protocol` at the fake `server`.
fn point_at(cmd: &mut std::process::Command, protocol: Protocol, server: &FakeServer) {
    match protocol {
        Protocol::OpenAi => cmd
            .args(["--model", "openai:gpt-test"])
            .env("OPENAI_BASE_URL", format!("{}/v1", server.url)),
        Protocol::Anthropic => cmd
            .args(["--model", "anthropic:claude-test"])
            .env("ANTHROPIC_BASE_URL", &server.url)
            .env("ANTHROPIC_API_KEY", "sk-ant-test"),
    };
}

/// Four steps: two calls each (one reads a file that is missing, one has invalid
/// arguments at the second step), then the answer. Returns the recorded request bodies.
fn four_steps(protocol: Protocol) -> Vec<Value> {
    let env = Env::new();
    env.write("a.txt", &"alpha \"quoted\" ✓\n".repeat(50));
    let turns: Vec<Turn> = (0..3)
        .map(|i| {
            Turn::text(if i == 1 { "" } else { "Looking." })
                .call(&format!("c{i}a"), "read_file", r#"{"path": "a.txt"}"#)
                .call(
                    &format!("c{i}b"),
                    "read_file",
                    if i == 1 {
                        r#"{"path": "#
                    } else {
                        r#"{"path": "missing.txt"}"#
                    },
                )
        })
        .chain([Turn::text("Done.")])
        .collect();
    let server = streaming(protocol, &turns);
    let mut cmd = env.sup();
    cmd.args(["run", "read a.txt", "--json"]);
    point_at(&mut cmd, protocol, &server);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bodies: Vec<Value> = server.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies.len(), 4);
    bodies
}

fn messages(body: &Value) -> Vec<Value> {
    body["messages"].as_array().unwrap().clone()
}

#[test]
fn each_chat_completions_request_extends_the_last_one() {
    let bodies = four_steps(Protocol::OpenAi);
    for pair in bodies.windows(2) {
        let (before, after) = (messages(&pair[0]), messages(&pair[1]));
        assert_eq!(
            after[..before.len()],
            before[..],
            "the old part is unchanged"
        );
        let new: Vec<&str> = after[before.len()..]
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(new, ["assistant", "tool", "tool"]);
    }
    let last = messages(&bodies[3]);
    let text = serde_json::to_string(&last).unwrap();
    assert_eq!(text.matches("alpha \\\"quoted\\\" ✓").count(), 3 * 50);
    // The second step's assistant turn has no text and sends `content: null`.
    let second = last
        .iter()
        .filter(|m| m["role"] == "assistant")
        .nth(1)
        .unwrap();
    assert_eq!(second["content"], Value::Null);
    assert_eq!(
        second["tool_calls"][1]["function"]["arguments"],
        r#"{"path": "#
    );
    let errors = last
        .iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("Error: "))
        })
        .count();
    assert_eq!(errors, 3, "every failed call is sent as an error: {text}");
}

/// Every block of every message, without its cache mark, and where the marks were.
fn unmarked(body: &Value) -> (Vec<Value>, Vec<(usize, usize)>) {
    let mut marks = Vec::new();
    let mut out = messages(body);
    for (i, m) in out.iter_mut().enumerate() {
        for (j, b) in m["content"].as_array_mut().unwrap().iter_mut().enumerate() {
            if let Some(mark) = b.as_object_mut().unwrap().remove("cache_control") {
                assert_eq!(mark["type"], "ephemeral");
                marks.push((i, j));
            }
        }
    }
    (out, marks)
}

#[test]
fn the_anthropic_cache_breakpoint_moves_to_the_latest_block() {
    let bodies = four_steps(Protocol::Anthropic);
    for (k, body) in bodies.iter().enumerate() {
        let (_, marks) = unmarked(body);
        let m = messages(body);
        let last = (
            m.len() - 1,
            m[m.len() - 1]["content"].as_array().unwrap().len() - 1,
        );
        assert_eq!(marks, [last], "request {k}: one mark, on the latest block");
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(tools.last().unwrap()["cache_control"]["type"], "ephemeral");
    }
    for pair in bodies.windows(2) {
        let (before, _) = unmarked(&pair[0]);
        let (after, _) = unmarked(&pair[1]);
        assert_eq!(
            after[..before.len()],
            before[..],
            "apart from the mark that moved on, the old part is unchanged"
        );
        let roles: Vec<&str> = after[before.len()..]
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["assistant", "user"]);
    }
    let (last, _) = unmarked(&bodies[3]);
    let results = &last[last.len() - 1]["content"];
    assert_eq!(results[0]["type"], "tool_result");
    assert_eq!(results[1]["is_error"], true);
    assert!(results[0].get("is_error").is_none());
    // Invalid arguments are sent as an empty input.
    assert_eq!(last[3]["content"][1]["input"], serde_json::json!({}));
}

/// `--fresh`: the second try's request starts anew from the prompt and the report, in both
/// protocols; nothing of the first try's conversation is sent again, though the body of the
/// first was kept to be extended.
#[test]
fn a_fresh_try_sends_a_new_conversation_not_the_kept_one() {
    for protocol in [Protocol::OpenAi, Protocol::Anthropic] {
        let env = Env::new();
        let turns = [
            Turn::text("First try, a long answer that only the first try has."),
            Turn::text("Second."),
        ];
        let server = streaming(protocol, &turns);
        let mut cmd = env.sup();
        cmd.args([
            "goal",
            "make it so",
            "--check-cmd",
            "echo try $SUP_TRY failed; exit 1",
            "--fresh",
            "--tries",
            "2",
        ]);
        point_at(&mut cmd, protocol, &server);
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bodies: Vec<Value> = server.requests().into_iter().map(|r| r.body).collect();
        assert_eq!(bodies.len(), 2, "{protocol:?}");
        let second = messages(&bodies[1]);
        let text = serde_json::to_string(&second).unwrap();
        assert!(!text.contains("only the first try"), "{protocol:?}: {text}");
        assert_eq!(
            second.len(),
            messages(&bodies[0]).len(),
            "{protocol:?}: {text}"
        );
        assert!(
            text.contains("make it so") && text.contains("try 1 failed"),
            "{text}"
        );
    }
}

struct Daemon {
    goals: tempfile::TempDir,
    home: tempfile::TempDir,
    clock: Arc<ManualClock>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn t(s: &str) -> chrono::DateTime<chrono::Utc> {
    parse_stamp(s).unwrap()
}

impl Daemon {
    /// A daemon at `start` over goals written by `write`, once it sleeps on its clock.
    async fn start(start: &str, write: impl Fn(&std::path::Path)) -> Daemon {
        let goals = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        write(goals.path());
        let clock = Arc::new(ManualClock::new(t(start)));
        let cfg = daemon::Config {
            goals_dir: goals.path().to_path_buf(),
            home: home.path().to_path_buf(),
            max_concurrent: 8,
            grace: Duration::from_secs(5),
            clock: clock.clone(),
            defaults: Default::default(),
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            let _tx = tx;
            daemon::run(cfg, stop, rx).await.unwrap();
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while clock.waiting() == 0 {
            assert!(Instant::now() < deadline, "the daemon never went to sleep");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Daemon {
            goals,
            home,
            clock,
            shutdown,
            task,
        }
    }

    async fn until_ended(&self, n: usize) -> Db {
        let db = Db::open(self.home.path()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let runs = db.runs(None, None, 100).unwrap();
            // A run's row ends before the daemon closes its occurrence: wait for both.
            let closed = |r: &sup::store::db::RunRow| {
                r.ended_at.is_some()
                    && db
                        .occurrences(&r.goal, 10)
                        .unwrap()
                        .iter()
                        .all(|o| o.1 != sup::store::OccurrenceStatus::Running)
            };
            if runs.len() >= n && runs.iter().all(closed) {
                return db;
            }
            assert!(Instant::now() < deadline, "runs never ended: {runs:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
        drop(self.goals);
    }
}

fn goal(dir: &std::path::Path, name: &str, extra: &str) {
    std::fs::create_dir_all(dir.join("work")).unwrap();
    std::fs::write(dir.join("model.json"), r#"[{"text": "done"}]"#).unwrap();
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!(
            "prompt = \"work\"\nmodel = \"script:model.json\"\nworkspace = \"work\"\n\
             schedule = \"0 9 * * *\"\ntimezone = \"UTC\"\n{extra}"
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_due_together_are_recorded_whole_and_linked_to_their_occurrence() {
    let d = Daemon::start("2026-01-01T08:59:59Z", |dir| {
        for i in 0..5 {
            goal(dir, &format!("g{i}"), "");
        }
    })
    .await;
    d.clock.set(t("2026-01-01T09:00:00.200Z"));
    let db = d.until_ended(5).await;
    let runs = db.runs(None, None, 100).unwrap();
    assert_eq!(runs.len(), 5, "{runs:?}");
    for r in &runs {
        assert_eq!(r.status, sup::store::RunStatus::Achieved, "{r:?}");
        assert_eq!(
            r.scheduled_for.as_deref().and_then(parse_stamp),
            Some(t("2026-01-01T09:00:00Z"))
        );
        // The row names the model as the run built it, not as the goal file wrote it.
        let model_file = d.goals.path().join("model.json");
        assert_eq!(r.model, format!("script:{}", model_file.display()));
        let transcript = std::path::Path::new(&r.dir).join("transcript.jsonl");
        let text = std::fs::read_to_string(&transcript).unwrap();
        assert!(text.contains("\"run_started\""), "{text}");
        let occ = db.occurrences(&r.goal, 10).unwrap();
        assert_eq!(occ.len(), 1);
        assert_eq!(occ[0].1, sup::store::OccurrenceStatus::Done);
        assert_eq!(occ[0].2.as_deref(), Some(r.id.as_str()), "{occ:?}");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_run_that_cannot_start_is_on_record_as_an_error() {
    let d = Daemon::start("2026-01-01T08:59:59Z", |dir| {
        goal(
            dir,
            "broken",
            "[[mcp]]\nname = \"gone\"\ncommand = [\"/nonexistent/mcp-server\"]\n",
        );
    })
    .await;
    d.clock.set(t("2026-01-01T09:00:00.200Z"));
    let db = d.until_ended(1).await;
    let runs = db.runs(Some("broken"), None, 10).unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].status, sup::store::RunStatus::Error);
    let error = runs[0].error.as_deref().unwrap_or("");
    assert!(
        error.contains("gone"),
        "the error says which server: {error}"
    );
    let occ = db.occurrences("broken", 10).unwrap();
    assert_eq!(occ[0].2.as_deref(), Some(runs[0].id.as_str()));
    d.stop().await;
}

//! Real providers through the binary, against fake servers on 127.0.0.1 that speak the
//! Chat Completions and Messages wire formats, streamed and whole, and record every request.

use crate::common::fake_server::{
    FakeServer, Indexing, Reply, Turn, anthropic_events, anthropic_json, anthropic_stream,
    openai_json, openai_stream,
};
use crate::common::{self, Env, Run, tool_messages};
use serde_json::{Value, json};

const OPENAI_KEY: &str = "sk-test-OPENAI-5ecret-key-0001";
const ANTHROPIC_KEY: &str = "sk-ant-test-5ecret-key-0002";

#[derive(Clone, Copy, PartialEq)]
enum Protocol {
    OpenAi,
    Anthropic,
}

fn run_against(env: &Env, server: &FakeServer, protocol: Protocol, args: &[&str]) -> Run {
    let mut cmd = env.sup();
    cmd.args(["run", "do the work", "--json"]);
    match protocol {
        Protocol::OpenAi => cmd
            .arg("--model")
            .arg("openai:gpt-test")
            .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
            .env("OPENAI_API_KEY", OPENAI_KEY),
        Protocol::Anthropic => cmd
            .arg("--model")
            .arg("anthropic:claude-test")
            .env("ANTHROPIC_BASE_URL", &server.url)
            .env("ANTHROPIC_API_KEY", ANTHROPIC_KEY),
    };
    Run::new(cmd.args(args).output().unwrap())
}

fn two_calls_then_final() -> (Turn, Turn) {
    (
        Turn::text("Let me look at both.")
            .call("call_a", "read_file", r#"{"path": "a.txt"}"#)
            .call("call_b", "read_file", r#"{"path": "b.txt"}"#),
        Turn::text("A says alpha, B says beta."),
    )
}

fn reply(protocol: Protocol, streamed: bool, turn: &Turn) -> Reply {
    match (protocol, streamed) {
        (Protocol::OpenAi, true) => openai_stream(turn, Indexing::Standard),
        (Protocol::OpenAi, false) => openai_json(turn),
        (Protocol::Anthropic, true) => anthropic_stream(turn),
        (Protocol::Anthropic, false) => anthropic_json(turn),
    }
}

fn multi_step(protocol: Protocol, streamed: bool) {
    let env = Env::new();
    env.write("a.txt", "alpha");
    env.write("b.txt", "beta");
    let (first, last) = two_calls_then_final();
    let server = FakeServer::start(vec![
        reply(protocol, streamed, &first),
        reply(protocol, streamed, &last),
    ]);
    let args: &[&str] = if streamed { &[] } else { &["--no-stream"] };
    let run = run_against(&env, &server, protocol, args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["answer"], "A says alpha, B says beta.");
    assert_eq!(run.tool_result("call_a")["content"], "alpha");
    assert_eq!(run.tool_result("call_b")["content"], "beta");
    let usage = &run.result()["usage"];
    assert!(usage["output_tokens"].as_u64().unwrap() >= 20, "{usage}");
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    for r in &reqs {
        assert_eq!(r.body["stream"], streamed);
    }
    let second = &reqs[1].body;
    match protocol {
        Protocol::OpenAi => {
            assert_eq!(reqs[0].path, "/v1/chat/completions");
            assert_eq!(
                reqs[0].header("authorization"),
                Some(format!("Bearer {OPENAI_KEY}").as_str())
            );
            let tools = second["tools"].as_array().unwrap();
            let read = tools
                .iter()
                .find(|t| t["function"]["name"] == "read_file")
                .unwrap();
            assert_eq!(read["function"]["parameters"]["required"], json!(["path"]));
            let m = second["messages"].as_array().unwrap();
            let assistant = &m[2];
            assert_eq!(assistant["role"], "assistant");
            let ids: Vec<&str> = assistant["tool_calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_str().unwrap())
                .collect();
            assert_eq!(ids, ["call_a", "call_b"]);
            assert_eq!(
                m[3],
                json!({"role": "tool", "tool_call_id": "call_a", "content": "alpha"})
            );
            assert_eq!(
                m[4],
                json!({"role": "tool", "tool_call_id": "call_b", "content": "beta"})
            );
            if streamed {
                assert_eq!(second["stream_options"]["include_usage"], true);
            }
        }
        Protocol::Anthropic => {
            assert_eq!(reqs[0].path, "/v1/messages");
            assert_eq!(reqs[0].header("x-api-key"), Some(ANTHROPIC_KEY));
            assert_eq!(reqs[0].header("anthropic-version"), Some("2023-06-01"));
            assert_eq!(second["max_tokens"], 8192);
            assert!(
                second["system"][0]["text"]
                    .as_str()
                    .unwrap()
                    .contains("workspace")
            );
            let tools = second["tools"].as_array().unwrap();
            let read = tools.iter().find(|t| t["name"] == "read_file").unwrap();
            assert_eq!(read["input_schema"]["required"], json!(["path"]));
            let m = second["messages"].as_array().unwrap();
            assert_eq!(m.len(), 3);
            let uses: Vec<&str> = m[1]["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| b["id"].as_str().unwrap())
                .collect();
            assert_eq!(uses, ["call_a", "call_b"]);
            assert_eq!(m[1]["content"][1]["input"], json!({"path": "a.txt"}));
            let results = m[2]["content"].as_array().unwrap();
            assert_eq!(m[2]["role"], "user");
            assert_eq!(results[0]["type"], "tool_result");
            assert_eq!(results[0]["tool_use_id"], "call_a");
            assert_eq!(results[1]["tool_use_id"], "call_b");
            assert_eq!(results[1]["content"], "beta");
        }
    }
}

#[test]
fn openai_multi_step_with_parallel_calls_streamed() {
    multi_step(Protocol::OpenAi, true);
}

#[test]
fn openai_multi_step_with_parallel_calls_whole() {
    multi_step(Protocol::OpenAi, false);
}

#[test]
fn anthropic_multi_step_with_parallel_calls_streamed() {
    multi_step(Protocol::Anthropic, true);
}

#[test]
fn anthropic_multi_step_with_parallel_calls_whole() {
    multi_step(Protocol::Anthropic, false);
}

#[test]
fn streamed_text_shows_live_on_stderr() {
    let env = Env::new();
    let server = FakeServer::start(vec![openai_stream(
        &Turn::text("Streaming words arrive in pieces."),
        Indexing::Standard,
    )]);
    let out = env
        .sup()
        .args(["run", "talk", "--model", "openai:gpt-test"])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("Streaming words arrive in pieces."),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("tokens: 100 in · 10 out"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout, "Streaming words arrive in pieces.\n");
}

#[test]
fn ollama_reused_index_missing_index_empty_and_invalid_arguments() {
    for indexing in [Indexing::ReusedZero, Indexing::Missing] {
        let env = Env::new();
        env.write("a.txt", "alpha");
        let first = Turn::default()
            .call("c1", "read_file", r#"{"path":"a.txt"}"#)
            .call("c2", "list_files", "")
            .call("c3", "read_file", r#"{"path": "a.txt""#);
        let server = FakeServer::start(vec![
            openai_stream(&first, indexing),
            openai_stream(&Turn::text("ok"), indexing),
        ]);
        let run = run_against(&env, &server, Protocol::OpenAi, &[]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert_eq!(run.tool_result("c1")["content"], "alpha");
        assert_eq!(run.tool_result("c2")["is_error"], false);
        let bad = run.tool_result("c3");
        assert_eq!(bad["is_error"], true);
        assert!(
            bad["content"].as_str().unwrap().contains("not valid JSON"),
            "{bad}"
        );
        let m = server.requests()[1].body["messages"].clone();
        let ids: Vec<&str> = m
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["role"] == "tool")
            .map(|x| x["tool_call_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["c1", "c2", "c3"]);
    }
}

#[test]
fn the_ollama_preset_needs_no_key() {
    let env = Env::new();
    let server = FakeServer::start(vec![openai_stream(
        &Turn::text("local"),
        Indexing::ReusedZero,
    )]);
    let out = env
        .sup()
        .args(["run", "hi", "--model", "ollama:qwen3"])
        .env("OLLAMA_BASE_URL", format!("{}/v1", server.url))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "local\n");
    let reqs = server.requests();
    assert_eq!(reqs[0].body["model"], "qwen3");
    assert!(reqs[0].header("authorization").is_none());
}

#[test]
fn deepseek_reasoning_content_is_sent_back() {
    let env = Env::new();
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let first = Reply::sse(vec![
        chunk(json!({"reasoning_content": "I should list "}), Value::Null),
        chunk(json!({"reasoning_content": "the files."}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "d1", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".into(),
    ]);
    let server = FakeServer::start(vec![
        first,
        openai_stream(&Turn::text("done"), Indexing::Standard),
    ]);
    let out = env
        .sup()
        .args([
            "run",
            "hi",
            "--model",
            "deepseek:deepseek-chat",
            "--base-url",
            &server.url,
        ])
        .env("DEEPSEEK_API_KEY", "sk-deepseek-test")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reqs = server.requests();
    assert_eq!(reqs[0].path, "/chat/completions");
    assert_eq!(
        reqs[1].body["messages"][2]["reasoning_content"],
        "I should list the files."
    );
}

#[test]
fn a_429_with_retry_after_is_retried_then_succeeds() {
    let env = Env::new();
    let server = FakeServer::start(vec![
        Reply::json(429, json!({"error": {"message": "Rate limit reached"}}))
            .header("retry-after", "1"),
        openai_stream(&Turn::text("after the wait"), Indexing::Standard),
    ]);
    let run = run_against(&env, &server, Protocol::OpenAi, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["answer"], "after the wait");
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn five_500s_are_exit_4_with_a_clear_message() {
    let env = Env::new();
    let fail = || {
        Reply::json(
            500,
            json!({"error": {"message": "The server had an error"}}),
        )
        .header("retry-after-ms", "10")
    };
    let server = FakeServer::start((0..6).map(|_| fail()).collect());
    let run = run_against(&env, &server, Protocol::OpenAi, &[]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert_eq!(server.requests().len(), 5, "five attempts, no more");
    let error = run.result()["error"].as_str().unwrap().to_string();
    assert!(error.starts_with("openai: HTTP 500"), "{error}");
    assert!(error.contains("The server had an error"), "{error}");
    assert!(error.contains("5 attempts"), "{error}");
}

#[test]
fn a_401_is_not_retried_and_names_the_key_variable() {
    let env = Env::new();
    let server = FakeServer::start(vec![Reply::json(
        401,
        json!({"error": {"message": "Incorrect API key provided"}}),
    )]);
    let run = run_against(&env, &server, Protocol::OpenAi, &[]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert_eq!(server.requests().len(), 1);
    let error = run.result()["error"].as_str().unwrap();
    assert!(
        error.contains("401")
            && error.contains("OPENAI_API_KEY")
            && error.contains("Incorrect API key"),
        "{error}"
    );

    let server = FakeServer::start(vec![Reply::json(
        401,
        json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
    )]);
    let run = run_against(&env, &server, Protocol::Anthropic, &[]);
    assert_eq!(run.code, 4);
    assert!(
        run.result()["error"]
            .as_str()
            .unwrap()
            .contains("ANTHROPIC_API_KEY")
    );
}

#[test]
fn a_missing_key_is_a_configuration_error() {
    let env = Env::new();
    let out = env
        .sup()
        .args(["run", "hi", "--model", "anthropic:claude-test"])
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ANTHROPIC_API_KEY"));
}

#[test]
fn a_stream_dropped_before_any_output_is_retried() {
    let env = Env::new();
    let server = FakeServer::start(vec![
        openai_stream(&Turn::text("never seen"), Indexing::Standard).dropped_after(1),
        openai_stream(&Turn::text("second time lucky"), Indexing::Standard),
    ]);
    let run = run_against(&env, &server, Protocol::OpenAi, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["answer"], "second time lucky");
}

#[test]
fn a_stream_dropped_mid_answer_is_exit_4_and_keeps_the_transcript() {
    let env = Env::new();
    let server = FakeServer::start(vec![
        openai_stream(
            &Turn::text("This answer will be cut off here"),
            Indexing::Standard,
        )
        .dropped_after(3),
        openai_stream(&Turn::text("not asked for"), Indexing::Standard),
    ]);
    let run = run_against(&env, &server, Protocol::OpenAi, &[]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert_eq!(server.requests().len(), 1, "not retried after output");
    let error = run.result()["error"].as_str().unwrap();
    assert!(
        error.contains("dropped") && error.contains("middle of the answer"),
        "{error}"
    );
    let t = env.transcript();
    assert!(
        t.iter()
            .any(|e| e["type"] == "result" && e["status"] == "error")
    );
}

#[test]
fn an_overloaded_error_event_mid_stream() {
    let env = Env::new();
    let overloaded = "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n".to_string();
    // Before any output: retried.
    let mut early = anthropic_events(&Turn::text("lost"));
    early.insert(1, overloaded.clone());
    early.truncate(2);
    let server = FakeServer::start(vec![
        Reply::sse(early),
        anthropic_stream(&Turn::text("recovered")),
    ]);
    let run = run_against(&env, &server, Protocol::Anthropic, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["answer"], "recovered");
    // After output: exit 4, the message says what happened.
    let mut late = anthropic_events(&Turn::text("Some words first then trouble"));
    late.insert(5, overloaded);
    late.truncate(6);
    let server = FakeServer::start(vec![Reply::sse(late), anthropic_stream(&Turn::text("no"))]);
    let run = run_against(&env, &server, Protocol::Anthropic, &[]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(
        run.result()["error"]
            .as_str()
            .unwrap()
            .contains("overloaded_error")
    );
}

#[test]
fn pause_turn_sends_the_turn_back_and_continues() {
    let env = Env::new();
    let server = FakeServer::start(vec![
        anthropic_stream(&Turn::text("Searching the web").finish("pause_turn")),
        anthropic_stream(&Turn::text(", and here is what I found.")),
    ]);
    let run = run_against(&env, &server, Protocol::Anthropic, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.result()["answer"],
        "Searching the web, and here is what I found."
    );
    assert_eq!(run.result()["steps"], 1);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let m = reqs[1].body["messages"].as_array().unwrap();
    let last = m.last().unwrap();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["content"][0]["text"], "Searching the web");
}

#[test]
fn running_out_of_output_tokens_is_a_length_stop_for_both() {
    let env = Env::new();
    let server = FakeServer::start(vec![anthropic_stream(
        &Turn::text("cut").finish("max_tokens"),
    )]);
    let run = run_against(&env, &server, Protocol::Anthropic, &["--max-tokens", "5"]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "length");
    assert_eq!(server.requests()[0].body["max_tokens"], 5);

    let server = FakeServer::start(vec![openai_stream(
        &Turn::text("cut").finish("length"),
        Indexing::Standard,
    )]);
    let run = run_against(&env, &server, Protocol::OpenAi, &[]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "length");
}

#[test]
fn a_content_filter_stop_is_an_error_that_says_so() {
    let env = Env::new();
    let server = FakeServer::start(vec![openai_json(&Turn::text("").finish("content_filter"))]);
    let run = run_against(&env, &server, Protocol::OpenAi, &["--no-stream"]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(
        run.result()["error"]
            .as_str()
            .unwrap()
            .contains("content filter")
    );
}

#[test]
fn a_recorded_run_replays_to_the_same_calls_and_result() {
    let env = Env::new();
    env.write("a.txt", "alpha");
    env.write("b.txt", "beta");
    let (first, last) = two_calls_then_final();
    let server = FakeServer::start(vec![
        openai_stream(&first, Indexing::Standard),
        openai_stream(&last, Indexing::Standard),
    ]);
    let recording = env.home.path().join("recorded.json");
    let live = run_against(
        &env,
        &server,
        Protocol::OpenAi,
        &["--record", recording.to_str().unwrap()],
    );
    assert_eq!(live.code, 0, "{}", live.stderr);
    let out = env
        .sup()
        .args(["run", "do the work", "--json", "--model"])
        .arg(format!("script:{}", recording.display()))
        .output()
        .unwrap();
    let replay = Run::new(out);
    assert_eq!(replay.code, 0, "{}", replay.stderr);
    let calls = |r: &Run| -> Vec<Value> {
        r.of_type("tool_call")
            .into_iter()
            .map(|c| json!([c["id"], c["name"], c["input"]]))
            .collect()
    };
    assert_eq!(calls(&live), calls(&replay));
    assert_eq!(live.result()["answer"], replay.result()["answer"]);
    assert_eq!(live.result()["usage"], replay.result()["usage"]);
    assert_eq!(live.result()["steps"], replay.result()["steps"]);
    assert_eq!(tool_messages(&env.transcript()).len(), 1);
}

#[test]
fn the_key_appears_in_nothing_a_run_writes() {
    let env = Env::new();
    let (first, last) = two_calls_then_final();
    env.write("a.txt", "alpha");
    env.write("b.txt", "beta");
    let recording = env.home.path().join("rec.json");
    let rec = recording.to_str().unwrap();
    let cases: Vec<(Protocol, Vec<Reply>)> = vec![
        (
            Protocol::OpenAi,
            vec![
                openai_stream(&first, Indexing::Standard),
                openai_stream(&last, Indexing::Standard),
            ],
        ),
        (
            Protocol::OpenAi,
            vec![Reply::json(401, json!({"error": {"message": "bad key"}}))],
        ),
        (
            Protocol::OpenAi,
            vec![
                openai_stream(&Turn::text("cut off mid way"), Indexing::Standard).dropped_after(3),
            ],
        ),
        (
            Protocol::Anthropic,
            vec![anthropic_stream(&first), anthropic_stream(&last)],
        ),
        (
            Protocol::Anthropic,
            vec![Reply::json(403, json!({"error": {"message": "forbidden"}}))],
        ),
    ];
    let mut printed = String::new();
    for (protocol, replies) in cases {
        let server = FakeServer::start(replies);
        let run = run_against(&env, &server, protocol, &["--record", rec]);
        assert!(run.code == 0 || run.code == 4, "{}", run.stderr);
        printed.push_str(&run.stdout);
        printed.push_str(&run.stderr);
    }
    for key in [OPENAI_KEY, ANTHROPIC_KEY] {
        assert!(!printed.contains(key), "the key was printed");
        let files = common::all_files(env.home.path());
        assert!(files.len() > 5);
        for f in files {
            let bytes = std::fs::read(&f).unwrap();
            assert!(
                !String::from_utf8_lossy(&bytes).contains(key),
                "the key is in {}",
                f.display()
            );
        }
    }
}

#[test]
fn the_key_is_not_logged_even_at_trace_level() {
    let env = Env::new();
    let server = FakeServer::start(vec![openai_stream(&Turn::text("hi"), Indexing::Standard)]);
    let out = env
        .sup()
        .env("RUST_LOG", "trace")
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .args(["run", "x", "--model", "openai:gpt-test", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("127.0.0.1"), "trace logging was on");
    assert!(!all.contains(OPENAI_KEY));
}

#[test]
fn a_context_window_error_says_what_to_do() {
    let env = Env::new();
    let too_long = || {
        Reply::json(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
        )
    };
    // The request, then three summary requests that do not fit either.
    let server = FakeServer::start((0..4).map(|_| too_long()).collect());
    let run = run_against(&env, &server, Protocol::Anthropic, &[]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(server.requests().len(), 4, "a 400 is not retried");
    assert_eq!(run.result()["stop_reason"], "context");
    let error = run.result()["error"].as_str().unwrap();
    assert!(
        error.contains("prompt is too long")
            && error.contains("context window of 200000 tokens")
            && error.contains("3 compactions in a row failed"),
        "{error}"
    );
}

#[test]
fn a_stream_silent_past_the_idle_timeout_is_retried() {
    let env = Env::new();
    let mut stalled = openai_stream(&Turn::text("too slow"), Indexing::Standard);
    if let crate::common::fake_server::Body::Chunks { pieces, .. } = &mut stalled.body {
        pieces[0].0 = 5000;
    }
    let server = FakeServer::start(vec![
        stalled,
        openai_stream(&Turn::text("on time"), Indexing::Standard),
    ]);
    let run = run_against(&env, &server, Protocol::OpenAi, &["--idle-timeout", "1s"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["answer"], "on time");
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn a_server_that_cannot_be_reached_is_retried_then_exit_4() {
    let env = Env::new();
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = env
        .sup()
        .args([
            "run",
            "hi",
            "--json",
            "--model",
            "openai:gpt-test",
            "--retries",
            "2",
        ])
        .env("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 4, "{}", run.stderr);
    let error = run.result()["error"].as_str().unwrap();
    assert!(
        error.contains("cannot reach") && error.contains("2 attempts"),
        "{error}"
    );
}

/// A keep-alive server that streams `turns`, each body's end `ms` after its last event.
fn ending_late(protocol: Protocol, turns: &[Turn], ms: u64) -> FakeServer {
    FakeServer::keep_alive(
        turns
            .iter()
            .map(|t| reply(protocol, true, t).ending_after(ms))
            .collect(),
    )
}

/// A server that writes a stream's last chunk (the body's end) apart from the events, after
/// them, as servers that flush each event do: each step's connection is kept for the next,
/// not closed because the answer was complete before the body ended.
fn keeps_the_connection_when_the_end_comes_late(protocol: Protocol) {
    let env = Env::new();
    env.write("a.txt", "alpha");
    env.write("b.txt", "beta");
    let turns = [
        Turn::text("").call("call_a", "read_file", r#"{"path": "a.txt"}"#),
        Turn::text("").call("call_b", "read_file", r#"{"path": "b.txt"}"#),
        Turn::text("A says alpha, B says beta."),
    ];
    let server = ending_late(protocol, &turns, 40);
    let run = run_against(&env, &server, protocol, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["answer"], "A says alpha, B says beta.");
    assert_eq!(server.requests().len(), 3);
    assert_eq!(server.connections(), 1, "a new connection for each step");
}

#[test]
fn a_chat_stream_whose_end_comes_late_keeps_its_connection() {
    keeps_the_connection_when_the_end_comes_late(Protocol::OpenAi);
}

#[test]
fn a_messages_stream_whose_end_comes_late_keeps_its_connection() {
    keeps_the_connection_when_the_end_comes_late(Protocol::Anthropic);
}

/// A server that never ends a stream after its answer: sup waits for the end once, briefly,
/// then no more; each answer still counts and the run ends.
#[test]
fn a_stream_that_never_ends_after_its_answer_is_waited_for_once() {
    let env = Env::new();
    env.write("a.txt", "alpha");
    let turns = [
        Turn::text("").call("call_a", "read_file", r#"{"path": "a.txt"}"#),
        Turn::text("").call("call_b", "read_file", r#"{"path": "a.txt"}"#),
        Turn::text("Alpha twice."),
    ];
    let server = ending_late(Protocol::OpenAi, &turns, 60_000);
    let mut cmd = env.sup();
    cmd.args(["run", "do the work", "--json", "--model", "openai:gpt-test"])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .env("RUST_LOG", "sup=debug");
    let run = Run::new(cmd.output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["answer"], "Alpha twice.");
    assert_eq!(
        run.stderr
            .matches("a stream did not end after its answer")
            .count(),
        1,
        "{}",
        run.stderr
    );
    assert_eq!(server.connections(), 3);
}

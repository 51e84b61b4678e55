//! Long runs through the binary: a conversation that outgrows a small context window is
//! compacted and the run ends `final`, against a server that refuses requests past its window
//! in each real server's words; a summary that never comes stops the run `context`; Ctrl-C
//! mid-stream keeps the partial text; an answer that never ends stops at the default output
//! limit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Env, Run, SpawnKilled, eventually, until};
use crate::wire_replay::{Protocol, RawServer, run_on, whole};

/// The window of the test server, in its tokens (4 bytes of request body each).
const WINDOW: usize = 4000;

/// How each real server says a request is past its window.
#[derive(Clone, Copy, Debug)]
enum Wording {
    OpenAi,
    Anthropic,
    LlamaCpp,
    Vllm,
    Ollama,
}

impl Wording {
    fn protocol(self) -> Protocol {
        match self {
            Wording::Anthropic => Protocol::Anthropic,
            _ => Protocol::OpenAi,
        }
    }

    fn refusal(self, tokens: usize) -> String {
        let w = WINDOW;
        whole(
            400,
            &match self {
                Wording::OpenAi => json!({"error": {"message": format!(
                    "This model's maximum context length is {w} tokens. However, your messages \
                     resulted in {tokens} tokens. Please reduce the length of the messages."),
                    "type": "invalid_request_error", "param": "messages",
                    "code": "context_length_exceeded"}}),
                Wording::Anthropic => json!({"type": "error", "error": {
                    "type": "invalid_request_error",
                    "message": format!("prompt is too long: {tokens} tokens > {w} maximum")}}),
                Wording::LlamaCpp => json!({"error": {"code": 400, "message": format!(
                    "request ({tokens} tokens) exceeds the available context size ({w} tokens), \
                     try increasing it"), "type": "exceed_context_size_error",
                    "n_prompt_tokens": tokens, "n_ctx": w}}),
                Wording::Vllm => json!({"object": "error", "message": format!(
                    "This model's maximum context length is {w} tokens. However, you requested \
                     {tokens} tokens ({tokens} in the messages, 0 in the completion). Please \
                     reduce the length of the messages or completion."),
                    "type": "BadRequestError", "param": null, "code": 400}),
                Wording::Ollama => json!({"error": "the input length exceeds the context length"}),
            },
        )
    }
}

/// What the small-window server saw.
#[derive(Default)]
struct Seen {
    /// Requests past the window (refused).
    refused: usize,
    /// Main requests (with tools) answered since the first summary, and whether each held
    /// the goal verbatim and every call with its result.
    after_summary: Vec<(bool, bool)>,
    summaries: usize,
    steps: usize,
}

const GOAL: &str = "Read f1.txt to f60.txt one by one, then say done.";

/// Whether every call in a Chat Completions or Messages body is followed by its result and
/// every result follows its call.
fn calls_whole(body: &Value) -> bool {
    let text = body["messages"].to_string();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for m in body["messages"].as_array().unwrap() {
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            calls.push(c["id"].as_str().unwrap().to_string());
        }
        if let Some(id) = m["tool_call_id"].as_str() {
            results.push(id.to_string());
        }
        for b in m["content"].as_array().into_iter().flatten() {
            if b["type"] == "tool_use" {
                calls.push(b["id"].as_str().unwrap().to_string());
            }
            if b["type"] == "tool_result" {
                results.push(b["tool_use_id"].as_str().unwrap().to_string());
            }
        }
    }
    !text.is_empty() && calls == results
}

/// A reply in `protocol`'s whole form: `call` reads a file, else the text ends the run.
fn answer(protocol: Protocol, tokens: usize, call: Option<usize>, text: &str) -> String {
    match (protocol, call) {
        (Protocol::OpenAi, Some(n)) => whole(
            200,
            &json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null, "tool_calls": [{"id": format!("c{n}"),
                "type": "function", "function": {"name": "read_file",
                "arguments": json!({"path": format!("f{n}.txt")}).to_string()}}]}}],
                "usage": {"prompt_tokens": tokens, "completion_tokens": 12}}),
        ),
        (Protocol::Anthropic, Some(n)) => whole(
            200,
            &json!({"id": "m", "type": "message", "role": "assistant", "content": [
                {"type": "tool_use", "id": format!("c{n}"), "name": "read_file",
                 "input": {"path": format!("f{n}.txt")}}], "stop_reason": "tool_use",
                "usage": {"input_tokens": tokens, "output_tokens": 12}}),
        ),
        (Protocol::OpenAi, None) => whole(
            200,
            &json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": tokens, "completion_tokens": 12}}),
        ),
        (Protocol::Anthropic, None) => whole(
            200,
            &json!({"id": "m", "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                "usage": {"input_tokens": tokens, "output_tokens": 12}}),
        ),
    }
}

/// A 60-step task whose results add up to ten times the window, against a server that
/// refuses requests past its window in `wording`'s words.
fn sixty_steps_in_a_small_window(wording: Wording, args: &[&str]) -> (Env, Run, Arc<Mutex<Seen>>) {
    sixty_steps_with(wording, args, |_| {})
}

fn sixty_steps_with(
    wording: Wording,
    args: &[&str],
    setup: impl FnOnce(&Env),
) -> (Env, Run, Arc<Mutex<Seen>>) {
    let env = Env::new();
    setup(&env);
    // 60 files of 2,700 bytes: 160 KB of results, ten times the 16 KB window.
    for n in 1..=60 {
        env.write(
            &format!("f{n}.txt"),
            &format!("file {n}: {}\n", "x".repeat(2690)),
        );
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let protocol = wording.protocol();
    let s = seen.clone();
    let server = RawServer::start(Box::new(move |_, body| {
        let tokens = body.to_string().len() / 4;
        let mut seen = s.lock().unwrap();
        if tokens > WINDOW {
            seen.refused += 1;
            return wording.refusal(tokens);
        }
        if body.get("tools").is_none() {
            seen.summaries += 1;
            return answer(
                protocol,
                tokens,
                None,
                &format!(
                    "Progress: read f1.txt to f{}.txt. Next: the rest.",
                    seen.steps
                ),
            );
        }
        if seen.summaries > 0 {
            let text = body["messages"].to_string();
            seen.after_summary
                .push((text.contains(GOAL), calls_whole(body)));
        }
        seen.steps += 1;
        let n = seen.steps;
        answer(protocol, tokens, (n <= 60).then_some(n), "done")
    }));
    let mut cmd = env.sup();
    if env.home.path().join("config.toml").exists() {
        cmd.env("SUP_CONFIG", env.home.path().join("config.toml"));
    }
    cmd.args(["run", GOAL, "--json", "--max-steps", "100", "--no-stream"]);
    match protocol {
        Protocol::OpenAi => cmd
            .args(["--model", "openai:small"])
            .env("OPENAI_BASE_URL", format!("{}/v1", server.url)),
        Protocol::Anthropic => cmd
            .args(["--model", "anthropic:small"])
            .env("ANTHROPIC_BASE_URL", &server.url)
            .env("ANTHROPIC_API_KEY", "sk-ant-test"),
    };
    let run = Run::new(cmd.args(args).output().unwrap());
    (env, run, seen)
}

fn compacts_and_ends_final(wording: Wording, args: &[&str]) {
    let (env, run, seen) = sixty_steps_in_a_small_window(wording, args);
    assert_eq!(
        run.code,
        0,
        "{wording:?}: {}\n{}",
        run.stderr,
        run.stdout
            .lines()
            .filter(|l| !l.contains("\"message\""))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(run.result()["stop_reason"], "final");
    assert_eq!(run.result()["steps"], 61);
    let seen = seen.lock().unwrap();
    assert!(seen.summaries >= 1, "{wording:?}: a summary was asked for");
    assert!(!seen.after_summary.is_empty());
    for (i, (goal, whole)) in seen.after_summary.iter().enumerate() {
        assert!(
            goal,
            "{wording:?}: request {i} after a summary lost the goal"
        );
        assert!(
            whole,
            "{wording:?}: request {i} after a summary split a call from its result"
        );
    }
    // The server's window is learned from the first refusal, then never passed again
    // (Ollama names no window: what was refused teaches it).
    assert!(
        seen.refused <= 1,
        "{wording:?}: {} requests past the window",
        seen.refused
    );
    let compacted = run.of_type("compacted");
    assert!(
        compacted.iter().any(|e| e["how"] == "summary")
            && compacted.iter().any(|e| e["how"] == "results"),
        "{wording:?}: {compacted:?}"
    );
    for c in &compacted {
        assert!(
            c["after_tokens"].as_u64() < c["before_tokens"].as_u64(),
            "{c}"
        );
        assert!(c["step"].as_u64().unwrap() >= 1);
    }
    // The summary requests count: the run's usage is more than its steps'.
    let steps_input: u64 = run
        .of_type("step_finished")
        .iter()
        .map(|e| e["usage"]["input_tokens"].as_u64().unwrap())
        .sum();
    let total = run.result()["usage"]["input_tokens"].as_u64().unwrap();
    assert!(total > steps_input, "{total} vs {steps_input}");
    // The transcript and `sup show` have them too.
    let t = env.transcript();
    assert_eq!(
        t.iter().filter(|e| e["type"] == "compacted").count(),
        compacted.len()
    );
    let id = run.result()["run_id"].as_str().unwrap().to_string();
    let show = env.sup().args(["show", &id]).output().unwrap();
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(
        shown.contains("compacted before step") && shown.contains("model's summary"),
        "{shown}"
    );
    // The stubs say where the whole results are kept, and they are.
    let kept: Vec<_> = std::fs::read_dir(env.run_dirs().pop().unwrap().join("outputs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("compacted-"))
        .collect();
    assert!(!kept.is_empty());
    assert!(
        std::fs::read_to_string(&kept[0])
            .unwrap()
            .starts_with("file "),
        "{kept:?}"
    );
}

#[test]
fn openai_wording_compacts_and_ends_final() {
    compacts_and_ends_final(Wording::OpenAi, &[]);
}

#[test]
fn anthropic_wording_compacts_and_ends_final() {
    compacts_and_ends_final(Wording::Anthropic, &[]);
}

#[test]
fn llama_cpp_wording_compacts_and_ends_final() {
    compacts_and_ends_final(Wording::LlamaCpp, &[]);
}

#[test]
fn vllm_wording_compacts_and_ends_final() {
    compacts_and_ends_final(Wording::Vllm, &[]);
}

#[test]
fn ollama_wording_compacts_and_ends_final() {
    compacts_and_ends_final(Wording::Ollama, &[]);
}

/// With the window given, compaction starts before any request passes it: none is refused.
#[test]
fn a_known_window_is_never_passed() {
    let (_env, run, seen) =
        sixty_steps_in_a_small_window(Wording::LlamaCpp, &["--context-window", "4000"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(seen.lock().unwrap().refused, 0);
}

/// `[models."provider:model"] context_window` in the user config is the window too.
#[test]
fn the_user_configs_window_is_never_passed() {
    let (_env, run, seen) = sixty_steps_with(Wording::Ollama, &[], |env| {
        std::fs::write(
            env.home.path().join("config.toml"),
            "[models.\"openai:small\"]\ncontext_window = 4000\n",
        )
        .unwrap();
    });
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(seen.lock().unwrap().refused, 0);
}

/// A window of 0, or a share of it outside (0, 1), is refused with the file, line and key.
#[test]
fn a_zero_window_or_a_share_outside_0_1_is_exit_2() {
    let env = Env::new();
    for (body, key) in [
        ("prompt = \"p\"\n\ncontext_window = 0\n", "context_window"),
        ("prompt = \"p\"\n\ncompact_at = 1.0\n", "compact_at"),
        ("prompt = \"p\"\n\ncompact_at = 0\n", "compact_at"),
        ("prompt = \"p\"\n\ncompact_at = -0.5\n", "compact_at"),
        (
            "prompt = \"p\"\n\n[models.\"openai:x\"]\ncontext_window = 0\n",
            "context_window",
        ),
    ] {
        let line = if body.contains("models") { 4 } else { 3 };
        crate::sandbox::refused_at(&env, body, line, key);
    }
    for args in [["--context-window", "0"], ["--compact-at", "1.5"]] {
        let out = env
            .sup()
            .args(["run", "x", "--model", "openai:m"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    let out = env
        .sup()
        .args([
            "run",
            "x",
            "--model",
            "openai:m",
            "--context-window",
            "4000",
        ])
        .args(["--compact-at", "0.5", "--print-config"])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with("context_window") && l.contains("4000"))
    );
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with("compact_at") && l.contains("0.5"))
    );
}

/// Compaction across tries: the checks fail after the first try, the conversation goes on
/// and is compacted again; every request after a compaction in the second try holds the
/// check failures verbatim, and the goal is achieved.
#[test]
fn compaction_keeps_the_latest_check_failures_across_tries() {
    let env = Env::new();
    for n in 1..=50 {
        env.write(
            &format!("f{n}.txt"),
            &format!("file {n}: {}\n", "x".repeat(2690)),
        );
    }
    let steps = Arc::new(Mutex::new(0usize));
    let s = steps.clone();
    let server = RawServer::start(Box::new(move |_, body| {
        let tokens = body.to_string().len() / 4;
        if tokens > WINDOW {
            return Wording::LlamaCpp.refusal(tokens);
        }
        if body.get("tools").is_none() {
            return answer(Protocol::OpenAi, tokens, None, "Progress: reading files.");
        }
        let mut n = s.lock().unwrap();
        *n += 1;
        match *n {
            25 => answer(Protocol::OpenAi, tokens, None, "done"),
            51 => whole(
                200,
                &json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": null, "tool_calls": [{"id": "w",
                    "type": "function", "function": {"name": "write_file",
                    "arguments": json!({"path": "done.txt", "content": "yes"}).to_string()}}]}}],
                    "usage": {"prompt_tokens": tokens, "completion_tokens": 12}}),
            ),
            52.. => answer(Protocol::OpenAi, tokens, None, "done"),
            k => answer(Protocol::OpenAi, tokens, Some(k.min(50)), ""),
        }
    }));
    let goal = env.write(
        "g/goal.toml",
        "prompt = \"Read the files, then make done.txt.\"\nmodel = \"openai:small\"\n\
         max_steps = 60\nno_stream = true\n\n[[check]]\nrun = \"test -f done.txt\"\n",
    );
    let out = env
        .sup()
        .args(["goal", "--file", goal.to_str().unwrap(), "--json"])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["status"], "achieved");
    assert_eq!(run.result()["tries"], 2);
    let t = env.transcript();
    let report = crate::common::user_messages(&t)
        .into_iter()
        .find(|m| m.starts_with("The acceptance checks ran"))
        .expect("a failure report");
    let report = serde_json::to_string(&report).unwrap();
    let requests = server.requests();
    let first_of_try_2 = requests
        .iter()
        .position(|r| r.to_string().contains(&report))
        .expect("the report was sent");
    let summaries: Vec<usize> = requests
        .iter()
        .enumerate()
        .skip(first_of_try_2)
        .filter(|(_, r)| r.get("tools").is_none())
        .map(|(i, _)| i)
        .collect();
    assert!(!summaries.is_empty(), "compacted in the second try too");
    for r in &requests[summaries[0] + 1..] {
        if r.get("tools").is_some() {
            assert!(
                r.to_string().contains(&report),
                "the failures verbatim: {r}"
            );
        }
    }
}

/// A summary that comes back empty is a failed compaction; three in a row stop the run
/// `context`, exit 3.
#[test]
fn empty_summaries_stop_the_run_with_context() {
    // The file's result (16 KB of it) passes the window, and is the newest: only a summary
    // could make room.
    let env = Env::new();
    env.write("f1.txt", &"y".repeat(20_000));
    let server = RawServer::start(Box::new(move |_, body| {
        let tokens = body.to_string().len() / 4;
        if tokens > WINDOW {
            return Wording::LlamaCpp.refusal(tokens);
        }
        if body.get("tools").is_none() {
            return answer(Protocol::OpenAi, tokens, None, "");
        }
        answer(Protocol::OpenAi, tokens, Some(1), "")
    }));
    let run = run_on(&env, &server.url, Protocol::OpenAi, &["--no-stream"]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "context");
    let error = run.result()["error"].as_str().unwrap();
    assert!(error.contains("the summary came back empty"), "{error}");
    let notices: Vec<&str> = run
        .of_type("notice")
        .iter()
        .filter_map(|e| e["text"].as_str())
        .filter(|t| t.contains("compaction"))
        .collect();
    assert_eq!(notices.len(), 3, "{notices:?}");
}

/// Ctrl-C while an answer streams: the text that arrived is in the transcript, marked
/// partial, with the usage the server reported so far; the trace says what is kept.
#[test]
fn ctrl_c_mid_stream_keeps_the_partial_text() {
    let env = Env::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let words = sent.clone();
    std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
            line.clear();
        }
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        );
        let start = json!({"type": "message_start", "message": {"usage": {"input_tokens": 321, "output_tokens": 0}}});
        let block = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
        for e in [start, block] {
            let piece = format!("data: {e}\n\n");
            let _ = write!(stream, "{:x}\r\n{piece}\r\n", piece.len());
        }
        for i in 0.. {
            let e = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("word{i} ")}});
            let piece = format!("data: {e}\n\n");
            if write!(stream, "{:x}\r\n{piece}\r\n", piece.len()).is_err() {
                return;
            }
            let _ = stream.flush();
            words.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let mut child = env
        .sup()
        .args(["run", "talk", "--model", "anthropic:claude-test"])
        .env("ANTHROPIC_BASE_URL", &url)
        .env("ANTHROPIC_API_KEY", "sk-ant-test")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn_killed();
    eventually(Duration::from_secs(30), "text to stream", || {
        let dir = env.run_dirs().pop()?;
        std::fs::read_to_string(dir.join("transcript.jsonl"))
            .ok()
            .filter(|t| t.contains("step_started"))?;
        Some(())
    });
    until("words to stream", 30, || {
        sent.load(std::sync::atomic::Ordering::SeqCst) >= 5
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let t = env.transcript();
    let partial = t
        .iter()
        .find(|e| e["type"] == "partial")
        .unwrap_or_else(|| panic!("no partial answer in {t:?}"));
    let text = partial["text"].as_str().unwrap();
    assert!(text.starts_with("word0 word1 "), "{text}");
    assert_eq!(partial["usage"]["input_tokens"], 321);
    assert_eq!(partial["why"], "cancelled");
    let result = t.iter().find(|e| e["type"] == "result").unwrap();
    assert_eq!(
        result["usage"]["input_tokens"], 321,
        "its usage is the run's"
    );
    assert_eq!(result["steps"], 1, "the step in flight counts");
    // The interrupt notice is a line of its own after the streamed text.
    assert!(
        stderr.lines().any(|l| l.starts_with("· interrupting")),
        "{stderr}"
    );
    assert!(
        stderr.contains("what arrived is kept in the transcript"),
        "{stderr}"
    );
}

/// An answer that never ends stops at the default output limit, which every Chat
/// Completions request carries (`max_tokens` for a compatible server).
#[test]
fn an_answer_that_never_ends_stops_at_the_default_max_tokens() {
    let env = Env::new();
    let server = RawServer::start(Box::new(move |_, body| {
        // A token a chunk, until the limit the request asks for (or far past any sane one).
        let limit = body["max_tokens"].as_u64().unwrap_or(100_000) as usize;
        let mut sse = String::new();
        for _ in 0..limit {
            sse.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n");
        }
        sse.push_str(
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
        );
        sse.push_str(&format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{limit}}}}}\n\ndata: [DONE]\n\n"
        ));
        format!("HTTP 200 OK\nContent-Type: text/event-stream\nTransfer-Encoding: chunked\n\n{sse}")
    }));
    let run = run_on(&env, &server.url, Protocol::OpenAi, &[]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "length");
    let sent = &server.requests()[0];
    assert_eq!(sent["max_tokens"], 8192, "{sent}");
    assert!(sent.get("max_completion_tokens").is_none());
    assert_eq!(run.result()["usage"]["output_tokens"], 8192);
    // And it is said in --print-config.
    let out = env
        .sup()
        .args(["run", "x", "--model", "openai:m", "--print-config"])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    let line = printed
        .lines()
        .find(|l| l.starts_with("max_tokens"))
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(line.contains("8192") && line.contains("default"), "{line}");
}

/// A retry warning names the status and the URL; the server's message is a sentence of its
/// own before sup's advice, though servers do not end theirs with a period.
#[test]
fn retry_warnings_name_status_and_url_and_server_words_are_a_sentence() {
    let env = Env::new();
    let server = RawServer::start(Box::new(|n, _| match n {
        0 => whole(
            503,
            &json!({"error": {"message": "Loading model", "code": 503}}),
        ),
        _ => whole(401, &json!({"error": {"message": "Invalid API Key"}})),
    }));
    let run = run_on(&env, &server.url, Protocol::OpenAi, &["--retries", "2"]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    let url = format!("{}/v1/chat/completions", server.url);
    let warning = run
        .stderr
        .lines()
        .find(|l| l.contains("attempt 1 of 2 failed"))
        .unwrap_or_else(|| panic!("{}", run.stderr));
    assert!(
        warning.contains("HTTP 503") && warning.contains(&url) && warning.contains("Loading model"),
        "{warning}"
    );
    let error = run.result()["error"].as_str().unwrap();
    assert!(
        error.contains("Invalid API Key. Check OPENAI_API_KEY"),
        "{error}"
    );
}

/// `kill -9` while the model is asked for the third step: both finished steps are in the
/// transcript, every line whole, their tool results given to the model too (a step's lines
/// are written in one batch, before each wait).
#[test]
fn a_run_killed_while_the_model_thinks_keeps_every_finished_step() {
    let env = Env::new();
    env.write("a.txt", "alpha\n");
    let script = env.script(json!([
        {"tool_calls": [{"id": "r1", "name": "read_file", "input": {"path": "a.txt"}}]},
        {"tool_calls": [{"id": "r2", "name": "list_files", "input": {}}]},
        {"delay_ms": 600_000, "text": "never"}
    ]));
    let mut child = env
        .sup()
        .args(["run", "read the file", "--model"])
        .arg(format!("script:{}", script.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn_killed();
    eventually(Duration::from_secs(30), "the third step to start", || {
        let dir = env.run_dirs().pop()?;
        let t = std::fs::read_to_string(dir.join("transcript.jsonl")).ok()?;
        t.contains(r#""step":3"#).then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    let t = env.transcript();
    let told = crate::common::tool_messages(&t);
    for (step, id) in [(1, "r1"), (2, "r2")] {
        assert!(
            t.iter()
                .any(|e| e["type"] == "tool_result" && e["id"] == id && e["step"] == step),
            "no result of {id}: {t:?}"
        );
        assert!(
            told.iter()
                .any(|m| m["results"][0]["call_id"] == id || m.to_string().contains(id)),
            "{id} not told to the model: {told:?}"
        );
    }
    assert!(
        t.iter()
            .any(|e| e["type"] == "step_started" && e["step"] == 3),
        "{t:?}"
    );
}

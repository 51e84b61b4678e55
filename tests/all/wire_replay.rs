//! Every exchange captured from a real llama.cpp `llama-server` (tests/fixtures/wire, a copy
//! of shared/wire) replayed to the binary by a test server that writes the captured answer to
//! the socket as it stands: status, headers and body bytes, a stream in its SSE events'
//! chunks. What `sup` keeps (transcript, usage, outcome) must equal what the server sent,
//! for both protocols, streamed and whole, the 11 parallel calls, and the 400 overflow.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::common::{Env, Run};

/// A capture of the server's answer: `HTTP STATUS REASON`, header lines, a blank line, the
/// body (a stream's body without its chunk framing).
pub(crate) fn capture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/wire/llama-server")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A whole JSON answer in the captures' form.
pub(crate) fn whole(status: u16, body: &Value) -> String {
    let body = body.to_string();
    format!(
        "HTTP {status} X\nContent-Type: application/json; charset=utf-8\nContent-Length: {}\n\n{body}",
        body.len()
    )
}

/// What the server answers a request with: the request's number (from 0) and its JSON body
/// give a capture-form answer.
pub(crate) type Answer = dyn Fn(usize, &Value) -> String + Send + Sync;

/// A real HTTP/1.1 server on 127.0.0.1 that answers each request with `answer`'s capture,
/// written raw: the status line and headers as captured (line ends made CRLF), the body
/// bytes unchanged; a chunked body is sent one SSE event per chunk. Connections are kept
/// alive unless the capture says `Connection: close`. Every request body is recorded.
pub(crate) struct RawServer {
    pub(crate) url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl RawServer {
    pub(crate) fn start(answer: Box<Answer>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let answer: Arc<Answer> = Arc::from(answer);
        let recorded = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (recorded, answer) = (recorded.clone(), answer.clone());
                std::thread::spawn(move || serve(stream, &recorded, &*answer));
            }
        });
        RawServer { url, requests }
    }

    pub(crate) fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, recorded: &Mutex<Vec<Value>>, answer: &Answer) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut len = 0;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let n = {
            let mut r = recorded.lock().unwrap();
            r.push(body.clone());
            r.len() - 1
        };
        let reply = answer(n, &body);
        match write_raw(&stream, &reply) {
            Ok(true) => {}
            _ => return,
        }
    }
}

/// Write a capture to the socket; whether the connection stays open.
fn write_raw(mut stream: &TcpStream, reply: &str) -> std::io::Result<bool> {
    let (head, body) = reply.split_once("\n\n").unwrap_or((reply, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or("HTTP 500 X");
    let status = status.strip_prefix("HTTP ").unwrap_or(status);
    let mut out = format!("HTTP/1.1 {status}\r\n");
    let mut chunked = false;
    let mut close = false;
    for l in lines {
        let lower = l.to_ascii_lowercase();
        chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
        close |= lower.starts_with("connection:") && lower.contains("close");
        out.push_str(l);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    stream.write_all(out.as_bytes())?;
    if chunked {
        // One chunk per event, as llama-server flushes them.
        let mut rest = body;
        while !rest.is_empty() {
            let end = rest.find("\n\n").map_or(rest.len(), |i| i + 2);
            let (piece, tail) = rest.split_at(end);
            write!(stream, "{:x}\r\n{piece}\r\n", piece.len())?;
            stream.flush()?;
            rest = tail;
        }
        stream.write_all(b"0\r\n\r\n")?;
    } else {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()?;
    Ok(!close)
}

/// What a captured answer says, read independently of `sup`: text, calls (id, name, raw
/// arguments), usage (input without cache, output, cache read), and its finish reason.
#[derive(Debug, Default, PartialEq)]
struct Said {
    text: String,
    calls: Vec<(String, String, String)>,
    usage: (u64, u64, u64),
    finish: Option<String>,
}

fn said(capture: &str) -> Said {
    let (_, body) = capture.split_once("\n\n").unwrap();
    let mut s = Said::default();
    let mut datas: Vec<Value> = Vec::new();
    if body.starts_with('{') {
        datas.push(serde_json::from_str(body).unwrap());
    } else {
        for line in body.lines() {
            if let Some(d) = line.strip_prefix("data: ")
                && d != "[DONE]"
            {
                datas.push(serde_json::from_str(d).unwrap());
            }
        }
    }
    let n = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let mut calls: Vec<(u64, String, String, String)> = Vec::new();
    let mut call = |i: u64, id: Option<&str>, name: Option<&str>, args: &str| {
        if !calls.iter().any(|c| c.0 == i) {
            calls.push((i, String::new(), String::new(), String::new()));
        }
        let c = calls.iter_mut().find(|c| c.0 == i).unwrap();
        if let Some(id) = id {
            c.1 = id.into();
        }
        if let Some(name) = name {
            c.2 = name.into();
        }
        c.3.push_str(args);
    };
    for v in &datas {
        if let Some(choices) = v["choices"].as_array() {
            for c in choices {
                let m = if c.get("delta").is_some() {
                    &c["delta"]
                } else {
                    &c["message"]
                };
                s.text.push_str(m["content"].as_str().unwrap_or(""));
                for (k, tc) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
                    let i = tc["index"].as_u64().unwrap_or(k as u64);
                    call(
                        i,
                        tc["id"].as_str(),
                        tc["function"]["name"].as_str(),
                        tc["function"]["arguments"].as_str().unwrap_or(""),
                    );
                }
                if let Some(f) = c["finish_reason"].as_str() {
                    s.finish = Some(f.into());
                }
            }
            if v["usage"].is_object() {
                let cached = n(v, "/usage/prompt_tokens_details/cached_tokens");
                s.usage = (
                    n(v, "/usage/prompt_tokens") - cached,
                    n(v, "/usage/completion_tokens"),
                    cached,
                );
            }
            continue;
        }
        match v["type"].as_str().unwrap_or("") {
            "message" => {
                for (i, b) in v["content"].as_array().unwrap().iter().enumerate() {
                    match b["type"].as_str() {
                        Some("text") => s.text.push_str(b["text"].as_str().unwrap()),
                        _ => call(
                            i as u64,
                            b["id"].as_str(),
                            b["name"].as_str(),
                            &b["input"].to_string(),
                        ),
                    }
                }
                s.finish = v["stop_reason"].as_str().map(Into::into);
                s.usage = (
                    n(v, "/usage/input_tokens"),
                    n(v, "/usage/output_tokens"),
                    n(v, "/usage/cache_read_input_tokens"),
                );
            }
            "message_start" => {
                s.usage.0 = n(v, "/message/usage/input_tokens");
                s.usage.2 = n(v, "/message/usage/cache_read_input_tokens");
            }
            "content_block_start" if v["content_block"]["type"] == "tool_use" => call(
                n(v, "/index"),
                v["content_block"]["id"].as_str(),
                v["content_block"]["name"].as_str(),
                "",
            ),
            "content_block_delta" => match v["delta"]["type"].as_str() {
                Some("text_delta") => s.text.push_str(v["delta"]["text"].as_str().unwrap()),
                _ => call(
                    n(v, "/index"),
                    None,
                    None,
                    v["delta"]["partial_json"].as_str().unwrap_or(""),
                ),
            },
            "message_delta" => {
                s.finish = v["delta"]["stop_reason"].as_str().map(Into::into);
                s.usage.1 = n(v, "/usage/output_tokens");
            }
            _ => {}
        }
    }
    s.calls = calls.into_iter().map(|c| (c.1, c.2, c.3)).collect();
    s
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Protocol {
    OpenAi,
    Anthropic,
}

/// `sup run` against `server` with `protocol`; `args` after the rest.
pub(crate) fn run_on(env: &Env, url: &str, protocol: Protocol, args: &[&str]) -> Run {
    let mut cmd = env.sup();
    cmd.args([
        "run",
        "Create a file hello.txt containing the word hi, then read it back.",
    ])
    .arg("--json");
    match protocol {
        Protocol::OpenAi => cmd
            .args(["--model", "openai:gemma"])
            .env("OPENAI_BASE_URL", format!("{url}/v1"))
            .env("OPENAI_API_KEY", "sk-replay"),
        Protocol::Anthropic => cmd
            .args(["--model", "anthropic:gemma"])
            .env("ANTHROPIC_BASE_URL", url)
            .env("ANTHROPIC_API_KEY", "sk-ant-replay"),
    };
    Run::new(cmd.args(args).output().unwrap())
}

/// An answer in the protocol's form that ends the run, streamed when `request` asks for a
/// stream.
pub(crate) fn done(protocol: Protocol, text: &str, request: &Value) -> String {
    if request["stream"] == true {
        let events = match protocol {
            Protocol::OpenAi => vec![
                json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]}),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2}}),
            ],
            Protocol::Anthropic => vec![
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 10, "output_tokens": 0}}}),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
                json!({"type": "message_stop"}),
            ],
        };
        let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        if protocol == Protocol::OpenAi {
            body.push_str("data: [DONE]\n\n");
        }
        return format!(
            "HTTP 200 OK\nContent-Type: text/event-stream\nTransfer-Encoding: chunked\n\n{body}"
        );
    }
    match protocol {
        Protocol::OpenAi => whole(
            200,
            &json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2}}),
        ),
        Protocol::Anthropic => whole(
            200,
            &json!({"id": "m", "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 10, "output_tokens": 2}}),
        ),
    }
}

/// Replay `name` as the first answer, then `done`; check the transcript against it.
fn replay(name: &str, protocol: Protocol, streamed: bool) -> (Env, Run, Said, RawServer) {
    let env = Env::new();
    env.write("notes.txt", "some notes\n");
    let first = capture(name);
    let server = RawServer::start(Box::new(move |n, request| {
        if n == 0 {
            first.clone()
        } else {
            done(protocol, "All done.", request)
        }
    }));
    let mut args = vec![];
    if !streamed {
        args.push("--no-stream");
    }
    let run = run_on(&env, &server.url, protocol, &args);
    let said = said(&capture(name));
    let sent = &server.requests()[0];
    assert_eq!(sent["stream"], streamed, "{sent}");
    (env, run, said, server)
}

/// The first step as the transcript has it: the assistant message and the step's usage.
fn first_step(env: &Env) -> (Value, Value) {
    let t = env.transcript();
    let message = t
        .iter()
        .find(|e| e["type"] == "message" && e["message"]["role"] == "assistant")
        .map(|e| e["message"].clone())
        .unwrap_or(Value::Null);
    let usage = t
        .iter()
        .find(|e| e["type"] == "step_finished")
        .map(|e| e["usage"].clone())
        .unwrap_or(Value::Null);
    (message, usage)
}

fn calls_of(message: &Value) -> Vec<(String, String, String)> {
    message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["name"].as_str().unwrap().to_string(),
                c["arguments"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn usage_is(usage: &Value, said: &Said) {
    assert_eq!(
        (
            usage["input_tokens"].as_u64().unwrap(),
            usage["output_tokens"].as_u64().unwrap(),
            usage["cache_read_tokens"].as_u64().unwrap(),
        ),
        said.usage,
        "{usage}"
    );
}

/// A text answer that ran into the output limit: the text whole, the usage, a `length` stop.
fn text_until_length(name: &str, protocol: Protocol, streamed: bool) {
    let (env, run, said, _server) = replay(name, protocol, streamed);
    assert!(!said.text.is_empty());
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "length");
    let (message, usage) = first_step(&env);
    assert_eq!(message["text"], said.text.as_str());
    usage_is(&usage, &said);
    assert_eq!(
        run.result()["usage"],
        usage,
        "one step: the run's usage is its own"
    );
    let texts: Vec<&str> = run
        .of_type("model_text")
        .iter()
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, [said.text.as_str()]);
}

#[test]
fn openai_streamed_text_is_kept_as_sent() {
    text_until_length("openai-stream-200-text.resp", Protocol::OpenAi, true);
}

#[test]
fn openai_whole_text_is_kept_as_sent() {
    text_until_length("openai-whole-200-text.resp", Protocol::OpenAi, false);
}

#[test]
fn anthropic_streamed_text_is_kept_as_sent() {
    text_until_length("anthropic-stream-200-text.resp", Protocol::Anthropic, true);
}

/// A tool call: run, its result sent back, then the run ends `final`.
fn one_call(name: &str, protocol: Protocol, streamed: bool) {
    let (env, run, said, server) = replay(name, protocol, streamed);
    assert_eq!(said.calls.len(), 1);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "final");
    let (message, usage) = first_step(&env);
    let mut calls = calls_of(&message);
    // The Messages protocol's input is JSON: compare it as JSON.
    for (c, s) in calls.iter_mut().zip(&said.calls) {
        let (a, b): (Value, Value) = (
            serde_json::from_str(&c.2).unwrap(),
            serde_json::from_str(&s.2).unwrap(),
        );
        assert_eq!(a, b);
        c.2 = s.2.clone();
    }
    assert_eq!(calls, said.calls);
    usage_is(&usage, &said);
    let total = &run.result()["usage"];
    assert_eq!(
        total["input_tokens"].as_u64().unwrap(),
        said.usage.0 + 10,
        "both steps counted: {total}"
    );
    let result = run.tool_result(&said.calls[0].0);
    assert!(
        result["content"].as_str().unwrap().contains("some notes"),
        "{result}"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let again = requests[1].to_string();
    assert!(
        again.contains(&said.calls[0].0),
        "the call id goes back: {again}"
    );
}

#[test]
fn openai_whole_tool_call_is_run_and_answered() {
    one_call("openai-whole-200-tools.resp", Protocol::OpenAi, false);
}

#[test]
fn anthropic_streamed_tool_call_is_run_and_answered() {
    one_call("anthropic-stream-200-tools.resp", Protocol::Anthropic, true);
}

#[test]
fn anthropic_whole_tool_call_is_run_and_answered() {
    one_call("anthropic-whole-200-tools.resp", Protocol::Anthropic, false);
}

/// Eleven calls in one streamed turn that ran out of output tokens: each kept with its id
/// and arguments as sent, none run (a `length` stop), the usage as reported.
#[test]
fn eleven_parallel_calls_are_kept_as_sent() {
    let (env, run, said, _server) = replay(
        "openai-stream-200-parallel-tools.resp",
        Protocol::OpenAi,
        true,
    );
    assert_eq!(said.calls.len(), 11);
    assert_eq!(said.finish.as_deref(), Some("length"));
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "length");
    let (message, usage) = first_step(&env);
    assert_eq!(calls_of(&message), said.calls);
    usage_is(&usage, &said);
    for (id, _, _) in &said.calls {
        let r = run.tool_result(id);
        assert!(r["content"].as_str().unwrap().contains("not run"), "{r}");
    }
    assert!(!env.ws.path().join("a.txt").exists(), "nothing was written");
}

/// A stream that ended after the first fragment of a call (the capture is cut there): the
/// run fails, and the fragment is in the transcript, marked partial.
#[test]
fn a_cut_stream_keeps_its_partial_call() {
    let (env, run, said, _server) = replay("openai-stream-200-tools.resp", Protocol::OpenAi, true);
    assert_eq!(said.finish, None, "the capture ends mid-answer");
    assert_eq!(run.code, 4, "{}", run.stderr);
    let error = run.result()["error"].as_str().unwrap();
    assert!(
        error.contains("ended before the answer was complete"),
        "{error}"
    );
    let t = env.transcript();
    let partial = t
        .iter()
        .find(|e| e["type"] == "partial")
        .unwrap_or_else(|| panic!("no partial in {t:?}"));
    assert_eq!(partial["tool_calls"][0]["id"], said.calls[0].0.as_str());
    assert_eq!(partial["tool_calls"][0]["name"], "read_file");
    assert_eq!(partial["tool_calls"][0]["arguments"], "{");
    assert!(
        !t.iter().any(|e| e["type"] == "tool_result"),
        "a partial call is never run"
    );
}

/// The 400 a request past the window gets, in the Chat Completions protocol: the window is
/// learned from `n_ctx`, the conversation compacted by a summary, and the run goes on; every
/// later request asks for no more output than the learned window leaves.
#[test]
fn openai_overflow_400_teaches_the_window_and_the_run_goes_on() {
    let env = Env::new();
    let overflow = capture("openai-stream-400-text.resp");
    let server = RawServer::start(Box::new(move |n, request| match n {
        0 => overflow.clone(),
        1 => done(
            Protocol::OpenAi,
            "Goal: hello.txt. Progress: none yet.",
            request,
        ),
        _ => done(Protocol::OpenAi, "Finished.", request),
    }));
    let run = run_on(&env, &server.url, Protocol::OpenAi, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(
        requests[1].get("tools").is_none(),
        "no tools for the summary"
    );
    let after = requests[2].to_string();
    assert!(after.contains("Create a file hello.txt containing the word hi"));
    assert!(after.contains("Progress: none yet."), "{after}");
    for r in &requests {
        let max = r["max_tokens"].as_u64().unwrap();
        assert!(max <= 8192, "{r}");
    }
    assert!(requests[2]["max_tokens"].as_u64().unwrap() < 8192);
    let compacted = run.of_type("compacted");
    assert_eq!(compacted.len(), 1, "{}", run.stdout);
    assert_eq!(compacted[0]["how"], "summary");
    // The summary request's usage is the run's too.
    assert_eq!(run.result()["usage"]["input_tokens"], 20);
}

/// The same 400 on every request, in the Messages protocol: three compactions fail, the run
/// stops `context` (exit 3), and the error names the window and the server's words.
#[test]
fn anthropic_overflow_400_everywhere_stops_with_context_naming_the_window() {
    let env = Env::new();
    let overflow = capture("anthropic-stream-400-text.resp");
    let server = RawServer::start(Box::new(move |_, _| overflow.clone()));
    let run = run_on(&env, &server.url, Protocol::Anthropic, &[]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "context");
    let error = run.result()["error"].as_str().unwrap();
    assert!(
        error.contains("context window of 8192 tokens")
            && error.contains("exceeds the available context size"),
        "{error}"
    );
    assert_eq!(
        server.requests().len(),
        4,
        "the request and three summaries"
    );
}

/// The 400 of a whole (unstreamed) request reads the same way.
#[test]
fn openai_whole_overflow_400_names_the_window() {
    let env = Env::new();
    let overflow = capture("openai-whole-400-text.resp");
    let server = RawServer::start(Box::new(move |_, _| overflow.clone()));
    let run = run_on(&env, &server.url, Protocol::OpenAi, &["--no-stream"]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    let error = run.result()["error"].as_str().unwrap();
    assert!(error.contains("of 8192 tokens"), "{error}");
    assert!(
        error.contains("request (21901 tokens) exceeds the available context size"),
        "{error}"
    );
}

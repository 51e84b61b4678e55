//! A real HTTP/1.1 server on 127.0.0.1 for tests: it plays scripted replies in order (whole
//! bodies, or chunked streams that may pause or drop the connection) and records every
//! request it receives. Helpers build replies in the real wire formats of Chat Completions
//! and Anthropic Messages, streamed and whole.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

#[derive(Clone, Debug)]
pub enum Body {
    Full(String),
    /// Chunked: each piece after its delay; `drop` closes the connection before the end;
    /// the last chunk (the body's end) after `end_delay` ms.
    Chunks {
        pieces: Vec<(u64, String)>,
        drop: bool,
        end_delay: u64,
    },
}

#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: Body::Full(body.to_string()),
        }
    }

    pub fn sse(events: Vec<String>) -> Self {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: Body::Chunks {
                pieces: events.into_iter().map(|e| (0, e)).collect(),
                drop: false,
                end_delay: 0,
            },
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// End the body (its last, empty chunk) only `ms` after the last piece, as a server that
    /// writes it apart from the events does.
    pub fn ending_after(mut self, ms: u64) -> Self {
        if let Body::Chunks { end_delay, .. } = &mut self.body {
            *end_delay = ms;
        }
        self
    }

    /// Cut the stream after `keep` pieces and drop the connection.
    pub fn dropped_after(mut self, keep: usize) -> Self {
        if let Body::Chunks { pieces, drop, .. } = &mut self.body {
            pieces.truncate(keep);
            *drop = true;
        }
        self
    }
}

#[derive(Clone, Debug)]
pub struct Recorded {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct FakeServer {
    pub url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    connections: Arc<AtomicUsize>,
}

/// What answers a request: the next scripted reply, or a function of the request's body.
enum Replies {
    Queue(Mutex<VecDeque<Reply>>),
    Routed(Box<dyn Fn(&Value) -> Reply + Send + Sync>),
}

impl FakeServer {
    pub fn start(replies: Vec<Reply>) -> Self {
        Self::serving(Replies::Queue(Mutex::new(VecDeque::from(replies))), false)
    }

    /// The same, keeping each connection open for the next request (`connection:
    /// keep-alive`), as a real server does.
    pub fn keep_alive(replies: Vec<Reply>) -> Self {
        Self::serving(Replies::Queue(Mutex::new(VecDeque::from(replies))), true)
    }

    /// A server that answers each request by what `route` makes of its JSON body (requests
    /// that come at once, from parallel attempts, are told apart by what they hold).
    pub fn routed(route: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Self {
        Self::serving(Replies::Routed(Box::new(route)), false)
    }

    fn serving(replies: Replies, keep_alive: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let queue = Arc::new(replies);
        let recorded = requests.clone();
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = connections.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                accepted.fetch_add(1, Ordering::SeqCst);
                let recorded = recorded.clone();
                let queue = queue.clone();
                std::thread::spawn(move || {
                    while serve(&stream, &recorded, &queue, keep_alive) && keep_alive {}
                });
            }
        });
        FakeServer {
            url,
            requests,
            connections,
        }
    }

    /// How many connections the server has accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

/// One HTTP/1.1 request as read off a connection.
pub struct Request {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Read one request (its line, headers and `content-length` body) from `stream`; `None` when
/// the connection closes first.
pub fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        path,
        headers,
        body,
    })
}

/// Answer one request on `stream`; whether it was answered whole (the connection can go on).
fn serve(
    stream: &TcpStream,
    recorded: &Mutex<Vec<Recorded>>,
    replies: &Replies,
    keep_alive: bool,
) -> bool {
    let Some(Request {
        path,
        headers,
        body,
    }) = read_request(stream)
    else {
        return false;
    };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    recorded.lock().unwrap().push(Recorded {
        path,
        headers,
        body: body.clone(),
    });
    let reply = match replies {
        Replies::Routed(route) => route(&body),
        Replies::Queue(queue) => queue.lock().unwrap().pop_front().unwrap_or_else(|| {
            Reply::json(
                500,
                json!({"error": {"message": "the fake server has no more replies"}}),
            )
        }),
    };
    let dropped = matches!(reply.body, Body::Chunks { drop: true, .. });
    respond(stream, reply, keep_alive).is_ok() && !dropped
}

fn respond(mut stream: &TcpStream, reply: Reply, keep_alive: bool) -> std::io::Result<()> {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let mut head = format!(
        "HTTP/1.1 {} Fake\r\nconnection: {connection}\r\n",
        reply.status
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match reply.body {
        Body::Full(text) => {
            head.push_str(&format!("content-length: {}\r\n\r\n", text.len()));
            stream.write_all(head.as_bytes())?;
            stream.write_all(text.as_bytes())?;
        }
        Body::Chunks {
            pieces,
            drop,
            end_delay,
        } => {
            head.push_str("transfer-encoding: chunked\r\n\r\n");
            stream.write_all(head.as_bytes())?;
            for (delay, piece) in pieces {
                std::thread::sleep(Duration::from_millis(delay));
                write!(stream, "{:x}\r\n{piece}\r\n", piece.len())?;
                stream.flush()?;
            }
            if drop {
                std::thread::sleep(Duration::from_millis(50));
                return stream.shutdown(std::net::Shutdown::Both);
            }
            std::thread::sleep(Duration::from_millis(end_delay));
            stream.write_all(b"0\r\n\r\n")?;
        }
    }
    stream.flush()
}

/// One model turn to serve.
#[derive(Clone, Debug, Default)]
pub struct Turn {
    pub text: String,
    /// (id, name, raw arguments)
    pub calls: Vec<(String, String, String)>,
    /// A finish/stop reason other than the natural one.
    pub finish: Option<String>,
}

impl Turn {
    pub fn text(text: &str) -> Self {
        Turn {
            text: text.into(),
            ..Turn::default()
        }
    }

    pub fn call(mut self, id: &str, name: &str, args: &str) -> Self {
        self.calls.push((id.into(), name.into(), args.into()));
        self
    }

    /// The scripted finish reason, else `stop` for a plain answer or `tools` for calls.
    fn finish_or(&self, stop: &str, tools: &str) -> String {
        self.finish
            .clone()
            .unwrap_or_else(|| if self.calls.is_empty() { stop } else { tools }.to_string())
    }

    pub fn finish(mut self, reason: &str) -> Self {
        self.finish = Some(reason.into());
        self
    }
}

fn pieces(s: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// How the Chat Completions stream numbers its tool calls.
#[derive(Clone, Copy, PartialEq)]
pub enum Indexing {
    /// OpenAI: each call its own index.
    Standard,
    /// Ollama: every call at index 0, told apart by its id.
    ReusedZero,
    /// No index at all.
    Missing,
}

/// A Chat Completions stream of `turn`, arguments split in 4-character deltas.
pub fn openai_stream(turn: &Turn, indexing: Indexing) -> Reply {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    for p in pieces(&turn.text, 5) {
        events.push(chunk(json!({"content": p}), Value::Null));
    }
    for (i, (id, name, args)) in turn.calls.iter().enumerate() {
        let with_index = |mut tc: Value| {
            match indexing {
                Indexing::Standard => tc["index"] = json!(i),
                Indexing::ReusedZero => tc["index"] = json!(0),
                Indexing::Missing => {}
            }
            tc
        };
        events.push(chunk(
            json!({"tool_calls": [with_index(json!({"id": id, "type": "function",
                "function": {"name": name, "arguments": ""}}))]}),
            Value::Null,
        ));
        for p in pieces(args, 4) {
            events.push(chunk(
                json!({"tool_calls": [with_index(json!({"function": {"arguments": p}}))]}),
                Value::Null,
            ));
        }
    }
    let finish = turn.finish_or("stop", "tool_calls");
    events.push(chunk(json!({}), json!(finish)));
    events.push(format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})
    ));
    events.push("data: [DONE]\n\n".into());
    Reply::sse(events)
}

/// A whole Chat Completions answer of `turn`.
pub fn openai_json(turn: &Turn) -> Reply {
    let mut message = json!({"role": "assistant", "content": if turn.text.is_empty() { Value::Null } else { json!(turn.text) }});
    if !turn.calls.is_empty() {
        message["tool_calls"] = turn
            .calls
            .iter()
            .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
            .collect();
    }
    let finish = turn.finish_or("stop", "tool_calls");
    Reply::json(
        200,
        json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "fake",
               "choices": [{"index": 0, "message": message, "finish_reason": finish}],
               "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}),
    )
}

fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// An Anthropic Messages stream of `turn`, input JSON split in 4-character deltas.
pub fn anthropic_events(turn: &Turn) -> Vec<String> {
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "content": [], "model": "fake", "stop_reason": null,
            "usage": {"input_tokens": 100, "cache_read_input_tokens": 50, "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
    )];
    let mut index = 0;
    if !turn.text.is_empty() {
        events.push(event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
        events.push(event("ping", json!({"type": "ping"})));
        for p in pieces(&turn.text, 5) {
            events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}})));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ));
        index = 1;
    }
    for (id, name, args) in &turn.calls {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        ));
        for p in pieces(args, 4) {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": p}}),
            ));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    let stop = turn.finish_or("end_turn", "tool_use");
    events.push(event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 10}})));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    events
}

pub fn anthropic_stream(turn: &Turn) -> Reply {
    Reply::sse(anthropic_events(turn))
}

/// A whole Anthropic Messages answer of `turn`.
pub fn anthropic_json(turn: &Turn) -> Reply {
    let mut content = Vec::new();
    if !turn.text.is_empty() {
        content.push(json!({"type": "text", "text": turn.text}));
    }
    for (id, name, args) in &turn.calls {
        let input: Value = serde_json::from_str(args).unwrap_or(json!({}));
        content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
    }
    let stop = turn.finish_or("end_turn", "tool_use");
    Reply::json(
        200,
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "fake", "content": content,
               "stop_reason": stop, "usage": {"input_tokens": 100, "output_tokens": 10}}),
    )
}

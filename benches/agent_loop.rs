//! The whole work loop as a user runs it: the `sup` binary against a loopback server that
//! streams one `read_file` call per step (2 KB results) and a final answer at the last step,
//! at 50, 200 and 400 steps, in both wire protocols (Chat Completions and Anthropic
//! Messages), streamed and as whole answers (`--no-stream`). For each run: the CPU of the whole `sup` process, its CPU per step early (steps
//! 10–20) and late (the last ten), its peak memory, and its CPU and time per step beyond a
//! bare client that replays the very same request bodies to the same server, and how much
//! of that is the client's own turn (from an answer sent to the next request begun). The
//! server does the same work for both clients in what is timed: it reads each body into
//! memory made ready before the run, and reads the client's CPU only where a window starts
//! or ends.
//! Run: `cargo bench --bench agent_loop`. `SUP_BENCH_ROUNDS` (default 3) runs of each; the
//! figures are their medians. `SUP_BENCH_BIN` measures another build of `sup`.
//! `SUP_BENCH_CALLGRIND=DIR` counts instructions instead (one run of each, under valgrind's
//! callgrind, its outputs kept in DIR): figures that hold on a loaded machine; the outputs
//! are what `build/hot-functions.py` reads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Clone, Copy, PartialEq)]
enum Protocol {
    OpenAi,
    Anthropic,
}

/// Sum of the on-CPU time (ns) of every thread of `pid`, from /proc/PID/task/*/schedstat.
fn cpu_ns(pid: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn status_kib(pid: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time of the waited-for children of this process, in seconds.
fn children_cpu() -> f64 {
    // getrusage, not /proc/self/stat's cutime: that counts in 10 ms ticks, a few per run.
    // SAFETY: `getrusage` only writes the `rusage` it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// An HTTP response streaming `events`, each `(event name, data)`.
fn sse(events: &[(&str, String)]) -> Vec<u8> {
    let body: String = events
        .iter()
        .map(|(name, data)| match *name {
            "" => format!("data: {data}\n\n"),
            name => format!("event: {name}\ndata: {data}\n\n"),
        })
        .collect();
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// An HTTP response holding one whole JSON answer.
fn whole(body: serde_json::Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A whole (not streamed) answer: a `read_file` call, or the final text.
fn whole_turn(protocol: Protocol, step: Option<usize>) -> Vec<u8> {
    let call = step.map(|k| {
        let path = if k.is_multiple_of(2) {
            "a.txt"
        } else {
            "b.txt"
        };
        (format!("call_{k}"), path)
    });
    match protocol {
        Protocol::OpenAi => {
            let message = match &call {
                Some((id, path)) => serde_json::json!({"role": "assistant", "content": null,
                    "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file",
                        "arguments": format!("{{\"path\":\"{path}\"}}")}}]}),
                None => serde_json::json!({"role": "assistant", "content": "done"}),
            };
            whole(
                serde_json::json!({"id": "c1", "object": "chat.completion", "model": "bench",
                "choices": [{"index": 0, "message": message,
                    "finish_reason": if call.is_some() { "tool_calls" } else { "stop" }}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
            )
        }
        Protocol::Anthropic => {
            let (content, stop) = match &call {
                Some((id, path)) => (
                    serde_json::json!([{"type": "tool_use", "id": id, "name": "read_file",
                        "input": {"path": path}}]),
                    "tool_use",
                ),
                None => (
                    serde_json::json!([{"type": "text", "text": "done"}]),
                    "end_turn",
                ),
            };
            whole(
                serde_json::json!({"id": "msg_1", "type": "message", "role": "assistant",
                "model": "bench", "content": content, "stop_reason": stop, "stop_sequence": null,
                "usage": {"input_tokens": 10, "output_tokens": 5}}),
            )
        }
    }
}

fn tool_turn(protocol: Protocol, step: usize) -> Vec<u8> {
    let path = if step.is_multiple_of(2) {
        "a.txt"
    } else {
        "b.txt"
    };
    let id = format!("call_{step}");
    let args = format!("{{\"path\":\"{path}\"}}");
    match protocol {
        Protocol::OpenAi => {
            let call = serde_json::json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null,
                "tool_calls": [{"index": 0, "id": id, "type": "function",
                    "function": {"name": "read_file", "arguments": args}}]}}]});
            sse(&[
                ("", call.to_string()),
                (
                    "",
                    r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.into(),
                ),
                (
                    "",
                    r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5}}"#.into(),
                ),
                ("", "[DONE]".into()),
            ])
        }
        Protocol::Anthropic => {
            let start = serde_json::json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": id, "name": "read_file", "input": {}}});
            let delta = serde_json::json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": args}});
            sse(&[
                ("message_start", MESSAGE_START.into()),
                ("content_block_start", start.to_string()),
                ("content_block_delta", delta.to_string()),
                ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.into()),
                ("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":5}}"#.into()),
                ("message_stop", r#"{"type":"message_stop"}"#.into()),
            ])
        }
    }
}

const MESSAGE_START: &str = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"bench","stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1}}}"#;

fn final_turn(protocol: Protocol) -> Vec<u8> {
    match protocol {
        Protocol::OpenAi => sse(&[
            ("", r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"done"}}]}"#.into()),
            ("", r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.into()),
            ("", r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5}}"#.into()),
            ("", "[DONE]".into()),
        ]),
        Protocol::Anthropic => sse(&[
            ("message_start", MESSAGE_START.into()),
            ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.into()),
            ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"done"}}"#.into()),
            ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.into()),
            ("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":5}}"#.into()),
            ("message_stop", r#"{"type":"message_stop"}"#.into()),
        ]),
    }
}

/// What the server saw of one client.
#[derive(Default)]
struct Seen {
    /// When each request had fully arrived.
    arrived: Vec<Instant>,
    /// When each request's first line arrived.
    began: Vec<Instant>,
    /// When each answer had been written.
    replied: Vec<Instant>,
    /// The client's CPU (ns) when each request had arrived (only for the `sup` client).
    cpu: Vec<u64>,
    /// Bodies of the requests inside the windows, by request number (from 1).
    bodies: Vec<(usize, Vec<u8>)>,
    /// Window bodies larger than the buffer made ready for them (read into fresh memory).
    outgrew: usize,
    peak_kib: u64,
}

struct Server {
    url: String,
    seen: Arc<Mutex<Seen>>,
}

/// A keep-alive HTTP/1.1 server: request `k` of `steps` gets a tool call, the last the final
/// answer. `pid` (set once the client is spawned) is whose CPU to sample.
fn serve(
    protocol: Protocol,
    steps: usize,
    windows: Vec<(usize, usize)>,
    pid: Arc<Mutex<Option<String>>>,
) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    // A buffer for each request inside the windows, its pages touched before the client
    // starts: room for about 3 KB a step, what a step adds to the conversation (a larger
    // body grows its buffer). Popped smallest first.
    let mut spare: Vec<Vec<u8>> = windows
        .iter()
        .flat_map(|&(a, b)| a..=b)
        .map(|k| vec![1u8; k * 3072 + 65536])
        .collect();
    spare.sort_by_key(|b| std::cmp::Reverse(b.len()));
    // Shared by the connections: sup may open a second one while its first goes back to
    // its pool.
    let spare = Arc::new(Mutex::new(spare));
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(socket) = socket else { return };
            let seen = s.clone();
            let windows = windows.clone();
            let pid = pid.clone();
            let spare = spare.clone();
            std::thread::spawn(move || {
                connection(protocol, socket, steps, (&windows, &spare), &pid, &seen)
            });
        }
    });
    Server { url, seen }
}

/// Buffers made ready for the requests inside the windows, smallest last.
type Spare = Mutex<Vec<Vec<u8>>>;

fn connection(
    protocol: Protocol,
    socket: TcpStream,
    steps: usize,
    (windows, spare): (&[(usize, usize)], &Spare),
    pid: &Mutex<Option<String>>,
    seen: &Mutex<Seen>,
) {
    socket.set_nodelay(true).unwrap();
    let mut write = socket.try_clone().unwrap();
    let mut reader = BufReader::with_capacity(1 << 16, socket);
    let mut line = String::new();
    let mut reused = Vec::new();
    loop {
        let mut len = 0usize;
        let mut began = None;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if began.is_none() {
                began = Some(Instant::now());
            }
            let l = line.trim_end().to_ascii_lowercase();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let k = seen.lock().unwrap().arrived.len() + 1;
        let kept = windows.iter().any(|&(a, b)| (a..=b).contains(&k));
        // A request outside the windows is read into the one reused buffer, one inside into
        // a buffer of its own made ready before the run: memory fresh at each request would
        // be the server's page faults, counted as the client's time.
        let mut body = if kept {
            spare.lock().unwrap().pop().unwrap_or_default()
        } else {
            std::mem::take(&mut reused)
        };
        let outgrew = len > body.capacity();
        body.clear();
        body.resize(len, 0);
        reader.read_exact(&mut body).unwrap();
        // The client's CPU only where a window starts or ends, and outside the window's
        // time: reading it is the server's time, and would count as the client's too. At
        // a start it is read before the arrival is stamped (the client, its body sent,
        // waits), at an end after.
        let sample = || pid.lock().unwrap().as_deref().map(cpu_ns).unwrap_or(0);
        let starts = windows.iter().any(|&(a, _)| k == a);
        let ends = windows.iter().any(|&(_, b)| k == b);
        let early_cpu = starts.then(sample);
        let now = Instant::now();
        let cpu = early_cpu.or_else(|| ends.then(sample)).unwrap_or(0);
        // Whole answers to a request that asks for no stream.
        let streamed = !body.windows(14).any(|w| w == b"\"stream\":false");
        {
            let mut seen = seen.lock().unwrap();
            seen.arrived.push(now);
            seen.began.push(began.unwrap_or(now));
            seen.cpu.push(cpu);
            if k == steps
                && let Some(p) = pid.lock().unwrap().as_deref()
            {
                seen.peak_kib = status_kib(p, "VmHWM:");
            }
            if kept {
                seen.outgrew += usize::from(outgrew);
                seen.bodies.push((k, body));
            } else {
                reused = body;
            }
        }
        let reply = match (streamed, k >= steps) {
            (true, true) => final_turn(protocol),
            (true, false) => tool_turn(protocol, k),
            (false, done) => whole_turn(protocol, (!done).then_some(k)),
        };
        if write.write_all(&reply).is_err() {
            return;
        }
        seen.lock().unwrap().replied.push(Instant::now());
    }
}

struct Figures {
    cpu_total: f64,
    cpu_early_us: f64,
    cpu_late_us: f64,
    wall_early_us: f64,
    wall_late_us: f64,
    /// The client's own turn per step (`turn`), late.
    turn_late_us: f64,
    bare_turn_late_us: f64,
    bare_early_us: f64,
    bare_late_us: f64,
    bare_cpu_early_us: f64,
    bare_cpu_late_us: f64,
    peak_mb: f64,
    late_body_kb: f64,
}

/// The client's own turn per request, in µs: from an answer written to the first line of
/// the next request, mean over the requests `a+1..=b` (the rest of a step is the server's:
/// reading the body, answering).
fn turn(seen: &Seen, (a, b): (usize, usize)) -> f64 {
    let b = b.min(seen.replied.len() + 1);
    let total: f64 = (a + 1..=b)
        .map(|k| (seen.began[k - 1] - seen.replied[k - 2]).as_secs_f64() * 1e6)
        .sum();
    total / (b - a) as f64
}

fn mean_interval(arrived: &[Instant], (a, b): (usize, usize)) -> f64 {
    // Requests are numbered from 1: the interval before request k is arrived[k-1] - arrived[k-2].
    (arrived[b - 1] - arrived[a - 1]).as_secs_f64() * 1e6 / (b - a) as f64
}

/// Replay `bodies` back to back to a fresh server with a bare reqwest client on this thread: wall time per
/// request between arrivals at the server, and this thread's CPU per request.
fn bare(protocol: Protocol, bodies: &[Vec<u8>]) -> (f64, f64, f64) {
    let seen_pid: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let server = serve(protocol, usize::MAX, Vec::new(), seen_pid);
    let endpoint = format!("{}/v1/chat/completions", server.url);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bodies: Vec<bytes::Bytes> = bodies.iter().map(|b| b.clone().into()).collect();
    let thread_cpu = || -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    rt.block_on(async {
        let client = reqwest::Client::new();
        // A warm connection, as sup has one; with the largest body, so that the server's
        // reused buffer has room for every one after it.
        let warm = client
            .post(&endpoint)
            .header("content-type", "application/json")
            .body(bodies[bodies.len() - 1].clone())
            .send()
            .await
            .unwrap();
        let _ = warm.bytes().await.unwrap();
        let cpu0 = thread_cpu();
        for b in &bodies {
            let r = client
                .post(&endpoint)
                .header("content-type", "application/json")
                .body(b.clone())
                .send()
                .await
                .unwrap();
            let _ = r.bytes().await.unwrap();
        }
        let cpu = (thread_cpu() - cpu0) as f64 / 1e3 / bodies.len() as f64;
        let arrived = server.seen.lock().unwrap().arrived.clone();
        // Request 1 is the warm one and 2 the window's first body: from 2 on are the
        // intervals the window of sup's run has (the requests after its first).
        let turn = turn(&server.seen.lock().unwrap(), (2, arrived.len()));
        let wall = mean_interval(&arrived, (2, arrived.len()));
        (wall, cpu, turn)
    })
}

/// The workspace of a run: the two 2 KB files the steps read.
fn workspace(ws: &std::path::Path) {
    let page: String = (0..40)
        .map(|i| format!("line {i:02} of a two-kilobyte file: lorem ipsum dolor sit amet.\n"))
        .collect();
    assert!(page.len() >= 2000);
    std::fs::write(ws.join("a.txt"), &page).unwrap();
    std::fs::write(ws.join("b.txt"), page.replace("lorem", "LOREM")).unwrap();
}

/// `sup run` of `steps` steps against the server at `url`; under `callgrind` (its output
/// file) when given.
fn sup(
    protocol: Protocol,
    steps: usize,
    streamed: bool,
    url: &str,
    (home, ws): (&std::path::Path, &std::path::Path),
    callgrind: Option<&std::path::Path>,
) -> Command {
    // SUP_BENCH_BIN: another build of sup to measure (e.g. the one before a change).
    let bin = std::env::var("SUP_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sup").into());
    let mut cmd = match callgrind {
        Some(out) => {
            let mut c = Command::new("valgrind");
            // Instruction addresses too: build/hot-functions.py reads them.
            c.args(["--tool=callgrind", "--quiet", "--dump-instr=yes"])
                .arg(format!("--callgrind-out-file={}", out.display()))
                .arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(["run", "read the files", "--max-steps"])
        .arg(steps.to_string());
    if !streamed {
        cmd.arg("--no-stream");
    }
    match protocol {
        Protocol::OpenAi => cmd
            .args(["--model", "openai:bench"])
            .env("OPENAI_BASE_URL", format!("{url}/v1")),
        Protocol::Anthropic => cmd
            .args(["--model", "anthropic:bench"])
            .env("ANTHROPIC_BASE_URL", url)
            .env("ANTHROPIC_API_KEY", "sk-ant-bench-key"),
    };
    cmd.env("SUP_HOME", home)
        .env("SUP_CONFIG", home.join("no-config.toml"))
        .env_remove("SUP_MODEL")
        .env_remove("RUST_LOG")
        .current_dir(ws)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// The instructions of a whole `sup run` of `steps` steps, counted by callgrind; its output
/// is kept in `dir` (for `callgrind_annotate`).
fn instructions(protocol: Protocol, steps: usize, streamed: bool, dir: &std::path::Path) -> u64 {
    let pid: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let server = serve(protocol, steps, Vec::new(), pid);
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    workspace(ws.path());
    let name = match protocol {
        Protocol::OpenAi => "openai",
        Protocol::Anthropic => "anthropic",
    };
    let how = if streamed { "streamed" } else { "whole" };
    let out = dir.join(format!("callgrind.{name}.{how}.{steps}"));
    let status = sup(
        protocol,
        steps,
        streamed,
        &server.url,
        (home.path(), ws.path()),
        Some(&out),
    )
    .status()
    .expect("valgrind (apt-get install -y valgrind)");
    assert!(status.success(), "sup run under callgrind failed: {status}");
    assert_eq!(server.seen.lock().unwrap().arrived.len(), steps);
    // The file's `summary:` line holds the instructions of every thread.
    std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("summary:")?.trim().parse().ok())
        .expect("a summary line in callgrind's output")
}

/// `SUP_BENCH_CALLGRIND=DIR`: instructions instead of time, repeatable on a loaded machine:
/// a whole run's, and one more step's (the longest run less the shortest, over the steps
/// between).
fn grind(dir: &std::path::Path, counts: &[usize], protocols: &[(Protocol, &str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    println!(
        "the work loop under callgrind: instructions of `sup run`, one read_file call per step; \
         outputs in {}",
        dir.display()
    );
    for &(protocol, _, title) in protocols {
        for (streamed, how) in [(true, "streamed"), (false, "whole answers")] {
            println!("{title}, {how}:");
            let all: Vec<(usize, u64)> = counts
                .iter()
                .map(|&n| (n, instructions(protocol, n, streamed, dir)))
                .collect();
            for (n, i) in &all {
                println!("  {n} steps: {:.1} M instructions", *i as f64 / 1e6);
            }
            if let (Some((a, ia)), Some((b, ib))) = (all.first(), all.last())
                && b > a
            {
                println!(
                    "  instructions per step, steps {a}–{b}: {:.0} k",
                    (ib - ia) as f64 / (b - a) as f64 / 1e3
                );
            }
        }
    }
}

fn run(protocol: Protocol, steps: usize, streamed: bool) -> Figures {
    let early = (10, 20);
    let late = (steps - 10, steps);
    let pid: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let server = serve(protocol, steps, vec![early, late], pid.clone());
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    workspace(ws.path());
    let mut child = sup(
        protocol,
        steps,
        streamed,
        &server.url,
        (home.path(), ws.path()),
        None,
    )
    .spawn()
    .unwrap();
    *pid.lock().unwrap() = Some(child.id().to_string());
    let cpu_before = children_cpu();
    let status = child.wait().unwrap();
    assert!(status.success(), "sup run failed: {status}");
    let cpu_total = children_cpu() - cpu_before;
    let seen = std::mem::take(&mut *server.seen.lock().unwrap());
    assert_eq!(seen.arrived.len(), steps, "one request per step");
    if seen.outgrew > 0 {
        eprintln!(
            "note: {} window bodies outgrew the buffers made ready for them: their page faults \
             count as sup's time",
            seen.outgrew
        );
    }
    let per_step_cpu =
        |(a, b): (usize, usize)| (seen.cpu[b - 1] - seen.cpu[a - 1]) as f64 / 1e3 / (b - a) as f64;
    let bodies = |(a, b): (usize, usize)| -> Vec<Vec<u8>> {
        seen.bodies
            .iter()
            .filter(|(k, _)| (a..=b).contains(k))
            .map(|(_, body)| body.clone())
            .collect()
    };
    let late_bodies = bodies(late);
    let (bare_early_us, bare_cpu_early_us, _) = bare(protocol, &bodies(early));
    let (bare_late_us, bare_cpu_late_us, bare_turn_late_us) = bare(protocol, &late_bodies);
    Figures {
        cpu_total,
        cpu_early_us: per_step_cpu(early),
        cpu_late_us: per_step_cpu(late),
        wall_early_us: mean_interval(&seen.arrived, early),
        wall_late_us: mean_interval(&seen.arrived, late),
        turn_late_us: turn(&seen, late),
        bare_turn_late_us,
        bare_early_us,
        bare_late_us,
        bare_cpu_early_us,
        bare_cpu_late_us,
        peak_mb: seen.peak_kib as f64 / 1024.0,
        late_body_kb: late_bodies.last().map_or(0, Vec::len) as f64 / 1024.0,
    }
}

fn main() {
    // reqwest is built without a default TLS provider; `sup` installs ring, and so does the
    // bare client here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let rounds: usize = var("SUP_BENCH_ROUNDS").parse().unwrap_or(3);
    // SUP_BENCH_STEPS=50,400 and SUP_BENCH_PROTOCOLS=anthropic narrow the runs.
    let mut counts: Vec<usize> = var("SUP_BENCH_STEPS")
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .filter(|&n| n > 20)
        .collect();
    if counts.is_empty() {
        counts = vec![50, 200, 400];
    }
    let only = var("SUP_BENCH_PROTOCOLS");
    let protocols: Vec<(Protocol, &str, &str)> = [
        (Protocol::OpenAi, "openai", "Chat Completions"),
        (Protocol::Anthropic, "anthropic", "Anthropic Messages"),
    ]
    .into_iter()
    .filter(|(_, name, _)| only.is_empty() || only.contains(name))
    .collect();
    let callgrind = var("SUP_BENCH_CALLGRIND");
    if !callgrind.is_empty() {
        grind(std::path::Path::new(&callgrind), &counts, &protocols);
        return;
    }
    println!(
        "the work loop: `sup run` against a loopback server, one read_file call (2 KB result) \
         per step; medians of {rounds} runs"
    );
    for (protocol, _, title) in protocols {
        for (streamed, how) in [(true, "streamed"), (false, "whole answers")] {
            println!("{title}, {how}:");
            for &steps in &counts {
                report(
                    steps,
                    &(0..rounds)
                        .map(|_| run(protocol, steps, streamed))
                        .collect::<Vec<_>>(),
                );
            }
        }
    }
}

fn report(steps: usize, all: &[Figures]) {
    let median = |f: &dyn Fn(&Figures) -> f64| {
        let mut v: Vec<f64> = all.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let target = |at: usize, what: &str| {
        if steps == at {
            format!("   (target: {what})")
        } else {
            String::new()
        }
    };
    let late = format!("{}–{}", steps - 10, steps);
    println!(
        "  {steps} steps (last request body {:.0} KB):",
        median(&|f| f.late_body_kb)
    );
    println!(
        "    CPU of the whole run                         {:>8.3} s{}",
        median(&|f| f.cpu_total),
        target(400, "at most 0.2 s")
    );
    println!(
        "    CPU per step, steps 10–20                    {:>8.0} µs",
        median(&|f| f.cpu_early_us)
    );
    println!(
        "    CPU per step, steps {late:<24} {:>8.0} µs",
        median(&|f| f.cpu_late_us)
    );
    println!(
        "    bare client CPU per request, early / late    {:>8.0} / {:.0} µs",
        median(&|f| f.bare_cpu_early_us),
        median(&|f| f.bare_cpu_late_us)
    );
    println!(
        "    CPU per step beyond the bare client, early   {:>8.0} µs",
        median(&|f| f.cpu_early_us - f.bare_cpu_early_us)
    );
    println!(
        "    CPU per step beyond the bare client, late    {:>8.0} µs",
        median(&|f| f.cpu_late_us - f.bare_cpu_late_us)
    );
    println!(
        "    late / early CPU per step beyond the bare client {:>5.2}×{}",
        median(&|f| {
            (f.cpu_late_us - f.bare_cpu_late_us) / (f.cpu_early_us - f.bare_cpu_early_us)
        }),
        target(400, "at most 1.5×")
    );
    println!(
        "    time per step beyond the bare client, 10–20  {:>8.0} µs  ({:.0} − {:.0}; target: \
         at most 500 µs)",
        median(&|f| f.wall_early_us - f.bare_early_us),
        median(&|f| f.wall_early_us),
        median(&|f| f.bare_early_us)
    );
    println!(
        "    time per step beyond the bare client, {late:<7}{:>7.0} µs  ({:.0} − {:.0}; target: \
         at most 500 µs)",
        median(&|f| f.wall_late_us - f.bare_late_us),
        median(&|f| f.wall_late_us),
        median(&|f| f.bare_late_us)
    );
    println!(
        "      of it the client's own turn (answer out → next request in) {:>4.0} µs  ({:.0} − {:.0})",
        median(&|f| f.turn_late_us - f.bare_turn_late_us),
        median(&|f| f.turn_late_us),
        median(&|f| f.bare_turn_late_us)
    );
    println!(
        "    peak memory of sup                           {:>8.1} MB{}",
        median(&|f| f.peak_mb),
        target(200, "at most 20 MB")
    );
}

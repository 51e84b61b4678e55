//! Many runs in one daemon (issue 30): 50 goals due in the same second, each a 20-step run
//! (one `read_file` call per step, whole answers) against a loopback server, in one
//! `sup daemon --max-concurrent 50`. Prints the daemon's peak memory and its CPU per step,
//! beside those of one `sup run` of the same 20 steps against the same server.
//! Run: `cargo bench --bench daemon` (`SUP_BENCH_GOALS=N` for another number of goals).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const STEPS: usize = 20;
/// The daemon's peak memory at most, in MB.
const TARGET_MB: f64 = 80.0;

/// A keep-alive HTTP/1.1 Chat Completions server: a request whose conversation holds fewer
/// than `STEPS - 1` tool results gets a `read_file` call, the others the final answer.
/// Counts the final answers it gave.
fn serve(finals: Arc<AtomicUsize>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(socket) = socket else { return };
            let finals = finals.clone();
            std::thread::spawn(move || connection(socket, &finals));
        }
    });
    url
}

fn connection(socket: TcpStream, finals: &AtomicUsize) {
    socket.set_nodelay(true).unwrap();
    let mut write = socket.try_clone().unwrap();
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    loop {
        let mut len = 0usize;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end().to_ascii_lowercase();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let done = body
            .windows(13)
            .filter(|w| w == b"\"role\":\"tool\"")
            .count();
        let message = if done + 1 >= STEPS {
            finals.fetch_add(1, Ordering::SeqCst);
            serde_json::json!({"role": "assistant", "content": "done"})
        } else {
            let path = if done % 2 == 0 { "a.txt" } else { "b.txt" };
            serde_json::json!({"role": "assistant", "content": null,
                "tool_calls": [{"id": format!("call_{done}"), "type": "function",
                    "function": {"name": "read_file",
                        "arguments": format!("{{\"path\":\"{path}\"}}")}}]})
        };
        let reply = serde_json::json!({"id": "c1", "object": "chat.completion", "model": "bench",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
        .to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            reply.len()
        );
        if write
            .write_all(format!("{head}{reply}").as_bytes())
            .is_err()
        {
            return;
        }
    }
}

/// A workspace with the two files the model reads.
fn workspace(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let page: String = (0..40)
        .map(|i| format!("line {i:02} of a two-kilobyte file: lorem ipsum dolor sit amet.\n"))
        .collect();
    std::fs::write(dir.join("a.txt"), &page).unwrap();
    std::fs::write(dir.join("b.txt"), page.replace("lorem", "LOREM")).unwrap();
}

/// CPU time of the waited-for children of this process (user + system), in seconds, to the
/// microsecond: `/proc/self/stat`'s `cutime` counts in 10 ms ticks, as much as a whole
/// 20-step run costs.
fn children_cpu() -> f64 {
    // SAFETY: `getrusage` only writes the `rusage` it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn sup(home: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sup"));
    cmd.env("SUP_HOME", home)
        .env("SUP_APPROVAL", "auto")
        .env("SUP_CONFIG", home.join("no-config.toml"))
        .env("OPENAI_API_KEY", "sk-bench")
        .env_remove("SUP_MODEL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// One `sup run` of `STEPS` steps: its CPU per step (s) and peak memory (MB).
fn one_run(url: &str) -> (f64, f64) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    workspace(&ws);
    let before = children_cpu();
    let mut child = sup(&tmp.path().join("home"))
        .args([
            "run",
            "read the files",
            "--no-stream",
            "--model",
            "openai:bench",
        ])
        .args(["--base-url", url, "--max-steps"])
        .arg(STEPS.to_string())
        .current_dir(&ws)
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak = 0;
    loop {
        peak = peak.max(peak_kib(pid));
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (
        (children_cpu() - before) / STEPS as f64,
        peak as f64 / 1024.0,
    )
}

fn main() {
    let goals: usize = std::env::var("SUP_BENCH_GOALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    let finals = Arc::new(AtomicUsize::new(0));
    let url = serve(finals.clone());
    let mut single: Vec<(f64, f64)> = (0..5).map(|_| one_run(&url)).collect();
    single.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (run_cpu, run_mb) = single[2];
    finals.store(0, Ordering::SeqCst);

    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let dir = tmp.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    // Due together, a few seconds from now: once a day at that second.
    let at = chrono::Utc::now() + chrono::Duration::seconds(4);
    let cron = at.format("%S %M %H * * *").to_string();
    for g in 0..goals {
        workspace(&dir.join(format!("work-{g}")));
        std::fs::write(
            dir.join(format!("g{g}.toml")),
            format!(
                "prompt = \"read the files\"\nmodel = \"openai:bench\"\nbase_url = \"{url}\"\n\
                 no_stream = true\nworkspace = \"work-{g}\"\nmax_steps = {STEPS}\ntries = 1\n\
                 schedule = \"{cron}\"\ntimezone = \"UTC\"\n"
            ),
        )
        .unwrap();
    }
    let before = children_cpu();
    let mut daemon = sup(&home)
        .args(["daemon", "--max-concurrent"])
        .arg(goals.to_string())
        .arg("--goals")
        .arg(&dir)
        .current_dir(tmp.path())
        .spawn()
        .unwrap();
    let pid = daemon.id();
    let started = Instant::now();
    let mut peak = 0;
    // Every run's final answer, then their ends recorded (no run left in the store's
    // `running`): the daemon's runs each hold one of its threads' tasks until then.
    let deadline = Duration::from_secs(300);
    while finals.load(Ordering::SeqCst) < goals && started.elapsed() < deadline {
        peak = peak.max(peak_kib(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    let db = home.join("sup.db");
    while started.elapsed() < deadline {
        peak = peak.max(peak_kib(pid));
        let running = Command::new("sqlite3")
            .arg(&db)
            .arg("SELECT count(*) FROM runs WHERE status = 'running'")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        match running.as_deref() {
            Some("0") => break,
            // No sqlite3 here: a moment for the last ends to be written.
            None | Some("") => {
                std::thread::sleep(Duration::from_millis(500));
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    peak = peak.max(peak_kib(pid));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    daemon.wait().unwrap();
    let cpu = children_cpu() - before;
    let done = finals.load(Ordering::SeqCst);
    let per_step = cpu / (goals * STEPS) as f64;
    println!(
        "one daemon, {goals} goals due in the same second, {STEPS} steps each (whole answers, \
         one read_file per step, loopback server; the machine may be loaded by other work):"
    );
    println!("  runs that gave their final answer   {done:>8} of {goals}");
    println!(
        "  daemon peak memory                  {:>8.1} MB   (target: at most {TARGET_MB} MB)",
        peak as f64 / 1024.0
    );
    println!(
        "  daemon CPU, whole                   {cpu:>8.2} s    ({:.1} s from start to stop)",
        started.elapsed().as_secs_f64()
    );
    println!(
        "  daemon CPU per step                 {:>8.0} µs   (target: at most one `sup run`'s)",
        per_step * 1e6
    );
    println!(
        "  one `sup run` of {STEPS} steps: CPU per step {:.0} µs (start-up included), peak \
         memory {run_mb:.1} MB (median of 5)",
        run_cpu * 1e6
    );
}

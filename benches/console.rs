//! The web console's figures, each beside its target (issue 14): the runs page with 10,000
//! runs in the store answers in under 100 ms, and a live transcript shows an event within
//! 200 ms of its being written (the time from appending the event to the transcript until
//! the page's event stream delivers it). Runs `sup serve` on 127.0.0.1 as a child process.
//! Run: `cargo bench --bench console`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sup::store::db::Db;

/// `sup serve` as a child, killed when dropped.
struct Console {
    child: Child,
    addr: String,
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(home: &std::path::Path) -> Console {
    let goals = home.join("goals");
    std::fs::create_dir_all(&goals).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sup"))
        .args(["serve", "--listen", "127.0.0.1:0", "--goals"])
        .arg(&goals)
        .env("SUP_HOME", home)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("sup serve did not start").unwrap();
        if let Some(a) = line.split("listening on http://").nth(1) {
            break a.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Console { child, addr }
}

/// GET `path`; the status.
fn get(addr: &str, path: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw)
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn fill(db: &Db, n: usize) {
    let statuses = ["achieved", "failed", "unfinished", "error"];
    db.conn().execute_batch("BEGIN").unwrap();
    for i in 0..n {
        let id = format!("20260101-{i:06}-aaaaaaaa");
        let started = format!(
            "2026-01-01T{:02}:{:02}:{:02}Z",
            i / 3600 % 24,
            i / 60 % 60,
            i % 60
        );
        db.conn()
            .execute(
                "INSERT INTO runs (id, goal, trigger, status, stop_reason, tries, steps,
                     input_tokens, output_tokens, started_at, ended_at, pid, model, workspace, dir)
                 VALUES (?1, ?2, 'schedule', ?3, 'final', 1, 3, 1200, 300, ?4, ?4, 1, 'script:x',
                     '/w', ?5)",
                (
                    &id,
                    format!("g{}", i % 20),
                    statuses[i % 4],
                    &started,
                    format!("/runs/{id}"),
                ),
            )
            .unwrap();
    }
    db.conn().execute_batch("COMMIT").unwrap();
}

fn runs_page(addr: &str) {
    println!("runs page with 10,000 runs in the store (30 requests each; target: under 100 ms):");
    for (what, path) in [
        ("/static/style.css (HTTP alone)", "/static/style.css"),
        ("/runs (page 1 of 200)", "/runs"),
        ("/runs?page=150", "/runs?page=150"),
        ("/runs?goal=g7&status=failed", "/runs?goal=g7&status=failed"),
    ] {
        let times: Vec<Duration> = (0..30)
            .map(|_| {
                let t = Instant::now();
                assert_eq!(get(addr, path), 200, "{path}");
                t.elapsed()
            })
            .collect();
        let worst = *times.iter().max().unwrap();
        println!(
            "  {what:<32} median {:>6.1} ms, worst {:>6.1} ms",
            ms(median(times)),
            ms(worst)
        );
    }
}

fn live_transcript(db: &Db, home: &std::path::Path, addr: &str) {
    let dir = home.join("runs/live-run");
    std::fs::create_dir_all(&dir).unwrap();
    let transcript = dir.join("transcript.jsonl");
    std::fs::write(&transcript, "").unwrap();
    // A running run whose pid (this process) is alive.
    db.conn()
        .execute(
            "INSERT INTO runs (id, goal, trigger, status, started_at, pid, model, workspace, dir)
             VALUES ('live-run', 'g', 'manual', 'running', '2026-01-01T00:00:00Z', ?1,
                 'script:x', '/w', ?2)",
            (std::process::id(), dir.to_str().unwrap()),
        )
        .unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /runs/live-run/events?from=0 HTTP/1.1\r\nHost: {addr}\r\n\r\n"
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&transcript)
        .unwrap();
    let mut lat = Vec::new();
    let mut buf = [0u8; 65536];
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..40u64 {
        let line = serde_json::json!({"type": "notice", "text": format!("mark-{i}")}).to_string();
        let t = Instant::now();
        file.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut got = String::new();
        while !got.contains(&format!("mark-{i}<")) {
            let n = s.read(&mut buf).unwrap();
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        lat.push(t.elapsed());
        // A spread of pauses, so writes land at every point of the server's poll.
        std::thread::sleep(Duration::from_millis((i * 37) % 97 + 10));
    }
    let worst = *lat.iter().max().unwrap();
    println!("live transcript (40 events; target: within 200 ms of the write):");
    println!(
        "  event written -> stream delivers it median {:>6.1} ms, worst {:>6.1} ms",
        ms(median(lat)),
        ms(worst)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let home = tempfile::tempdir().unwrap();
    let db = Db::open(home.path()).unwrap();
    fill(&db, 10_000);
    let c = serve(home.path());
    runs_page(&c.addr);
    live_transcript(&db, home.path(), &c.addr);
}

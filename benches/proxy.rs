//! What the network allowlist's proxy adds to a request on loopback: one `curl` fetching the
//! same small answer from a loopback HTTP server many times (a new connection each), once
//! unconfined and direct, once in a jail with `network = ["127.0.0.1:PORT"]`, whose only way
//! out is sup's proxy; the median of curl's own `time_total` per request, and the proxy's
//! extra time beside its target. Run: `cargo bench --bench proxy`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use sup::tools::process::{self, Spec};
use sup::tools::sandbox::{HostPattern, Jail, Network, Policy, Sandbox};
use tokio_util::sync::CancellationToken;

/// Requests per configuration and round.
const REQUESTS: usize = 200;
const ROUNDS: usize = 3;
/// What the proxy may add to a request on loopback (median), in milliseconds.
const TARGET_MS: f64 = 1.0;

/// An HTTP server on loopback answering `ok` to each connection.
fn server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            });
        }
    });
    port
}

/// Curl's `time_total` of each of `REQUESTS` requests to `url`, in milliseconds.
async fn times(dir: &std::path::Path, jail: Arc<Jail>, url: &str) -> Vec<f64> {
    let mut args: Vec<String> = ["-s", "-w", "\n%{time_total}\n"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(std::iter::repeat_n(url.to_string(), REQUESTS));
    let spec = Spec {
        program: "curl".into(),
        args,
        cwd: dir.to_path_buf(),
        env: Vec::new(),
        stdin: None,
        timeout: Duration::from_secs(60),
        stdout: dir.join("out"),
        stderr: dir.join("err"),
        jail,
    };
    let done = process::run(&spec, &CancellationToken::new())
        .await
        .expect("curl runs");
    assert!(done.ending.success(), "curl failed");
    let out = std::fs::read_to_string(dir.join("out")).expect("output");
    let t: Vec<f64> = out
        .lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .map(|s| s * 1000.0)
        .collect();
    assert_eq!(t.len(), REQUESTS, "{out}");
    t
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let home = tempfile::tempdir().expect("tempdir");
    let ws = tempfile::tempdir().expect("tempdir");
    let ws_path = std::fs::canonicalize(ws.path()).expect("canonical");
    let port = server();
    let settings = Sandbox {
        policy: Some(Policy::WorkspaceWrite),
        network: Some(Network::Allow(vec![
            HostPattern::parse(&format!("127.0.0.1:{port}")).expect("pattern"),
        ])),
        ..Sandbox::default()
    };
    let jailed = Arc::new(
        Jail::new(
            &settings,
            &ws_path,
            &home.path().join("r1"),
            "bench",
            home.path(),
            &[],
        )
        .expect("jail"),
    );
    println!("{}", jailed.describe());
    let direct = Arc::new(Jail::unconfined());
    let url = format!("http://127.0.0.1:{port}/");
    println!(
        "{ROUNDS} rounds × {REQUESTS} requests by one curl (a new connection each), direct and \
         through the proxy in turn"
    );
    let (mut d, mut p) = (Vec::new(), Vec::new());
    runtime.block_on(async {
        for _ in 0..ROUNDS {
            d.extend(times(&ws_path, direct.clone(), &url).await);
            p.extend(times(&ws_path, jailed.clone(), &url).await);
        }
    });
    let (d, p) = (median(d), median(p));
    let added = p - d;
    println!("              direct: median {d:.3} ms per request (the baseline)");
    println!(
        "  through the proxy: median {p:.3} ms per request, proxy adds {added:+.3} ms; target \
         < {TARGET_MS} ms added to a request on loopback: {}",
        if added < TARGET_MS { "met" } else { "NOT MET" }
    );
}

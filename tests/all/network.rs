//! The network allowlist (`network = ["host", "*.domain", "host:port"]`), as root and as uid
//! 65534: the jail's own network namespace, whose only way out is sup's proxy; listed hosts
//! answer through it, the rest (another loopback port, the store's 5432) get a 403 naming the
//! host and the key, a connection around the proxy has nowhere to go, and each refusal is an
//! event of the run.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common;

use common::{Env, both};
use serde_json::{Value, json};

fn cmd(id: &str, command: &str) -> Value {
    json!({"tool_calls": [{"id": id, "name": "run_command", "input": {"command": command}}]})
}

fn say(text: &str) -> Value {
    json!({"text": text})
}

fn text(v: &Value) -> String {
    v["content"].as_str().unwrap_or_default().to_string()
}

/// An HTTP server on loopback that answers `hello from PORT` and counts its connections.
struct Server {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Server {
    fn start() -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                let body = format!("hello from {port}");
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Server { port, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

#[test]
fn a_listed_host_answers_through_the_proxy_and_the_rest_is_refused() {
    both(|nobody| {
        let env = Env::new();
        let (listed, other) = (Server::start(), Server::start());
        let (a, b) = (listed.port, other.port);
        let body = format!(
            "prompt = \"work\"\nnetwork = [\"127.0.0.1:{a}\", \"*.crates.io\", \"registry.npmjs.org\"]\n"
        );
        let turns = json!([
            cmd("plain", &format!("curl -sS http://127.0.0.1:{a}/hi")),
            cmd("tunnel", &format!("curl -sS -p http://localhost:{a}/hi")),
            cmd("other", &format!("curl -sS http://127.0.0.1:{b}/")),
            cmd("store", "curl -sS http://127.0.0.1:5432/"),
            cmd("store-tunnel", "curl -sS -p http://localhost:5432/ 2>&1"),
            cmd(
                "direct",
                &format!("curl -sS --noproxy '*' http://127.0.0.1:{a}/ 2>&1; echo rc=$?"),
            ),
            cmd("route", "exec 3<>/dev/tcp/10.1.2.3/80 2>&1; echo rc=$?"),
            cmd("env", "env | grep -i _proxy | sort"),
            say("done"),
        ]);
        let run = env.goal_as(nobody, "g/goal.toml", &body, turns);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let line = run
            .of_type("notice")
            .into_iter()
            .filter_map(|n| n["text"].as_str())
            .find(|t| t.starts_with("sandbox: "))
            .unwrap_or_default()
            .to_string();
        assert!(
            line.contains("network: allowlist (3 hosts: 127.0.0.1:") && line.contains("via proxy"),
            "{line}"
        );
        let got = |id: &str| text(run.tool_result(id));
        assert!(
            got("plain").contains(&format!("hello from {a}")),
            "{}",
            got("plain")
        );
        assert!(
            got("tunnel").contains(&format!("hello from {a}")),
            "{}",
            got("tunnel")
        );
        let other_text = got("other");
        assert!(
            other_text.contains(&format!("sup refused 127.0.0.1:{b}"))
                && other_text.contains("`network`"),
            "{other_text}"
        );
        assert_eq!(other.hits(), 0, "the unlisted port was reached");
        assert!(
            got("store").contains("sup refused 127.0.0.1:5432"),
            "{}",
            got("store")
        );
        assert!(
            got("store-tunnel").contains("403"),
            "{}",
            got("store-tunnel")
        );
        // Around the proxy: the jail's loopback is its own, and there is no other route.
        let direct = got("direct");
        assert!(
            direct.contains("rc=7") && !direct.contains("hello"),
            "{direct}"
        );
        assert!(got("route").contains("unreachable"), "{}", got("route"));
        assert_eq!(
            listed.hits(),
            2,
            "only the two proxied requests reach the listed host"
        );
        let env_text = got("env");
        for k in [
            "HTTP_PROXY=http://127.0.0.1:",
            "https_proxy=",
            "ALL_PROXY=",
            "NO_PROXY=",
        ] {
            assert!(env_text.contains(k), "{k}: {env_text}");
        }
        assert!(env_text.contains("NO_PROXY=\n"), "{env_text}");
        // Each refusal is an event: in the trace, the transcript and `sup show`.
        let refused: Vec<String> = run
            .of_type("notice")
            .into_iter()
            .filter_map(|n| n["text"].as_str())
            .filter(|t| t.starts_with("network: refused"))
            .map(String::from)
            .collect();
        assert_eq!(refused.len(), 3, "{refused:?}");
        assert!(
            refused[0].contains(&format!("127.0.0.1:{b}")),
            "{refused:?}"
        );
        let transcript = env.transcript();
        assert!(
            transcript.iter().any(|e| e["type"] == "notice"
                && e["text"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("network: refused localhost:5432")),
            "{transcript:?}"
        );
        let id = run.result()["run_id"].as_str().unwrap().to_string();
        let shown = env.sup().args(["show", &id]).output().unwrap();
        let shown = String::from_utf8_lossy(&shown.stdout);
        assert!(
            shown.contains(&format!("network: refused 127.0.0.1:{b}")),
            "{shown}"
        );
    });
}

/// Addresses that reach this machine under other names (`0.0.0.0`, `127.0.0.2`) are the
/// loopback all the same: listed, they still need a loopback entry for the port.
#[test]
fn another_name_for_this_machine_does_not_reach_its_loopback() {
    let env = Env::new();
    let server = Server::start();
    let port = server.port;
    let body = format!("prompt = \"work\"\nnetwork = [\"0.0.0.0:{port}\", \"127.0.0.2:{port}\"]\n");
    let turns = json!([
        cmd("zero", &format!("curl -sS http://0.0.0.0:{port}/")),
        cmd("two", &format!("curl -sS http://127.0.0.2:{port}/")),
        say("done"),
    ]);
    let run = env.goal_as(false, "g/goal.toml", &body, turns);
    assert_eq!(run.code, 0, "{}", run.stderr);
    for id in ["zero", "two"] {
        let t = text(run.tool_result(id));
        assert!(t.contains("sup refused") && t.contains("loopback"), "{t}");
    }
    assert_eq!(server.hits(), 0);
}

#[test]
fn a_malformed_host_pattern_is_exit_2_with_file_and_line() {
    let env = Env::new();
    for bad in ["https://crates.io", "a.*.org", "x.org:http", "*"] {
        let body = format!("prompt = \"work\"\n\nnetwork = [\"ok.org\", \"{bad}\"]\n");
        crate::sandbox::refused_at(&env, &body, 3, "network");
        let goal = env.write("g/goal.toml", &body);
        let out = env
            .sup()
            .args([
                "goal",
                "--file",
                goal.to_str().unwrap(),
                "--model",
                "script:x",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(bad) && err.contains("host pattern"), "{err}");
    }
}

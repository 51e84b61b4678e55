//! Unattended operation through the binary: notifications to a webhook receiver on
//! loopback (failures, queued approvals, retries, a receiver that never answers), cost caps
//! against a fake provider that reports usage, prompt templates across daemon runs,
//! `sup status`, `sup service`, `--print-config`, and the bad input each of them refuses.

use crate::common;
use crate::common::{Killed, SpawnKilled};

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fake_server::{FakeServer, Reply, read_request};
use common::{Env, stop, until};
use serde_json::{Value, json};

/// How the receiver answers one request.
#[derive(Clone, Copy)]
enum Answer {
    Status(u16),
    /// 200 after this many milliseconds.
    Late(u64),
    /// Read the request, then say nothing until the test ends.
    Never,
}

#[derive(Clone, Debug)]
struct Got {
    headers: Vec<(String, String)>,
    body: String,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A webhook receiver on 127.0.0.1 that answers in the order given (then 200) and records
/// every request.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    fn start(answers: Vec<Answer>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let got = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(Mutex::new(std::collections::VecDeque::from(answers)));
        let recorded = got.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let recorded = recorded.clone();
                let answer = answers
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or(Answer::Status(200));
                std::thread::spawn(move || {
                    let Some(request) = read_request(&stream) else {
                        return;
                    };
                    recorded.lock().unwrap().push(Got {
                        headers: request.headers,
                        body: String::from_utf8_lossy(&request.body).into_owned(),
                    });
                    match answer {
                        Answer::Status(s) => {
                            let _ = write!(
                                stream,
                                "HTTP/1.1 {s} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            );
                        }
                        Answer::Late(ms) => {
                            std::thread::sleep(Duration::from_millis(ms));
                            let _ = write!(
                                stream,
                                "HTTP/1.1 200 X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            );
                        }
                        Answer::Never => std::thread::sleep(Duration::from_secs(600)),
                    }
                });
            }
        });
        Receiver { url, got }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

/// A goal file `NAME.toml` in `home/goals` with a scripted model of `turns`.
fn goal_file(env: &Env, name: &str, body: &str, turns: Value) -> PathBuf {
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string(&turns).unwrap(),
    )
    .unwrap();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "model = \"script:{name}.json\"\nworkspace = \"work-{name}\"\ntimezone = \"UTC\"\n{body}"
        ),
    )
    .unwrap();
    path
}

fn out(env: &Env, args: &[&str]) -> (i32, String, String) {
    let o = env.sup().args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_failed_goal_sends_one_signed_notice_with_the_failing_check_and_its_output_tail() {
    let env = Env::new();
    let hook = Receiver::start(vec![]);
    let file = goal_file(
        &env,
        "lines",
        &format!(
            "prompt = \"write three lines\"\ntries = 1\n\
             [[check]]\nrun = \"echo 'want 3 lines, found 2' >&2; exit 1\"\n\
             [[notify]]\nwebhook = \"{}\"\nsecret_env = \"HOOK_SECRET\"\n\
             headers = {{ Authorization = \"Bearer $HOOK_TOKEN\" }}\n",
            hook.url
        ),
        json!([{"text": "All done! Everything passes, trust me."}]),
    );
    let o = env
        .sup()
        .args(["goal", "--json", "--file"])
        .arg(&file)
        .env("HOOK_SECRET", "s3cret")
        .env("HOOK_TOKEN", "tok-1")
        .output()
        .unwrap();
    let run = common::Run::new(o);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let run_id = run.result()["run_id"].as_str().unwrap().to_string();
    let got = hook.got();
    assert_eq!(got.len(), 1, "one notice: {got:?}");
    let n = got[0].json();
    assert_eq!(n["event"], "failed");
    assert_eq!(n["goal"], "lines");
    assert_eq!(n["run_id"], run_id.as_str());
    assert_eq!(n["status"], "failed");
    assert_eq!(n["stop_reason"], "checks_failed");
    assert_eq!(n["tries"], 1);
    let check = &n["failed_checks"][0];
    assert!(check["name"].as_str().unwrap().contains("exit 1"), "{n}");
    assert!(
        check["output_tail"]
            .as_str()
            .unwrap()
            .contains("want 3 lines, found 2"),
        "{n}"
    );
    assert!(
        !got[0].body.contains("trust me"),
        "the model's words are never in a notice: {}",
        got[0].body
    );
    assert_eq!(got[0].header("authorization"), Some("Bearer tok-1"));
    // The signature is HMAC-SHA256 of the exact body.
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(b"s3cret").unwrap();
    mac.update(got[0].body.as_bytes());
    let want: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        got[0].header("x-sup-signature"),
        Some(format!("sha256={want}").as_str())
    );
    let (code, shown, _) = out(&env, &["show", &run_id]);
    assert_eq!(code, 0);
    assert!(shown.contains("notifications:"), "{shown}");
    assert!(shown.contains("failed →"), "{shown}");
    assert!(shown.contains("HTTP 200"), "{shown}");
}

#[test]
fn a_queued_approval_sends_a_notice_with_its_request_id() {
    let env = Env::new();
    let hook = Receiver::start(vec![]);
    std::fs::write(
        env.home.path().join("config.toml"),
        format!(
            "[[notify]]\nwebhook = \"{}\"\non = [\"approval_needed\"]\n",
            hook.url
        ),
    )
    .unwrap();
    let script = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "run_command", "input": {"command": "touch made-by-agent"}}]},
        {"text": "stopped"}
    ]));
    let mut child = env
        .sup()
        .env("SUP_CONFIG", env.home.path().join("config.toml"))
        .args([
            "run",
            "make a file",
            "--approval",
            "queue",
            // Should an assertion below fail, the run still ends within a minute instead of
            // waiting out the default hour for an answer.
            "--approval-timeout",
            "60s",
            "--json",
            "--model",
        ])
        .arg(format!("script:{}", script.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn_killed();
    until("the approval notice", 30, || !hook.got().is_empty());
    let n = hook.got()[0].json();
    assert_eq!(n["event"], "approval_needed");
    let id = n["approval"]["request_id"].as_str().unwrap().to_string();
    assert_eq!(n["approval"]["tool"], "run_command");
    assert_eq!(n["approval"]["summary"], "touch made-by-agent");
    assert_eq!(n["approval"]["approve"], format!("sup approve {id}"));
    let (_, pending, _) = out(&env, &["approvals", "--json"]);
    let pending: Value = serde_json::from_str(&pending).unwrap();
    assert_eq!(pending[0]["id"], id.as_str(), "{pending}");
    let (code, _, err) = out(&env, &["deny", &id, "--reason", "not now"]);
    assert_eq!(code, 0, "{err}");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(!env.ws().join("made-by-agent").exists());
    assert_eq!(hook.got().len(), 1, "only approval_needed was asked for");
}

#[test]
fn a_500_is_retried_and_each_attempt_is_listed() {
    let env = Env::new();
    let hook = Receiver::start(vec![Answer::Status(500), Answer::Status(500)]);
    let file = goal_file(
        &env,
        "ok",
        &format!(
            "prompt = \"p\"\n[[notify]]\nwebhook = \"{}\"\non = [\"achieved\"]\nformat = \"slack\"\n",
            hook.url
        ),
        json!([{"text": "done"}]),
    );
    let o = env
        .sup()
        .args(["goal", "--json", "--file"])
        .arg(&file)
        .output()
        .unwrap();
    let run = common::Run::new(o);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let got = hook.got();
    assert_eq!(got.len(), 3, "two 500s, then delivered");
    let text = got[2].json()["text"].as_str().unwrap().to_string();
    assert!(text.contains("goal ok achieved"), "{text}");
    let run_id = run.result()["run_id"].as_str().unwrap();
    let (_, shown, _) = out(&env, &["show", run_id]);
    assert!(shown.contains("attempt 1 · HTTP 500"), "{shown}");
    assert!(shown.contains("attempt 2 · HTTP 500"), "{shown}");
    assert!(shown.contains("attempt 3 · HTTP 200"), "{shown}");
}

#[test]
fn a_receiver_that_never_answers_or_is_down_changes_nothing_but_a_bounded_wait() {
    let env = Env::new();
    let hook = Receiver::start(vec![Answer::Never; 5]);
    let down = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/", l.local_addr().unwrap())
    };
    let file = goal_file(
        &env,
        "slow",
        &format!(
            "prompt = \"p\"\ntries = 1\n[[check]]\nrun = \"exit 1\"\n\
             [[notify]]\nwebhook = \"{}\"\ntimeout = \"1s\"\n\
             [[notify]]\nwebhook = \"{down}\"\ntimeout = \"1s\"\n",
            hook.url
        ),
        json!([{"text": "done"}]),
    );
    let started = Instant::now();
    let o = env
        .sup()
        .args(["goal", "--json", "--file"])
        .arg(&file)
        .output()
        .unwrap();
    let took = started.elapsed();
    let run = common::Run::new(o);
    assert_eq!(run.code, 1, "the outcome is the checks': {}", run.stderr);
    assert_eq!(run.result()["status"], "failed");
    assert_eq!(hook.got().len(), 1, "one attempt within the wait");
    // The run itself takes well under a second; the notices add at most the timeout: the
    // retries still due when it is over are not made, since the process ends.
    assert!(took < Duration::from_millis(1000 + 3000), "took {took:?}");
    let run_id = run.result()["run_id"].as_str().unwrap();
    let (_, shown, _) = out(&env, &["show", run_id]);
    assert!(
        shown.contains("attempt 1 · no answer within the notify timeout of 1s"),
        "{shown}"
    );
    assert!(
        shown.contains("attempt 2 · not made: sup ended first"),
        "{shown}"
    );
    assert!(shown.contains("cannot reach it"), "{shown}");
}

#[test]
fn a_command_channel_gets_the_notice_on_stdin() {
    let env = Env::new();
    let sink = env.home.path().join("notice.json");
    let file = goal_file(
        &env,
        "cmd",
        &format!(
            "prompt = \"p\"\nmax_steps = 1\n[[notify]]\ncommand = [\"sh\", \"-c\", \"cat > '{}'\"]\n",
            sink.display()
        ),
        json!([{"tool_calls": [{"id": "c1", "name": "list_files", "input": {"path": "."}}]}]),
    );
    let (code, _, err) = out(&env, &["goal", "--file", file.to_str().unwrap()]);
    assert_eq!(code, 3, "{err}");
    let n: Value = serde_json::from_str(&std::fs::read_to_string(&sink).unwrap()).unwrap();
    assert_eq!(n["event"], "unfinished");
    assert_eq!(n["stop_reason"], "max_steps");
}

/// A Chat Completions answer that reports `prompt_tokens` of input and no output.
pub(crate) fn priced_turn(call: Option<&str>, prompt_tokens: u64) -> Reply {
    let message = match call {
        // Each call reads another (missing) file, so no two calls repeat.
        Some(id) => json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "read_file",
             "arguments": json!({"path": format!("{id}.txt")}).to_string()}}]}),
        None => json!({"role": "assistant", "content": "finished"}),
    };
    Reply::json(
        200,
        json!({"id": "x", "object": "chat.completion", "model": "fake",
               "choices": [{"index": 0, "message": message,
                            "finish_reason": if call.is_some() { "tool_calls" } else { "stop" }}],
               "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0}}),
    )
}

/// A user config pricing `openai:fake` at $1000 per million input tokens.
fn priced(env: &Env) -> PathBuf {
    let path = env.home.path().join("config.toml");
    std::fs::write(
        &path,
        "[prices.\"openai:fake\"]\ninput = 1000.0\noutput = 0.0\n",
    )
    .unwrap();
    path
}

#[test]
fn a_cost_cap_stops_before_the_call_that_would_pass_it() {
    let env = Env::new();
    // Each call reports 2000 input tokens: $2 a call.
    let server = FakeServer::start(
        (1..=6)
            .map(|i| priced_turn(Some(&format!("c{i}")), 2000))
            .collect(),
    );
    let config = priced(&env);
    let o = env
        .sup()
        .env("SUP_CONFIG", &config)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .args([
            "run",
            "list files",
            "--model",
            "openai:fake",
            "--no-stream",
            "--max-cost",
            "7",
            "--json",
        ])
        .output()
        .unwrap();
    let run = common::Run::new(o);
    assert_eq!(run.code, 3, "{}", run.stderr);
    let result = run.result();
    assert_eq!(result["stop_reason"], "cost");
    assert_eq!(result["status"], "unfinished");
    // Before call 4: $6 spent + ~2000 tokens coming at $1000/M = $8 > $7: not made.
    assert_eq!(server.requests().len(), 3);
    assert!(
        (result["cost_usd"].as_f64().unwrap() - 6.0).abs() < 1e-9,
        "{result}"
    );
    let steps = run.of_type("step_finished");
    assert!((steps[0]["cost"].as_f64().unwrap() - 2.0).abs() < 1e-9);
    assert!((steps[2]["total_cost"].as_f64().unwrap() - 6.0).abs() < 1e-9);
    let (_, runs, _) = out(&env, &["runs"]);
    assert!(runs.contains("$6.0000"), "{runs}");
}

#[test]
fn a_per_day_cap_holds_across_two_runs() {
    let env = Env::new();
    let server = FakeServer::start(vec![
        // Run 1: a call and an answer, $3 each.
        priced_turn(Some("c1"), 3000),
        priced_turn(None, 3000),
        // Run 2 would do the same, but only $4 of the day's $10 are left.
        priced_turn(Some("c2"), 3000),
        priced_turn(None, 3000),
    ]);
    let config = priced(&env);
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("daily.toml");
    std::fs::write(
        &file,
        "prompt = \"p\"\nmodel = \"openai:fake\"\ntimezone = \"Pacific/Auckland\"\nmax_cost_per_day = 10\n",
    )
    .unwrap();
    let go = || {
        let o = env
            .sup()
            .env("SUP_CONFIG", &config)
            .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
            .args(["goal", "--no-stream", "--json", "--file"])
            .arg(&file)
            .output()
            .unwrap();
        common::Run::new(o)
    };
    let first = go();
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!((first.result()["cost_usd"].as_f64().unwrap() - 6.0).abs() < 1e-9);
    let second = go();
    assert_eq!(second.code, 3, "{}", second.stderr);
    assert_eq!(second.result()["stop_reason"], "cost");
    assert_eq!(server.requests().len(), 3, "run 2 made one call, not two");
    assert!((second.result()["cost_usd"].as_f64().unwrap() - 3.0).abs() < 1e-9);
}

#[test]
fn a_cap_with_an_unknown_price_refuses_to_start_unless_allowed() {
    let env = Env::new();
    let script = env.script(json!([{"text": "done"}]));
    let model = format!("script:{}", script.display());
    let (code, _, err) = out(&env, &["run", "p", "--model", &model, "--max-cost", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("[prices.\"{model}\"]")), "{err}");
    assert!(err.contains("unknown_price = \"allow\""), "{err}");
    let file = goal_file(
        &env,
        "free",
        "prompt = \"p\"\nmax_cost = 1\nunknown_price = \"allow\"\n",
        json!([{"text": "done"}]),
    );
    let (code, _, err) = out(&env, &["goal", "--file", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("no cost cap is kept"), "{err}");
}

/// The user messages of a run's transcript.
fn prompts(dir: &Path) -> Vec<String> {
    common::user_messages(&common::read_jsonl(&dir.join("transcript.jsonl")))
}

#[test]
fn the_previous_answer_carries_over_between_two_daemon_runs() {
    let env = Env::new();
    goal_file(
        &env,
        "daily",
        "schedule = \"* * * * * *\"\ntries = 1\nprompt = \"\"\"\nOn {{ date }} for {{ params.who }} ({{ trigger }}).\n\
         Last time: {% if previous.answer %}{{ previous.answer }} ({{ previous.status }}){% else %}nothing{% endif %}.\"\"\"\n\
         [params]\nwho = \"Ada\"\n",
        json!([{"text": "the answer is 42"}]),
    );
    let mut daemon = env
        .sup()
        .args(["daemon", "--goals"])
        .arg(env.home.path().join("goals"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn_killed();
    let runs = || {
        sup::store::db::Db::open(env.home.path())
            .unwrap()
            .runs(Some("daily"), None, 100)
            .unwrap()
            .into_iter()
            .filter(|r| r.status != sup::store::RunStatus::Running)
            .collect::<Vec<_>>()
    };
    until("two runs", 30, || runs().len() >= 2);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    daemon.wait().unwrap();
    let mut all = runs();
    all.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.id.cmp(&b.id)));
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let first = prompts(Path::new(&all[0].dir));
    assert_eq!(
        first[0],
        format!("On {today} for Ada (schedule).\nLast time: nothing.")
    );
    let second = prompts(Path::new(&all[1].dir));
    assert_eq!(
        second[0],
        format!("On {today} for Ada (schedule).\nLast time: the answer is 42 (achieved).")
    );
}

#[test]
fn a_prompt_without_template_syntax_is_used_as_written() {
    let env = Env::new();
    let prompt = "Keep {braces}, {% and %} as they are";
    let run = env.json(&["run", prompt], json!([{"text": "ok"}]), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let started = run.of_type("run_started");
    assert_eq!(started[0]["prompt"], prompt);
}

#[test]
fn a_param_flag_fills_the_prompt() {
    let env = Env::new();
    let run = env.json(
        &["run", "Hello {{ params.name }}"],
        json!([{"text": "ok"}]),
        &["--param", "name=World"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.of_type("run_started")[0]["prompt"], "Hello World");
}

#[test]
fn bad_input_is_exit_2_with_file_and_line() {
    let env = Env::new();
    let cases = [
        (
            "prompt = \"p\"\n[[notify]]\nwebhook = \"http://127.0.0.1:9/\"\non = [\"faild\"]\n",
            2,
            "faild",
        ),
        (
            "prompt = \"p\"\n\n[[notify]]\non = [\"failed\"]\n",
            3,
            "exactly one channel",
        ),
        (
            "prompt = \"p\"\n[[notify]]\nwebhook = \"http://127.0.0.1:9/\"\ncommand = [\"cat\"]\n",
            2,
            "exactly one channel",
        ),
        (
            "prompt = \"p\"\n[[notify]]\nwebhook = \"localhost:80/x\"\n",
            2,
            "not an http(s) URL",
        ),
        ("prompt = \"p\"\nmax_cost = -1\n", 2, "max_cost"),
        (
            "prompt = \"p\"\n\nmax_cost_per_day = -0.5\n",
            3,
            "max_cost_per_day",
        ),
        (
            "tries = 1\nprompt = \"\"\"\nfirst line\n{{ previous.anwser }}\"\"\"\n",
            4,
            "previous.anwser",
        ),
        ("prompt = \"{{ params.city }}\"\n", 1, "params.city"),
        ("prompt = \"{{ date \"\n", 1, "template"),
    ];
    for (i, (body, line, what)) in cases.into_iter().enumerate() {
        let path = env.home.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, format!("model = \"script:x.json\"\n{body}")).unwrap();
        let (code, _, err) = out(&env, &["goal", "--file", path.to_str().unwrap()]);
        assert_eq!(code, 2, "case {i}: {err}");
        let at = format!("bad{i}.toml:{}:", line + 1);
        assert!(err.contains(&at), "case {i}: want {at} in {err}");
        assert!(err.contains(what), "case {i}: want {what} in {err}");
    }
    let (code, _, err) = out(&env, &["run", "p", "--max-cost", "-1"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn status_exits_1_for_an_overdue_goal_and_0_when_all_are_healthy() {
    let env = Env::new();
    let file = goal_file(
        &env,
        "hourly",
        "prompt = \"p\"\nschedule = \"0 * * * *\"\n",
        json!([{"text": "done"}]),
    );
    let goals = env.home.path().join("goals");
    let goals = goals.to_str().unwrap();
    // Written just now: no occurrence was due since, so nothing is overdue.
    let (code, text, err) = out(&env, &["status", "--goals", goals]);
    assert_eq!(code, 0, "{text}{err}");
    // Written three hours ago, and no daemon ran since.
    let touched = std::process::Command::new("touch")
        .args(["-d", "3 hours ago"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(touched.success());
    let (code, text, _) = out(&env, &["status", "--goals", goals, "--json"]);
    assert_eq!(code, 1, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["healthy"], false);
    assert_eq!(v["goals"][0]["overdue"], true, "{v}");
    assert!(v["goals"][0]["next"].is_string());
    let (code, text, _) = out(&env, &["status", "--goals", goals]);
    assert_eq!(code, 1);
    assert!(text.contains("OVERDUE"), "{text}");
}

#[test]
fn status_exits_1_when_the_last_run_did_not_achieve() {
    let env = Env::new();
    goal_file(
        &env,
        "manual",
        "prompt = \"p\"\ntries = 1\n[[check]]\nrun = \"exit 1\"\n",
        json!([{"text": "done"}]),
    );
    let goals = env.home.path().join("goals");
    let goals = goals.to_str().unwrap();
    let (code, text, _) = out(&env, &["status", "--goals", goals]);
    assert_eq!(code, 0, "never run is healthy: {text}");
    let (code, _, _) = out(&env, &["trigger", "manual", "--goals", goals]);
    assert_eq!(code, 1);
    let (code, text, _) = out(&env, &["status", "--goals", goals]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("last failed (manual"), "{text}");
}

#[test]
fn service_install_writes_a_unit_that_systemd_accepts_and_uninstall_removes_it() {
    let env = Env::new();
    let config = env.home.path().join("xdg");
    let goals = env.home.path().join("my goals");
    std::fs::create_dir_all(&goals).unwrap();
    let o = env
        .sup()
        .env("XDG_CONFIG_HOME", &config)
        .args([
            "service",
            "install",
            "--user",
            "--no-enable",
            "--grace",
            "45s",
            "--goals",
        ])
        .arg(&goals)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let unit_path = config.join("systemd/user/sup.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let goals = std::fs::canonicalize(&goals).unwrap();
    let home = std::fs::canonicalize(env.home.path()).unwrap();
    assert!(unit.contains("Restart=on-failure"), "{unit}");
    assert!(unit.contains("KillMode=mixed"), "{unit}");
    assert!(
        unit.contains("ExecReload=/bin/kill -HUP $MAINPID"),
        "{unit}"
    );
    assert!(
        unit.contains("TimeoutStopSec=75"),
        "longer than --grace: {unit}"
    );
    assert!(
        unit.contains(&format!("--goals \"{}\"", goals.display())),
        "{unit}"
    );
    assert!(unit.contains("--grace 45s"), "{unit}");
    assert!(
        unit.contains(&format!("Environment=SUP_HOME={}", home.display())),
        "{unit}"
    );
    assert!(unit.contains("WantedBy=default.target"), "{unit}");
    if Path::new("/usr/bin/systemd-analyze").exists() || Path::new("/bin/systemd-analyze").exists()
    {
        let o = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&unit_path)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&o.stderr);
        // Complaints about the host's own units are not ours.
        let ours: Vec<&str> = said.lines().filter(|l| l.contains("sup.service")).collect();
        assert!(o.status.success() && ours.is_empty(), "{said}");
    }
    let o = env
        .sup()
        .env("XDG_CONFIG_HOME", &config)
        .args(["service", "uninstall", "--user", "--no-enable"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(!unit_path.exists());
}

/// What `--print-config` printed, which must exit 0, and the line of each setting by its key.
fn printed_config(o: std::process::Output) -> (String, impl Fn(&str) -> String) {
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines = text.clone();
    let line = move |key: &str| {
        lines
            .lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no {key} in {lines}"))
            .to_string()
    };
    (text, line)
}

#[test]
fn print_config_shows_each_setting_and_where_it_came_from() {
    let env = Env::new();
    let file = goal_file(
        &env,
        "cfg",
        "prompt = \"p\"\nmax_steps = 7\nmax_cost_per_day = 2\nunknown_price = \"allow\"\n",
        json!([{"text": "done"}]),
    );
    let o = env
        .sup()
        .env("SUP_MODEL", "openai:gpt-4o-mini")
        .args(["goal", "--print-config", "--tries", "2", "--file"])
        .arg(&file)
        .output()
        .unwrap();
    let (text, line) = printed_config(o);
    assert!(line("tries").contains("flag"), "{text}");
    assert!(line("max_steps").contains("goal file"), "{text}");
    assert!(line("model").contains("goal file"), "{text}");
    assert!(line("max_cost_per_day").contains("goal file"), "{text}");
    assert!(line("token_budget").contains("default"), "{text}");
    assert!(env.run_dirs().is_empty(), "nothing ran");
}

/// `sup daemon --goals HOME/goals`, its output discarded.
fn daemon(env: &Env) -> Killed {
    env.sup()
        .args(["daemon", "--goals"])
        .arg(env.home.path().join("goals"))
        .env_remove("DEEPSEEK_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn_killed()
}

#[test]
fn a_daemon_run_that_cannot_start_sends_an_error_notice() {
    let env = Env::new();
    let hook = Receiver::start(vec![]);
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("keyless.toml"),
        format!(
            "prompt = \"p\"\nmodel = \"deepseek:deepseek-chat\"\nworkspace = \"w\"\n\
             schedule = \"* * * * * *\"\n[[notify]]\nwebhook = \"{}\"\n",
            hook.url
        ),
    )
    .unwrap();
    let d = daemon(&env);
    until("an error notice", 30, || !hook.got().is_empty());
    stop(d);
    let n = hook.got()[0].json();
    assert_eq!(n["event"], "error", "{n}");
    assert_eq!(n["goal"], "keyless");
    assert_eq!(n["trigger"], "schedule");
    assert!(
        n["error"].as_str().unwrap().contains("DEEPSEEK_API_KEY"),
        "{n}"
    );
    let id = n["run_id"].as_str().unwrap();
    let row = sup::store::db::Db::open(env.home.path())
        .unwrap()
        .run(id)
        .unwrap();
    assert_eq!(row.status, sup::store::RunStatus::Error);
}

/// Where the process lives on, a receiver that never answers gets all three attempts, each
/// bounded by the timeout, while the daemon goes on with its goals.
#[test]
fn the_daemon_retries_a_receiver_that_never_answers_in_the_background() {
    let env = Env::new();
    let hook = Receiver::start(vec![Answer::Never; 40]);
    goal_file(
        &env,
        "hang",
        &format!(
            "prompt = \"p\"\ntries = 1\nschedule = \"* * * * * *\"\n[[check]]\nrun = \"exit 1\"\n\
             [[notify]]\nwebhook = \"{}\"\ntimeout = \"1s\"\n",
            hook.url
        ),
        json!([{"text": "done"}]),
    );
    let d = daemon(&env);
    let first = || {
        let got = hook.got();
        let id = got.first().map(|g| g.json()["run_id"].clone());
        got.iter()
            .filter(|g| Some(g.json()["run_id"].clone()) == id)
            .count()
    };
    // Meanwhile the daemon goes on: later runs are told too.
    let runs = || {
        hook.got()
            .iter()
            .map(|g| g.json()["run_id"].to_string())
            .collect::<std::collections::BTreeSet<String>>()
            .len()
    };
    until(
        "three attempts at the first run's notice, and a later run's",
        30,
        || first() >= 3 && runs() >= 2,
    );
    stop(d);
    assert_eq!(first(), 3);
}

/// `goals/NAME.toml` running `openai:fake` under `max_cost_per_day = CAP`, and a closure
/// running it once with `sup goal` against `server`.
fn daily_goal(env: &Env, name: &str, cap: &str, extra: &str) -> PathBuf {
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(
        &file,
        format!(
            "prompt = \"p\"\nmodel = \"openai:fake\"\ntimezone = \"Pacific/Auckland\"\n\
             max_cost_per_day = {cap}\n{extra}"
        ),
    )
    .unwrap();
    file
}

fn goal_cmd(env: &Env, config: &Path, server: &FakeServer, file: &Path) -> std::process::Command {
    let mut cmd = env.sup();
    cmd.env("SUP_CONFIG", config)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .args(["goal", "--no-stream", "--json", "--file"])
        .arg(file);
    cmd
}

#[test]
fn the_days_spending_counts_runs_that_were_pruned() {
    let env = Env::new();
    let server = FakeServer::start(vec![
        // Run 1: $3 + $3.
        priced_turn(Some("c1"), 3000),
        priced_turn(None, 3000),
        // Run 2: $3, then $3.01 - $9 spent leaves too little for another call.
        priced_turn(Some("c2"), 3000),
        priced_turn(None, 3000),
        // Run 3 would make a call if run 1's $6 were forgotten when it was pruned.
        priced_turn(None, 3000),
    ]);
    let config = priced(&env);
    let file = daily_goal(&env, "pruned", "9.01", "keep_runs = 1\n");
    let go = || common::Run::new(goal_cmd(&env, &config, &server, &file).output().unwrap());
    let first = go();
    assert_eq!(first.code, 0, "{}", first.stderr);
    let second = go();
    assert_eq!(second.code, 3, "{}", second.stderr);
    assert_eq!(server.requests().len(), 3);
    let runs = sup::store::db::Db::open(env.home.path())
        .unwrap()
        .runs(Some("pruned"), None, 10)
        .unwrap();
    assert_eq!(runs.len(), 1, "run 1 was pruned");
    let third = go();
    assert_eq!(third.code, 3, "{}", third.stderr);
    assert_eq!(third.result()["stop_reason"], "cost");
    assert_eq!(server.requests().len(), 3, "run 3 made no call");
}

#[test]
fn the_days_spending_counts_a_run_killed_while_it_ran() {
    let env = Env::new();
    let hang = Reply {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: common::fake_server::Body::Chunks {
            pieces: vec![(600_000, "{}".into())],
            drop: false,
            end_delay: 0,
        },
    };
    let server = FakeServer::start(vec![
        // $3, then the second call never answers: the run is killed while it waits.
        priced_turn(Some("c1"), 3000),
        hang,
        priced_turn(None, 3000),
    ]);
    let config = priced(&env);
    let file = daily_goal(&env, "killed", "100", "");
    let mut child = goal_cmd(&env, &config, &server, &file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn_killed();
    until("the second call", 30, || server.requests().len() == 2);
    child.kill().unwrap();
    child.wait().unwrap();
    // Now $3.01 a day: with the killed run's $3 counted, too little is left for a call.
    daily_goal(&env, "killed", "3.01", "");
    let next = common::Run::new(goal_cmd(&env, &config, &server, &file).output().unwrap());
    assert_eq!(next.code, 3, "{}", next.stderr);
    assert_eq!(next.result()["stop_reason"], "cost");
    assert_eq!(server.requests().len(), 2, "the killed run's $3 counted");
}

#[test]
fn a_provider_that_reports_no_usage_is_counted_by_estimate_under_a_cap() {
    let env = Env::new();
    let no_usage = |id: &str| {
        let mut r = priced_turn(Some(id), 0);
        if let common::fake_server::Body::Full(text) = &mut r.body {
            let mut v: Value = serde_json::from_str(text).unwrap();
            v.as_object_mut().unwrap().remove("usage");
            *text = v.to_string();
        }
        r
    };
    let server = FakeServer::start((1..=6).map(|i| no_usage(&format!("c{i}"))).collect());
    let config = env.home.path().join("config.toml");
    // A prompt of 40 000 bytes is about 10 000 tokens: about $1 a call at $100 per million.
    std::fs::write(
        &config,
        "[prices.\"openai:fake\"]\ninput = 100.0\noutput = 0.0\n",
    )
    .unwrap();
    let prompt = "read the files. ".repeat(2500);
    let o = env
        .sup()
        .env("SUP_CONFIG", &config)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .args(["run", &prompt, "--model", "openai:fake", "--no-stream"])
        .args(["--max-cost", "2.5", "--json"])
        .output()
        .unwrap();
    let run = common::Run::new(o);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "cost");
    assert_eq!(
        server.requests().len(),
        2,
        "a third ~$1 call would pass $2.5"
    );
    let cost = run.result()["cost_usd"].as_f64().unwrap();
    assert!(cost > 2.0 && cost < 2.5, "{cost}");
    let steps = run.of_type("step_finished");
    assert!(steps[0]["usage"]["input_tokens"].as_u64().unwrap() >= 10_000);
}

#[test]
fn status_finds_the_due_occurrence_of_a_per_second_schedule_among_many() {
    let env = Env::new();
    let file = goal_file(
        &env,
        "everysecond",
        "prompt = \"p\"\nschedule = \"* * * * * *\"\n",
        json!([{"text": "done"}]),
    );
    let touched = std::process::Command::new("touch")
        .args(["-d", "10 minutes ago"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(touched.success());
    // A daemon ran every occurrence of the last ten minutes: far more than 100 since the
    // one `status` checks (two minutes ago).
    let db = sup::store::db::Db::open(env.home.path()).unwrap();
    let now = chrono::Timelike::with_nanosecond(&chrono::Utc::now(), 0).unwrap();
    for s in -600..=30 {
        let at = now + chrono::Duration::seconds(s);
        db.claim("everysecond", at, sup::store::OccurrenceStatus::Done, "d")
            .unwrap();
    }
    let goals = env.home.path().join("goals");
    let (code, text, err) = out(&env, &["status", "--goals", goals.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}{err}");
    assert!(!text.contains("OVERDUE"), "{text}");
}

#[test]
fn a_secret_a_check_printed_is_redacted_in_every_notice_format() {
    let env = Env::new();
    let hook = Receiver::start(vec![]);
    let key = "sk-fake-key-0123456789abcdef";
    let server = FakeServer::start(vec![priced_turn(None, 10)]);
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("leak.toml");
    std::fs::write(
        &file,
        format!(
            "prompt = \"p\"\nmodel = \"openai:fake\"\ntries = 1\n\
             [[check]]\nrun = \"echo 'the key is {key}' >&2; exit 1\"\n\
             [[notify]]\nwebhook = \"{url}\"\n\
             [[notify]]\nwebhook = \"{url}\"\nformat = \"text\"\n\
             [[notify]]\nwebhook = \"{url}\"\nformat = \"slack\"\n",
            url = hook.url
        ),
    )
    .unwrap();
    let o = env
        .sup()
        .env("OPENAI_API_KEY", key)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .args(["goal", "--no-stream", "--file"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let got = hook.got();
    assert_eq!(got.len(), 3, "{got:?}");
    for g in &got {
        assert!(!g.body.contains(key), "{}", g.body);
        assert!(g.body.contains("the key is [redacted]"), "{}", g.body);
    }
}

#[test]
fn a_negative_price_in_the_user_config_is_exit_2_with_its_file_and_line() {
    let env = Env::new();
    let config = env.home.path().join("config.toml");
    std::fs::write(
        &config,
        "keep_runs = 5\n[prices.\"openai:x\"]\ninput = 1.0\noutput = -2.0\n",
    )
    .unwrap();
    let o = env
        .sup()
        .env("SUP_CONFIG", &config)
        .args(["run", "p", "--model", "script:x.json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("{}:2:", config.display())), "{err}");
    assert!(err.contains("`output` is -2"), "{err}");
}

#[test]
fn print_config_prints_a_cap_on_an_unpriced_model_and_says_it_would_not_start() {
    let env = Env::new();
    let o = env
        .sup()
        .args(["run", "--print-config", "p", "--model", "ollama:llama3"])
        .args(["--max-cost", "1"])
        .output()
        .unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(text.contains("max_cost"), "{text}");
    assert!(text.contains("unknown"), "{text}");
    assert!(err.contains("would not start"), "{err}");
    assert!(env.run_dirs().is_empty(), "nothing ran");
}

#[test]
fn recovered_is_sent_once_after_a_failure_and_an_achieved_run_is_not_sent_by_default() {
    let env = Env::new();
    let hook = Receiver::start(vec![]);
    let file = goal_file(
        &env,
        "rec",
        &format!(
            "prompt = \"p\"\ntries = 1\n[[check]]\nrun = \"test -f ok\"\n\
             [[notify]]\nwebhook = \"{url}\"\n\
             [[notify]]\nwebhook = \"{url}\"\nformat = \"text\"\n",
            url = hook.url
        ),
        json!([{"text": "done"}]),
    );
    let go = || out(&env, &["goal", "--file", file.to_str().unwrap()]).0;
    assert_eq!(go(), 1);
    std::fs::write(env.home.path().join("goals/work-rec/ok"), "").unwrap();
    assert_eq!(go(), 0);
    // Achieved after achieved: `achieved` is not among the default events.
    assert_eq!(go(), 0);
    let got = hook.got();
    assert_eq!(got.len(), 4, "failed and recovered, to each table: {got:?}");
    let json_events: Vec<String> = got
        .iter()
        .filter(|g| g.header("content-type") == Some("application/json"))
        .map(|g| g.json()["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(json_events, ["failed", "recovered"]);
    let texts: Vec<&Got> = got
        .iter()
        .filter(|g| {
            g.header("content-type")
                .is_some_and(|c| c.starts_with("text/plain"))
        })
        .collect();
    assert_eq!(texts.len(), 2, "{got:?}");
    assert!(
        texts[0]
            .body
            .starts_with("sup · goal rec failed (checks_failed) after 1 try"),
        "{}",
        texts[0].body
    );
    assert!(
        texts[0].body.contains("✗ test -f ok · exit 1"),
        "{}",
        texts[0].body
    );
    assert!(
        texts[1].body.starts_with("sup · goal rec recovered"),
        "{}",
        texts[1].body
    );
}

#[test]
fn a_missed_occurrence_is_told_by_the_daemon() {
    let env = Env::new();
    let hook = Receiver::start(vec![]);
    goal_file(
        &env,
        "minutely",
        &format!(
            "prompt = \"p\"\nschedule = \"* * * * *\"\n[[notify]]\nwebhook = \"{}\"\non = [\"missed\"]\n",
            hook.url
        ),
        json!([{"text": "done"}]),
    );
    // The last occurrence run was three minutes ago: the daemon was down since, and by the
    // default catch-up policy the occurrences in between are recorded missed, not run.
    let now = chrono::Utc::now();
    let minute = now - chrono::Duration::seconds(chrono::Timelike::second(&now) as i64);
    let minute = chrono::Timelike::with_nanosecond(&minute, 0).unwrap();
    let last = minute - chrono::Duration::minutes(3);
    let db = sup::store::db::Db::open(env.home.path()).unwrap();
    assert!(
        db.claim(
            "minutely",
            last,
            sup::store::OccurrenceStatus::Done,
            "earlier"
        )
        .unwrap()
    );
    let d = daemon(&env);
    until("a missed notice", 30, || !hook.got().is_empty());
    stop(d);
    let n = hook.got()[0].json();
    assert_eq!(n["event"], "missed", "{n}");
    assert_eq!(n["goal"], "minutely");
    assert_eq!(n["status"], "missed");
    let at = sup::store::db::parse_stamp(n["scheduled_for"].as_str().unwrap()).unwrap();
    assert!(at > last && at <= now, "{n}");
    let missed = db
        .occurrences("minutely", 10)
        .unwrap()
        .into_iter()
        .filter(|o| o.1 == sup::store::OccurrenceStatus::Missed)
        .count();
    assert!(missed >= 1);
}

#[test]
fn the_goal_key_max_cost_is_kept_and_sup_show_gives_the_cost() {
    let env = Env::new();
    let server = FakeServer::start(
        (1..=6)
            .map(|i| priced_turn(Some(&format!("c{i}")), 2000))
            .collect(),
    );
    let config = priced(&env);
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("capped.toml");
    std::fs::write(
        &file,
        "prompt = \"p\"\nmodel = \"openai:fake\"\nmax_cost = 7\n",
    )
    .unwrap();
    let run = common::Run::new(goal_cmd(&env, &config, &server, &file).output().unwrap());
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "cost");
    assert_eq!(server.requests().len(), 3);
    let id = run.result()["run_id"].as_str().unwrap().to_string();
    let (code, shown, _) = out(&env, &["show", &id]);
    assert_eq!(code, 0);
    assert!(shown.contains("$6.0000"), "{shown}");
}

#[test]
fn service_install_enables_the_unit_with_systemctl_and_uninstall_disables_it() {
    let env = Env::new();
    let bin = env.home.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = env.home.path().join("systemctl.log");
    let fake = bin.join("systemctl");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n", log.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let config = env.home.path().join("xdg");
    let goals = env.home.path().join("goals");
    std::fs::create_dir_all(&goals).unwrap();
    let service = |args: &[&str]| {
        let o = env
            .sup()
            .env("PATH", &path)
            .env("XDG_CONFIG_HOME", &config)
            .arg("service")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    service(&["install", "--user", "--goals", goals.to_str().unwrap()]);
    assert!(config.join("systemd/user/sup.service").exists());
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        ["--user daemon-reload", "--user enable --now sup.service"]
    );
    service(&["uninstall", "--user"]);
    assert!(!config.join("systemd/user/sup.service").exists());
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls.lines().skip(2).collect::<Vec<_>>(),
        ["--user disable --now sup.service", "--user daemon-reload"]
    );
}

#[test]
fn print_config_names_the_environment_and_the_user_config() {
    let env = Env::new();
    let config = env.home.path().join("config.toml");
    std::fs::write(&config, "max_steps = 9\n").unwrap();
    let o = env
        .sup()
        .env("SUP_CONFIG", &config)
        .env("SUP_MODEL", "openai:gpt-4o-mini")
        .args(["run", "--print-config", "p"])
        .output()
        .unwrap();
    let (text, line) = printed_config(o);
    assert!(line("model").contains("openai:gpt-4o-mini"), "{text}");
    assert!(line("model").ends_with("environment"), "{text}");
    assert!(line("max_steps").contains('9'), "{text}");
    assert!(
        line("max_steps").ends_with(&format!("user config {}", config.display())),
        "{text}"
    );
}

#[test]
fn a_param_flag_wins_over_the_goal_files_params() {
    let env = Env::new();
    let file = goal_file(
        &env,
        "hello",
        "prompt = \"Hello {{ params.who }} and {{ params.other }}\"\n[params]\nwho = \"Ada\"\nother = \"Grace\"\n",
        json!([{"text": "ok"}]),
    );
    let o = env
        .sup()
        .args(["goal", "--json", "--param", "who=Bob", "--file"])
        .arg(&file)
        .output()
        .unwrap();
    let run = common::Run::new(o);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.of_type("run_started")[0]["prompt"],
        "Hello Bob and Grace"
    );
}

#[test]
fn templates_give_the_failed_checks_the_times_in_the_goals_zone_and_fill_the_system_prompt() {
    let env = Env::new();
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("t.json"), r#"[{"text": "done"}]"#).unwrap();
    std::fs::write(
        dir.join("tokyo.toml"),
        "model = \"script:t.json\"\nworkspace = \"w\"\ntimezone = \"Asia/Tokyo\"\n\
         schedule = \"* * * * * *\"\ntries = 1\n\
         system = \"SYS {{ goal }} {{ trigger }}\"\n\
         prompt = \"{{ previous.failed_checks }}|{{ scheduled_for }}|{{ time }}|{{ now }}\"\n\
         [[check]]\nrun = \"echo 'want 3 lines, found 2' >&2; exit 1\"\n",
    )
    .unwrap();
    let d = daemon(&env);
    let runs = || {
        let mut r: Vec<_> = sup::store::db::Db::open(env.home.path())
            .unwrap()
            .runs(Some("tokyo"), None, 100)
            .unwrap()
            .into_iter()
            .filter(|r| r.status != sup::store::RunStatus::Running)
            .collect();
        r.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.id.cmp(&b.id)));
        r
    };
    until("two runs", 30, || runs().len() >= 2);
    stop(d);
    let all = runs();
    let transcript =
        |i: usize| common::read_jsonl(&Path::new(&all[i].dir).join("transcript.jsonl"));
    let first = common::user_messages(&transcript(0));
    assert!(
        first[0].starts_with('|'),
        "nothing failed before: {}",
        first[0]
    );
    let second_t = transcript(1);
    let second = common::user_messages(&second_t)[0].clone();
    let parts: Vec<&str> = second.split('|').collect();
    assert!(
        parts[0].contains("found 2' >&2; exit 1 (exit 1)"),
        "{second}"
    );
    assert!(parts[0].contains("want 3 lines, found 2"), "{second}");
    let scheduled = parts[1];
    assert!(scheduled.ends_with("+09:00"), "{second}");
    assert_eq!(
        sup::store::db::parse_stamp(scheduled),
        all[1]
            .scheduled_for
            .as_deref()
            .and_then(sup::store::db::parse_stamp),
        "{second}"
    );
    let now = chrono::DateTime::parse_from_rfc3339(parts[3]).unwrap();
    assert_eq!(now.offset().local_minus_utc(), 9 * 3600, "{second}");
    assert_eq!(parts[2], now.format("%H:%M").to_string(), "{second}");
    let system: Vec<&Value> = second_t
        .iter()
        .filter(|e| e["type"] == "message" && e["message"]["role"] == "system")
        .collect();
    assert_eq!(system[0]["message"]["content"], "SYS tokyo schedule");
}

#[test]
fn an_approval_notice_in_flight_is_delivered_before_the_process_ends() {
    let env = Env::new();
    // The receiver answers after the run is over: the run ends when its approval times out.
    let hook = Receiver::start(vec![Answer::Late(2500)]);
    std::fs::write(
        env.home.path().join("config.toml"),
        format!(
            "[[notify]]\nwebhook = \"{}\"\non = [\"approval_needed\"]\n",
            hook.url
        ),
    )
    .unwrap();
    let script = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "run_command", "input": {"command": "touch x"}}]},
        {"text": "stopped"}
    ]));
    let o = env
        .sup()
        .env("SUP_CONFIG", env.home.path().join("config.toml"))
        .args([
            "run",
            "make a file",
            "--approval",
            "queue",
            "--approval-timeout",
            "1s",
        ])
        .args(["--json", "--model"])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = common::Run::new(o);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = run.result()["run_id"].as_str().unwrap().to_string();
    let (_, shown, _) = out(&env, &["show", &id]);
    assert!(shown.contains("approval_needed →"), "{shown}");
    assert!(shown.contains("attempt 1 · HTTP 200"), "{shown}");
}

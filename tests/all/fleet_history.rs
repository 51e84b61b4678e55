//! A fleet's history and answers across machines, through the binary against PostgreSQL: a
//! run waiting for approval hears the answer through `NOTIFY`; `max_cost_per_day` and
//! `previous.answer` hold across daemons; `sup status`, `sup serve` and `sup service install`
//! with `--store`.

use std::path::Path;
use std::process::{Child, Stdio};

use serde_json::json;

use crate::common;
use crate::fleet::{Fleet, stop, until};
use common::fake_server::{FakeServer, Reply};

/// A Chat Completions answer that reports `prompt_tokens` of input and no output.
fn priced_turn(call: Option<&str>, prompt_tokens: u64) -> Reply {
    let message = match call {
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

/// A daemon on machine `m` that reaches the fake provider and prices its model.
fn priced_daemon(f: &mut Fleet, m: usize, server: &FakeServer, config: &Path) -> Child {
    let log = std::fs::File::create(f.log(m)).unwrap();
    f.sup(m)
        .env("SUP_CONFIG", config)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", "sk-test")
        .args(["daemon", "--goals", "."])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Wait until daemon `m` serves its goals.
fn serving(f: &Fleet, m: usize) {
    until("the daemon serves its goals", 20, || {
        f.pg.one(&format!(
            "SELECT count(*) FROM goal_versions v JOIN daemons d ON d.id = v.daemon_id
             WHERE d.host = 'm{m}' AND d.state = 'alive'"
        )) != "0"
    });
}

#[test]
fn a_waiting_run_hears_its_answer_through_notify() {
    let mut f = Fleet::new();
    f.goal_turns(
        "w",
        None,
        r#"[{"tool_calls": [{"name": "write_file", "input": {"path": "made.txt", "content": "x"}}]}, {"text": "written"}]"#,
        "approval = \"queue\"\napproval_timeout = \"1h\"",
    );
    let d = f.daemon(0, &[]);
    serving(&f, 0);
    let (code, text) = f.out(1, &["trigger", "w", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    let mut id = String::new();
    until("an approval request in the store", 20, || {
        id =
            f.pg.one("SELECT id FROM approvals WHERE status = 'pending'");
        !id.is_empty()
    });
    let made = f.goals.path().join("work-w/made.txt");
    assert!(!made.exists());
    // Another machine answers; only the store connects it to the waiting run.
    let (code, text) = f.out(1, &["approve", &id]);
    assert_eq!(code, 0, "{text}");
    // Without a notification the run would look again only after its slow fallback poll
    // (30s), after this wait gives up.
    until("the approved run ends", 15, || {
        f.pg.one("SELECT status FROM runs WHERE goal = 'w'") != "running"
    });
    let logs = f.logs();
    assert_eq!(
        f.pg.one("SELECT status FROM runs WHERE goal = 'w'"),
        "achieved",
        "{logs}"
    );
    assert!(made.exists());
    assert_eq!(
        f.pg.one(&format!("SELECT status FROM approvals WHERE id = '{id}'")),
        "approved"
    );
    // The run recorded who answered, from the store.
    let decided = f.pg.one(
        "SELECT e.event::text FROM events e JOIN runs r ON r.id = e.run_id
         WHERE r.goal = 'w' AND e.event->>'type' = 'approval' AND e.event->>'decision' = 'approved'",
    );
    assert!(decided.contains("@m1"), "{decided}\n{logs}");
    stop(d);
}

#[test]
fn the_days_cost_cap_and_the_previous_answer_hold_across_daemons() {
    let mut f = Fleet::new();
    let server = FakeServer::start(vec![
        // Run 1 (machine 0): a call and an answer, $3 each.
        priced_turn(Some("c1"), 3000),
        priced_turn(None, 3000),
        // Run 2 (machine 1) would do the same, but only $4 of the day's $10 are left.
        priced_turn(Some("c2"), 3000),
        priced_turn(None, 3000),
    ]);
    let config = f.goals.path().join("prices.toml");
    std::fs::write(
        &config,
        "[prices.\"openai:fake\"]\ninput = 1000.0\noutput = 0.0\n",
    )
    .unwrap();
    std::fs::write(
        f.goals.path().join("daily.toml"),
        "prompt = \"Last time: {% if previous.answer %}{{ previous.answer }} ({{ previous.status }}){% else %}nothing{% endif %}.\"\n\
         model = \"openai:fake\"\nno_stream = true\nworkspace = \"work-daily\"\ntries = 1\n\
         timezone = \"Pacific/Auckland\"\nmax_cost_per_day = 10\n",
    )
    .unwrap();
    let ended = |f: &Fleet| {
        f.pg.one("SELECT count(*) FROM runs WHERE status <> 'running'")
            .parse::<u32>()
            .unwrap()
    };
    let a = priced_daemon(&mut f, 0, &server, &config);
    serving(&f, 0);
    let (code, text) = f.out(2, &["trigger", "daily", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    until("run 1 ends", 20, || ended(&f) == 1);
    assert_eq!(stop(a), 0);
    let b = priced_daemon(&mut f, 1, &server, &config);
    serving(&f, 1);
    let (code, text) = f.out(2, &["trigger", "daily", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    until("run 2 ends", 20, || ended(&f) == 2);
    stop(b);
    let logs = f.logs();
    let row = |host: &str| {
        f.pg.rows(&format!(
            "SELECT status, stop_reason, cost::text, answer FROM runs WHERE host = '{host}'"
        ))
        .into_iter()
        .next()
        .unwrap_or_default()
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect::<Vec<_>>()
    };
    assert_eq!(row("m0"), ["achieved", "final", "6", "finished"], "{logs}");
    assert_eq!(row("m1")[..3], ["unfinished", "cost", "3"], "{logs}");
    assert_eq!(server.requests().len(), 3, "run 2 made one call, not two");
    let prompt = |host: &str| {
        f.pg.one(&format!(
            "SELECT e.event->>'prompt' FROM events e JOIN runs r ON r.id = e.run_id
             WHERE r.host = '{host}' AND e.event->>'type' = 'run_started'"
        ))
    };
    assert_eq!(prompt("m0"), "Last time: nothing.");
    assert_eq!(prompt("m1"), "Last time: finished (achieved).", "{logs}");
    // The history shows the cost, from any machine.
    let (code, text) = f.out(2, &["runs"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("$6.0000"), "{text}");
}

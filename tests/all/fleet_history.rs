//! A fleet's history and answers across machines, through the binary against PostgreSQL: a
//! run waiting for approval hears the answer through `NOTIFY`; `max_cost_per_day` and
//! `previous.answer` hold across daemons; `sup status`, `sup serve` and `sup service install`
//! with `--store`.

use std::path::Path;
use std::process::Stdio;

use crate::common::{Killed, SpawnKilled, stop, until};

use crate::common;
use crate::fleet::Fleet;
use crate::unattended::priced_turn;
use common::fake_server::FakeServer;

/// A daemon on machine `m` that reaches the fake provider and prices its model.
fn priced_daemon(f: &mut Fleet, m: usize, server: &FakeServer, config: &Path) -> Killed {
    let log = std::fs::File::create(f.log(m)).unwrap();
    f.sup(m)
        .env("SUP_CONFIG", config)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("OPENAI_API_KEY", "sk-test")
        .args(["daemon", "--goals", "."])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn_killed()
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

/// Goal `w`, whose one `write_file` call waits in the queue for a yes, and machine 0's
/// daemon serving it.
fn queued_write(f: &mut Fleet) -> Killed {
    f.goal_turns(
        "w",
        None,
        r#"[{"tool_calls": [{"name": "write_file", "input": {"path": "made.txt", "content": "x"}}]}, {"text": "written"}]"#,
        "approval = \"queue\"\napproval_timeout = \"1h\"",
    );
    let d = f.daemon(0, &[]);
    serving(f, 0);
    d
}

#[test]
fn a_waiting_run_hears_its_answer_through_notify() {
    let mut f = Fleet::new();
    let d = queued_write(&mut f);
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

#[test]
fn sup_status_with_a_store_judges_by_the_fleets_runs() {
    let mut f = Fleet::new();
    f.goal("good", None, 0, "");
    f.goal("bad", None, 0, "[[check]]\nrun = \"false\"");
    for g in ["good", "bad"] {
        let (code, text) = f.out(0, &["trigger", g, "--goals", "."]);
        assert!(code == 0 || code == 1, "{text}");
    }
    // Machine 1 has no local history: what it says comes from the store.
    let (code, text) = f.out(1, &["status", "--goals", "."]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("✓ good · last achieved (manual"), "{text}");
    assert!(text.contains("✗ bad · last failed (manual"), "{text}");
    let (code, text) = f.out(1, &["status", "--goals", ".", "--json"]);
    assert_eq!(code, 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["healthy"], false);
    std::fs::remove_file(f.goals.path().join("bad.toml")).unwrap();
    let (code, text) = f.out(1, &["status", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    // A scheduled goal whose occurrences nobody ran is overdue: its file is older than its
    // last occurrence, and the store has no occurrence for it.
    f.goal("nightly", Some("0 0 * * *"), 0, "");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3 * 86_400);
    std::fs::File::options()
        .write(true)
        .open(f.goals.path().join("nightly.toml"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let (code, text) = f.out(1, &["status", "--goals", "."]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("✗ nightly · never run · OVERDUE"), "{text}");
}

#[test]
fn the_web_console_on_a_store_lists_shows_and_answers_for_the_fleet() {
    use crate::web::{console, csrf_of, get, http, sign_in};
    let mut f = Fleet::new();
    let d = queued_write(&mut f);
    // The console runs on machine 1, which runs nothing itself.
    let mut cmd = f.sup(1);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--goals", "."]);
    let c = console(cmd);
    let (code, text) = f.out(2, &["trigger", "w", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    let mut id = String::new();
    until("an approval request in the store", 20, || {
        id =
            f.pg.one("SELECT id FROM approvals WHERE status = 'pending'");
        !id.is_empty()
    });
    let page = get(&c.addr, "/approvals", None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(&id), "{}", page.body);
    assert!(page.body.contains("made.txt"), "{}", page.body);
    let cookie = sign_in(&c.addr, "ada", None);
    let csrf = csrf_of(&get(&c.addr, "/approvals", Some(&cookie)).body);
    let approve = format!("/approvals/{id}/approve");
    let r = http(
        &c.addr,
        "POST",
        &approve,
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    until("the approved run ends", 15, || {
        f.pg.one("SELECT status FROM runs WHERE goal = 'w'") != "running"
    });
    let logs = f.logs();
    let run = f.pg.one("SELECT id FROM runs WHERE goal = 'w'");
    assert_eq!(
        f.pg.one("SELECT status FROM runs WHERE goal = 'w'"),
        "achieved",
        "{logs}"
    );
    assert_eq!(
        f.pg.one(&format!(
            "SELECT decided_by FROM approvals WHERE id = '{id}'"
        )),
        "web:ada"
    );
    // Answered twice: a conflict that says who answered.
    let r = http(
        &c.addr,
        "POST",
        &approve,
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("web:ada"), "{}", r.body);
    let page = get(&c.addr, "/approvals", None);
    assert!(
        page.body.contains("No approval requests are waiting"),
        "{}",
        page.body
    );
    assert!(page.body.contains("web:ada"), "{}", page.body);
    // The runs list and the run, with its transcript from the store.
    let page = get(&c.addr, "/runs", None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains(&run) && page.body.contains("achieved"),
        "{}",
        page.body
    );
    let page = get(&c.addr, &format!("/runs/{run}"), None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("write_file"), "{}", page.body);
    assert!(page.body.contains("written"), "{}", page.body);
    assert!(page.body.contains("<dd>m0</dd>"), "{}", page.body);
    // The transcript from an offset, as server-sent events, ends with the run's end.
    let page = get(&c.addr, &format!("/runs/{run}/events?from=0"), None);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("event: line"), "{}", page.body);
    assert!(page.body.contains("event: end"), "{}", page.body);
    assert_eq!(get(&c.addr, "/runs/no-such-run", None).status, 404);
    // Goals, with the fleet's verdict; pausing goes to the store.
    let page = get(&c.addr, "/goals", Some(&cookie));
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(&format!("run {run}")), "{}", page.body);
    let r = http(
        &c.addr,
        "POST",
        "/goals/w/pause",
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(
        f.pg.one("SELECT paused FROM goal_state WHERE goal = 'w'"),
        "t"
    );
    stop(d);
}

#[test]
fn service_install_keeps_a_store_password_out_of_the_unit() {
    use std::os::unix::fs::PermissionsExt;
    let env = common::Env::new();
    let config = env.home.path().join("xdg");
    let goals = env.home.path().join("goals");
    std::fs::create_dir_all(&goals).unwrap();
    let install = |store: &str| {
        let o = env
            .sup()
            .env("XDG_CONFIG_HOME", &config)
            .env("SUP_STORE", store)
            .args(["service", "install", "--user", "--no-enable", "--goals"])
            .arg(&goals)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::read_to_string(config.join("systemd/user/sup.service")).unwrap()
    };
    let secrets = config.join("sup/env");
    let unit = install("postgres://sup:s3cret-pass@127.0.0.1:5432/fleet");
    assert!(!unit.contains("s3cret"), "{unit}");
    assert!(!unit.contains("Environment=SUP_STORE"), "{unit}");
    assert!(
        unit.contains(&format!("EnvironmentFile=-{}", secrets.display())),
        "{unit}"
    );
    let text = std::fs::read_to_string(&secrets).unwrap();
    assert!(
        text.contains("SUP_STORE=postgres://sup:s3cret-pass@127.0.0.1:5432/fleet"),
        "{text}"
    );
    let mode = std::fs::metadata(&secrets).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Without a password the URL is in the unit, and the old one leaves the secrets file,
    // which would override it.
    std::fs::write(&secrets, format!("OPENAI_API_KEY=sk-x\n{text}")).unwrap();
    let unit = install("postgres://sup@127.0.0.1:5432/fleet");
    assert!(
        unit.contains("Environment=SUP_STORE=postgres://sup@127.0.0.1:5432/fleet"),
        "{unit}"
    );
    let text = std::fs::read_to_string(&secrets).unwrap();
    assert_eq!(text, "OPENAI_API_KEY=sk-x\n");
}

#[test]
fn a_fleet_daemon_with_serve_shows_the_fleets_runs() {
    use crate::web::{console, get};
    let mut f = Fleet::new();
    f.goal("once", None, 0, "");
    let mut cmd = f.sup(0);
    cmd.args(["daemon", "--goals", ".", "--serve", "127.0.0.1:0"]);
    let c = console(cmd);
    serving(&f, 0);
    // Machine 1 triggers; the daemon on machine 0 runs it.
    let (code, text) = f.out(1, &["trigger", "once", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    until("the run ends", 20, || {
        f.pg.one("SELECT count(*) FROM runs WHERE status = 'achieved'") == "1"
    });
    let run = f.pg.one("SELECT id FROM runs");
    let page = get(&c.addr, "/runs", None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(&run), "{}", page.body);
}

#[test]
fn a_store_of_schema_1_is_migrated_to_keep_cost_and_answer() {
    let mut f = Fleet::new();
    // As the first fleet release left it.
    f.pg.exec(
        "ALTER TABLE runs DROP COLUMN cost; ALTER TABLE runs DROP COLUMN answer;
         ALTER TABLE runs DROP COLUMN continued_from, DROP COLUMN parent,
             DROP COLUMN attempt, DROP COLUMN branch, DROP COLUMN base_commit,
             DROP COLUMN commit_sha, DROP COLUMN diff_stat, DROP COLUMN repo;
         ALTER TABLE triggers DROP COLUMN payload; DROP TABLE webhook_deliveries;
         UPDATE sup_schema SET version = 1",
    );
    f.goal("once", None, 0, "");
    let (code, text) = f.out(0, &["trigger", "once", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(f.pg.one("SELECT version FROM sup_schema"), "4");
    assert_eq!(f.pg.one("SELECT answer FROM runs"), "done");
}

#[test]
fn a_fleet_runs_worktree_branch_and_base_are_in_the_store_for_every_machine() {
    let mut f = Fleet::new();
    let ws = f.goals.path().join("work-wt");
    std::fs::create_dir_all(&ws).unwrap();
    let init: &[&[&str]] = &[
        &["init", "-q", "-b", "main"],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "first",
        ],
    ];
    for args in init {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(&ws)
            .args(*args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }
    f.goal("wt", None, 0, "isolation = \"worktree\"");
    let (code, text) = f.out(0, &["trigger", "wt", "--goals", "."]);
    assert_eq!(code, 0, "{text}");
    let branch = f.pg.one("SELECT branch FROM runs");
    assert!(branch.starts_with("sup/wt/"), "{branch:?}\n{text}");
    // Another machine reads the lineage and worktree from the store.
    let out = f.sup(1).args(["runs", "--json"]).output().unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs[0]["branch"], branch.as_str(), "{runs}");
    assert!(
        runs[0]["base"].as_str().is_some_and(|b| b.len() == 40),
        "{runs}"
    );
}

//! The console's health at a glance, through the binary: the goals page shows whether a goal
//! is overdue (as `sup status` judges it), failing or healthy, whether a daemon serves it,
//! and a chart of its last runs drawn on the server as SVG; a run's page shows its waiting
//! requests with their buttons, a rerun button and each step's time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::common::{Env, eventually};
use crate::web::{console, csrf_of, get, http, sign_in};

/// A goals folder beside the workspace, with `name.toml` scripted by `name.json`.
fn goal(env: &Env, name: &str, extra: &str, turns: serde_json::Value) -> PathBuf {
    let dir = env.home.path().join("goals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.json")), turns.to_string()).unwrap();
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!(
            "prompt = \"work\"\nmodel = \"script:{name}.json\"\nworkspace = \"{}\"\ntries = 1\n{extra}",
            env.ws().display()
        ),
    )
    .unwrap();
    dir
}

fn run_goal(env: &Env, file: &Path, args: &[&str]) -> i32 {
    env.sup()
        .args(["goal", "--file"])
        .arg(file)
        .args(args)
        .output()
        .unwrap()
        .status
        .code()
        .unwrap()
}

fn serve(env: &Env, dir: &Path) -> crate::web::Console {
    let mut cmd = env.sup();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--goals"])
        .arg(dir);
    console(cmd)
}

/// The goal's `<section>` of the goals page.
fn section(page: &str, name: &str) -> String {
    let start = page
        .find(&format!("id=\"goal-{name}\""))
        .unwrap_or_else(|| panic!("no section of {name}: {page}"));
    let rest = &page[start..];
    rest[..rest.find("</section>").unwrap_or(rest.len())].to_string()
}

#[test]
fn the_goals_page_shows_overdue_failing_and_healthy_goals_with_a_chart_of_their_runs() {
    let env = Env::new();
    // Due every minute, its file written an hour ago, nothing ran: overdue.
    let dir = goal(
        &env,
        "late",
        "schedule = \"* * * * *\"\n",
        json!([{"text": "x"}]),
    );
    let late = dir.join("late.toml");
    assert!(
        Command::new("touch")
            .args(["-d", "1 hour ago"])
            .arg(&late)
            .status()
            .unwrap()
            .success()
    );
    // Two achieved runs, then a failed one: failing, with three bars.
    goal(
        &env,
        "flaky",
        "",
        json!([{"text": "a"}, {"text": "b"}, {"text": "c"}]),
    );
    let flaky = dir.join("flaky.toml");
    assert_eq!(run_goal(&env, &flaky, &["--check-cmd", "true"]), 0);
    assert_eq!(run_goal(&env, &flaky, &["--check-cmd", "true"]), 0);
    assert_eq!(run_goal(&env, &flaky, &["--check-cmd", "false"]), 1);
    // One achieved run and no schedule: healthy.
    goal(&env, "fine", "", json!([{"text": "ok"}]));
    assert_eq!(run_goal(&env, &dir.join("fine.toml"), &[]), 0);

    let c = serve(&env, &dir);
    let page = get(&c.addr, "/goals", None);
    assert_eq!(page.status, 200, "{}", page.body);

    let s = section(&page.body, "late");
    assert!(s.contains("badge failed\">overdue"), "{s}");
    assert!(s.contains("has no verdict"), "{s}");
    assert!(s.contains("no runs yet"), "{s}");
    assert!(
        s.contains("not known to a console alone"),
        "`sup serve` alone cannot see a local daemon: {s}"
    );

    let s = section(&page.body, "flaky");
    assert!(s.contains("badge failed\">failing"), "{s}");
    assert!(s.contains("<svg class=\"history\""), "{s}");
    assert_eq!(s.matches("<rect class=\"bar achieved\"").count(), 2, "{s}");
    assert_eq!(s.matches("<rect class=\"bar failed\"").count(), 1, "{s}");
    assert!(s.contains("3 runs · 2 achieved"), "{s}");
    // Oldest on the left: the failed run, the newest, is the last bar.
    let last_bar = s.rfind("<rect class=\"bar").unwrap();
    assert!(
        s[last_bar..].starts_with("<rect class=\"bar failed\""),
        "{s}"
    );

    let s = section(&page.body, "fine");
    assert!(s.contains("badge achieved\">healthy"), "{s}");
    assert_eq!(s.matches("<rect class=\"bar achieved\"").count(), 1, "{s}");

    // `sup status` says the same of the overdue goal.
    let out = env
        .sup()
        .args(["status", "--json", "--goals"])
        .arg(&dir)
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let late = status["goals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "late")
        .unwrap();
    assert_eq!(late["overdue"], true);
}

#[test]
fn a_daemons_own_console_says_its_daemon_is_alive() {
    let env = Env::new();
    let dir = goal(&env, "solo", "", json!([{"text": "x"}]));
    let mut cmd = env.sup();
    cmd.args(["daemon", "--serve", "127.0.0.1:0", "--goals"])
        .arg(&dir);
    let c = console(cmd);
    let page = get(&c.addr, "/goals", None);
    let s = section(&page.body, "solo");
    assert!(s.contains("daemon alive\">alive"), "{s}");
}

#[test]
fn a_runs_page_answers_its_waiting_request_shows_step_times_and_reruns_its_goal() {
    let env = Env::new();
    let dir = goal(
        &env,
        "asks",
        "approval = \"queue\"\n",
        json!([
            {"tool_calls": [{"id": "w", "name": "write_file", "input": {"path": "asked.txt", "content": "yes\n"}}]},
            {"text": "written"},
            {"text": "again"}
        ]),
    );
    let c = serve(&env, &dir);
    let cookie = sign_in(&c.addr, "ann", None);
    let mut run = env
        .sup()
        .args(["goal", "--json", "--approval", "queue", "--file"])
        .arg(dir.join("asks.toml"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let run_id = eventually(Duration::from_secs(20), "the waiting request", || {
        let out = env.sup().args(["approvals", "--json"]).output().unwrap();
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
        rows.first()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
    });
    let page = get(&c.addr, &format!("/runs/{run_id}"), Some(&cookie));
    assert!(page.body.contains("Waiting for a person"), "{}", page.body);
    assert!(page.body.contains("asked.txt"), "{}", page.body);
    let csrf = csrf_of(&page.body);
    let id = {
        let at = page.body.find("action=\"/approvals/").unwrap() + "action=\"/approvals/".len();
        let rest = &page.body[at..];
        rest[..rest.find('/').unwrap()].to_string()
    };
    let r = http(
        &c.addr,
        "POST",
        &format!("/approvals/{id}/approve"),
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 303);
    assert!(run.wait().unwrap().success());
    assert_eq!(
        std::fs::read_to_string(env.ws().join("asked.txt")).unwrap(),
        "yes\n"
    );

    let page = get(&c.addr, &format!("/runs/{run_id}"), Some(&cookie));
    assert!(!page.body.contains("Waiting for a person"), "answered");
    let steps = {
        let at = page
            .body
            .find("<table class=\"steps\"")
            .expect("a steps table");
        let rest = &page.body[at..];
        rest[..rest.find("</table>").unwrap()].to_string()
    };
    assert_eq!(
        steps.matches("<tr><td>").count(),
        2,
        "two steps, each timed: {steps}"
    );
    assert!(steps.contains("ms</td>"), "{steps}");
    assert!(page.body.contains("Run asks again"), "{}", page.body);
    // The rerun plays a script that asks for nothing, so that it ends by itself.
    std::fs::write(
        dir.join("asks.json"),
        json!([{"text": "again"}]).to_string(),
    )
    .unwrap();
    let r = http(
        &c.addr,
        "POST",
        "/goals/asks/trigger",
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 303);
    eventually(Duration::from_secs(20), "the rerun", || {
        let out = env.sup().args(["runs", "--json"]).output().unwrap();
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
        (rows.len() == 2 && rows.iter().all(|r| r["status"] == "achieved")).then_some(())
    });
}

#[test]
fn a_runs_page_shows_the_diff_of_each_write_redacted() {
    let env = Env::new();
    const TOKEN: &str = "s3cr3t-token-value-42";
    env.write("notes.txt", &format!("token={TOKEN}\nold line\nkept\n"));
    let dir = goal(
        &env,
        "writes",
        "env_pass = [\"DIFF_TEST_TOKEN\"]\n",
        json!([
            {"tool_calls": [
                {"id": "w1", "name": "write_file", "input": {"path": "notes.txt", "content": format!("token={TOKEN}\nnew line\nkept\n")}},
                {"id": "w2", "name": "write_file", "input": {"path": "fresh.txt", "content": "first\n"}}
            ]},
            {"text": "written"}
        ]),
    );
    let out = env
        .sup()
        .env("DIFF_TEST_TOKEN", TOKEN)
        .args(["goal", "--json", "--file"])
        .arg(dir.join("writes.toml"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = crate::common::Run::new(out);
    let run_id = run.result()["run_id"].as_str().unwrap().to_string();
    let c = serve(&env, &dir);
    let page = get(&c.addr, &format!("/runs/{run_id}"), None).body;
    let diffs: Vec<&str> = page
        .split("<details class=\"diff\" open>")
        .skip(1)
        .collect();
    assert_eq!(diffs.len(), 2, "a diff for each write: {page}");
    assert!(
        diffs[0].contains(r#"<span class="del">-old line</span>"#),
        "{}",
        diffs[0]
    );
    assert!(
        diffs[0].contains(r#"<span class="add">+new line</span>"#),
        "{}",
        diffs[0]
    );
    assert!(
        diffs[0].contains(r#"<span class="same"> kept</span>"#),
        "{}",
        diffs[0]
    );
    assert!(
        diffs[1].contains(r#"<span class="add">+first</span>"#),
        "{}",
        diffs[1]
    );
    assert!(!page.contains(TOKEN), "the secret is on the page");
    assert!(diffs[0].contains("token=[redacted]"), "{}", diffs[0]);
}

//! The verify loop through the binary: checks, retries, failure reports, goal files.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{Env, Run, user_messages};
use serde_json::{Value, json};

fn write_turn(path: &str, content: &str) -> Value {
    json!({"tool_calls": [{"name": "write_file", "input": {"path": path, "content": content}}]})
}

fn say(text: &str) -> Value {
    json!({"text": text})
}

/// `sup goal PROMPT --model script:… --json ARGS…`.
fn goal(env: &Env, turns: Value, args: &[&str]) -> Run {
    env.json(&["goal", "make it so"], turns, args)
}

/// A check script in the workspace: passes when `out.txt` has two lines.
fn two_lines_check(env: &Env) {
    env.write(
        "check.sh",
        "n=$(wc -l < out.txt 2>/dev/null || echo 0)\n\
         if [ \"$n\" -ne 2 ]; then echo \"want 2 lines in out.txt, got $n\"; exit 1; fi\n",
    );
}

#[test]
fn passing_on_the_first_try() {
    let env = Env::new();
    let run = goal(
        &env,
        json!([write_turn("out.txt", "x\n"), say("done")]),
        &["--check-cmd", "test -f out.txt"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let r = run.result();
    assert_eq!(r["status"], "achieved");
    assert_eq!(r["tries"], 1);
    let check = &r["checks"][0][0];
    assert_eq!(check["name"], "test -f out.txt");
    assert_eq!(check["passed"], true);
    assert_eq!(check["exit_status"], 0);
    assert!(check["duration_ms"].is_u64());
}

#[test]
fn the_human_trace_says_goal_achieved_and_the_tries() {
    let env = Env::new();
    two_lines_check(&env);
    let run = env.human(
        &["goal", "two lines"],
        json!([
            write_turn("out.txt", "one\n"),
            say("done"),
            write_turn("out.txt", "one\ntwo\n"),
            say("fixed")
        ]),
        &["--check", "check.sh"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("◆ Goal achieved · 2 tries"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout, "fixed\n");
}

#[test]
fn failing_then_passing_shows_the_model_the_failure_report() {
    let env = Env::new();
    two_lines_check(&env);
    let run = goal(
        &env,
        json!([
            write_turn("out.txt", "one\n"),
            say("done"),
            write_turn("out.txt", "one\ntwo\n"),
            say("fixed")
        ]),
        &["--check", "check.sh", "--tries", "3"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["tries"], 2);
    assert_eq!(run.result()["checks"][0][0]["passed"], false);
    assert_eq!(run.result()["checks"][1][0]["passed"], true);
    let users = user_messages(&env.transcript());
    assert_eq!(users.len(), 2, "the prompt, then the failure report");
    let report = &users[1];
    assert!(report.contains("check.sh"), "{report}");
    assert!(report.contains("exit 1"), "{report}");
    assert!(
        report.contains("want 2 lines in out.txt, got 1"),
        "{report}"
    );
    assert!(report.contains("do not change the checks"), "{report}");
    assert!(report.contains("whole output"), "{report}");
}

#[test]
fn never_passing_is_exit_1_after_all_tries() {
    let env = Env::new();
    let run = goal(
        &env,
        json!([say("one"), say("two")]),
        &["--check-cmd", "echo nope; exit 5", "--tries", "2"],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let r = run.result();
    assert_eq!(r["status"], "failed");
    assert_eq!(r["stop_reason"], "checks_failed");
    assert_eq!(r["tries"], 2);
    assert_eq!(r["checks"][1][0]["exit_status"], 5);
}

#[test]
fn the_human_trace_names_the_failing_checks() {
    let env = Env::new();
    let run = env.human(
        &["goal", "x"],
        json!([say("one")]),
        &[
            "--check-cmd",
            "false",
            "--check-cmd",
            "true",
            "--tries",
            "1",
        ],
    );
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("Goal not achieved · 1 try · checks still failing: false"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout, "");
}

#[test]
fn a_check_that_hangs_times_out() {
    let env = Env::new();
    let started = Instant::now();
    let run = goal(
        &env,
        json!([say("done")]),
        &[
            "--check-cmd",
            "sleep 60",
            "--check-timeout",
            "1s",
            "--tries",
            "1",
        ],
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(run.code, 1, "{}", run.stderr);
    let c = &run.result()["checks"][0][0];
    assert_eq!(c["outcome"], "timed out after 1s");
    assert!(c["exit_status"].is_null());
}

#[test]
fn the_agent_cannot_overwrite_a_check() {
    let env = Env::new();
    env.write("checks/ok.sh", "test -f done.txt\n");
    let run = goal(
        &env,
        json!([
            {"tool_calls": [
                {"id": "w", "name": "write_file", "input": {"path": "checks/ok.sh", "content": "exit 0\n"}},
                {"id": "e", "name": "edit_file", "input": {"path": "./checks/../checks/ok.sh", "old_string": "test", "new_string": "true ||"}}
            ]},
            write_turn("done.txt", "yes"),
            say("done")
        ]),
        &["--check", "checks/ok.sh"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    for id in ["w", "e"] {
        let r = run.tool_result(id);
        assert_eq!(r["is_error"], true);
        assert!(r["content"].as_str().unwrap().contains("read-only"), "{r}");
    }
    assert_eq!(
        std::fs::read_to_string(env.ws.path().join("checks/ok.sh")).unwrap(),
        "test -f done.txt\n"
    );
}

#[test]
fn a_check_changed_behind_its_back_fails_the_goal() {
    let env = Env::new();
    env.write("check.sh", "exit 1\n");
    let run = goal(
        &env,
        json!([
            {"tool_calls": [{"name": "run_command", "input": {"command": "echo 'exit 0' > check.sh"}}]},
            say("done")
        ]),
        // The sandbox makes the check read-only; without it the tamper report still holds.
        &["--check", "check.sh", "--sandbox", "off"],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let r = run.result();
    assert_eq!(r["status"], "failed");
    assert_eq!(r["stop_reason"], "check_changed");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("check.sh was changed"),
        "{r}"
    );
}

#[test]
fn the_human_trace_says_when_a_check_was_changed() {
    let env = Env::new();
    env.write("check.sh", "exit 1\n");
    let run = env.human(
        &["goal", "x"],
        json!([
        {"tool_calls": [{"name": "run_command", "input": {"command": "echo 'exit 0' > check.sh"}}]},
        say("done")
    ]),
        &["--check", "check.sh", "--sandbox", "off"],
    );
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("Goal not achieved") && run.stderr.contains("check.sh was changed"),
        "{}",
        run.stderr
    );
}

#[test]
fn fresh_starts_each_try_from_the_prompt_and_the_latest_report() {
    let env = Env::new();
    let run = goal(
        &env,
        json!([say("one"), say("two"), say("three")]),
        &[
            "--check-cmd",
            "echo try $SUP_TRY failed; exit 1",
            "--fresh",
            "--tries",
            "2",
        ],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let t = env.transcript();
    let msgs: Vec<&Value> = t
        .iter()
        .filter(|e| e["type"] == "message")
        .map(|e| &e["message"])
        .collect();
    // try 1: system, user, assistant; try 2: system, user (prompt + report), assistant.
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "system", "user", "assistant"]
    );
    let second = msgs[4]["content"].as_str().unwrap();
    assert!(second.starts_with("make it so"), "{second}");
    assert!(second.contains("try 1 failed"), "{second}");
}

#[test]
fn the_token_budget_counts_across_tries() {
    let env = Env::new();
    let u = json!({"input_tokens": 50, "output_tokens": 50});
    let run = goal(
        &env,
        json!([
            {"usage": u, "text": "one"},
            {"usage": u, "text": "two"},
            {"usage": u, "text": "three"},
            {"usage": u, "text": "four"}
        ]),
        &[
            "--check-cmd",
            "echo $SUP_TRY; exit 1",
            "--tries",
            "5",
            "--token-budget",
            "250",
        ],
    );
    assert_eq!(run.code, 3, "{}", run.stderr);
    let r = run.result();
    assert_eq!(r["status"], "unfinished");
    assert_eq!(r["stop_reason"], "budget");
    assert_eq!(r["usage"]["input_tokens"], 150);
    assert_eq!(r["steps"], 3);
}

#[test]
fn the_same_failure_three_times_is_no_progress() {
    let env = Env::new();
    let run = goal(
        &env,
        json!([say("1"), say("2"), say("3"), say("4"), say("5")]),
        &[
            "--check-cmd",
            "echo always the same; exit 1",
            "--tries",
            "5",
        ],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let r = run.result();
    assert_eq!(r["stop_reason"], "no_progress");
    assert_eq!(r["tries"], 3);
}

#[test]
fn a_limit_inside_a_try_is_recorded_and_the_checks_still_run() {
    let env = Env::new();
    let run = goal(
        &env,
        json!([write_turn("out.txt", "x"), write_turn("more.txt", "y")]),
        &["--check-cmd", "test -f out.txt", "--max-steps", "1"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let finished = run.of_type("try_finished");
    assert_eq!(finished[0]["stop_reason"], "max_steps");
    assert_eq!(run.result()["status"], "achieved");
}

#[test]
fn checks_get_the_workspace_try_goal_run_id_and_answer() {
    let env = Env::new();
    env.write(
        "env.sh",
        "{ echo \"ws=$SUP_WORKSPACE\"; echo \"try=$SUP_TRY\"; echo \"goal=$SUP_GOAL\"; \
         echo \"run=$SUP_RUN_ID\"; echo \"answer=$(cat \"$SUP_ANSWER\")\"; echo \"pwd=$(pwd)\"; \
         read -t 1 line && echo stdin-open || echo stdin-closed; } > seen.txt\n",
    );
    let run = goal(
        &env,
        json!([say("forty-two")]),
        &["--check", "env.sh", "--name", "answer"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let seen = std::fs::read_to_string(env.ws.path().join("seen.txt")).unwrap();
    let ws = env.ws();
    assert!(seen.contains(&format!("ws={}", ws.display())), "{seen}");
    assert!(seen.contains("try=1"), "{seen}");
    assert!(seen.contains("goal=answer"), "{seen}");
    assert!(
        seen.contains(&format!("run={}", run.result()["run_id"].as_str().unwrap())),
        "{seen}"
    );
    assert!(seen.contains("answer=forty-two"), "{seen}");
    assert!(seen.contains(&format!("pwd={}", ws.display())), "{seen}");
    assert!(seen.contains("stdin-closed"), "{seen}");
}

#[test]
fn a_missing_check_or_interpreter_is_exit_2_before_any_model_call() {
    let env = Env::new();
    let turns = json!([write_turn("touched.txt", "x"), say("done")]);
    let run = goal(&env, turns.clone(), &["--check", "missing.js"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("missing.js"), "{}", run.stderr);

    env.write("check.js", "process.exit(0)\n");
    let script = env.script(turns);
    let empty = tempfile::tempdir().unwrap();
    let out = env
        .sup()
        .env("PATH", empty.path())
        .args(["goal", "x", "--check", "check.js", "--model"])
        .arg(format!("script:{}", script.display()))
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("`node`"), "{}", run.stderr);
    assert!(
        !env.ws.path().join("touched.txt").exists(),
        "the model was never asked"
    );
}

fn goal_file(env: &Env, text: &str) -> std::path::PathBuf {
    let path = env.home.path().join("g.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn goal_file_error(env: &Env, text: &str) -> String {
    let path = goal_file(env, text);
    let out = env
        .sup()
        .arg("goal")
        .arg("--file")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn each_goal_file_error_names_the_file_the_key_and_the_line() {
    let env = Env::new();
    let e = goal_file_error(&env, "prompt = \"p\"\nmodel = \"script:x\"\nmax_step = 3\n");
    assert!(e.contains("g.toml:3:") && e.contains("max_step"), "{e}");
    let e = goal_file_error(&env, "prompt = \"p\"\ntries = \"many\"\n");
    assert!(e.contains("g.toml:2:") && e.contains("tries"), "{e}");
    let e = goal_file_error(
        &env,
        "prompt = \"p\"\n\n[[check]]\nrun = \"true\"\ntimeout = \"a while\"\n",
    );
    assert!(
        e.contains("g.toml:5:") && e.contains("check.timeout"),
        "{e}"
    );
    let e = goal_file_error(&env, "prompt = \"p\"\n[[check]]\nscript = \"nope.js\"\n");
    assert!(e.contains("g.toml:2:") && e.contains("nope.js"), "{e}");
    let e = goal_file_error(
        &env,
        "prompt = \"p\"\n[[tool]]\nname = \"t\"\nrisk = \"dangerous\"\ncommand = [\"x\"]\n",
    );
    assert!(e.contains("g.toml:4:") && e.contains("risk"), "{e}");
    let e = goal_file_error(&env, "prompt = \"p\"\ncatch_up = \"soonish\"\n");
    assert!(e.contains("g.toml:2:") && e.contains("catch_up"), "{e}");
    let e = goal_file_error(
        &env,
        "prompt = \"p\"\n[[check]]\nrun = \"true\"\nscript = \"x.sh\"\n",
    );
    assert!(e.contains("g.toml:2:") && e.contains("exactly one"), "{e}");
    let e = goal_file_error(&env, "prompt = \"unclosed\n");
    assert!(e.contains("g.toml:1:"), "{e}");
}

#[test]
fn flags_override_the_goal_file() {
    let env = Env::new();
    let script = env.script(json!([say("one"), say("two"), say("three")]));
    let path = goal_file(
        &env,
        &format!(
            "prompt = \"from the file\"\nmodel = \"script:{}\"\ntries = 1\n\
             [[check]]\nrun = \"exit 1\"\n",
            script.display()
        ),
    );
    // The file alone: one try, its check fails.
    let out = env
        .sup()
        .arg("goal")
        .arg("--file")
        .arg(&path)
        .arg("--json")
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 1);
    assert_eq!(run.result()["tries"], 1);
    // Flags: another prompt, another check, more tries, another workspace.
    let ws2 = tempfile::tempdir().unwrap();
    let out = env
        .sup()
        .arg("goal")
        .arg("from the flag")
        .arg("--file")
        .arg(&path)
        .args([
            "--tries",
            "2",
            "--check-cmd",
            "test $SUP_TRY = 2",
            "--json",
            "--workspace",
        ])
        .arg(ws2.path())
        .output()
        .unwrap();
    let run = Run::new(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.result()["tries"], 2);
    let started = &run.of_type("run_started")[0];
    assert_eq!(started["prompt"], "from the flag");
    assert_eq!(
        started["workspace"],
        std::fs::canonicalize(ws2.path())
            .unwrap()
            .display()
            .to_string()
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "work" {
                copy_dir(&entry.path(), &target);
            }
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn every_example_goal_is_achieved_offline() {
    let env = Env::new();
    let goals = env.home.path().join("goals");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("goals"), &goals);
    for (name, tries) in [("haiku", 2), ("weather", 1), ("ticket", 1)] {
        // The examples' own approval rules let them write: no `auto` here.
        let out = env
            .sup()
            .env_remove("SUP_APPROVAL")
            .arg("goal")
            .arg("--file")
            .arg(goals.join(format!("{name}.toml")))
            .arg("--json")
            .output()
            .unwrap();
        let run = Run::new(out);
        assert_eq!(run.code, 0, "{name}: {}", run.stderr);
        assert_eq!(run.result()["status"], "achieved", "{name}");
        assert_eq!(run.result()["tries"], tries, "{name}");
    }
    let haiku = std::fs::read_to_string(goals.join("work/haiku/haiku.txt")).unwrap();
    assert!(haiku.contains("循环"));
}

#[test]
fn the_model_comes_from_the_flag_then_the_goal_file_then_sup_model() {
    let env = Env::new();
    let from_file = env.script(json!([say("from the file")]));
    let from_env = env.script(json!([say("from SUP_MODEL")]));
    let from_flag = env.script(json!([say("from the flag")]));
    let with_model = goal_file(
        &env,
        &format!(
            "prompt = \"p\"\nmodel = \"script:{}\"\n",
            from_file.display()
        ),
    );
    let answer = |file: &Path, flag: Option<&Path>| {
        let mut cmd = env.sup();
        cmd.env("SUP_MODEL", format!("script:{}", from_env.display()))
            .arg("goal")
            .arg("--file")
            .arg(file);
        if let Some(f) = flag {
            cmd.arg("--model").arg(format!("script:{}", f.display()));
        }
        String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
    };
    assert_eq!(answer(&with_model, None), "from the file\n");
    assert_eq!(answer(&with_model, Some(&from_flag)), "from the flag\n");
    let without = env.home.path().join("plain.toml");
    std::fs::write(&without, "prompt = \"p\"\n").unwrap();
    assert_eq!(answer(&without, None), "from SUP_MODEL\n");
    // A bad SUP_APPROVAL is named.
    let out = env
        .sup()
        .env("SUP_APPROVAL", "sometimes")
        .args(["run", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SUP_APPROVAL"));
}

//! The configuration pipeline through the binary: goal-file keys that were flags only
//! (`output_cap`, `check_timeout`), a command tool's own `timeout`, the user config as the
//! lowest layer, and enum values that say what is allowed.

use crate::common::{Env, Run};
use serde_json::json;

fn goal_file(env: &Env, text: &str) -> std::path::PathBuf {
    let path = env.home.path().join("g.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn goal(env: &Env, file: &std::path::Path, args: &[&str]) -> Run {
    let out = env
        .sup()
        .arg("goal")
        .arg("--file")
        .arg(file)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    Run::new(out)
}

#[test]
fn a_command_tool_has_its_own_timeout() {
    let env = Env::new();
    let script = env.script(json!([
        {"tool_calls": [{"id": "slow", "name": "slow", "input": {}}]},
        {"text": "ok"}
    ]));
    let file = goal_file(
        &env,
        &format!(
            "prompt = \"p\"\nmodel = \"script:{}\"\ntool_timeout = \"60s\"\n\
             [[tool]]\nname = \"slow\"\ncommand = [\"sleep\", \"30\"]\ntimeout = \"1s\"\n",
            script.display()
        ),
    );
    let started = std::time::Instant::now();
    let run = goal(&env, &file, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let r = run.tool_result("slow");
    assert_eq!(r["is_error"], true);
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains("timed out after 1s"),
        "{r}"
    );
    // Not the run's 60s.
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn output_cap_and_check_timeout_are_goal_file_keys() {
    let env = Env::new();
    env.write("big.txt", &"x".repeat(5000));
    let script = env.script(json!([
        {"tool_calls": [{"id": "r", "name": "read_file", "input": {"path": "big.txt"}}]},
        {"text": "done"}
    ]));
    let file = goal_file(
        &env,
        &format!(
            "prompt = \"p\"\nmodel = \"script:{}\"\noutput_cap = 1000\ncheck_timeout = \"1s\"\n\
             tries = 1\n[[check]]\nrun = \"sleep 20\"\n",
            script.display()
        ),
    );
    let run = goal(&env, &file, &[]);
    let content = run.tool_result("r")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(content.len() < 1500, "capped at 1000: {}", content.len());
    assert!(content.contains("cut from the middle"), "{content}");
    assert_eq!(run.code, 1, "{}", run.stderr);
    let check = &run.of_type("check")[0];
    assert!(
        check["outcome"].as_str().unwrap().contains("timed out"),
        "{check}"
    );
}

#[test]
fn the_user_config_is_the_lowest_layer() {
    let env = Env::new();
    let script = env.script(json!([
        {"tool_calls": [{"id": "1", "name": "list_files", "input": {"path": "."}}]},
        {"tool_calls": [{"id": "2", "name": "list_files", "input": {"path": ".."}}]},
        {"text": "done"}
    ]));
    let config = env.home.path().join("config.toml");
    std::fs::write(
        &config,
        format!("model = \"script:{}\"\nmax_steps = 1\n", script.display()),
    )
    .unwrap();
    let user = |args: &[&str]| {
        let out = env
            .sup()
            .env("SUP_CONFIG", &config)
            .args(["run", "x", "--json"])
            .args(args)
            .output()
            .unwrap();
        Run::new(out)
    };
    // The user config gives the model and one step.
    let run = user(&[]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.result()["stop_reason"], "max_steps");
    // A flag beats it.
    let run = user(&["--max-steps", "5"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // A goal's key in the user config is refused, naming the key.
    std::fs::write(&config, "prompt = \"p\"\n").unwrap();
    let run = user(&[]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("`prompt`"), "{}", run.stderr);
}

#[test]
fn the_user_config_is_checked_like_a_goal_file() {
    let env = Env::new();
    let dir = env.home.path().join("cfg");
    std::fs::create_dir_all(dir.join("cache")).unwrap();
    let config = dir.join("config.toml");
    let run = |config_text: &str, turns: serde_json::Value| {
        std::fs::write(&config, config_text).unwrap();
        let script = env.script(turns);
        let out = env
            .sup()
            .env("SUP_CONFIG", &config)
            .env("SUP_SANDBOX", "workspace-write")
            .args(["run", "x", "--json", "--model"])
            .arg(format!("script:{}", script.display()))
            .output()
            .unwrap();
        Run::new(out)
    };
    // A rule that does not parse names the config file and its line, as in a goal file.
    let r = run(
        "max_steps = 3\n\n[approval_rules]\nallow = [\"run_command(ls\"]\n",
        json!([{"text": "done"}]),
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("config.toml:4:") && r.stderr.contains("approval_rules.allow"),
        "{}",
        r.stderr
    );
    // `writable` is relative to the config file's folder, not to where sup was started.
    let target = dir.join("cache/out.txt");
    let r = run(
        "writable = [\"cache\"]\n",
        json!([
            {"tool_calls": [{"id": "w", "name": "run_command",
                "input": {"command": format!("echo hi > {}", target.display())}}]},
            {"text": "done"}
        ]),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.tool_result("w")["is_error"], false, "{}", r.stdout);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "hi\n");
    // A folder that does not exist names the file and line too.
    let r = run("\nwritable = [\"nowhere\"]\n", json!([{"text": "done"}]));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("config.toml:2:"), "{}", r.stderr);
}

#[test]
fn a_bad_enum_value_names_the_key_and_the_choices() {
    let env = Env::new();
    let file = goal_file(&env, "prompt = \"p\"\n\napproval = \"sometimes\"\n");
    let run = goal(&env, &file, &[]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("g.toml:3:")
            && run.stderr.contains("approval")
            && run.stderr.contains("never"),
        "{}",
        run.stderr
    );
    let out = env
        .sup()
        .args(["run", "x", "--approval", "sometimes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("sometimes") && e.contains("queue"), "{e}");
}

#[test]
fn a_broken_store_is_not_bad_usage() {
    let env = Env::new();
    // A folder where the database file should be: the store cannot open.
    std::fs::create_dir_all(env.home.path().join("sup.db")).unwrap();
    let out = env.sup().args(["runs"]).output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{e}");
    assert!(e.contains("sup.db"), "{e}");
    // An unknown run is still the user's mistake.
    let env = Env::new();
    let out = env.sup().args(["show", "no-such-run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

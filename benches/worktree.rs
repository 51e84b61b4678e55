//! What a git worktree adds to a run: `sup goal` (a scripted model that answers at once, one
//! check `true`) on a repository of 10,000 committed files, in the workspace itself and with
//! `--isolation worktree` (a worktree made from HEAD, the work committed on a branch, the
//! folder removed). The runs alternate so load weighs on both alike; the medians and their
//! difference are printed beside the target. Run: `cargo bench --bench worktree`
//! (`SUP_BENCH_RUNS=N` for more or fewer runs of each).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const FILES: usize = 10_000;
/// What the worktree may add to a run (median), in milliseconds.
const TARGET_MS: f64 = 300.0;

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
        .status
        .success();
    assert!(ok, "git {args:?}");
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

fn main() {
    let runs: usize = std::env::var("SUP_BENCH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(9);
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let home = tmp.path().join("home");
    for i in 0..FILES {
        let dir = repo.join(format!("src/m{:03}", i / 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(
        &repo,
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-q",
            "-m",
            "files",
        ],
    );
    let script = tmp.path().join("turns.json");
    std::fs::write(&script, r#"[{"text": "done"}]"#).unwrap();
    // SUP_HOME on the repository's disk (as it is by default), and, where there is one, on
    // a tmpfs: the worktree's files are made and removed there, which is most of its cost.
    measure(
        &repo,
        &home,
        tmp.path(),
        &script,
        runs,
        "SUP_HOME beside the repository",
    );
    if Path::new("/dev/shm").is_dir() {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        measure(
            &repo,
            shm.path(),
            tmp.path(),
            &script,
            runs,
            "SUP_HOME on a tmpfs",
        );
    }
}

fn measure(repo: &Path, home: &Path, tmp: &Path, script: &Path, runs: usize, what: &str) {
    let run = |isolated: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sup"));
        cmd.env("SUP_HOME", home)
            .env("SUP_APPROVAL", "auto")
            .env("SUP_CONFIG", tmp.join("no-config.toml"))
            .current_dir(repo)
            .args(["goal", "work", "--check-cmd", "true", "--model"])
            .arg(format!("script:{}", script.display()));
        if isolated {
            cmd.args(["--isolation", "worktree", "--keep", "never"]);
        }
        let started = Instant::now();
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        started.elapsed()
    };
    // One of each first: caches warm, the store made.
    run(false);
    run(true);
    let (mut plain, mut isolated) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        plain.push(run(false));
        isolated.push(run(true));
    }
    let (p, i) = (median(plain), median(isolated));
    println!(
        "worktree, {FILES} files, {what}, {runs} runs each: run {p:.1} ms, isolated {i:.1} ms, \
         the worktree adds {:.1} ms (median; target ≤ {TARGET_MS} ms)",
        i - p
    );
}

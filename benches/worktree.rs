//! What a git worktree adds to a run, and what the protected-path snapshot costs a try, on a
//! repository of 10,000 committed files.
//! - The worktree: `sup goal` (a scripted model that answers at once, one check `true`) in
//!   the workspace itself and with `--isolation worktree` (a worktree made from HEAD, the
//!   work committed on a branch, the folder removed). The runs alternate so load weighs on
//!   both alike; the medians and their difference are printed beside the target, and beside
//!   git's own floor, measured in the same rounds: `git worktree add` (writing the 10,000
//!   files) and `git add -A` in it (git reads back every file it wrote in the same second
//!   as its index). The repository is packed, as a cloned one is.
//! - The snapshot: runs of 1 and of 3 tries (the check `false`) in the 10,000-file
//!   repository with its objects loose (10,103 files in `.git`, as after `git add` of it all)
//!   and in a one-file repository; what the big `.git` adds to each further try.
//!
//! Run: `cargo bench --bench worktree` (`SUP_BENCH_RUNS=N` for more or fewer runs of each).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const FILES: usize = 10_000;
/// What the worktree may add to a run (median), in milliseconds.
const TARGET_MS: f64 = 300.0;
/// What the protected-path snapshot may add to a try on that repository, in milliseconds.
const SNAPSHOT_TARGET_MS: f64 = 20.0;

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "-c",
            "gc.auto=0",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn timed(f: impl FnOnce()) -> Duration {
    let started = Instant::now();
    f();
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

/// A repository of `files` committed files, its objects loose.
fn repo(at: &Path, files: usize) {
    for i in 0..files {
        let dir = at.join(format!("src/m{:03}", i / 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    git(at, &["init", "-q", "-b", "main"]);
    // No `gc --auto` in the background while the runs are timed.
    git(at, &["config", "gc.auto", "0"]);
    git(at, &["add", "-A"]);
    git(at, &["commit", "-q", "-m", "files"]);
}

struct Bench<'a> {
    tmp: &'a Path,
    runs: usize,
}

impl Bench<'_> {
    /// `sup goal` in `repo` with SUP_HOME `home`: its wall time.
    fn sup(&self, repo: &Path, home: &Path, script: &Path, args: &[&str]) -> Duration {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sup"));
        cmd.env("SUP_HOME", home)
            .env("SUP_APPROVAL", "auto")
            .env("SUP_CONFIG", self.tmp.join("no-config.toml"))
            .current_dir(repo)
            .args(["goal", "work", "--model"])
            .arg(format!("script:{}", script.display()))
            .args(args);
        let started = Instant::now();
        let out = cmd.output().unwrap();
        let took = started.elapsed();
        // A run of failing checks ends unfinished (1); anything else is the bench's fault.
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        took
    }

    fn worktree(&self, repo: &Path, home: &Path, script: &Path, what: &str) {
        let plain = ["--check-cmd", "true"];
        let isolated = [
            "--check-cmd",
            "true",
            "--isolation",
            "worktree",
            "--keep",
            "never",
        ];
        let floor_at = home.join("git-floor");
        let floor = || {
            let added = timed(|| {
                git(repo, &["worktree", "add", "-q", "--detach", &s(&floor_at)]);
                git(&floor_at, &["add", "-A"]);
            });
            let removed = timed(|| git(repo, &["worktree", "remove", "--force", &s(&floor_at)]));
            (added, removed)
        };
        // One of each first: caches warm, the store made.
        self.sup(repo, home, script, &plain);
        self.sup(repo, home, script, &isolated);
        floor();
        let (mut p, mut i, mut f, mut r) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..self.runs {
            p.push(self.sup(repo, home, script, &plain));
            i.push(self.sup(repo, home, script, &isolated));
            let (added, removed) = floor();
            f.push(added);
            r.push(removed);
        }
        let (p, i, f, r) = (median(p), median(i), median(f), median(r));
        println!(
            "worktree, {FILES} files, {what}, {} runs each: run {p:.1} ms, isolated {i:.1} ms, \
             the worktree adds {:.1} ms (median; target ≤ {TARGET_MS} ms; git's own floor \
             {f:.1} ms: `worktree add` + `add -A`; the folder's removal, {r:.1} ms by \
             `git worktree remove`, is not waited for)",
            self.runs,
            i - p
        );
    }

    /// What the protected-path snapshot of `big`'s `.git` adds to the first try and to each
    /// further one, beside `small`'s.
    fn snapshot(&self, big: &Path, small: &Path, home: &Path) {
        let script = self.tmp.join("three.json");
        std::fs::write(&script, r#"[{"text": "a"}, {"text": "b"}, {"text": "c"}]"#).unwrap();
        let tries = |n: &'static str| ["--check-cmd", "false", "--tries", n];
        let mut m: [Vec<Duration>; 4] = Default::default();
        for round in 0..=self.runs {
            let t = [
                self.sup(big, home, &script, &tries("1")),
                self.sup(big, home, &script, &tries("3")),
                self.sup(small, home, &script, &tries("1")),
                self.sup(small, home, &script, &tries("3")),
            ];
            // The first round warms the caches.
            if round > 0 {
                for (v, t) in m.iter_mut().zip(t) {
                    v.push(t);
                }
            }
        }
        let [b1, b3, s1, s3] = m.map(median);
        let first = b1 - s1;
        let per_try = ((b3 - b1) - (s3 - s1)) / 2.0;
        println!(
            "protected-path snapshot, {FILES} files, {} loose objects in .git, {} runs each: \
             the first try {first:.1} ms, each further try {per_try:.1} ms beside a one-file \
             repository (median; target ≤ {SNAPSHOT_TARGET_MS} ms a try)",
            FILES + 103,
            self.runs
        );
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn main() {
    let runs: usize = std::env::var("SUP_BENCH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(9);
    let tmp = tempfile::tempdir().unwrap();
    let b = Bench {
        tmp: tmp.path(),
        runs,
    };
    let repo_at = tmp.path().join("repo");
    let small = tmp.path().join("small");
    repo(&repo_at, FILES);
    repo(&small, 1);
    b.snapshot(&repo_at, &small, &tmp.path().join("home"));
    git(&repo_at, &["gc", "-q"]);
    let script = tmp.path().join("turns.json");
    std::fs::write(&script, r#"[{"text": "done"}]"#).unwrap();
    // SUP_HOME on the repository's disk (as it is by default), and, where there is one, on
    // a tmpfs: the worktree's files are made and removed there, which is most of its cost.
    b.worktree(
        &repo_at,
        &tmp.path().join("home"),
        &script,
        "SUP_HOME beside the repository",
    );
    if Path::new("/dev/shm").is_dir() {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        b.worktree(&repo_at, shm.path(), &script, "SUP_HOME on a tmpfs");
    }
}

//! System calls per step of the work loop, counted by the kernel: the release `sup run`
//! (`--sandbox off`, the `script:` model) over a workspace of 240 small files (in one folder,
//! as the issue measured it, and again spread over 12 folders), each step one `list_files`
//! and one `read_file` call, under `strace -f -c`. The count per step is the
//! whole run's over its steps (start-up included, as the issue counted it), and beside it the
//! cost of one more step (a 100-step run less a 10-step one, over 90 steps), with the calls
//! that make it up.
//! Run: `cargo bench --bench syscalls`. Needs `strace` (`apt-get install -y strace`); skips
//! with a message without it. `SUP_BENCH_BIN` measures another build of `sup`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

const FILES: usize = 240;
const STEPS: usize = 100;
const SHORT: usize = 10;
const TARGET: f64 = 60.0;

/// The workspace's file `i`: in one folder, or in `folders` of them.
fn file(i: usize, folders: usize) -> String {
    match folders {
        0 => format!("f{i:03}.txt"),
        n => format!("d{:02}/f{i:03}.txt", i % n),
    }
}

/// The workspace: 240 small files.
fn workspace(ws: &Path, folders: usize) {
    for i in 0..FILES {
        let path = ws.join(file(i, folders));
        let dir = path.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let text: String = (0..8)
            .map(|l| format!("file {i} line {l}: some small text\n"))
            .collect();
        std::fs::write(path, text).unwrap();
    }
}

/// `steps` turns of one `list_files` and one `read_file` call (a different file each step),
/// then a final answer.
fn script(path: &Path, steps: usize, folders: usize) {
    let mut turns: Vec<serde_json::Value> = (0..steps)
        .map(|s| {
            let i = s % FILES;
            serde_json::json!({
                "usage": {"input_tokens": 10, "output_tokens": 5},
                "tool_calls": [
                    {"name": "list_files", "input": {}},
                    {"name": "read_file", "input": {"path": file(i, folders)}}
                ]
            })
        })
        .collect();
    turns.push(serde_json::json!({"text": "done"}));
    std::fs::write(path, serde_json::to_string(&turns).unwrap()).unwrap();
}

/// System calls by name over a whole `sup run` of `steps` steps.
fn count(steps: usize, folders: usize) -> BTreeMap<String, u64> {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    workspace(ws.path(), folders);
    let model = home.path().join("model.json");
    script(&model, steps, folders);
    let out = home.path().join("strace.txt");
    let bin = std::env::var("SUP_BENCH_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_sup").into());
    let status = Command::new("strace")
        .args(["-f", "-c", "-o"])
        .arg(&out)
        .arg(bin)
        .args(["run", "list and read the files", "--sandbox", "off"])
        .arg("--model")
        .arg(format!("script:{}", model.display()))
        .arg("--max-steps")
        .arg((steps + 1).to_string())
        .env("SUP_HOME", home.path())
        .env("SUP_APPROVAL", "auto")
        .env("SUP_CONFIG", home.path().join("no-config.toml"))
        .env_remove("SUP_MODEL")
        .env_remove("RUST_LOG")
        .current_dir(ws.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "sup run failed: {status}");
    parse(&std::fs::read_to_string(&out).unwrap())
}

/// The rows of `strace -c`'s table: `% time  seconds  usecs/call  calls  [errors]  syscall`.
fn parse(summary: &str) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    for line in summary.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || f[0].parse::<f64>().is_err() || f[f.len() - 1] == "total" {
            continue;
        }
        if let Ok(n) = f[3].parse::<u64>() {
            calls.insert(f[f.len() - 1].to_string(), n);
        }
    }
    calls
}

fn main() {
    if Command::new("strace").arg("-V").output().is_err() {
        println!(
            "system calls per step: skipped, strace is not installed \
             (apt-get install -y strace, then run again)"
        );
        return;
    }
    println!(
        "system calls of `sup run --sandbox off` (script: model), {FILES} files, one \
         list_files and one read_file per step, counted by `strace -f -c`"
    );
    for folders in [0, 12] {
        report(folders);
    }
}

/// Count and print for one layout of the workspace.
fn report(folders: usize) {
    let long = count(STEPS, folders);
    let short = count(SHORT, folders);
    let total: u64 = long.values().sum();
    let short_total: u64 = short.values().sum();
    let per_step = total as f64 / STEPS as f64;
    match folders {
        0 => println!("{FILES} files in one folder:"),
        n => println!("{FILES} files in {n} folders:"),
    }
    println!("  {STEPS} steps: {total} system calls; {SHORT} steps: {short_total}");
    println!("system calls per step: {per_step:.0} (target at most {TARGET:.0})");
    let marginal = |name: &str| {
        (long.get(name).copied().unwrap_or(0) as f64 - short.get(name).copied().unwrap_or(0) as f64)
            / (STEPS - SHORT) as f64
    };
    let one_more = (total as f64 - short_total as f64) / (STEPS - SHORT) as f64;
    println!("  of one more step: {one_more:.1}, of which:");
    let mut rows: Vec<(String, f64)> = long.keys().map(|k| (k.clone(), marginal(k))).collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (name, n) in rows.iter().filter(|(_, n)| *n >= 0.5) {
        println!("    {name:<16} {n:>6.1}");
    }
}

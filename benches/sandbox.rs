//! What the sandbox costs a command: `bash -c true` (what `run_command "true"` runs) through
//! the process runner, unconfined and in the default `workspace-write` jail (the run's PID
//! namespace with its relay and own `/proc`, the seccomp filter, the hidden files, the
//! limits and Landlock; with a `.git` folder, which adds a read-only bind, and with a goal
//! file two folders deep, whose parents are bound onto themselves too). Median and mean per
//! command, and the sandbox's extra time beside its target. Run: `cargo bench --bench sandbox`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use sup::tools::process::{self, Spec};
use sup::tools::sandbox::{Jail, Policy, Sandbox};
use tokio_util::sync::CancellationToken;

const RUNS: usize = 300;
/// What the sandbox may add to `run_command "true"` (median), in milliseconds.
const TARGET_MS: f64 = 2.0;

fn spec(dir: &std::path::Path, jail: Arc<Jail>) -> Spec {
    Spec {
        program: "bash".into(),
        args: vec!["-c".into(), "true".into()],
        cwd: dir.to_path_buf(),
        env: vec![("SUP_RUN_ID".into(), "bench".into())],
        stdin: None,
        timeout: Duration::from_secs(10),
        stdout: dir.join("out"),
        stderr: dir.join("err"),
        jail,
    }
}

/// CPU time (user and system) of this process and of its children that ended: what a
/// command costs the machine, whatever else runs on it.
fn cpu() -> Duration {
    let mut total = Duration::ZERO;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: getrusage into a zeroed local struct.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        for t in [u.ru_utime, u.ru_stime] {
            total += Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
        }
    }
    total
}

/// Run the configurations in turn, one command each round, so that load on the machine
/// weighs on all of them alike; each one's wall times, sorted, and its CPU time in all.
async fn time(specs: &[&Spec]) -> (Vec<Vec<Duration>>, Vec<Duration>) {
    let cancel = CancellationToken::new();
    let mut times = vec![Vec::with_capacity(RUNS); specs.len()];
    let mut cpus = vec![Duration::ZERO; specs.len()];
    for _ in 0..RUNS {
        for (i, spec) in specs.iter().enumerate() {
            let (started, used) = (Instant::now(), cpu());
            let done = process::run(spec, &cancel).await.expect("bash runs");
            assert!(done.ending.success());
            times[i].push(started.elapsed());
            cpus[i] += cpu().saturating_sub(used);
        }
    }
    for t in &mut times {
        t.sort();
    }
    (times, cpus)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn stats(times: &[Duration]) -> (f64, f64) {
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    (ms(times[times.len() / 2]), ms(mean))
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let home = tempfile::tempdir().expect("tempdir");
    let ws = tempfile::tempdir().expect("tempdir");
    let ws_path = std::fs::canonicalize(ws.path()).expect("canonical");
    let git_ws = tempfile::tempdir().expect("tempdir");
    let git_path = std::fs::canonicalize(git_ws.path()).expect("canonical");
    std::fs::create_dir(git_path.join(".git")).expect(".git");
    let deep_ws = tempfile::tempdir().expect("tempdir");
    let deep_path = std::fs::canonicalize(deep_ws.path()).expect("canonical");
    std::fs::create_dir_all(deep_path.join(".git")).expect(".git");
    std::fs::create_dir_all(deep_path.join("goals/deep")).expect("goals");
    std::fs::write(deep_path.join("goals/deep/g.toml"), "prompt = \"x\"\n").expect("goal");
    let settings = Sandbox {
        policy: Some(Policy::WorkspaceWrite),
        ..Sandbox::default()
    };
    let plain = Jail::new(
        &settings,
        &ws_path,
        &home.path().join("r1"),
        &format!("bench-{}-1", std::process::id()),
        home.path(),
        &[],
    )
    .expect("jail");
    let with_git = Jail::new(
        &settings,
        &git_path,
        &home.path().join("r2"),
        &format!("bench-{}-2", std::process::id()),
        home.path(),
        &[],
    )
    .expect("jail");
    let deep = Jail::new(
        &Sandbox {
            protect: vec![deep_path.join("goals/deep/g.toml")],
            ..settings.clone()
        },
        &deep_path,
        &home.path().join("r3"),
        &format!("bench-{}-3", std::process::id()),
        home.path(),
        &[],
    )
    .expect("jail");
    println!("{}", plain.describe());
    println!("{}", with_git.describe());
    println!("{}", deep.describe());
    let configs = [
        ("unconfined", spec(&ws_path, Arc::new(Jail::unconfined()))),
        ("workspace-write", spec(&ws_path, Arc::new(plain))),
        (
            "workspace-write + .git",
            spec(&git_path, Arc::new(with_git)),
        ),
        ("+ .git + deep goal file", spec(&deep_path, Arc::new(deep))),
    ];
    // What preparing a command costs in `sup` itself (the ruleset, its path fds).
    for (name, spec) in &configs {
        let started = Instant::now();
        for _ in 0..RUNS {
            let mut cmd = tokio::process::Command::new("true");
            let armed = spec.jail.apply(&mut cmd, &spec.env, None).expect("apply");
            drop(armed);
        }
        println!(
            "{name:>24}: preparing a command takes {:.3} ms (target: at most {TARGET_MS} ms, \
             all the jail may add)",
            ms(started.elapsed()) / RUNS as f64
        );
    }
    println!("{RUNS} × `bash -c true` through the process runner, configurations interleaved");
    let specs: Vec<&Spec> = configs.iter().map(|(_, s)| s).collect();
    // Warm up, then measure.
    runtime.block_on(time(&specs));
    let (times, cpus) = runtime.block_on(time(&specs));
    let (base, _) = stats(&times[0]);
    let per_command = |c: Duration| ms(c) / RUNS as f64;
    for (i, ((name, _), t)) in configs.iter().zip(&times).enumerate() {
        let (median, mean) = stats(t);
        let added = median - base;
        let verdict = if i == 0 {
            "(the baseline)".to_string()
        } else {
            format!(
                "target < {TARGET_MS} ms added to run_command true: {}",
                if added < TARGET_MS { "met" } else { "NOT MET" }
            )
        };
        println!(
            "{name:>24}: median {median:.3} ms, mean {mean:.3} ms, sandbox adds {added:+.3} ms \
             (median); {verdict}"
        );
        println!(
            "{:>24}  CPU {:.3} ms per command, sandbox adds {:+.3} ms (what load does not change)",
            "",
            per_command(cpus[i]),
            per_command(cpus[i]) - per_command(cpus[0])
        );
    }
}

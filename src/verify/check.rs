//! Acceptance checks: scripts (run by extension) and shell command lines, run in the
//! workspace with a timeout, stdin closed, the `SUP_*` environment and the run's sandbox;
//! exit 0 passes. Script checks run from a copy frozen in the run folder when the goal starts
//! (Python isolated with `-I`), with `SUP_CHECK_DIR` naming the original folder. Judges
//! (`super::judge`) run after every other check passed. Also the failure report the model
//! gets, and the guard that notices a check changed mid-run. The interpreters checks run with
//! (`node`, `python3`, `bash`, …) are found once when the goal starts, outside the workspace
//! and through pyenv, asdf, mise, rbenv and nodenv shims, so that no `.python-version`,
//! `.tool-versions`, `.nvmrc` or `.node-version` the agent writes chooses them (unless the
//! goal says `workspace_toolchain = true`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::judge::{self, Judge};
use crate::approval::{Gate, Judgement};
use crate::model::Usage;
use crate::tools::command::resolve_program;
use crate::tools::process::{self, Ending, program_exists, read_tail, script_command};
use crate::tools::sandbox::Jail;
use crate::trace::{self, CheckReport, Events};

#[derive(Clone, Debug)]
pub(crate) enum CheckKind {
    /// A script file (canonical path), run by its extension.
    Script(PathBuf),
    /// A shell command line, run with `bash -c`.
    Command(String),
    /// A person: accepts, or rejects with a reason.
    Human(String),
    /// A model that reads the evidence (`super::judge`).
    Judge(Box<Judge>),
}

#[derive(Clone, Debug)]
pub struct Check {
    /// How the check is named in reports: the script path as given, or the command line.
    pub(crate) name: String,
    pub(crate) kind: CheckKind,
    pub(crate) timeout: Duration,
    /// For a frozen script: the folder of the original (`SUP_CHECK_DIR`).
    origin: Option<PathBuf>,
}

pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

impl Check {
    pub(crate) fn script(name: String, path: PathBuf, timeout: Duration) -> Self {
        Check {
            name,
            kind: CheckKind::Script(path),
            timeout,
            origin: None,
        }
    }

    pub fn command(line: String, timeout: Duration) -> Self {
        Check {
            name: line.clone(),
            kind: CheckKind::Command(line),
            timeout,
            origin: None,
        }
    }

    pub(crate) fn human(question: String, timeout: Duration) -> Self {
        Check {
            name: format!("human: {question}"),
            kind: CheckKind::Human(question),
            timeout,
            origin: None,
        }
    }

    /// A judge of `criteria`; `model` is its own model, if it names one.
    pub(crate) fn judge(criteria: String, model: Option<String>, timeout: Duration) -> Self {
        Check {
            name: format!(
                "{}{}",
                trace::JUDGE_PREFIX,
                crate::trace::one_line(&criteria, 100)
            ),
            kind: CheckKind::Judge(Box::new(Judge {
                criteria,
                own_model: model,
                model: String::new(),
                base: PathBuf::from("."),
                price: None,
                bound: None,
            })),
            timeout,
            origin: None,
        }
    }

    /// The judge of a judge check.
    pub(crate) fn as_judge(&self) -> Option<&Judge> {
        match &self.kind {
            CheckKind::Judge(j) => Some(j),
            _ => None,
        }
    }

    pub(crate) fn as_judge_mut(&mut self) -> Option<&mut Judge> {
        match &mut self.kind {
            CheckKind::Judge(j) => Some(j),
            _ => None,
        }
    }

    /// What kind of check this is, as reports say.
    pub(crate) fn kind(&self) -> trace::CheckKind {
        match &self.kind {
            CheckKind::Script(_) => trace::CheckKind::Script,
            CheckKind::Command(_) => trace::CheckKind::Command,
            CheckKind::Human(_) => trace::CheckKind::Human,
            CheckKind::Judge(_) => trace::CheckKind::Judge,
        }
    }

    pub(crate) fn script_path(&self) -> Option<PathBuf> {
        match &self.kind {
            CheckKind::Script(p) => Some(p.clone()),
            _ => None,
        }
    }

    /// Whether the check can run at all: its file exists and its interpreter is installed.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if let CheckKind::Human(_) | CheckKind::Judge(_) = self.kind {
            return Ok(());
        }
        let (program, _) = self.argv();
        if let CheckKind::Script(path) = &self.kind {
            if !path.is_file() {
                return Err(format!("check script {} does not exist", path.display()));
            }
            use std::os::unix::fs::PermissionsExt;
            let runs_directly = program == path.display().to_string();
            let executable = path
                .metadata()
                .is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
            if runs_directly && !executable {
                return Err(format!(
                    "check script {} is run directly (its extension names no interpreter) but                      is not executable: chmod +x it, or use .js, .mjs, .py or .sh",
                    path.display()
                ));
            }
        }
        if !program_exists(&program) {
            return Err(format!(
                "check `{}` needs `{program}`, which is not installed (not found on PATH)",
                self.name
            ));
        }
        Ok(())
    }

    fn argv(&self) -> (String, Vec<String>) {
        match &self.kind {
            // Isolated: nothing beside the script or in PYTHON* variables shadows its imports.
            CheckKind::Script(p) if p.extension().is_some_and(|e| e == "py") => {
                ("python3".into(), vec!["-I".into(), p.display().to_string()])
            }
            CheckKind::Script(p) => script_command(p),
            CheckKind::Command(line) => ("bash".into(), vec!["-c".into(), line.clone()]),
            CheckKind::Human(_) | CheckKind::Judge(_) => (String::new(), Vec::new()),
        }
    }
}

/// Copy every script check into `dir` and point the check at its copy, so nothing the agent
/// does to the original changes what judges it. A script that cannot be copied is a
/// failing check, never the original run in its place.
pub(crate) fn freeze(checks: &[Check], dir: &Path) -> Vec<Check> {
    checks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let CheckKind::Script(original) = &c.kind else {
                return c.clone();
            };
            let name = original
                .file_name()
                .map_or_else(|| "check".into(), |n| n.to_string_lossy().into_owned());
            let copy = dir.join(format!("{}-{name}", i + 1));
            let copied = std::fs::create_dir_all(dir).and_then(|_| std::fs::copy(original, &copy));
            if let Err(e) = copied {
                tracing::warn!("cannot freeze the check {}: {e}", original.display());
                return Check::command(
                    format!(
                        "echo 'the check {} could not be copied into the run folder: {e}' >&2; \
                         exit 1",
                        original.display()
                    ),
                    c.timeout,
                );
            }
            Check {
                name: c.name.clone(),
                kind: CheckKind::Script(copy),
                timeout: c.timeout,
                origin: original.parent().map(Path::to_path_buf),
            }
        })
        .collect()
}

/// The contents of every script check, to notice changes later.
pub(crate) fn snapshot(checks: &[Check]) -> Vec<Option<Vec<u8>>> {
    checks
        .iter()
        .map(|c| c.script_path().and_then(|p| std::fs::read(p).ok()))
        .collect()
}

/// The name of a script check whose file differs from `originals`, if any.
pub(crate) fn changed(checks: &[Check], originals: &[Option<Vec<u8>>]) -> Option<String> {
    checks
        .iter()
        .zip(snapshot(checks))
        .zip(originals)
        .find(|((_, now), before)| now != *before)
        .map(|((c, _), _)| c.name.clone())
}

/// Interpreters pinned for checks.
const INTERPRETERS: &[&str] = &["python3", "python", "node", "bash", "sh", "ruby", "perl"];

/// The interpreters checks run with, fixed when the goal starts: each name's absolute
/// program, and a folder of links to them put first on the checks' PATH, with the version
/// managers' own pins, so a check's command line finds the same ones.
#[derive(Clone, Debug, Default)]
pub(crate) struct Toolchain {
    programs: Vec<(String, PathBuf)>,
    env: Vec<(String, String)>,
}

impl Toolchain {
    /// Find the interpreters on PATH as they resolve outside `workspace`, and link them in
    /// `dir`.
    pub(crate) fn pin(workspace: &Path, dir: &Path) -> Toolchain {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut t = Toolchain::default();
        let mut pins: Vec<(String, String)> = Vec::new();
        for name in INTERPRETERS {
            let Some((real, pin)) = resolve_program(name, workspace) else {
                continue;
            };
            pins.extend(pin);
            t.programs.push((name.to_string(), real));
        }
        if std::fs::create_dir_all(dir).is_ok() {
            for (name, real) in &t.programs {
                let _ = std::os::unix::fs::symlink(real, dir.join(name));
            }
            let rest = std::env::split_paths(&path).filter(|d| !d.starts_with(workspace));
            if let Ok(joined) = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(rest))
            {
                t.env
                    .push(("PATH".into(), joined.to_string_lossy().into_owned()));
            }
        }
        pins.sort();
        pins.dedup();
        t.env.extend(pins);
        t
    }

    /// The absolute program of an interpreter name, when pinned.
    fn program(&self, name: &str) -> Option<String> {
        self.programs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.display().to_string())
    }
}

/// What a round of checks runs with.
pub(crate) struct CheckRun<'a> {
    pub(crate) workspace: &'a Path,
    /// The run's sandbox.
    pub(crate) jail: &'a Arc<Jail>,
    pub(crate) env: &'a [(String, String)],
    /// Where outputs go (`RUN/try-N`).
    pub(crate) dir: &'a Path,
    pub(crate) answer: &'a str,
    pub(crate) answer_file: &'a Path,
    pub(crate) feedback_cap: usize,
    pub(crate) cancel: &'a CancellationToken,
    /// Asks the person of a human check.
    pub(crate) gate: Option<&'a Gate>,
    pub(crate) events: &'a Events,
    /// The interpreters fixed when the goal started.
    pub(crate) toolchain: &'a Toolchain,
    /// What judges see besides the try; `None` when the goal has none.
    pub(crate) judge: Option<&'a judge::Context<'a>>,
}

/// A round of checks: each check's report, and what its judges spent and said.
pub(crate) struct Round {
    pub(crate) reports: Vec<CheckReport>,
    /// Tokens the judges spent.
    pub(crate) usage: Usage,
    /// US dollars the judges spent, of those whose price is known.
    pub(crate) cost: f64,
    /// A judge said the goal cannot be achieved, and why.
    pub(crate) impossible: Option<String>,
}

fn file_stem(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    s
}

/// Run every check in order, reporting each as it ends: scripts, commands and people first,
/// all of them; then the judges, only when all of those passed (no judge is paid to look at
/// a try the scripts already failed), with their reports as evidence.
pub(crate) async fn run_all(
    checks: &[Check],
    run: &CheckRun<'_>,
    on_each: impl Fn(&CheckReport),
) -> Round {
    let _ = std::fs::create_dir_all(run.dir);
    if let Err(e) = std::fs::write(run.answer_file, run.answer) {
        tracing::warn!("cannot write {}: {e}", run.answer_file.display());
    }
    let mut round = Round {
        reports: Vec::new(),
        usage: Usage::default(),
        cost: 0.0,
        impossible: None,
    };
    for (i, check) in checks.iter().enumerate() {
        if check.as_judge().is_some() {
            continue;
        }
        let report = run_one(check, i, run).await;
        on_each(&report);
        round.reports.push(report);
    }
    let others = round.reports.clone();
    let all_passed = others.iter().all(|r| r.passed);
    for (i, check) in checks.iter().enumerate() {
        let Some(j) = check.as_judge() else {
            continue;
        };
        let report = match run.judge {
            Some(ctx) if all_passed && round.impossible.is_none() => {
                let asked = judge::Asked {
                    name: &check.name,
                    index: i,
                    timeout: check.timeout,
                    workspace: run.workspace,
                    dir: run.dir,
                    answer: run.answer,
                    cancel: run.cancel,
                };
                let judged = judge::ask(j, &asked, &others, ctx).await;
                round.usage += judged.usage;
                round.cost += judged.cost.unwrap_or(0.0);
                round.impossible = round.impossible.take().or(judged.impossible);
                judged.report
            }
            _ => judge::not_asked(&check.name, j),
        };
        on_each(&report);
        round.reports.push(report);
    }
    round
}

async fn ask_person(check: &Check, question: &str, run: &CheckRun<'_>) -> CheckReport {
    let started = std::time::Instant::now();
    let judgement = match run.gate {
        Some(gate) => gate.human(question, run.events, run.cancel).await,
        None => Judgement::Rejected("no person can be asked in this run".into()),
    };
    let (passed, outcome, tail) = match judgement {
        Judgement::Accepted => (true, "accepted".to_string(), String::new()),
        Judgement::Rejected(reason) => (false, "rejected".to_string(), format!("{reason}\n")),
    };
    CheckReport {
        name: check.name.clone(),
        kind: check.kind(),
        model: None,
        passed,
        exit_status: None,
        outcome,
        duration_ms: started.elapsed().as_millis() as u64,
        output_tail: tail,
        output_path: None,
    }
}

async fn run_one(check: &Check, index: usize, run: &CheckRun<'_>) -> CheckReport {
    if let CheckKind::Human(question) = &check.kind {
        return ask_person(check, question, run).await;
    }
    let (program, args) = check.argv();
    let program = run.toolchain.program(&program).unwrap_or(program);
    let base = format!("check-{}-{}", index + 1, file_stem(&check.name));
    let mut env = run.env.to_vec();
    env.extend(run.toolchain.env.iter().cloned());
    if let Some(origin) = &check.origin {
        env.push(("SUP_CHECK_DIR".into(), origin.display().to_string()));
    }
    let spec = process::Spec {
        program,
        args,
        cwd: run.workspace.to_path_buf(),
        env,
        jail: run.jail.clone(),
        stdin: None,
        timeout: check.timeout,
        stdout: run.dir.join(format!("{base}.stdout")),
        stderr: run.dir.join(format!("{base}.stderr")),
    };
    let (ending, duration) = match process::run(&spec, run.cancel).await {
        Ok(f) => (f.ending, f.duration),
        Err(e) => {
            return CheckReport {
                name: check.name.clone(),
                kind: check.kind(),
                model: None,
                passed: false,
                exit_status: None,
                outcome: "could not start".into(),
                duration_ms: 0,
                output_tail: e.to_string(),
                output_path: None,
            };
        }
    };
    let half = run.feedback_cap / 2;
    let mut tail = String::new();
    for (label, path) in [("stdout", &spec.stdout), ("stderr", &spec.stderr)] {
        if let Ok((text, cut)) = read_tail(path, half)
            && !text.trim().is_empty()
        {
            tail.push_str(&format!(
                "--- {label}{} ---\n{}\n",
                if cut { " (last part)" } else { "" },
                text.trim_end()
            ));
        }
    }
    CheckReport {
        name: check.name.clone(),
        kind: check.kind(),
        model: None,
        passed: ending.success(),
        exit_status: ending.exit_code(),
        outcome: match ending {
            Ending::Exited(0) => "passed".into(),
            other => other.describe(check.timeout),
        },
        duration_ms: duration.as_millis() as u64,
        output_tail: tail,
        // One path a line: paths may hold spaces (a SUP_HOME with one), never a newline here.
        output_path: Some(format!(
            "{}\n{}",
            spec.stdout.display(),
            spec.stderr.display()
        )),
    }
}

/// The message that tells the model which checks failed and how.
pub(crate) fn failure_report(results: &[CheckReport], attempt: u32, tries: u32) -> String {
    let failed: Vec<&CheckReport> = results
        .iter()
        .filter(|r| !r.passed && !judge::not_asked_report(r))
        .collect();
    let mut s = format!(
        "The acceptance checks ran after your work (try {attempt} of {tries}) and {} of {} \
         failed. Fix the work so that they pass; do not change the checks.\n",
        failed.len(),
        results.len()
    );
    for r in failed {
        s.push_str(&format!("\nCheck `{}` failed: {}.\n", r.name, r.outcome));
        if r.output_tail.trim().is_empty() {
            s.push_str("(it printed nothing)\n");
        } else {
            s.push_str(&r.output_tail);
        }
        if let Some(p) = &r.output_path {
            s.push_str(&format!(
                "(whole output: {})\n",
                p.lines().collect::<Vec<_>>().join(" and ")
            ));
        }
    }
    s
}

/// What makes two failure reports the same, leaving out paths and times.
pub(crate) fn report_key(results: &[CheckReport]) -> String {
    results
        .iter()
        .filter(|r| !r.passed)
        .map(|r| format!("{}\u{1}{}\u{1}{}", r.name, r.outcome, r.output_tail))
        .collect::<Vec<_>>()
        .join("\u{2}")
}

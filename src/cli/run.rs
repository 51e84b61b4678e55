//! `sup run` and `sup goal`: flags (and a goal file) into a run spec, the trace on the
//! terminal, signals, and the outcome as an exit status.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Ending, Fail, GoalArgs, RunArgs};
use crate::config::Settings;
use crate::run::{self, Invocation, RunSpec, Trigger};
use crate::store::{self, TriggerKind};
use crate::trace::{EventSink, HumanTrace, JsonLines, Results, Status};

pub(crate) async fn run(args: RunArgs) -> Result<Ending, Fail> {
    let c = &args.common;
    let (json, quiet, print) = (c.json, c.quiet, c.print_config);
    let spec = run_spec(args)?;
    if print {
        return Ok(print_config(&spec, false));
    }
    execute(spec, json, quiet, false, TriggerKind::Cli).await
}

/// The spec of `sup run`.
pub(crate) fn run_spec(args: RunArgs) -> Result<RunSpec, Fail> {
    let mut inv = invocation(args.common.settings)?;
    inv.flags.prompt = Some(args.prompt);
    let mut spec = RunSpec::build(&inv, None).map_err(Fail::from)?;
    spec.thread.origin = Some(run::resume::Origin::command_line());
    Ok(spec)
}

pub(crate) async fn goal(args: GoalArgs) -> Result<Ending, Fail> {
    let c = &args.common;
    let (json, quiet, print) = (c.json, c.quiet, c.print_config);
    let flag_checks =
        !(args.checks.is_empty() && args.check_cmds.is_empty() && args.check_judges.is_empty());
    let spec = goal_spec(args)?;
    if print {
        return Ok(print_config(&spec, flag_checks));
    }
    execute(spec, json, quiet, true, TriggerKind::Cli).await
}

/// The spec of `sup goal`.
pub(crate) fn goal_spec(args: GoalArgs) -> Result<RunSpec, Fail> {
    let file = match &args.file {
        Some(path) => Some(
            crate::schedule::goals::load(path)
                .map_err(Fail::usage)?
                .file,
        ),
        None => None,
    };
    let mut inv = invocation(args.common.settings)?;
    let flags = &mut inv.flags;
    flags.name = args
        .name
        .clone()
        .or_else(|| file.is_none().then(|| "goal".to_string()));
    flags.prompt = args.prompt.clone();
    flags.tries = args.tries;
    flags.fresh = args.fresh.then_some(true);
    flags.check_timeout = args.check_timeout;
    flags.judge_model = args.judge_model.clone();
    for path in &args.checks {
        inv.checks
            .push(run::script_check(path).map_err(Fail::from)?);
    }
    for line in &args.check_cmds {
        inv.checks.push(run::command_check(line));
    }
    for criteria in &args.check_judges {
        inv.checks
            .push(run::judge_check(criteria).map_err(Fail::from)?);
    }
    let mut spec = RunSpec::build(&inv, file.as_ref()).map_err(Fail::from)?;
    spec.thread.origin = Some(run::resume::Origin::command_line());
    Ok(spec)
}

/// `--print-config`: every setting, its effective value and where it came from.
fn print_config(spec: &RunSpec, flag_checks: bool) -> Ending {
    use std::io::Write;
    let e = &spec.effective;
    let mut out = std::io::stdout().lock();
    let sources: std::collections::BTreeMap<&str, Vec<String>> = e
        .provenance
        .iter()
        .map(|(k, s)| (k, s.iter().map(ToString::to_string).collect()))
        .collect();
    for (key, value) in e.settings.shown() {
        let from = sources.get(key).map(|s| s.join(" + "));
        let (value, from) = match applied(spec, key, from, flag_checks) {
            Some(v) => v,
            None => (value, None),
        };
        let from = from
            .or_else(|| sources.get(key).map(|s| s.join(" + ")))
            .unwrap_or_else(|| "default (unset)".to_string());
        let _ = writeln!(
            out,
            "{key:<18} {:<40} {from}",
            crate::trace::one_line(&value, 200)
        );
    }
    let price = spec.price.map_or_else(
        || "unknown".into(),
        |p| format!("${} in · ${} out per million tokens", p.input, p.output),
    );
    let _ = writeln!(out, "{:<18} {:<40} resolved", "price", price);
    if let Some(why) = &spec.price_refusal {
        eprintln!("sup: a run with these settings would not start: {why}");
    }
    Ending::Achieved
}

/// What applies for a key whose setting alone does not say it: the checks and tools a run
/// has (from `[[check]]`, or `--check` and `--check-cmd` instead; `[[tool]]`), and the
/// approval mode and sandbox a run with these settings gets when none is set; with where
/// it came from when that is not the setting's own source.
fn applied(
    spec: &RunSpec,
    key: &str,
    from: Option<String>,
    flag_checks: bool,
) -> Option<(String, Option<String>)> {
    use crate::verify::check::CheckKind;
    let list = |items: Vec<String>| {
        if items.is_empty() {
            "—".to_string()
        } else {
            items.join(", ")
        }
    };
    let file = || {
        spec.effective
            .provenance
            .iter()
            .flat_map(|(_, sources)| sources.iter())
            .find(|s| matches!(s, crate::config::Source::GoalFile(_)))
            .map(ToString::to_string)
    };
    match key {
        "check" => {
            let checks: Vec<String> = spec
                .goal
                .checks
                .iter()
                .map(|c| match &c.kind {
                    CheckKind::Script(_) => format!("script {}", c.name),
                    CheckKind::Command(line) => format!("run {line}"),
                    CheckKind::Human(q) => format!("human {q}"),
                    CheckKind::Judge(j) => format!("judge {} ({})", j.criteria, j.model),
                })
                .collect();
            let from = match (checks.is_empty(), flag_checks) {
                (true, _) => None,
                (false, true) => Some("flag".to_string()),
                (false, false) => from.or_else(file),
            };
            Some((list(checks), from))
        }
        "tool" => Some((
            list(spec.tools.iter().map(|t| t.name.clone()).collect()),
            (!spec.tools.is_empty()).then(file).flatten(),
        )),
        "approval" => Some(match spec.approval {
            Some(_) => return None,
            None if crate::approval::Terminal::detect().is_some() => {
                ("ask".into(), Some("default (a terminal to ask at)".into()))
            }
            None => (
                "never".into(),
                Some(
                    "default (no terminal: calls no rule allows are denied; scheduled runs \
                     queue)"
                        .into(),
                ),
            ),
        }),
        "sandbox" if from.is_none() => Some((
            spec.sandbox.policy.unwrap_or_default().name().to_string(),
            Some("default".into()),
        )),
        _ => None,
    }
}

/// The flags' layer with the environment's.
pub(crate) fn invocation(flags: Settings) -> Result<Invocation, Fail> {
    Ok(Invocation {
        flags,
        checks: Vec::new(),
        env: Settings::from_env().map_err(Fail::usage)?,
    })
}

/// Cancel on the first SIGINT or SIGTERM; exit at once on a second SIGINT.
pub(super) fn watch_signals(cancel: CancellationToken) -> Result<(), Fail> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).map_err(Fail::store)?;
    let mut term = signal(SignalKind::terminate()).map_err(Fail::store)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        crate::trace::notice(
            "· interrupting: stopping the model and tools (Ctrl-C again to quit at once)",
        );
        cancel.cancel();
        int.recv().await;
        crate::tools::mcp::kill_all();
        std::process::exit(i32::from(Ending::Interrupted.code()));
    });
    Ok(())
}

/// Run a spec in the foreground with the terminal's trace.
pub(crate) async fn execute(
    spec: RunSpec,
    json: bool,
    quiet: bool,
    is_goal: bool,
    trigger: TriggerKind,
) -> Result<Ending, Fail> {
    let sink: Arc<dyn EventSink> = if json {
        Arc::new(JsonLines::new())
    } else {
        let results = if quiet {
            Results::Hidden
        } else {
            Results::Head
        };
        Arc::new(HumanTrace::new(is_goal).with_results(results))
    };
    let cancel = CancellationToken::new();
    watch_signals(cancel.clone())?;
    let trigger = Trigger {
        kind: trigger,
        scheduled_for: None,
    };
    let launched = run::launch(&spec, &store::home(), trigger, vec![sink], &cancel)
        .await
        .map_err(Fail::from)?;
    let outcome = launched.outcome;
    if !json
        && outcome.status == Status::Achieved
        && let Some(answer) = outcome.answer.as_deref().filter(|a| !a.is_empty())
    {
        println!("{}", crate::redact::text(answer));
    }
    Ok(Ending::of(outcome.status))
}

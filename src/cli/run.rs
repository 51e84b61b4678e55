//! `sup run` and `sup goal`: flags (and a goal file) into a run spec, the trace on the
//! terminal, signals, and the outcome as an exit status.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Ending, Fail, GoalArgs, RunArgs};
use crate::config::Settings;
use crate::run::{self, Invocation, RunSpec, Trigger};
use crate::store::{self, TriggerKind};
use crate::trace::{EventSink, HumanTrace, JsonLines, Status};

pub(crate) async fn run(args: RunArgs) -> Result<Ending, Fail> {
    let (json, print) = (args.json, args.print_config);
    let spec = run_spec(args)?;
    if print {
        return Ok(print_config(&spec));
    }
    execute(spec, json, false, TriggerKind::Cli).await
}

/// The spec of `sup run`.
pub(crate) fn run_spec(args: RunArgs) -> Result<RunSpec, Fail> {
    let mut inv = invocation(args.settings)?;
    inv.flags.prompt = Some(args.prompt);
    let mut spec = RunSpec::build(&inv, None).map_err(Fail::from)?;
    spec.thread.origin = Some(run::resume::Origin::command_line());
    Ok(spec)
}

pub(crate) async fn goal(args: GoalArgs) -> Result<Ending, Fail> {
    let (json, print) = (args.json, args.print_config);
    let spec = goal_spec(args)?;
    if print {
        return Ok(print_config(&spec));
    }
    execute(spec, json, true, TriggerKind::Cli).await
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
    let mut inv = invocation(args.settings)?;
    let flags = &mut inv.flags;
    flags.name = args
        .name
        .clone()
        .or_else(|| file.is_none().then(|| "goal".to_string()));
    flags.prompt = args.prompt.clone();
    flags.tries = args.tries;
    flags.fresh = args.fresh.then_some(true);
    flags.check_timeout = args.check_timeout;
    for path in &args.checks {
        inv.checks
            .push(run::script_check(path).map_err(Fail::from)?);
    }
    for line in &args.check_cmds {
        inv.checks.push(run::command_check(line));
    }
    let mut spec = RunSpec::build(&inv, file.as_ref()).map_err(Fail::from)?;
    spec.thread.origin = Some(run::resume::Origin::command_line());
    Ok(spec)
}

/// `--print-config`: every setting, its effective value and where it came from.
fn print_config(spec: &RunSpec) -> Ending {
    use std::io::Write;
    let e = &spec.effective;
    let mut out = std::io::stdout().lock();
    let sources: std::collections::BTreeMap<&str, Vec<String>> = e
        .provenance
        .iter()
        .map(|(k, s)| (k, s.iter().map(ToString::to_string).collect()))
        .collect();
    for (key, value) in e.settings.shown() {
        let from = sources
            .get(key)
            .map_or_else(|| "default (unset)".to_string(), |s| s.join(" + "));
        let _ = writeln!(
            out,
            "{key:<18} {:<40} {from}",
            crate::trace::one_line(&value, 200)
        );
    }
    let _ = writeln!(
        out,
        "{:<18} {:<40} resolved",
        "price",
        spec.price
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "unknown".into())
    );
    if let Some(why) = &spec.price_refusal {
        eprintln!("sup: a run with these settings would not start: {why}");
    }
    Ending::Achieved
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
        eprintln!("· interrupting: stopping the model and tools (Ctrl-C again to quit at once)");
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
    is_goal: bool,
    trigger: TriggerKind,
) -> Result<Ending, Fail> {
    let sink: Arc<dyn EventSink> = if json {
        Arc::new(JsonLines::new())
    } else {
        Arc::new(HumanTrace::new(is_goal))
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

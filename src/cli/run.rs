//! `sup run` and `sup goal`: flags (and a goal file) into a run spec, the trace on the
//! terminal, signals, and the outcome as an exit status.

use std::sync::Arc;

use anyhow::anyhow;
use tokio_util::sync::CancellationToken;

use super::{Common, Fail, GoalArgs, RunArgs, exit};
use crate::store;
use crate::trace::{EventSink, HumanTrace, JsonLines, Status};
use crate::verify::launch::{self, LaunchError, Overrides, RunSpec, Trigger};
use crate::verify::{Check, check::DEFAULT_TIMEOUT};

pub async fn run(args: RunArgs) -> Result<u8, Fail> {
    let mut o = overrides(&args.common)?;
    o.prompt = Some(args.prompt);
    let spec = RunSpec::build(&o, None).map_err(launch_fail)?;
    execute(spec, args.common.json, false, "cli").await
}

pub async fn goal(args: GoalArgs) -> Result<u8, Fail> {
    let file = match &args.file {
        Some(path) => Some(
            crate::schedule::goals::load(path)
                .map_err(Fail::usage)?
                .file,
        ),
        None => None,
    };
    let mut o = overrides(&args.common)?;
    o.name = args
        .name
        .clone()
        .or_else(|| file.is_none().then(|| "goal".to_string()));
    o.prompt = args.prompt.clone();
    o.tries = args.tries;
    o.fresh = args.fresh;
    o.check_timeout = args.check_timeout;
    for path in &args.checks {
        o.checks
            .push(launch::script_check(path, args.check_timeout).map_err(launch_fail)?);
    }
    for line in &args.check_cmds {
        o.checks.push(Check::command(
            line.clone(),
            args.check_timeout.unwrap_or(DEFAULT_TIMEOUT),
        ));
    }
    let spec = RunSpec::build(&o, file.as_ref()).map_err(launch_fail)?;
    execute(spec, args.common.json, true, "cli").await
}

/// The flags every running command shares, as overrides, with the environment's defaults.
pub fn overrides(c: &Common) -> Result<Overrides, Fail> {
    let (default_model, default_approval) = env_defaults()?;
    Ok(Overrides {
        default_model,
        default_approval,
        model: c.model.clone(),
        max_steps: c.max_steps,
        token_budget: c.token_budget,
        workspace: c.workspace.clone(),
        system: c.system.clone(),
        tool_timeout: c.tool_timeout,
        output_cap: c.output_cap,
        providers: c.provider_options(),
        record: c.record.clone(),
        approval: c.approval,
        allow: c.allow.clone(),
        ask: c.ask.clone(),
        deny: c.deny.clone(),
        approval_timeout: c.approval_timeout,
        mcp: c.mcp.clone(),
        sandbox: crate::tools::sandbox::Sandbox {
            policy: c.sandbox,
            required: c.sandbox_required,
            env_pass: c.env_pass.clone(),
            ..Default::default()
        },
        ..Overrides::default()
    })
}

/// `SUP_MODEL` and `SUP_APPROVAL`: defaults below the flags and the goal file.
pub fn env_defaults() -> Result<(Option<String>, Option<crate::approval::Mode>), Fail> {
    Ok((
        super::env_default("SUP_MODEL", |s| Ok(s.to_string()))?,
        super::env_default("SUP_APPROVAL", super::approval_mode)?,
    ))
}

pub fn launch_fail(e: LaunchError) -> Fail {
    Fail::usage(anyhow!(e))
}

/// Cancel on the first SIGINT or SIGTERM; exit at once on a second SIGINT.
fn watch_signals(cancel: CancellationToken) -> Result<(), Fail> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).map_err(Fail::usage)?;
    let mut term = signal(SignalKind::terminate()).map_err(Fail::usage)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        eprintln!("· interrupting: stopping the model and tools (Ctrl-C again to quit at once)");
        cancel.cancel();
        int.recv().await;
        crate::tools::mcp::kill_all();
        std::process::exit(i32::from(exit::INTERRUPTED));
    });
    Ok(())
}

/// The exit status of an outcome.
pub fn exit_code(outcome: &crate::verify::Outcome) -> u8 {
    match outcome.status {
        Status::Achieved => exit::ACHIEVED,
        Status::Failed => exit::CHECKS_FAILED,
        Status::Unfinished => exit::LIMIT,
        Status::Error if outcome.config_error => exit::USAGE,
        Status::Error => exit::MODEL,
        Status::Interrupted => exit::INTERRUPTED,
    }
}

/// Run a spec in the foreground with the terminal's trace.
pub async fn execute(
    spec: RunSpec,
    json: bool,
    is_goal: bool,
    trigger: &'static str,
) -> Result<u8, Fail> {
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
    let launched = launch::launch(&spec, &store::home(), trigger, vec![sink], &cancel)
        .await
        .map_err(launch_fail)?;
    let outcome = launched.outcome;
    if !json
        && outcome.status == Status::Achieved
        && let Some(answer) = outcome.answer.as_deref().filter(|a| !a.is_empty())
    {
        println!("{answer}");
    }
    Ok(exit_code(&outcome))
}

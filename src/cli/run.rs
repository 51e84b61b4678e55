//! `sup run` and `sup goal`: turn flags and goal files into a goal, set up the run (model,
//! tools, run folder, trace, signals), run it through the verify loop, and map the outcome to
//! an exit status.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, anyhow};
use tokio_util::sync::CancellationToken;

use super::{Common, Fail, GoalArgs, RunArgs, exit};
use crate::model::record::Recorder;
use crate::model::{self, ToolSpec};
use crate::store::{self, RunDir, Transcript};
use crate::tools::command::CommandTool;
use crate::tools::{Registry, builtin};
use crate::trace::{Event, Events, HumanTrace, JsonLines, Status};
use crate::verify::file::{GoalFile, ToolDef};
use crate::verify::{self, Check, Goal, Runtime, check::DEFAULT_TIMEOUT};
use crate::work::Limits;

pub async fn run(args: RunArgs) -> Result<u8, Fail> {
    let spec = Spec::new(args.common, None, "run".into(), Some(args.prompt), false)?;
    execute(spec).await
}

pub async fn goal(args: GoalArgs) -> Result<u8, Fail> {
    let file = match &args.file {
        Some(path) => Some(GoalFile::load(path).map_err(Fail::usage)?),
        None => None,
    };
    let name = args
        .name
        .clone()
        .or_else(|| file.as_ref().map(|f| f.name.clone()))
        .unwrap_or_else(|| "goal".into());
    let prompt = args
        .prompt
        .clone()
        .or_else(|| file.as_ref().and_then(|f| f.prompt.clone()));
    let mut spec = Spec::new(args.common.clone(), file.as_ref(), name, prompt, true)?;
    let timeout = args.check_timeout;
    let mut checks: Vec<Check> = Vec::new();
    if args.checks.is_empty() && args.check_cmds.is_empty() {
        if let Some(f) = &file {
            checks = f.checks.clone();
            if let Some(t) = timeout {
                for c in &mut checks {
                    c.timeout = t;
                }
            }
        }
    }
    for path in &args.checks {
        let full = std::fs::canonicalize(path)
            .with_context(|| format!("check script {} does not exist", path.display()))
            .map_err(Fail::usage)?;
        checks.push(Check::script(
            path.display().to_string(),
            full,
            timeout.unwrap_or(DEFAULT_TIMEOUT),
        ));
    }
    for line in &args.check_cmds {
        checks.push(Check::command(
            line.clone(),
            timeout.unwrap_or(DEFAULT_TIMEOUT),
        ));
    }
    for c in &checks {
        c.validate().map_err(|e| Fail::usage(anyhow!(e)))?;
    }
    spec.goal.checks = checks;
    spec.goal.tries = args
        .tries
        .or_else(|| file.as_ref().and_then(|f| f.tries))
        .unwrap_or(3);
    if spec.goal.tries == 0 {
        return Err(Fail::usage(anyhow!("--tries must be at least 1")));
    }
    spec.goal.fresh = args.fresh || file.as_ref().and_then(|f| f.fresh).unwrap_or(false);
    execute(spec).await
}

/// Everything a run is made of, before it starts.
struct Spec {
    goal: Goal,
    model: String,
    /// Where a relative `script:` path starts: the goal file's folder when the model came
    /// from the file, else the current directory.
    model_base: PathBuf,
    json: bool,
    is_goal: bool,
    tools: Vec<ToolDef>,
    providers: model::ProviderOptions,
    record: Option<PathBuf>,
}

impl Spec {
    fn new(
        common: Common,
        file: Option<&GoalFile>,
        name: String,
        prompt: Option<String>,
        is_goal: bool,
    ) -> Result<Spec, Fail> {
        let prompt = prompt.ok_or_else(|| {
            Fail::usage(anyhow!(
                "no prompt: give one on the command line, or `prompt = \"…\"` in the goal file"
            ))
        })?;
        let from_flag = common.model.clone().filter(|m| !m.is_empty());
        let model_base = match (&from_flag, file) {
            (None, Some(f)) => f
                .path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            _ => PathBuf::from("."),
        };
        let model = from_flag
            .or_else(|| file.and_then(|f| f.model.clone()))
            .ok_or_else(|| {
                Fail::usage(anyhow!(
                    "no model configured: pass --model PROVIDER:MODEL or set SUP_MODEL \
                     (e.g. `--model script:goals/haiku/model.json` to run offline)"
                ))
            })?;
        let workspace = match (&common.workspace, file.and_then(|f| f.workspace.clone())) {
            (Some(w), _) => w.clone(),
            (None, Some(w)) => {
                // A goal file's workspace is made on first use.
                std::fs::create_dir_all(&w)
                    .with_context(|| format!("cannot create the workspace {}", w.display()))
                    .map_err(Fail::usage)?;
                w
            }
            (None, None) => PathBuf::from("."),
        };
        let workspace = std::fs::canonicalize(&workspace)
            .with_context(|| format!("workspace {} does not exist", workspace.display()))
            .map_err(Fail::usage)?;
        if !workspace.is_dir() {
            return Err(Fail::usage(anyhow!(
                "workspace {} is not a folder",
                workspace.display()
            )));
        }
        let defaults = Limits::default();
        let limits = Limits {
            max_steps: common
                .max_steps
                .or_else(|| file.and_then(|f| f.max_steps))
                .unwrap_or(defaults.max_steps),
            token_budget: common
                .token_budget
                .or_else(|| file.and_then(|f| f.token_budget)),
            tool_timeout: common
                .tool_timeout
                .or_else(|| file.and_then(|f| f.tool_timeout))
                .unwrap_or(defaults.tool_timeout),
            output_cap: common.output_cap.unwrap_or(defaults.output_cap),
            repeat_limit: defaults.repeat_limit,
        };
        if limits.max_steps == 0 {
            return Err(Fail::usage(anyhow!("--max-steps must be at least 1")));
        }
        if limits.output_cap < 256 {
            return Err(Fail::usage(anyhow!(
                "--output-cap must be at least 256 bytes"
            )));
        }
        let system = common
            .system
            .clone()
            .or_else(|| file.and_then(|f| f.system.clone()))
            .unwrap_or_else(|| verify::default_system(&workspace));
        Ok(Spec {
            goal: Goal {
                name,
                prompt,
                system,
                checks: Vec::new(),
                tries: 1,
                fresh: false,
                limits,
                workspace,
                feedback_cap: 8 * 1024,
            },
            model,
            model_base,
            json: common.json,
            providers: common.provider_options(),
            record: common.record.clone(),
            is_goal,
            tools: file.map(|f| f.tools.clone()).unwrap_or_default(),
        })
    }
}

fn registry(defs: &[ToolDef]) -> Result<Registry, Fail> {
    let mut registry = Registry::new();
    builtin::register_all(&mut registry).map_err(Fail::usage)?;
    for d in defs {
        let tool = CommandTool::new(
            ToolSpec {
                name: d.name.clone(),
                description: d.description.clone(),
                input_schema: d.input_schema.clone(),
            },
            d.risk,
            d.program.clone(),
            d.args.clone(),
        );
        registry.add(Arc::new(tool)).map_err(Fail::usage)?;
    }
    Ok(registry)
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
        std::process::exit(i32::from(exit::INTERRUPTED));
    });
    Ok(())
}

async fn execute(spec: Spec) -> Result<u8, Fail> {
    let mut model =
        model::from_spec(&spec.model, &spec.model_base, &spec.providers).map_err(Fail::usage)?;
    if let Some(path) = &spec.record {
        model = Box::new(Recorder::new(model, path.clone()).map_err(Fail::usage)?);
    }
    let tools = registry(&spec.tools)?;
    let run = RunDir::create(&store::home()).map_err(Fail::usage)?;
    let transcript = Transcript::create(&run.transcript()).map_err(Fail::usage)?;
    let mut events = Events::new().with(Arc::new(transcript));
    events = if spec.json {
        events.with(Arc::new(JsonLines::new()))
    } else {
        events.with(Arc::new(HumanTrace::new(spec.is_goal)))
    };
    let cancel = CancellationToken::new();
    watch_signals(cancel.clone())?;
    events.emit(Event::RunStarted {
        run_id: run.id.clone(),
        model: model.name().to_string(),
        workspace: spec.goal.workspace.display().to_string(),
        prompt: spec.goal.prompt.clone(),
    });
    let rt = Runtime {
        model: model.as_ref(),
        tools: &tools,
        events: &events,
        cancel: &cancel,
        run: &run,
    };
    let outcome = verify::run(&spec.goal, &rt).await;
    events.emit(outcome.event(&run.id));
    if !spec.json && outcome.status == Status::Achieved {
        if let Some(answer) = outcome.answer.as_deref().filter(|a| !a.is_empty()) {
            println!("{answer}");
        }
    }
    Ok(match outcome.status {
        Status::Achieved => exit::ACHIEVED,
        Status::Failed => exit::CHECKS_FAILED,
        Status::Unfinished => exit::LIMIT,
        Status::Error if outcome.config_error => exit::USAGE,
        Status::Error => exit::MODEL,
        Status::Interrupted => exit::INTERRUPTED,
    })
}

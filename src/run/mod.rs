//! Assembling one run, the same way from every entry point (`sup run`, `sup goal`, the daemon,
//! `sup trigger`): the layers of settings merged (`crate::config`) and resolved into a
//! `RunSpec` (the workspace made and found, checks and rules settled); then the model, the
//! tools, the MCP servers, the approval gate, the run folder, the transcript and the store
//! record set up around the verify loop. A run that started is always recorded, whatever
//! ends it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::approval::queue::QueueApprover;
use crate::approval::{Approver, Gate, Mode, Rules, Terminal, TerminalApprover};
use crate::config::{self, CheckDef, ConfigError, Effective, GoalFile, Settings, Source, ToolDef};
use crate::model::record::Recorder;
use crate::model::{self, ModelError, ProviderOptions, ToolSpec};
use crate::store::db::{Db, DbError, Ended, NewRun};
use crate::store::{RunDir, StoreError, Transcript, TriggerKind};
use crate::tools::command::CommandTool;
use crate::tools::mcp::{McpError, ServerSpec, Servers};
use crate::tools::{Registry, RegistryError, builtin};
use crate::trace::{Event, EventSink, Events};
use crate::verify::{Check, Goal, Outcome, Runtime, default_system};
use crate::work::Limits;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tools(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Mcp(#[from] McpError),
}

/// What the command line and the environment say, apart from a goal file.
#[derive(Clone, Debug, Default)]
pub struct Invocation {
    /// The flags' layer.
    pub flags: Settings,
    /// Checks from `--check` / `--check-cmd`; when any, they replace the goal file's.
    pub checks: Vec<CheckDef>,
    /// The environment's layer (`Settings::from_env`).
    pub env: Settings,
}

/// Everything a run is made of, before it starts.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub goal: Goal,
    pub model: String,
    /// Where a relative `script:` path starts.
    pub model_base: PathBuf,
    pub tools: Vec<ToolDef>,
    pub providers: ProviderOptions,
    pub record: Option<PathBuf>,
    pub keep_runs: u32,
    /// The approval mode asked for; `None` picks by where the run happens.
    pub approval: Option<Mode>,
    pub rules: Rules,
    pub approval_timeout: Duration,
    pub mcp: Vec<ServerSpec>,
    /// The effective settings and where each came from.
    pub effective: Effective,
}

fn setup(msg: impl Into<String>) -> RunError {
    RunError::Setup(msg.into())
}

impl RunSpec {
    /// Read the user config, merge every layer, and resolve the result.
    pub fn build(inv: &Invocation, file: Option<&GoalFile>) -> Result<RunSpec, RunError> {
        let user = config::UserConfig::load()?;
        let effective = config::merge(&config::Layers {
            flags: &inv.flags,
            goal: file,
            env: &inv.env,
            user: &user,
        })?;
        Self::resolve(effective, &inv.checks, file)
    }

    /// Settle what depends on the machine: the workspace (a goal file's is made on first
    /// use), check timeouts, defaults that depend on other settings.
    pub fn resolve(
        effective: Effective,
        flag_checks: &[CheckDef],
        file: Option<&GoalFile>,
    ) -> Result<RunSpec, RunError> {
        let s = &effective.settings;
        let from = |key: &str| effective.provenance.source(key);
        // A relative `script:` path starts at the goal file's folder when the model came
        // from the file.
        let model_base = match (from("model"), file) {
            (Some(Source::GoalFile(_)), Some(f)) => f.dir(),
            _ => PathBuf::from("."),
        };
        let workspace = match &s.workspace {
            Some(w) => {
                if matches!(from("workspace"), Some(Source::GoalFile(_))) {
                    std::fs::create_dir_all(w).map_err(|e| {
                        setup(format!("cannot create the workspace {}: {e}", w.display()))
                    })?;
                }
                w.clone()
            }
            None => PathBuf::from("."),
        };
        let workspace = std::fs::canonicalize(&workspace)
            .ok()
            .filter(|w| w.is_dir())
            .ok_or_else(|| setup(format!("workspace {} is not a folder", workspace.display())))?;
        let limits = Limits {
            max_steps: s.max_steps.unwrap_or_default(),
            token_budget: s.token_budget,
            tool_timeout: s.tool_timeout.unwrap_or_default(),
            output_cap: s.output_cap.unwrap_or_default(),
            repeat_limit: Limits::default().repeat_limit,
        };
        let check_timeout = s.check_timeout.unwrap_or_default();
        let forced = matches!(from("check_timeout"), Some(Source::Flag));
        let defs = if flag_checks.is_empty() {
            file.map(|f| f.checks.as_slice()).unwrap_or_default()
        } else {
            flag_checks
        };
        let checks: Vec<Check> = defs
            .iter()
            .map(|d| {
                let mut c = d.check.clone();
                c.timeout = match d.timeout {
                    Some(own) if !forced => own,
                    _ => check_timeout,
                };
                c
            })
            .collect();
        for c in &checks {
            c.validate().map_err(setup)?;
        }
        let tries = s.tries.unwrap_or(if checks.is_empty() { 1 } else { 3 });
        let r = &s.approval_rules;
        let rules = Rules::parse(&r.allow, &r.ask, &r.deny).map_err(ConfigError::from)?;
        let name = s
            .name
            .clone()
            .or_else(|| file.map(|f| f.name.clone()))
            .unwrap_or_else(|| "run".into());
        let http = crate::model::http::HttpOptions {
            stream: !s.no_stream.unwrap_or_default(),
            request_timeout: s.request_timeout.unwrap_or_default(),
            idle_timeout: s.idle_timeout.unwrap_or_default(),
            max_attempts: s.retries.unwrap_or_default().max(1),
            ..Default::default()
        };
        Ok(RunSpec {
            goal: Goal {
                name,
                prompt: s.prompt.clone().unwrap_or_default(),
                system: s
                    .system
                    .clone()
                    .unwrap_or_else(|| default_system(&workspace)),
                checks,
                tries,
                fresh: s.fresh.unwrap_or_default(),
                limits,
                workspace,
                feedback_cap: 8 * 1024,
            },
            model: s.model.clone().unwrap_or_default(),
            model_base,
            tools: file.map(|f| f.tools.clone()).unwrap_or_default(),
            providers: ProviderOptions {
                base_url: s.base_url.clone(),
                http,
                max_tokens: s.max_tokens,
            },
            record: s.record.clone(),
            keep_runs: s.keep_runs.unwrap_or_default(),
            approval: s.approval,
            rules,
            approval_timeout: s.approval_timeout.unwrap_or_default(),
            mcp: s
                .mcp
                .iter()
                .map(|m| ServerSpec {
                    name: m.name.clone(),
                    command: m.command.clone(),
                    args: m.args.clone(),
                    env: m.env.clone(),
                })
                .collect(),
            effective,
        })
    }
}

/// A check from `--check FILE`; `human` is a person.
pub fn script_check(path: &Path) -> Result<CheckDef, RunError> {
    let check = if path == Path::new("human") && !path.exists() {
        Check::human(
            "Is the work done? Accept it, or reject it and say what is wrong.".into(),
            Duration::ZERO,
        )
    } else {
        let full = std::fs::canonicalize(path)
            .map_err(|_| setup(format!("check script {} does not exist", path.display())))?;
        Check::script(path.display().to_string(), full, Duration::ZERO)
    };
    Ok(CheckDef {
        check,
        timeout: None,
    })
}

/// A check from `--check-cmd LINE`.
pub fn command_check(line: &str) -> CheckDef {
    CheckDef {
        check: Check::command(line.to_string(), Duration::ZERO),
        timeout: None,
    }
}

fn registry(defs: &[ToolDef]) -> Result<Registry, RunError> {
    let mut registry = Registry::new();
    builtin::register_all(&mut registry)?;
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
        registry.add_with_timeout(Arc::new(tool), d.timeout)?;
    }
    Ok(registry)
}

/// What started a run.
#[derive(Clone, Copy, Debug)]
pub struct Trigger {
    pub kind: TriggerKind,
    pub scheduled_for: Option<DateTime<Utc>>,
}

/// A run that happened.
pub struct Launched {
    pub run_id: String,
    pub outcome: Outcome,
}

/// The approval gate of a run. Scheduled runs never prompt (their default is `queue`); a run
/// with no terminal never waits on a prompt (its default is `never`), and says so. Calls are
/// put to the terminal when there is one and the mode is not `queue`, else to the queue;
/// human checks to the terminal when there is one.
fn gate(spec: &RunSpec, trigger: Trigger, run_id: &str, home: &Path, events: &Events) -> Gate {
    let scheduled = trigger.kind == TriggerKind::Schedule;
    let terminal = if scheduled { None } else { Terminal::detect() };
    let notice = |text: String| events.emit(Event::Notice { text });
    let mode = match spec.approval {
        Some(Mode::Ask) if scheduled => {
            notice("approval: scheduled runs never prompt; mode ask becomes queue".into());
            Mode::Queue
        }
        Some(Mode::Ask) if terminal.is_none() => {
            notice(
                "approval: no terminal to ask at, so mode never: write and exec calls that no \
                 rule allows are denied (use --approval queue or auto)"
                    .into(),
            );
            Mode::Never
        }
        Some(m) => m,
        None if scheduled => Mode::Queue,
        None if terminal.is_some() => Mode::Ask,
        None => {
            notice(
                "approval: no terminal, so mode never: write and exec calls that no rule \
                 allows are denied (use --approval queue or auto, or allow rules)"
                    .into(),
            );
            Mode::Never
        }
    };
    let queue: Arc<dyn Approver> = Arc::new(QueueApprover {
        home: home.to_path_buf(),
        run_id: run_id.to_string(),
        goal: spec.goal.name.clone(),
        timeout: spec.approval_timeout,
    });
    let terminal: Option<Arc<dyn Approver>> = terminal.map(|terminal| {
        Arc::new(TerminalApprover {
            terminal,
            workspace: spec.goal.workspace.clone(),
        }) as Arc<dyn Approver>
    });
    let calls = match &terminal {
        Some(t) if mode != Mode::Queue => t.clone(),
        _ => queue.clone(),
    };
    Gate::new(mode, spec.rules.clone(), calls, terminal.unwrap_or(queue))
}

/// Set up and run `spec` to its end, recording it in the store under `home`.
pub async fn launch(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    let mut model = model::from_spec(&spec.model, &spec.model_base, &spec.providers)?;
    if let Some(path) = &spec.record {
        model = Box::new(Recorder::new(model, path.clone())?);
    }
    let mut tools = registry(&spec.tools)?;
    let mut db = Db::open(home)?;
    let run = RunDir::create(home)?;
    // MCP servers start before the first model call; one that cannot start ends the run
    // here, before anything was recorded.
    let (mut servers, mcp_tools) =
        match Servers::start(&spec.mcp, &spec.goal.workspace, &run.dir).await {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&run.dir);
                return Err(e.into());
            }
        };
    for t in mcp_tools {
        if let Err(e) = tools.add(t) {
            servers.shutdown().await;
            let _ = std::fs::remove_dir_all(&run.dir);
            return Err(e.into());
        }
    }
    let mut events = Events::new().with(Arc::new(Transcript::create(&run.transcript())?));
    for sink in sinks {
        events = events.with(sink);
    }
    db.start_run(&NewRun {
        id: &run.id,
        goal: &spec.goal.name,
        trigger: trigger.kind,
        scheduled_for: trigger.scheduled_for,
        model: model.name(),
        workspace: &spec.goal.workspace.display().to_string(),
        dir: &run.dir.display().to_string(),
    })?;
    events.emit(Event::RunStarted {
        run_id: run.id.clone(),
        model: model.name().to_string(),
        workspace: spec.goal.workspace.display().to_string(),
        prompt: spec.goal.prompt.clone(),
    });
    let gate = gate(spec, trigger, &run.id, home, &events);
    let rt = Runtime {
        model: model.as_ref(),
        tools: &tools,
        events: &events,
        cancel,
        run: &run,
        gate: Some(&gate),
    };
    let outcome = crate::verify::run(&spec.goal, &rt).await;
    servers.shutdown().await;
    events.emit(outcome.event(&run.id));
    db.finish_run(
        &run.id,
        &Ended {
            status: outcome.status,
            stop_reason: outcome.stop_reason,
            tries: outcome.tries,
            steps: outcome.steps,
            usage: outcome.usage,
            error: outcome.error.as_deref(),
            checks: &outcome.checks,
        },
    )?;
    for dir in db.prune(&spec.goal.name, spec.keep_runs)? {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!("cannot remove the pruned run folder {dir}: {e}");
        }
    }
    Ok(Launched {
        run_id: run.id,
        outcome,
    })
}

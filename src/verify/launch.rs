//! Launching a goal run, the same way from every entry point (`sup run`, `sup goal`, the
//! daemon, `sup trigger`): flags and goal file merged into a `RunSpec`; then the model, the
//! tools, the run folder, the transcript and the store record set up around the verify loop.
//! A run that started is always recorded, whatever ends it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::check::DEFAULT_TIMEOUT;
use super::file::{GoalFile, ToolDef};
use super::{Check, Goal, Outcome, Runtime, default_system};
use crate::approval::{self, Gate, Mode, QueueTarget, Rules, Terminal};
use crate::model::record::Recorder;
use crate::model::{self, ModelError, ProviderOptions, ToolSpec};
use crate::store::db::{Db, DbError, Ended, NewRun};
use crate::store::{RunDir, StoreError, Transcript};
use crate::tools::command::CommandTool;
use crate::tools::mcp::{McpError, ServerSpec, Servers};
use crate::tools::{Registry, RegistryError, builtin};
use crate::trace::{Event, EventSink, Events};
use crate::work::Limits;

/// Runs kept per goal unless the goal file says `keep_runs`.
pub const DEFAULT_KEEP_RUNS: u32 = 100;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tools(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Rule(#[from] approval::RuleError),
    #[error(transparent)]
    Mcp(#[from] McpError),
}

/// What the command line may say over a goal file. `None` leaves the file's value.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub name: Option<String>,
    pub prompt: Option<String>,
    /// `--model`: wins over the goal file.
    pub model: Option<String>,
    /// `SUP_MODEL`: used when neither the flag nor the goal file names a model.
    pub default_model: Option<String>,
    pub max_steps: Option<u32>,
    pub token_budget: Option<u64>,
    pub workspace: Option<PathBuf>,
    pub system: Option<String>,
    pub tool_timeout: Option<Duration>,
    pub output_cap: Option<usize>,
    pub providers: ProviderOptions,
    pub record: Option<PathBuf>,
    pub tries: Option<u32>,
    pub fresh: bool,
    /// Checks from flags; they replace the file's checks.
    pub checks: Vec<Check>,
    pub check_timeout: Option<Duration>,
    /// `--approval`: wins over the goal file.
    pub approval: Option<Mode>,
    /// `SUP_APPROVAL`: used when neither the flag nor the goal file names a mode.
    pub default_approval: Option<Mode>,
    pub allow: Vec<String>,
    pub ask: Vec<String>,
    pub deny: Vec<String>,
    pub approval_timeout: Option<Duration>,
    /// MCP servers from `--mcp`, added to the goal file's.
    pub mcp: Vec<ServerSpec>,
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
}

fn usage(msg: impl Into<String>) -> LaunchError {
    LaunchError::Usage(msg.into())
}

impl RunSpec {
    /// Merge flags over a goal file; check what can be checked before any model call.
    pub fn build(o: &Overrides, file: Option<&GoalFile>) -> Result<RunSpec, LaunchError> {
        let prompt = o
            .prompt
            .clone()
            .or_else(|| file.and_then(|f| f.prompt.clone()))
            .ok_or_else(|| {
                usage(
                    "no prompt: give one on the command line, or `prompt = \"…\"` in the goal file",
                )
            })?;
        // The flag, then the goal file, then SUP_MODEL. A relative `script:` path starts at
        // the goal file's folder when the model came from the file.
        let flag = o.model.clone().filter(|m| !m.is_empty());
        let from_file = file
            .and_then(|f| f.model.clone())
            .filter(|_| flag.is_none());
        let model_base = match (&from_file, file) {
            (Some(_), Some(f)) => f
                .path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            _ => PathBuf::from("."),
        };
        let model = flag
            .or(from_file)
            .or_else(|| o.default_model.clone().filter(|m| !m.is_empty()))
            .ok_or_else(|| {
                usage(
                    "no model configured: pass --model PROVIDER:MODEL or set SUP_MODEL \
                     (e.g. `--model script:goals/scripts/haiku.json` to run offline, or \
                     `--model openai:gpt-4o-mini`)",
                )
            })?;
        let workspace = match (&o.workspace, file.and_then(|f| f.workspace.clone())) {
            (Some(w), _) => w.clone(),
            (None, Some(w)) => {
                // A goal file's workspace is made on first use.
                std::fs::create_dir_all(&w).map_err(|e| {
                    usage(format!("cannot create the workspace {}: {e}", w.display()))
                })?;
                w
            }
            (None, None) => PathBuf::from("."),
        };
        let workspace = std::fs::canonicalize(&workspace)
            .ok()
            .filter(|w| w.is_dir())
            .ok_or_else(|| usage(format!("workspace {} is not a folder", workspace.display())))?;
        let defaults = Limits::default();
        let limits = Limits {
            max_steps: o
                .max_steps
                .or_else(|| file.and_then(|f| f.max_steps))
                .unwrap_or(defaults.max_steps),
            token_budget: o.token_budget.or_else(|| file.and_then(|f| f.token_budget)),
            tool_timeout: o
                .tool_timeout
                .or_else(|| file.and_then(|f| f.tool_timeout))
                .unwrap_or(defaults.tool_timeout),
            output_cap: o.output_cap.unwrap_or(defaults.output_cap),
            repeat_limit: defaults.repeat_limit,
        };
        if limits.max_steps == 0 {
            return Err(usage("--max-steps must be at least 1"));
        }
        if limits.output_cap < 256 {
            return Err(usage("--output-cap must be at least 256 bytes"));
        }
        let system = o
            .system
            .clone()
            .or_else(|| file.and_then(|f| f.system.clone()))
            .unwrap_or_else(|| default_system(&workspace));
        let mut checks = if o.checks.is_empty() {
            file.map(|f| f.checks.clone()).unwrap_or_default()
        } else {
            o.checks.clone()
        };
        if let Some(t) = o.check_timeout {
            for c in &mut checks {
                c.timeout = t;
            }
        }
        for c in &checks {
            c.validate().map_err(usage)?;
        }
        let tries = o
            .tries
            .or_else(|| file.and_then(|f| f.tries))
            .unwrap_or(if checks.is_empty() { 1 } else { 3 });
        if tries == 0 {
            return Err(usage("--tries must be at least 1"));
        }
        let file_rules = file.map(|f| f.approval_rules.clone()).unwrap_or_default();
        let mut rules = user_rules()?;
        rules.extend(Rules::parse(
            &file_rules.allow,
            &file_rules.ask,
            &file_rules.deny,
        )?);
        rules.extend(Rules::parse(&o.allow, &o.ask, &o.deny)?);
        // The flag, then the goal file, then SUP_APPROVAL.
        let approval = o
            .approval
            .or_else(|| {
                file.and_then(|f| f.approval.as_ref())
                    .and_then(|a| Mode::parse(&a.value))
            })
            .or(o.default_approval);
        let name = o
            .name
            .clone()
            .or_else(|| file.map(|f| f.name.clone()))
            .unwrap_or_else(|| "run".into());
        Ok(RunSpec {
            goal: Goal {
                name,
                prompt,
                system,
                checks,
                tries,
                fresh: o.fresh || file.and_then(|f| f.fresh).unwrap_or(false),
                limits,
                workspace,
                feedback_cap: 8 * 1024,
            },
            model,
            model_base,
            tools: file.map(|f| f.tools.clone()).unwrap_or_default(),
            providers: o.providers.clone(),
            record: o.record.clone(),
            keep_runs: file.and_then(|f| f.keep_runs).unwrap_or(DEFAULT_KEEP_RUNS),
            approval,
            rules,
            mcp: file
                .map(|f| {
                    f.mcp
                        .iter()
                        .map(|m| ServerSpec {
                            name: m.name.clone(),
                            command: m.command.clone(),
                            args: m.args.clone(),
                            env: m.env.clone(),
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
                .into_iter()
                .chain(o.mcp.iter().cloned())
                .collect(),
            approval_timeout: o
                .approval_timeout
                .or_else(|| file.and_then(|f| f.approval_timeout))
                .unwrap_or(approval::DEFAULT_TIMEOUT),
        })
    }
}

/// The user's config file: `$SUP_CONFIG`, or `$XDG_CONFIG_HOME/sup/config.toml`, or
/// `~/.config/sup/config.toml`.
pub fn user_config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SUP_CONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("sup/config.toml"))
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct UserConfig {
    #[serde(default)]
    approval_rules: crate::verify::file::RawRules,
}

/// Approval rules from the user's config file (none when it does not exist).
fn user_rules() -> Result<Rules, LaunchError> {
    let Some(path) = user_config_path().filter(|p| p.exists()) else {
        return Ok(Rules::default());
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
    let config: UserConfig = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map_or(0, |s| text[..s.start].matches('\n').count() + 1);
        usage(format!("{}:{line}: {}", path.display(), e.message().trim()))
    })?;
    let r = config.approval_rules;
    Ok(Rules::parse(&r.allow, &r.ask, &r.deny)?)
}

/// A check from `--check FILE`; `human` is a person.
pub fn script_check(path: &Path, timeout: Option<Duration>) -> Result<Check, LaunchError> {
    if path == Path::new("human") && !path.exists() {
        return Ok(Check::human(
            "Is the work done? Accept it, or reject it and say what is wrong.".into(),
            timeout.unwrap_or(DEFAULT_TIMEOUT),
        ));
    }
    script_check_file(path, timeout)
}

/// A check from `--check FILE`.
fn script_check_file(path: &Path, timeout: Option<Duration>) -> Result<Check, LaunchError> {
    let full = std::fs::canonicalize(path)
        .map_err(|_| usage(format!("check script {} does not exist", path.display())))?;
    Ok(Check::script(
        path.display().to_string(),
        full,
        timeout.unwrap_or(DEFAULT_TIMEOUT),
    ))
}

fn registry(defs: &[ToolDef]) -> Result<Registry, LaunchError> {
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
        registry.add(Arc::new(tool))?;
    }
    Ok(registry)
}

/// What started a run.
#[derive(Clone, Copy, Debug)]
pub struct Trigger {
    /// `cli`, `schedule` or `manual`.
    pub kind: &'static str,
    pub scheduled_for: Option<DateTime<Utc>>,
}

/// A run that happened.
pub struct Launched {
    pub run_id: String,
    pub outcome: Outcome,
}

/// The approval gate of a run. Scheduled runs never prompt (their default is `queue`); a run
/// with no terminal never waits on a prompt (its default is `never`), and says so.
fn gate(spec: &RunSpec, trigger: Trigger, run_id: &str, home: &Path, events: &Events) -> Gate {
    let scheduled = trigger.kind == "schedule";
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
    Gate::new(
        mode,
        spec.rules.clone(),
        spec.approval_timeout,
        terminal,
        QueueTarget {
            home: home.to_path_buf(),
            run_id: run_id.to_string(),
            goal: spec.goal.name.clone(),
        },
        spec.goal.workspace.clone(),
    )
}

/// Set up and run `spec` to its end, recording it in the store under `home`.
pub async fn launch(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, LaunchError> {
    launch_in(spec, home, trigger, None, sinks, cancel).await
}

/// `launch` for a run whose row the caller wrote already (the daemon, in the transaction
/// that claimed its occurrence), in the folder `run` names. A run that cannot start is
/// recorded as an error.
pub async fn launch_recorded(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    run: RunDir,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, LaunchError> {
    let id = run.id.clone();
    let result = launch_in(spec, home, trigger, Some(run), sinks, cancel).await;
    if let Err(e) = &result {
        let failed = Db::open(home).and_then(|db| db.fail_run(&id, &e.to_string()));
        if let Err(db) = failed {
            tracing::error!("run {id}: cannot record that it could not start: {db}");
        }
    }
    result
}

async fn launch_in(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    recorded: Option<RunDir>,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, LaunchError> {
    let mut model = model::from_spec(&spec.model, &spec.model_base, &spec.providers)?;
    if let Some(path) = &spec.record {
        model = Box::new(Recorder::new(model, path.clone())?);
    }
    let mut tools = registry(&spec.tools)?;
    let mut db = Db::open(home)?;
    let prerecorded = recorded.is_some();
    let run = match recorded {
        Some(run) => {
            run.make()?;
            run
        }
        None => RunDir::create(home)?,
    };
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
    if !prerecorded {
        db.start_run(&NewRun {
            id: &run.id,
            goal: &spec.goal.name,
            trigger: trigger.kind,
            scheduled_for: trigger.scheduled_for,
            model: model.name(),
            workspace: &spec.goal.workspace.display().to_string(),
            dir: &run.dir.display().to_string(),
        })?;
    } else if model.name() != spec.model {
        db.set_run_model(&run.id, model.name())?;
    }
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
    let outcome = super::run(&spec.goal, &rt).await;
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

//! Assembling one run, the same way from every entry point (`sup run`, `sup goal`, the daemon,
//! `sup trigger`): the layers of settings merged (`crate::config`) and resolved into a
//! `RunSpec` (the workspace made and found, checks and rules settled); then the model, the
//! tools, the MCP servers, the approval gate, the run folder, the transcript and the store
//! record set up around the verify loop. A run that started is always recorded, whatever
//! ends it.

pub(crate) mod parallel;
pub(crate) mod resume;
pub(crate) mod worktree;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::approval::queue::QueueApprover;
use crate::approval::{Approver, Gate, Mode, Rules, Terminal, TerminalApprover};
use crate::config::{self, CheckDef, ConfigError, Effective, GoalFile, Settings, Source, ToolDef};
use crate::model::prices::{Price, Prices};
use crate::model::record::Recorder;
use crate::model::{self, ModelError, ProviderOptions, ToolSpec};
use crate::notify::{Notice, Notifier, Notify};
use crate::store::db::{Db, DbError, Ended, KeptOutcome, KeptRun, NewRun, PATIENCE};
use crate::store::pg::{self, PgError, PgStore};
use crate::store::{RunDir, StoreError, Transcript, TriggerKind};
use crate::template::{self, Source as Template};
use crate::tools::command::CommandTool;
use crate::tools::mcp::{McpError, ServerSpec, Servers};
use crate::tools::sandbox::{Jail, Sandbox, SandboxError};
use crate::tools::{Registry, RegistryError, builtin};
use crate::trace::{CheckReport, Event, EventSink, Events};
use crate::verify::{Check, Goal, Outcome, Runtime, default_system};
use crate::work::Limits;
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
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
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Pg(#[from] PgError),
    #[error(transparent)]
    Worktree(#[from] worktree::WorktreeError),
}

/// What the command line and the environment say, apart from a goal file.
#[derive(Clone, Debug, Default)]
pub struct Invocation {
    /// The flags' layer.
    pub(crate) flags: Settings,
    /// Checks from `--check` / `--check-cmd`; when any, they replace the goal file's.
    pub(crate) checks: Vec<CheckDef>,
    /// The environment's layer (`Settings::from_env`).
    pub(crate) env: Settings,
}

/// Everything a run is made of, before it starts.
#[derive(Clone, Debug)]
pub(crate) struct RunSpec {
    pub(crate) goal: Goal,
    pub(crate) model: String,
    /// Where a relative `script:` path starts.
    pub(crate) model_base: PathBuf,
    pub(crate) tools: Vec<ToolDef>,
    pub(crate) providers: ProviderOptions,
    pub(crate) record: Option<PathBuf>,
    pub(crate) keep_runs: u32,
    /// The approval mode asked for; `None` picks by where the run happens.
    pub(crate) approval: Option<Mode>,
    pub(crate) rules: Rules,
    pub(crate) approval_timeout: Duration,
    pub(crate) mcp: Vec<ServerSpec>,
    /// The effective settings and where each came from.
    pub(crate) effective: Effective,
    /// The prompt and system prompt as written; `goal.prompt` and `goal.system` are
    /// rendered from them at the start of each run.
    pub(crate) prompt_src: Template,
    pub(crate) system_src: Template,
    pub(crate) params: BTreeMap<String, String>,
    /// The goal's time zone (`timezone`, else the machine's).
    pub(crate) timezone: chrono_tz::Tz,
    /// The goal file's and the user config's `[[notify]]` tables.
    pub(crate) notify: Vec<Notify>,
    /// The model's price, when known.
    pub(crate) price: Option<Price>,
    pub(crate) max_cost: Option<f64>,
    pub(crate) max_cost_per_day: Option<f64>,
    /// Why the run may not start: a cost cap on a model whose price is unknown, unless
    /// `unknown_price = "allow"` (`--print-config` still prints).
    pub(crate) price_refusal: Option<String>,
    /// The sandbox of the run's processes, with the goal file and user config protected.
    pub(crate) sandbox: Sandbox,
    /// A git worktree of its own, parallel attempts (`worktree`, `parallel`).
    pub(crate) isolate: worktree::Isolate,
    /// How the run ties to others: where it came from, what it continues, which attempt.
    pub(crate) thread: resume::Thread,
    /// The body of the webhook delivery that started the run (`{{ trigger.payload }}`).
    pub(crate) payload: Option<Arc<serde_json::Value>>,
}

fn setup(msg: impl Into<String>) -> RunError {
    RunError::Setup(msg.into())
}

impl RunSpec {
    /// Read the user config, merge every layer, and resolve the result.
    pub(crate) fn build(inv: &Invocation, file: Option<&GoalFile>) -> Result<RunSpec, RunError> {
        Self::build_with(inv, &config::UserConfig::load()?, file)
    }

    /// `build` with the user config read already (the daemon reads it once for all goals).
    pub(crate) fn build_with(
        inv: &Invocation,
        user: &config::UserConfig,
        file: Option<&GoalFile>,
    ) -> Result<RunSpec, RunError> {
        let effective = config::merge(&config::Layers {
            flags: &inv.flags,
            goal: file,
            env: &inv.env,
            user,
        })?;
        Self::resolve(effective, &inv.checks, file)
    }

    /// The model's name as the run's model will give it (`script:` with its full path).
    pub(crate) fn model_name(&self) -> String {
        model::resolved_name(&self.model, &self.model_base)
    }

    /// Settle what depends on the machine: the workspace (a goal file's is made on first
    /// use), check timeouts, defaults that depend on other settings.
    pub(crate) fn resolve(
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
            price: None,
            max_cost: None,
            context_window: s.context_window.or_else(|| {
                crate::model::windows::window(&s.model.clone().unwrap_or_default(), &s.models)
            }),
            compact_at: s.compact_at.unwrap_or(crate::work::DEFAULT_COMPACT_AT),
            learned_window: Default::default(),
            pool: None,
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
        let checks = judges_resolved(
            checks,
            &effective,
            file,
            flag_checks.is_empty(),
            &model_base,
        )?;
        let tries = s.tries.unwrap_or(if checks.is_empty() { 1 } else { 3 });
        let r = &s.approval_rules;
        let rules = Rules::parse(&r.allow, &r.ask, &r.deny).map_err(ConfigError::from)?;
        let name = s
            .name
            .clone()
            .or_else(|| file.map(|f| f.name.clone()))
            .unwrap_or_else(|| "run".into());
        let unattended = Unattended::resolve(&effective, file, &workspace)?;
        let http = crate::model::http::HttpOptions {
            stream: !s.no_stream.unwrap_or_default(),
            request_timeout: s.request_timeout.unwrap_or_default(),
            idle_timeout: s.idle_timeout.unwrap_or_default(),
            max_attempts: s.retries.unwrap_or_default().max(1),
            ..Default::default()
        };
        let sandbox = Sandbox {
            policy: Some(s.sandbox.unwrap_or_default()),
            network: s.network.clone(),
            writable: s.writable.iter().map(PathBuf::from).collect(),
            required: s.sandbox_required.unwrap_or(false),
            keep_background: s.keep_background.unwrap_or(false),
            env_pass: s.env_pass.clone(),
            protect: file
                .map(|f| f.path.clone())
                .into_iter()
                .chain(config::UserConfig::path())
                .collect(),
            goals: None,
            unix_sockets: s.unix_sockets.unwrap_or(false),
            hidden: s.hidden.iter().map(PathBuf::from).collect(),
            readable: s.readable.iter().map(PathBuf::from).collect(),
            max_processes: s.max_processes,
            max_memory: s.max_memory,
        };
        let protect = Arc::new(
            crate::tools::Protected::new(&workspace, &s.protect, &sandbox.writable)
                .map_err(setup)?,
        );
        let isolate = worktree::Isolate::resolve(s, &workspace)?;
        Ok(RunSpec {
            isolate,
            thread: resume::Thread::default(),
            sandbox,
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
                protect,
                workspace_toolchain: s.workspace_toolchain.unwrap_or(false),
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
                    url: m.url.clone(),
                    headers: m.headers.clone(),
                    args: m.args.clone(),
                    env: m.env.clone(),
                    trust_annotations: m.trust_annotations,
                    sandbox: m.sandbox,
                    env_pass: m.env_pass.clone(),
                })
                .collect(),
            effective,
            prompt_src: unattended.prompt_src,
            system_src: unattended.system_src,
            params: unattended.params,
            timezone: unattended.timezone,
            notify: unattended.notify,
            price: unattended.price,
            max_cost: unattended.max_cost,
            max_cost_per_day: unattended.max_cost_per_day,
            price_refusal: unattended.refusal,
            payload: None,
        })
    }
}

/// The settings of unattended operation, resolved: templates checked, notify tables,
/// the price and the cost caps (a cap on an unpriced model refuses unless allowed).
struct Unattended {
    prompt_src: Template,
    system_src: Template,
    params: BTreeMap<String, String>,
    timezone: chrono_tz::Tz,
    notify: Vec<Notify>,
    price: Option<Price>,
    max_cost: Option<f64>,
    max_cost_per_day: Option<f64>,
    refusal: Option<String>,
}

impl Unattended {
    fn resolve(
        effective: &Effective,
        file: Option<&GoalFile>,
        workspace: &Path,
    ) -> Result<Unattended, RunError> {
        let s = &effective.settings;
        let from = |key: &str| effective.provenance.source(key);
        let source = |key: &'static str, text: String| {
            let in_file = matches!(from(key), Some(Source::GoalFile(_)));
            Template {
                text,
                file: match file {
                    Some(f) if in_file => f.path.display().to_string(),
                    _ => format!("(the {key} on the command line)"),
                },
                line: match file {
                    Some(f) if in_file => f.lines.get(key).copied().unwrap_or(1),
                    _ => 1,
                },
            }
        };
        let prompt_src = source("prompt", s.prompt.clone().unwrap_or_default());
        let system_src = source(
            "system",
            s.system
                .clone()
                .unwrap_or_else(|| default_system(workspace)),
        );
        // Later entries come from higher sources: `--param` wins over `[params]`.
        let params: BTreeMap<String, String> = s.params.iter().cloned().collect();
        prompt_src
            .check(&params)
            .map_err(|e| setup(e.to_string()))?;
        system_src
            .check(&params)
            .map_err(|e| setup(e.to_string()))?;
        let timezone = match &s.timezone {
            Some(z) => crate::config::parse_zone(z.get_ref()).map_err(|m| {
                let at = file
                    .map(|f| {
                        format!(
                            "{}:{}: ",
                            f.path.display(),
                            f.lines.get("timezone").copied().unwrap_or(0)
                        )
                    })
                    .unwrap_or_default();
                setup(format!("{at}key `timezone`: {m}"))
            })?,
            None => crate::config::local_zone(),
        };
        let notify = s
            .notify
            .iter()
            .map(|n| Notify::parse(n.get_ref().clone()).map_err(|e| setup(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let prices = Prices::new(s.prices.clone()).map_err(|e| setup(e.to_string()))?;
        let model = s.model.clone().unwrap_or_default();
        let price = prices.get(&model);
        let capped = s.max_cost.is_some() || s.max_cost_per_day.is_some();
        let allow = s.unknown_price == Some(config::UnknownPrice::Allow);
        let refusal = (price.is_none() && capped && !allow).then(|| {
            format!(
                "the price of `{model}` is unknown, so its cost cap cannot be kept: add it to \
                 the user config ({}):\n  [prices.\"{model}\"]\n  input = 1.0    # US dollars \
                 per million input tokens\n  output = 4.0\n  cache_read = 0.1\n  \
                 cache_write = 1.25\nor set `unknown_price = \"allow\"` to run without the cap",
                config::UserConfig::path().map_or_else(
                    || "~/.config/sup/config.toml".to_string(),
                    |p| p.display().to_string()
                )
            )
        });
        Ok(Unattended {
            refusal,
            prompt_src,
            system_src,
            params,
            timezone,
            notify,
            price,
            max_cost: s.max_cost,
            max_cost_per_day: s.max_cost_per_day,
        })
    }
}

/// A check from `--check FILE`; `human` is a person.
pub(crate) fn script_check(path: &Path) -> Result<CheckDef, RunError> {
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

/// A check from `--check-judge CRITERIA`.
pub(crate) fn judge_check(criteria: &str) -> Result<CheckDef, RunError> {
    if criteria.trim().is_empty() {
        return Err(setup(
            "--check-judge: the criteria are empty; say what the judge should find, e.g. \
             --check-judge \"README.md explains how to install\"",
        ));
    }
    Ok(CheckDef {
        check: Check::judge(criteria.to_string(), None, Duration::ZERO),
        timeout: None,
    })
}

/// Each judge check with its model settled (its own, else `judge_model`, else the run's),
/// where a relative `script:` path of it starts, and its price.
fn judges_resolved(
    mut checks: Vec<Check>,
    effective: &Effective,
    file: Option<&GoalFile>,
    from_file: bool,
    model_base: &Path,
) -> Result<Vec<Check>, RunError> {
    let s = &effective.settings;
    let prices = Prices::new(s.prices.clone()).map_err(|e| setup(e.to_string()))?;
    let file_dir = file.map(GoalFile::dir);
    let judge_model_base = match (effective.provenance.source("judge_model"), &file_dir) {
        (Some(Source::GoalFile(_)), Some(d)) => d.clone(),
        _ => PathBuf::from("."),
    };
    for c in &mut checks {
        let Some(j) = c.as_judge_mut() else {
            continue;
        };
        let (spec, base) = match (&j.own_model, &s.judge_model) {
            (Some(own), _) => (
                own.clone(),
                file_dir
                    .clone()
                    .filter(|_| from_file)
                    .unwrap_or_else(|| PathBuf::from(".")),
            ),
            (None, Some(m)) => (m.clone(), judge_model_base.clone()),
            (None, None) => (
                s.model.clone().unwrap_or_default(),
                model_base.to_path_buf(),
            ),
        };
        j.price = prices.get(&spec);
        j.model = spec;
        j.base = base;
    }
    Ok(checks)
}

/// The models of the run's judges, by the name each gives itself: the run's own model where
/// a judge names it, else one made for the judges that name it (a missing key stops the run
/// here, before it starts).
fn judge_models(
    spec: &RunSpec,
    run_model: &Arc<dyn model::Model>,
) -> Result<BTreeMap<String, Arc<crate::verify::judge::JudgeModel>>, RunError> {
    use crate::verify::judge::JudgeModel;
    let mut models = BTreeMap::new();
    for j in spec.goal.checks.iter().filter_map(Check::as_judge) {
        let name = model::resolved_name(&j.model, &j.base);
        if models.contains_key(&name) {
            continue;
        }
        let m = if name == run_model.name() {
            run_model.clone()
        } else {
            Arc::from(
                model::from_spec(&j.model, &j.base, &spec.providers).map_err(|e| match e {
                    ModelError::Config(m) => ModelError::Config(format!("the judge's model: {m}")),
                    e => e,
                })?,
            )
        };
        models.insert(name, JudgeModel::new(m));
    }
    Ok(models)
}

/// A check from `--check-cmd LINE`.
pub(crate) fn command_check(line: &str) -> CheckDef {
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
pub(crate) struct Trigger {
    pub(crate) kind: TriggerKind,
    pub(crate) scheduled_for: Option<DateTime<Utc>>,
}

/// A run that happened.
pub(crate) struct Launched {
    pub(crate) run_id: String,
    pub(crate) outcome: Outcome,
}

/// The approval gate of a run. The daemon's runs (scheduled or watched) never prompt (their
/// default is `queue`); a run with no terminal never waits on a prompt (its default is
/// `never`), and says so. Calls are
/// put to the terminal when there is one and the mode is not `queue`, else to the queue;
/// human checks to the terminal when there is one.
fn gate(
    spec: &RunSpec,
    trigger: Trigger,
    run_id: &str,
    home: &Path,
    shared: Option<&Shared>,
    events: &Events,
) -> Gate {
    let scheduled = matches!(trigger.kind, TriggerKind::Schedule | TriggerKind::Watch);
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
        shared: shared.map(|s| (s.store.clone(), s.run_id.clone())),
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
        .watching(spec.goal.workspace.clone())
}

/// The goal as this run sees it at `now`: templates rendered, the price and the cost cap set
/// (the smaller of `max_cost` and what is left of `max_cost_per_day` after `spent_today`).
fn this_run(
    spec: &RunSpec,
    now: DateTime<Utc>,
    trigger: Trigger,
    previous: template::Previous,
    spent_today: f64,
) -> Result<Goal, RunError> {
    let mut goal = spec.goal.clone();
    let ctx = template::Context::new(
        spec.timezone,
        now,
        &goal.name,
        template::TriggerVar::new(trigger.kind.as_str(), spec.payload.clone()),
        trigger.scheduled_for,
        previous,
        spec.params.clone(),
    );
    goal.prompt = spec
        .prompt_src
        .render(&ctx)
        .map_err(|e| setup(e.to_string()))?;
    goal.system = spec
        .system_src
        .render(&ctx)
        .map_err(|e| setup(e.to_string()))?;
    goal.limits.price = spec.price;
    if spec.price.is_some() {
        let left_today = spec.max_cost_per_day.map(|cap| cap - spent_today);
        goal.limits.max_cost = match (spec.max_cost, left_today) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(goal)
}

/// The start of `now`'s day in the goal's time zone, when the day's spending counts: only
/// when a daily cap is kept.
fn day_start(spec: &RunSpec, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    spec.price?;
    spec.max_cost_per_day?;
    Some(first_instant_of_day(spec.timezone, now))
}

/// The first instant of `now`'s day in `tz`: local midnight, or, where the clocks skip
/// midnight (a change to summer time at 00:00), the first local time that exists.
fn first_instant_of_day(tz: chrono_tz::Tz, now: DateTime<Utc>) -> DateTime<Utc> {
    let day = now.with_timezone(&tz).date_naive();
    // Clocks skip at most a few hours; the first minute that exists starts the day.
    (0..24 * 60)
        .filter_map(|m| day.and_hms_opt(m / 60, m % 60, 0))
        .find_map(|t| chrono::TimeZone::from_local_datetime(&tz, &t).earliest())
        .map_or(now, |t| t.with_timezone(&Utc))
}

/// The previous run as templates see it, with its checks.
fn previous_of(p: &crate::store::db::RunRow, checks: &[(u32, CheckReport)]) -> template::Previous {
    let last_try = checks.iter().map(|(t, _)| *t).max().unwrap_or(0);
    let mut failed = String::new();
    for (_, c) in checks.iter().filter(|(t, c)| *t == last_try && !c.passed) {
        failed.push_str(&format!("{} ({})\n", c.name, c.outcome));
        for path in c.output_paths() {
            if let Ok((tail, _)) = crate::tools::process::read_tail(Path::new(path), 2000) {
                failed.push_str(&tail);
                if !tail.ends_with('\n') {
                    failed.push('\n');
                }
            }
        }
    }
    template::Previous {
        status: p.status.to_string(),
        answer: p.answer.clone().unwrap_or_default(),
        failed_checks: failed,
    }
}

/// A run of a fleet: its row in the shared store, where `previous.*` and the day's spending
/// are read (whichever daemon ran the earlier runs) and its approval requests are answered.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) store: PgStore,
    /// The run's id in the store.
    pub(crate) run_id: String,
}

/// How long a fleet's run waits for the store to answer before it does not start.
const SHARED_PATIENCE: Duration = Duration::from_secs(30);

/// The previous run of the goal and the goal as this run sees it, from the local store.
fn prepare(
    spec: &RunSpec,
    db: &Db,
    trigger: Trigger,
) -> Result<(Option<crate::store::db::RunRow>, Goal), RunError> {
    let name = &spec.goal.name;
    let now = Utc::now();
    let previous = db.previous_run(name, "")?;
    let view = previous
        .as_ref()
        .map(|p| previous_of(p, &db.checks(&p.id).unwrap_or_default()));
    let spent = match day_start(spec, now) {
        Some(t) => db.cost_since(name, t)?,
        None => 0.0,
    };
    let goal = this_run(spec, now, trigger, view.unwrap_or_default(), spent)?;
    Ok((previous, goal))
}

/// `prepare` for a fleet's run, from the shared store: the previous run and the day's
/// spending of the goal on any daemon.
async fn prepare_shared(
    spec: &RunSpec,
    sh: &Shared,
    trigger: Trigger,
) -> Result<(Option<crate::store::db::RunRow>, Goal), RunError> {
    let name = &spec.goal.name;
    let now = Utc::now();
    let previous = pg::retry("reading the previous run", SHARED_PATIENCE, || {
        sh.store.previous_run(name, &sh.run_id)
    })
    .await?
    .map(|f| f.run);
    let view = match &previous {
        Some(p) => Some(previous_of(
            p,
            &sh.store.checks(&p.id).await.unwrap_or_default(),
        )),
        None => None,
    };
    let spent = match day_start(spec, now) {
        Some(t) => {
            pg::retry("reading the day's spending", SHARED_PATIENCE, || {
                sh.store.cost_since(name, t)
            })
            .await?
        }
        None => 0.0,
    };
    let goal = this_run(spec, now, trigger, view.unwrap_or_default(), spent)?;
    Ok((previous, goal))
}

/// Set up and run `spec` to its end, recording it in the store under `home`.
pub(crate) async fn launch(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    if spec.isolate.parallel > 1 {
        return parallel::launch(spec, home, trigger, None, sinks, cancel).await;
    }
    launch_in(spec, home, trigger, None, None, sinks, cancel).await
}

/// `launch` for a fleet's run: `previous.*`, `max_cost_per_day` and approval answers come
/// from the shared store.
pub(crate) async fn launch_shared(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    shared: &Shared,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    launch_in(spec, home, trigger, None, Some(shared), sinks, cancel).await
}

/// A run the caller recorded already (the daemon, in the transaction that claimed its
/// occurrence): its folder, and the model its row names.
pub(crate) struct Recorded {
    pub(crate) run: RunDir,
    pub(crate) model: String,
}

/// `launch` for a run whose row the caller wrote already, with the spec `build` makes (here,
/// off the caller's path). A run that cannot start is recorded as an error.
pub(crate) async fn launch_recorded(
    build: impl FnOnce() -> Result<RunSpec, RunError>,
    home: &Path,
    trigger: Trigger,
    recorded: Recorded,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    let id = recorded.run.id.clone();
    let (result, notify, goal) = match build() {
        Ok(spec) if spec.isolate.parallel > 1 => (
            parallel::launch(&spec, home, trigger, Some(recorded), sinks, cancel).await,
            spec.notify,
            spec.goal.name,
        ),
        Ok(spec) => (
            launch_in(&spec, home, trigger, Some(recorded), None, sinks, cancel).await,
            spec.notify,
            spec.goal.name,
        ),
        // Without a spec there are no tables to tell.
        Err(e) => (Err(e), Vec::new(), String::new()),
    };
    if let Err(e) = &result {
        let error = e.to_string();
        let failed = Db::open(home).and_then(|db| db.fail_run(&id, &error));
        if let Err(db) = failed {
            tracing::error!("run {id}: cannot record that it could not start: {db}");
        }
        not_started(home, notify, &goal, &id, trigger, &error).await;
    }
    result
}

/// Tell the `[[notify]]` tables that take `error` that the run `id` could not start.
pub(crate) async fn not_started(
    home: &Path,
    notify: Vec<Notify>,
    goal: &str,
    id: &str,
    trigger: Trigger,
    error: &str,
) {
    if notify.is_empty() {
        return;
    }
    let notice = Notice::not_started(
        goal,
        id,
        trigger.kind.as_str(),
        trigger.scheduled_for,
        error,
    );
    Notifier::new(home, notify)
        .send(&[crate::notify::Kind::Error], &notice)
        .await;
}

pub(crate) async fn launch_in(
    spec: &RunSpec,
    home: &Path,
    trigger: Trigger,
    recorded: Option<Recorded>,
    shared: Option<&Shared>,
    sinks: Vec<Arc<dyn EventSink>>,
    cancel: &CancellationToken,
) -> Result<Launched, RunError> {
    if let Some(why) = &spec.price_refusal {
        return Err(setup(why.clone()));
    }
    let mut model = resume::model(spec)?;
    if let Some(path) = &spec.record {
        model = Box::new(Recorder::new(model, path.clone())?);
    }
    let model: Arc<dyn model::Model> = Arc::from(model);
    let judges = judge_models(spec, &model)?;
    let mut tools = registry(&spec.tools)?;
    let mut db = Db::open(home)?;
    // Runs whose process is gone are settled first: an outcome a busy store could not take
    // is recorded now, and what runs killed with `kill -9` or crashed left running ends.
    if let Err(e) = db.mark_orphans() {
        tracing::warn!("{e}");
    }
    crate::tools::sandbox::sweep_dead_runs(home);
    // Their worktree folders go too, their work committed on their branches.
    worktree::sweep_dead(home, &db);
    let (previous, mut goal) = match shared {
        None => prepare(spec, &db, trigger)?,
        Some(sh) => prepare_shared(spec, sh, trigger).await?,
    };
    for c in &mut goal.checks {
        if let Some(j) = c.as_judge_mut() {
            j.bound = judges
                .get(&model::resolved_name(&j.model, &j.base))
                .cloned();
        }
    }
    let (run, recorded_model) = match recorded {
        Some(r) => {
            r.run.make()?;
            (r.run, Some(r.model))
        }
        None => (RunDir::create(home)?, None),
    };
    // An isolated run works in a worktree of its own from here on.
    let (tree, moved) = match worktree::isolate(spec, &goal, home, &run.id) {
        Ok(Some((s, g, t))) => {
            goal = g;
            (Some(t), Some(s))
        }
        Ok(None) => (None, None),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run.dir);
            return Err(e.into());
        }
    };
    let spec = moved.as_ref().unwrap_or(spec);
    let mut checks: Vec<PathBuf> = spec
        .goal
        .checks
        .iter()
        .filter_map(Check::script_path)
        .collect();
    // What the goal protects is read-only to commands, as the checks are.
    checks.extend(crate::verify::protect::roots(
        &spec.goal.workspace,
        &spec.goal.protect,
    ));
    let jail = match Jail::new(
        &spec.sandbox,
        &spec.goal.workspace,
        &run.dir,
        &run.id,
        home,
        &checks,
    ) {
        Ok(j) => Arc::new(j),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run.dir);
            return Err(e.into());
        }
    };
    // MCP servers start before the first model call; one that cannot start ends the run
    // here, before anything was recorded.
    let (mut servers, mcp_tools) =
        match Servers::start(&spec.mcp, &spec.goal.workspace, &run.dir, &jail, &run.id).await {
            Ok(s) => s,
            Err(e) => {
                jail.sweep();
                let _ = std::fs::remove_dir_all(&run.dir);
                return Err(e.into());
            }
        };
    // From here on every way out shuts the servers down.
    let started = || {
        for t in mcp_tools {
            tools.add(t)?;
        }
        let transcript = Transcript::create(&run.transcript())?;
        let new_run = NewRun {
            id: &run.id,
            goal: &spec.goal.name,
            trigger: trigger.kind,
            scheduled_for: trigger.scheduled_for,
            model: model.name(),
            workspace: &spec.goal.workspace.display().to_string(),
            dir: &run.dir.display().to_string(),
        };
        // As recorded, for a store made again before the run ends.
        let kept_run = KeptRun::of(&new_run, Utc::now());
        if recorded_model.is_none() {
            db.start_run(&new_run)?;
        } else if recorded_model.as_deref() != Some(model.name()) {
            db.set_run_model(&run.id, model.name())?;
        }
        resume::started(spec, &db, &run, tree.as_ref())?;
        Ok::<_, RunError>((transcript, kept_run))
    };
    let (transcript, kept_run) = match started() {
        Ok(t) => t,
        Err(e) => {
            servers.shutdown().await;
            jail.sweep();
            let _ = std::fs::remove_dir_all(&run.dir);
            return Err(e);
        }
    };
    let mut events = Events::new().with(Arc::new(transcript));
    for sink in sinks {
        events = events.with(sink);
    }
    if let Some(spans) = crate::trace::otel::sink(&goal.name) {
        events = events.with(spans);
    }
    if day_start(spec, Utc::now()).is_some() {
        // Under a daily cap the cost is recorded as it grows: a running run, or one killed,
        // counts what it spent.
        match Db::open(home) {
            Ok(db) => {
                events = events.with(Arc::new(CostSink {
                    db: std::sync::Mutex::new(db),
                    run_id: run.id.clone(),
                }))
            }
            Err(e) => tracing::warn!("run {}: its cost is recorded at its end only: {e}", run.id),
        }
    }
    let notifier = Notifier::new(home, spec.notify.clone());
    if !spec.notify.is_empty() {
        events = events.with(notifier.approvals(&goal.name, &run.id, trigger.kind.as_str()));
    }
    events.emit(Event::RunStarted {
        run_id: run.id.clone(),
        model: model.name().to_string(),
        workspace: spec.goal.workspace.display().to_string(),
        prompt: goal.prompt.clone(),
    });
    events.emit(Event::Notice {
        text: jail.describe(),
    });
    let refusals = events.clone();
    jail.on_refusal(move |text| refusals.emit(Event::Notice { text }));
    let gate = gate(spec, trigger, &run.id, home, shared, &events);
    if spec.price.is_none() && (spec.max_cost.is_some() || spec.max_cost_per_day.is_some()) {
        events.emit(Event::Notice {
            text: format!(
                "cost: the price of {} is unknown (unknown_price = \"allow\"), so no cost cap \
                 is kept",
                spec.model
            ),
        });
    }
    let rt = Runtime {
        model: model.as_ref(),
        tools: &tools,
        events: &events,
        cancel,
        run: &run,
        gate: Some(&gate),
        jail: jail.clone(),
        mcp: Some(&servers),
    };
    // A panic anywhere in the run becomes an `error` outcome, recorded like any other.
    let outcome = match AssertUnwindSafe(crate::verify::run_from(&goal, &rt, spec.thread.history()))
        .catch_unwind()
        .await
    {
        Ok(o) => o,
        Err(panic) => panicked(panic.as_ref()),
    };
    servers.shutdown().await;
    // Whatever the agent left running ends with its run.
    jail.sweep();
    let thread = resume::ended(spec, &db, &run.id, tree, &outcome, &events);
    let mut result = outcome.event(&run.id);
    if let Event::Result { thread: t, .. } = &mut result {
        *t = thread;
    }
    events.emit(result);
    crate::redact::tree(&run.dir, &["transcript.jsonl"]);
    let ended = Ended {
        status: outcome.status,
        stop_reason: outcome.stop_reason,
        tries: outcome.tries,
        steps: outcome.steps,
        usage: outcome.usage,
        cost: outcome.cost,
        answer: outcome.answer.as_deref(),
        error: outcome.error.as_deref(),
        checks: &outcome.checks,
    };
    // The outcome first, beside the transcript: it is small, and whole or absent; the next
    // start records it if the store cannot take it now. When the disk is full, what the run
    // kept besides goes first, with a note, so that the outcome fits.
    let kept = KeptOutcome {
        run: Some(kept_run),
        ..KeptOutcome::of(&ended)
    };
    let mut dropped = false;
    let mut drop_kept = |events: &Events| {
        if dropped {
            return false;
        }
        dropped = true;
        let freed = run.drop_kept_outputs();
        events.emit(Event::Notice {
            text: format!(
                "the disk is full: the run's kept outputs (tool and check outputs, its tmp \
                 folder; {freed} bytes) were dropped so that its outcome is kept"
            ),
        });
        true
    };
    let mut file = kept.keep(&run.dir);
    if matches!(&file, Err(e) if e.kind() == std::io::ErrorKind::StorageFull) && drop_kept(&events)
    {
        file = kept.keep(&run.dir);
    }
    // A store deleted or replaced while the run went on is made again (this connection
    // writes a file nobody reads), and the run recorded in it whole.
    if db.is_replaced() {
        match Db::open(home) {
            Ok(fresh) => {
                tracing::warn!(
                    "the store {} was deleted or replaced during run {}: it is made again",
                    home.join("sup.db").display(),
                    run.id
                );
                db = fresh;
            }
            Err(e) => {
                tracing::warn!("the store was deleted or replaced and cannot be made again: {e}")
            }
        }
    }
    let mut recorded = db.finish_run_patiently(&run.id, &ended, PATIENCE).await;
    if matches!(&recorded, Err(e) if crate::store::db::is_full(e)) && drop_kept(&events) {
        recorded = db.finish_run_patiently(&run.id, &ended, PATIENCE).await;
    }
    if recorded.is_err() && matches!(db.run(&run.id), Err(DbError::NoRun(_))) {
        match db.adopt(&run.id, &run.dir, &kept) {
            Ok(true) => recorded = Ok(()),
            Ok(false) => {}
            Err(e) => tracing::warn!("run {}: {e}", run.id),
        }
    }
    match recorded {
        Ok(()) => {
            if file.is_ok()
                && let Err(e) = std::fs::remove_file(run.dir.join(crate::store::db::OUTCOME_FILE))
            {
                tracing::warn!(
                    "run {}: cannot remove its recorded outcome file: {e}",
                    run.id
                );
            }
            // Built from what was recorded; the outcome is final before anyone is told.
            if !spec.notify.is_empty() {
                match db.run(&run.id) {
                    Ok(row) => {
                        if let Some((kinds, notice)) =
                            Notice::of_run(&row, &outcome.checks, previous.as_ref())
                        {
                            notifier.send(&kinds, &notice).await;
                        }
                    }
                    Err(e) => tracing::warn!("no notice for run {}: {e}", run.id),
                }
            }
            match db.prune(&spec.goal.name, spec.keep_runs) {
                Ok(dirs) => {
                    for dir in dirs {
                        if let Err(e) = std::fs::remove_dir_all(&dir) {
                            tracing::warn!("cannot remove the pruned run folder {dir}: {e}");
                        }
                    }
                }
                Err(e) => tracing::warn!("cannot prune old runs: {e}"),
            }
        }
        // The run's outcome stands whatever the store does: it is kept beside the
        // transcript, and the next start records it.
        Err(e) => match &file {
            Ok(path) => tracing::error!(
                "recording the outcome of run {} failed: {e}; it is kept in {} and the next \
                 `sup` start records it",
                run.id,
                path.display()
            ),
            Err(io) => tracing::error!(
                "recording the outcome of run {} failed: {e}; keeping it in {} failed too: \
                 {io}",
                run.id,
                run.dir.display()
            ),
        },
    }
    // An approval notice still on its way is delivered (or out of time) before the end.
    notifier.settle().await;
    Ok(Launched {
        run_id: run.id,
        outcome,
    })
}

/// Records a run's cost after each model call.
struct CostSink {
    db: std::sync::Mutex<Db>,
    run_id: String,
}

impl EventSink for CostSink {
    fn emit(&self, event: &Event) {
        let Event::StepFinished {
            total_cost: Some(cost),
            ..
        } = event
        else {
            return;
        };
        if let Ok(db) = self.db.lock()
            && let Err(e) = db.set_run_cost(&self.run_id, *cost)
        {
            tracing::warn!("run {}: cannot record its cost so far: {e}", self.run_id);
        }
    }
}

/// The outcome of a run whose code panicked: an error that says where.
fn panicked(panic: &(dyn std::any::Any + Send)) -> Outcome {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown cause".into());
    Outcome {
        status: crate::trace::Status::Error,
        stop_reason: crate::trace::StopReason::Error,
        tries: 0,
        steps: 0,
        usage: crate::model::Usage::default(),
        cost: None,
        answer: None,
        error: Some(format!(
            "sup hit a bug and stopped this run (a panic: {what}); please report it"
        )),
        checks: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_day_starts_at_its_first_instant_where_midnight_does_not_exist() {
        // Santiago skipped from 00:00 to 01:00 on 2024-09-08: the day began at 01:00 (-03).
        let tz: chrono_tz::Tz = "America/Santiago".parse().unwrap();
        let noon = "2024-09-08T15:00:00Z".parse::<DateTime<Utc>>().unwrap();
        assert_eq!(
            first_instant_of_day(tz, noon),
            "2024-09-08T04:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        let day_before = "2024-09-07T15:00:00Z".parse::<DateTime<Utc>>().unwrap();
        assert_eq!(
            first_instant_of_day(tz, day_before),
            "2024-09-07T04:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
    }
}

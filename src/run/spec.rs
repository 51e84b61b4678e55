//! What a run is made of, resolved before it starts (`RunSpec`): the layers of settings
//! merged, the workspace found, the checks, judges, tools, rules and approval mode settled,
//! and the unattended approver chosen. Nothing here starts a process or writes the store.

use super::*;

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

pub(super) fn setup(msg: impl Into<String>) -> RunError {
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
pub(super) fn judge_models(
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

pub(super) fn registry(defs: &[ToolDef]) -> Result<Registry, RunError> {
    let mut registry = Registry::new();
    builtin::register_all(&mut registry)?;
    for d in defs {
        let spec = ToolSpec {
            name: d.name.clone(),
            description: d.description.clone(),
            input_schema: d.input_schema.clone(),
        };
        let tool = CommandTool::new(
            About { spec, risk: d.risk },
            d.program.clone(),
            d.args.clone(),
        );
        registry.add_with_timeout(Arc::new(tool), d.timeout)?;
    }
    Ok(registry)
}

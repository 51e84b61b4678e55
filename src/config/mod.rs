//! Settings of every layer, from every source, merged once. One `Settings` struct of optional
//! fields is at the same time the command line's options (clap, flattened into `sup run` and
//! `sup goal`), the goal file's schema (serde, strict) and the user config's; the environment
//! (`SUP_MODEL`, `SUP_APPROVAL`) fills one too. `merge` takes them in precedence order
//! (flag > goal file > environment > user config > default) key by key, remembers where each
//! effective value came from, and validates; it touches no file. Reading the user config and
//! making folders is resolution, done apart (`UserConfig::load`, `crate::run`).
//!
//! A new setting is one field in `Settings` (with its `#[arg]`/`#[serde]` attributes) and, if
//! it has a fixed default, one line in `Settings::defaults`.

pub(crate) mod goal;
mod show;
mod values;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

pub(crate) use crate::duration::{duration, parse_duration, parse_timeout, timeout};
pub use goal::{CheckDef, McpServer, RawCheck, RawTool, ToolDef};
pub use goal::{GoalFile, GoalFileError};

use crate::approval::Mode;
use crate::tools::Protected;
use crate::tools::sandbox::{Policy, check_env_pass};
use show::Show;
use values::*;
pub(crate) use values::{local_zone, parse_enum, parse_zone};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] GoalFileError),
    /// An environment variable with a value that does not parse.
    #[error("{var}: {message}")]
    Env { var: &'static str, message: String },
    /// A setting that parsed but cannot work, or one that is missing.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Rule(#[from] crate::approval::RuleError),
}

/// What to do when an occurrence comes while the goal's last run is still going.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Record the occurrence as skipped.
    Skip,
    /// Let one occurrence wait and run after.
    Queue,
    /// Cancel the running one, then start.
    Replace,
    /// Run side by side.
    Allow,
}

/// Where an effective setting came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Flag,
    GoalFile(std::sync::Arc<Path>),
    /// `SUP_<KEY>`.
    Environment,
    UserConfig(std::sync::Arc<Path>),
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag => write!(f, "flag"),
            Source::GoalFile(p) => write!(f, "goal file {}", p.display()),
            Source::Environment => write!(f, "environment"),
            Source::UserConfig(p) => write!(f, "user config {}", p.display()),
            Source::Default => write!(f, "default"),
        }
    }
}

/// Where each effective setting came from: its key, then every source that gave it, the
/// winning one first (lists gather from several).
#[derive(Clone, Debug, Default)]
pub(crate) struct Provenance(BTreeMap<&'static str, Vec<Source>>);

impl Provenance {
    fn note(&mut self, key: &'static str, source: &Source) {
        self.0.entry(key).or_default().push(source.clone());
    }

    /// The source of a setting's value (for a list: of its highest-precedence part).
    pub(crate) fn source(&self, key: &str) -> Option<&Source> {
        self.0.get(key).and_then(|s| s.first())
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static str, &[Source])> {
        self.0.iter().map(|(k, v)| (*k, v.as_slice()))
    }
}

/// How one source's value of a setting combines with a lower source's.
trait Merge {
    /// Take from `lower` what `self` lacks; whether `lower` gave anything.
    fn merge_from(&mut self, lower: &Self) -> bool;
}

/// A single value: the higher source wins.
impl<T: Clone> Merge for Option<T> {
    fn merge_from(&mut self, lower: &Self) -> bool {
        if self.is_none() && lower.is_some() {
            self.clone_from(lower);
            true
        } else {
            false
        }
    }
}

/// A table: a higher source's entries win, a lower one fills in the rest.
impl<V: Clone> Merge for BTreeMap<String, V> {
    fn merge_from(&mut self, lower: &Self) -> bool {
        for (k, v) in lower {
            self.entry(k.clone()).or_insert_with(|| v.clone());
        }
        !lower.is_empty()
    }
}

/// A list: every source adds to it, the lowest first.
impl<T: Clone> Merge for Vec<T> {
    fn merge_from(&mut self, lower: &Self) -> bool {
        if lower.is_empty() {
            return false;
        }
        let higher = std::mem::take(self);
        self.extend(lower.iter().cloned());
        self.extend(higher);
        true
    }
}

/// Declares `Settings` and its key-by-key merge from the same field list.
macro_rules! settings {
    ($(#[$meta:meta])* pub struct Settings { $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty, )* }) => {
        $(#[$meta])*
        pub struct Settings { $( $(#[$fmeta])* pub $field: $ty, )* }

        impl Settings {
            /// Fill what this layer lacks from `lower`, noting the keys `lower` gave.
            fn merge_layer(&mut self, lower: &Settings, source: &Source, provenance: &mut Provenance) {
                $(
                    if Merge::merge_from(&mut self.$field, &lower.$field) {
                        provenance.note(stringify!($field), source);
                    }
                )*
            }

            /// Every key with its value as `--print-config` shows it.
            pub(crate) fn shown(&self) -> Vec<(&'static str, String)> {
                vec![$( (stringify!($field), Show::show(&self.$field)) ),*]
            }
        }
    };
}

settings! {
    /// Every setting, each optional: a flag, a goal-file key and a user-config key at once
    /// (`#[arg(skip)]`: not a flag of `sup run`; `#[serde(skip)]`: not a file key).
    #[derive(clap::Args, Deserialize, Clone, Debug, Default)]
    #[serde(deny_unknown_fields)]
    pub struct Settings {
        /// The goal's name (default: the goal file's stem, or `goal`).
        #[arg(skip)]
        pub name: Option<String>,
        /// What the agent should do.
        #[arg(skip)]
        pub prompt: Option<String>,
        /// PROVIDER:MODEL, e.g. `openai:gpt-4o-mini` or `script:turns.json`. Wins over a goal
        /// file's `model`, which wins over $SUP_MODEL.
        #[arg(long)]
        pub model: Option<String>,
        /// Model turns at most in one work loop (default 30).
        #[arg(long)]
        pub max_steps: Option<u32>,
        /// Input plus output tokens at most over the whole run.
        #[arg(long)]
        pub token_budget: Option<u64>,
        /// Where the agent works and checks run (default: the current directory).
        #[arg(long)]
        pub workspace: Option<PathBuf>,
        /// The system prompt (default: a short one naming the workspace).
        #[arg(long)]
        pub system: Option<String>,
        /// Timeout of one tool call (default 120s).
        #[arg(long, value_parser = parse_timeout)]
        #[serde(default, deserialize_with = "timeout")]
        pub tool_timeout: Option<Duration>,
        /// Bytes of a tool result the model sees (default 16384); the rest is kept on disk.
        #[arg(long)]
        pub output_cap: Option<usize>,
        /// The provider's base URL (overrides OPENAI_BASE_URL, ANTHROPIC_BASE_URL, …).
        #[arg(long)]
        pub base_url: Option<String>,
        /// Ask for whole answers instead of streams.
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub no_stream: Option<bool>,
        /// The model's output token limit per turn (default 8192, less when the known
        /// context window leaves less room; `max_tokens` on the wire, `max_completion_tokens`
        /// for OpenAI's own API).
        #[arg(long)]
        pub max_tokens: Option<u32>,
        /// Tokens the model's context window holds (default: the built-in table or
        /// `[models."provider:model"]`, else what the server says).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        #[serde(default, deserialize_with = "crate::model::windows::positive")]
        pub context_window: Option<u64>,
        /// The share of the context window past which the conversation is compacted
        /// (default 0.85; between 0 and 1).
        #[arg(long, value_parser = parse_fraction)]
        #[serde(default, deserialize_with = "fraction")]
        pub compact_at: Option<f64>,
        /// How long one request to the provider may take, a streamed answer included; stream
        /// keep-alives do not extend it (default 600s).
        #[arg(long, value_parser = parse_timeout)]
        #[serde(default, deserialize_with = "timeout")]
        pub request_timeout: Option<Duration>,
        /// How long a stream may stay silent before it counts as broken (default 120s).
        #[arg(long, value_parser = parse_timeout)]
        #[serde(default, deserialize_with = "timeout")]
        pub idle_timeout: Option<Duration>,
        /// Attempts at most for one model request (default 5).
        #[arg(long)]
        pub retries: Option<u32>,
        /// Write every model turn to FILE as a `script:` file that replays the run.
        #[arg(long)]
        #[serde(skip)]
        pub record: Option<PathBuf>,
        /// ask (prompt at the terminal), queue (wait for `sup approve`), auto (allow what no
        /// rule denies) or never (deny what no rule allows). Wins over a goal file's `approval`,
        /// which wins over $SUP_APPROVAL; without any: ask at a terminal, never without one.
        #[arg(long, value_parser = parse_enum::<Mode>)]
        pub approval: Option<Mode>,
        /// How long a queued approval waits before it counts as a denial (default 1h).
        #[arg(long, value_parser = parse_timeout)]
        #[serde(default, deserialize_with = "timeout")]
        pub approval_timeout: Option<Duration>,
        #[command(flatten)]
        #[serde(default)]
        pub approval_rules: RuleLists,
        /// An MCP server over stdio: NAME=COMMAND (split at spaces); its tools are NAME__TOOL.
        #[arg(long, value_parser = mcp_server)]
        #[serde(default)]
        pub mcp: Vec<McpServer>,
        /// The sandbox of commands, command tools, checks and MCP servers: workspace-write
        /// (default), read-only or off. Wins over a goal file's `sandbox`, which wins over
        /// $SUP_SANDBOX.
        #[arg(long, value_parser = Policy::parse)]
        pub sandbox: Option<Policy>,
        /// Whether the agent's processes may open TCP connections (default true), or a list
        /// of the hosts they may reach through sup's proxy.
        #[arg(skip)]
        #[serde(default, deserialize_with = "crate::tools::sandbox::network")]
        pub network: Option<crate::tools::sandbox::Network>,
        /// Folders writable besides the workspace (relative to the file that names them, or `~/…`).
        #[arg(skip)]
        #[serde(default)]
        pub writable: Vec<String>,
        /// Refuse to run (exit 2) where the kernel lacks part of the sandbox.
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub sandbox_required: Option<bool>,
        /// Leave the agent's background processes alive while checks judge.
        #[arg(skip)]
        pub keep_background: Option<bool>,
        /// Let the agent's processes open unix sockets (`socket(AF_UNIX)`; default false).
        #[arg(skip)]
        pub unix_sockets: Option<bool>,
        /// Paths hidden from the agent's processes besides the credential stores (relative to
        /// the goal file, or `~/…`).
        #[arg(skip)]
        #[serde(default)]
        pub hidden: Vec<String>,
        /// Hidden paths shown again (relative to the goal file, or `~/…`).
        #[arg(skip)]
        #[serde(default)]
        pub readable: Vec<String>,
        /// Processes a run's jail may hold at once (default 1024).
        #[arg(skip)]
        pub max_processes: Option<u64>,
        /// Memory a run's jail may use: bytes, or `512M`, `4G` (default half the machine's).
        #[arg(skip)]
        #[serde(default, deserialize_with = "memory_size")]
        pub max_memory: Option<u64>,
        /// Pass this secret-named variable (…KEY, …TOKEN, …) to commands, checks and MCP
        /// servers.
        #[arg(long, value_parser = checked(check_env_pass))]
        #[serde(default, deserialize_with = "env_pass_names")]
        pub env_pass: Vec<String>,
        /// A path the agent may not create, change or delete: a gitignore-style glob relative
        /// to the workspace (`tests/**`, `conftest.py`); repeatable.
        #[arg(long, value_name = "GLOB", value_parser = checked(Protected::check_glob))]
        #[serde(default, deserialize_with = "protect_globs")]
        pub protect: Vec<String>,
        /// Checks use the workspace's own toolchain (`.python-version`, `.nvmrc`, … as the
        /// agent leaves them) instead of the interpreters found when the goal started.
        #[arg(skip)]
        pub workspace_toolchain: Option<bool>,
        /// Work-and-check rounds at most (default 3 with checks, else 1).
        #[arg(skip)]
        pub tries: Option<u32>,
        /// The model of judge checks that name none (default: the run's model).
        #[arg(skip)]
        pub judge_model: Option<String>,
        /// Start each try again from the prompt plus the latest failure report.
        #[arg(skip)]
        pub fresh: Option<bool>,
        /// Timeout of each check without its own (default 300s); `--check-timeout` sets all.
        #[arg(skip)]
        #[serde(default, deserialize_with = "timeout")]
        pub check_timeout: Option<Duration>,
        /// Runs kept per goal (default 100; at least 1).
        #[arg(skip)]
        #[serde(default, deserialize_with = "at_least_one")]
        pub keep_runs: Option<u32>,
        /// A cron expression: only the daemon reads it.
        #[arg(skip)]
        pub schedule: Option<Spanned<String>>,
        /// An IANA time zone for `schedule` (default: the machine's).
        #[arg(skip)]
        pub timezone: Option<Spanned<String>>,
        #[arg(skip)]
        pub overlap: Option<Overlap>,
        #[arg(skip)]
        #[serde(default, deserialize_with = "duration")]
        pub catch_up: Option<Duration>,
        #[arg(skip)]
        #[serde(default, deserialize_with = "duration")]
        pub jitter: Option<Duration>,
        /// Gitignore-style globs relative to the workspace (`src/**`, `*.py`): the daemon
        /// starts the goal when a file that matches changes (goal files only).
        #[arg(skip)]
        #[serde(default, deserialize_with = "watch_globs")]
        pub watch: Vec<String>,
        /// How long a burst of watched changes must be quiet before the goal starts
        /// (default 2s).
        #[arg(skip)]
        #[serde(default, deserialize_with = "duration")]
        pub debounce: Option<Duration>,
        /// A fleet daemon (`--store`) runs the goal only when it has all these tags
        /// (`sup daemon --tags`).
        #[arg(skip)]
        #[serde(default)]
        pub tags: Vec<String>,
        /// A fleet run whose daemon died (its lease ran out) is retried by another daemon.
        #[arg(skip)]
        pub retry_interrupted: Option<bool>,
        /// `[[check]]` tables (goal files only).
        #[arg(skip)]
        #[serde(default)]
        pub check: Vec<Spanned<RawCheck>>,
        /// `[[tool]]` tables (goal files only).
        #[arg(skip)]
        #[serde(default)]
        pub tool: Vec<Spanned<RawTool>>,
        /// US dollars this run may spend at most, all tries (wins over the goal's `max_cost`).
        #[arg(long, value_name = "USD", value_parser = parse_cost)]
        #[serde(default, deserialize_with = "cost")]
        pub max_cost: Option<f64>,
        /// US dollars a goal may spend per calendar day in its time zone.
        #[arg(skip)]
        #[serde(default, deserialize_with = "cost")]
        pub max_cost_per_day: Option<f64>,
        /// `allow`: a cost cap on a model with no known price runs without the cap.
        #[arg(skip)]
        pub unknown_price: Option<UnknownPrice>,
        /// A template parameter, `{{ params.NAME }}` in the prompt; wins over `[params]`.
        #[arg(long = "param", value_name = "NAME=VALUE", value_parser = param)]
        #[serde(default, deserialize_with = "params")]
        pub params: Vec<(String, String)>,
        /// `[[notify]]` tables, from the goal file and the user config both.
        #[arg(skip)]
        #[serde(default)]
        pub notify: Vec<Spanned<crate::notify::RawNotify>>,
        /// `[prices."provider:model"]`, US dollars per million tokens, over the built-in table.
        #[arg(skip)]
        #[serde(default, deserialize_with = "prices")]
        pub prices: BTreeMap<String, crate::model::prices::Price>,
        /// `[models."provider:model"]`: `context_window`, over the built-in table.
        #[arg(skip)]
        #[serde(default)]
        pub models: BTreeMap<String, crate::model::windows::ModelInfo>,
        /// `worktree`: each run works in a git worktree of its own, on a new branch
        /// `sup/GOAL/RUN_ID` made from the current HEAD; the workspace stays untouched.
        #[arg(long, value_parser = parse_enum::<Isolation>)]
        pub isolation: Option<Isolation>,
        /// Which worktree branches stay: `achieved` (default), `always` or `never`.
        #[arg(long, value_parser = parse_enum::<Keep>)]
        pub keep: Option<Keep>,
        /// Attempts at once (1 to 16), each in its own worktree; the first whose checks all
        /// pass wins and the others are cancelled. Implies `isolation = "worktree"`.
        #[arg(long, value_parser = parse_parallel)]
        #[serde(default, deserialize_with = "parallel")]
        pub parallel: Option<u32>,
        /// What the daemon does at its next start with a run of this goal it left
        /// interrupted: `mark` (default) or `continue` (as `sup continue RUN_ID`).
        #[arg(skip)]
        pub on_interrupt: Option<OnInterrupt>,
        /// `[webhook]`: a signed `POST /hooks/NAME` on the console starts the goal.
        #[arg(skip)]
        pub webhook: Option<Spanned<goal::Webhook>>,
    }
}

/// What a cost cap does with a model whose price is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownPrice {
    /// Run without the cap, and say so.
    Allow,
    /// Refuse to start (the default).
    Refuse,
}

/// Where a run works: in the workspace itself, or in a git worktree of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// In the workspace (the default).
    None,
    /// In a fresh git worktree on a branch of its own.
    Worktree,
}

/// Which worktree branches stay when a run ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// Those of achieved runs (the default).
    #[default]
    Achieved,
    Always,
    Never,
}

/// What the daemon does with a goal's run it left interrupted (killed, crashed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnInterrupt {
    /// Record it as interrupted (the default).
    Mark,
    /// Continue it from its transcript at the next start.
    Continue,
}

/// Approval rules: allow, ask and deny, gathered from every source.
#[derive(clap::Args, Deserialize, Clone, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct RuleLists {
    /// Allow calls matching `tool` or `tool(pattern)`, e.g. `run_command(cargo test*)`.
    #[arg(long)]
    #[serde(default)]
    pub(crate) allow: Vec<String>,
    /// Always ask a person for calls matching this rule.
    #[arg(long)]
    #[serde(default)]
    pub(crate) ask: Vec<String>,
    /// Deny calls matching this rule.
    #[arg(long)]
    #[serde(default)]
    pub(crate) deny: Vec<String>,
}

impl Merge for RuleLists {
    fn merge_from(&mut self, lower: &Self) -> bool {
        let a = self.allow.merge_from(&lower.allow);
        let b = self.ask.merge_from(&lower.ask);
        let c = self.deny.merge_from(&lower.deny);
        a || b || c
    }
}

/// How long watched changes must be quiet before the goal starts, unless `debounce` says.
pub(crate) const DEFAULT_DEBOUNCE: Duration = Duration::from_secs(2);

/// Runs kept per goal unless `keep_runs` says otherwise.
pub(crate) const DEFAULT_KEEP_RUNS: u32 = 100;

impl Settings {
    /// The lowest layer: every setting with a fixed default. Settings whose default depends on
    /// others (`tries`, `system`, `workspace`, `approval`, `name`) are settled in `crate::run`.
    pub(crate) fn defaults() -> Settings {
        let http = crate::model::http::HttpOptions::default();
        // The work loop's limits are written once, in `work::Limits::default`.
        let limits = crate::work::Limits::default();
        Settings {
            max_steps: Some(limits.max_steps),
            tool_timeout: Some(limits.tool_timeout),
            output_cap: Some(limits.output_cap),
            max_tokens: Some(crate::model::DEFAULT_MAX_TOKENS),
            compact_at: Some(crate::work::DEFAULT_COMPACT_AT),
            no_stream: Some(!http.stream),
            request_timeout: Some(http.request_timeout),
            idle_timeout: Some(http.idle_timeout),
            retries: Some(http.max_attempts),
            approval_timeout: Some(crate::approval::DEFAULT_TIMEOUT),
            fresh: Some(false),
            check_timeout: Some(crate::verify::check::DEFAULT_TIMEOUT),
            keep_runs: Some(DEFAULT_KEEP_RUNS),
            overlap: Some(Overlap::Skip),
            catch_up: Some(Duration::ZERO),
            jitter: Some(Duration::ZERO),
            debounce: Some(DEFAULT_DEBOUNCE),
            ..Settings::default()
        }
    }

    /// The environment's layer: `SUP_MODEL`, `SUP_APPROVAL`.
    pub(crate) fn from_env() -> Result<Settings, ConfigError> {
        fn var(name: &str) -> Option<String> {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        }
        let sandbox = var("SUP_SANDBOX")
            .map(|v| Policy::parse(&v))
            .transpose()
            .map_err(|message| ConfigError::Env {
                var: "SUP_SANDBOX",
                message,
            })?;
        let approval = var("SUP_APPROVAL")
            .map(|v| parse_enum::<Mode>(&v))
            .transpose()
            .map_err(|message| ConfigError::Env {
                var: "SUP_APPROVAL",
                message,
            })?;
        Ok(Settings {
            model: var("SUP_MODEL"),
            approval,
            sandbox,
            ..Settings::default()
        })
    }

    /// Keys that only a goal file may set, of those this layer sets.
    fn goal_only_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        let mut key = |set: bool, name| {
            if set {
                keys.push(name)
            }
        };
        key(self.name.is_some(), "name");
        key(self.prompt.is_some(), "prompt");
        key(self.schedule.is_some(), "schedule");
        key(self.timezone.is_some(), "timezone");
        key(!self.watch.is_empty(), "watch");
        key(!self.check.is_empty(), "check");
        key(!self.tool.is_empty(), "tool");
        key(self.webhook.is_some(), "webhook");
        keys
    }
}

/// The user's config file, read: `$SUP_CONFIG`, or `$XDG_CONFIG_HOME/sup/config.toml`, or
/// `~/.config/sup/config.toml`. Its keys are the goal file's, less those of one goal.
#[derive(Clone, Debug, Default)]
pub(crate) struct UserConfig {
    path: Option<PathBuf>,
    settings: Settings,
}

impl UserConfig {
    pub(crate) fn path() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("SUP_CONFIG").filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
        Some(base.join("sup/config.toml"))
    }

    /// Read the user config; none when the file does not exist.
    pub(crate) fn load() -> Result<UserConfig, ConfigError> {
        let Some(path) = Self::path().filter(|p| p.exists()) else {
            return Ok(UserConfig::default());
        };
        Self::parse(&path, &goal::read(&path, "user config")?)
    }

    pub(crate) fn parse(path: &Path, text: &str) -> Result<UserConfig, ConfigError> {
        let settings = goal::settings(path, text)?;
        if let Some(key) = settings.goal_only_keys().first() {
            return Err(ConfigError::Invalid(format!(
                "{}: key `{key}` belongs in a goal file, not the user config",
                path.display()
            )));
        }
        Ok(UserConfig {
            path: Some(path.to_path_buf()),
            settings,
        })
    }
}

/// Every source of one run's settings, highest precedence first.
pub(crate) struct Layers<'a> {
    pub(crate) flags: &'a Settings,
    pub(crate) goal: Option<&'a GoalFile>,
    pub(crate) env: &'a Settings,
    pub(crate) user: &'a UserConfig,
}

/// The effective settings of a run and where each came from.
#[derive(Clone, Debug)]
pub struct Effective {
    pub(crate) settings: Settings,
    pub(crate) provenance: Provenance,
}

/// Merge the layers key by key and validate the result. Pure: reads and makes nothing.
pub(crate) fn merge(layers: &Layers) -> Result<Effective, ConfigError> {
    let mut merged = Settings::default();
    let mut provenance = Provenance::default();
    let defaults = Settings::defaults();
    // Shared by every setting noted from them: a path is not copied per setting.
    let user_path: std::sync::Arc<Path> =
        layers.user.path.as_deref().unwrap_or(Path::new("")).into();
    let mut sources: Vec<(Source, &Settings)> = vec![(Source::Flag, layers.flags)];
    if let Some(g) = layers.goal {
        sources.push((Source::GoalFile(g.path.as_path().into()), &g.settings));
    }
    sources.push((Source::Environment, layers.env));
    sources.push((Source::UserConfig(user_path), &layers.user.settings));
    sources.push((Source::Default, &defaults));
    for (source, layer) in &sources {
        merged.merge_layer(layer, source, &mut provenance);
    }
    validate(&merged)?;
    Ok(Effective {
        settings: merged,
        provenance,
    })
}

fn validate(s: &Settings) -> Result<(), ConfigError> {
    let invalid = |m: &str| Err(ConfigError::Invalid(m.into()));
    if s.prompt.is_none() {
        return invalid(
            "no prompt: give one on the command line, or `prompt = \"…\"` in the goal file",
        );
    }
    if s.model.as_deref().is_none_or(str::is_empty) {
        return invalid(
            "no model configured: pass --model PROVIDER:MODEL or set SUP_MODEL \
             (e.g. `--model script:goals/scripts/haiku.json` to run offline, or \
             `--model openai:gpt-4o-mini`)",
        );
    }
    if s.max_steps == Some(0) {
        return invalid("--max-steps must be at least 1");
    }
    if s.output_cap.is_some_and(|c| c < 256) {
        return invalid("--output-cap must be at least 256 bytes");
    }
    if s.tries == Some(0) {
        return invalid("--tries must be at least 1");
    }
    let r = &s.approval_rules;
    crate::approval::Rules::parse(&r.allow, &r.ask, &r.deny)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn goal(text: &str) -> GoalFile {
        GoalFile::parse(Path::new("/g/x.toml"), text).unwrap()
    }

    #[test]
    fn precedence_is_flag_goal_file_environment_user_config_default() {
        let g = goal("prompt = \"p\"\nmodel = \"script:file\"\nmax_steps = 7\n");
        let flags = Settings {
            model: Some("script:flag".into()),
            ..Settings::default()
        };
        let env = Settings {
            model: Some("script:env".into()),
            approval: Some(Mode::Queue),
            ..Settings::default()
        };
        let user = UserConfig::parse(
            Path::new("/u/config.toml"),
            "approval = \"never\"\ntoken_budget = 99\n[approval_rules]\nallow = [\"read_file\"]\n",
        )
        .unwrap();
        let layers = Layers {
            flags: &flags,
            goal: Some(&g),
            env: &env,
            user: &user,
        };
        let e = merge(&layers).unwrap();
        let s = &e.settings;
        assert_eq!(s.model.as_deref(), Some("script:flag"));
        assert_eq!(s.max_steps, Some(7));
        assert_eq!(s.approval, Some(Mode::Queue));
        assert_eq!(s.token_budget, Some(99));
        assert_eq!(s.tool_timeout, Some(Duration::from_secs(120)));
        let p = &e.provenance;
        assert_eq!(p.source("model"), Some(&Source::Flag));
        assert_eq!(
            p.source("max_steps"),
            Some(&Source::GoalFile(Path::new("/g/x.toml").into()))
        );
        assert_eq!(p.source("approval"), Some(&Source::Environment));
        assert_eq!(
            p.source("token_budget"),
            Some(&Source::UserConfig(Path::new("/u/config.toml").into()))
        );
        assert_eq!(p.source("tool_timeout"), Some(&Source::Default));
        assert_eq!(p.source("workspace"), None);
    }

    #[test]
    fn rules_gather_from_every_source_lowest_first() {
        let g = goal("prompt = \"p\"\nmodel = \"m:x\"\n[approval_rules]\nallow = [\"b\"]\n");
        let mut flags = Settings::default();
        flags.approval_rules.allow.push("c".into());
        let user =
            UserConfig::parse(Path::new("/u.toml"), "[approval_rules]\nallow = [\"a\"]\n").unwrap();
        let e = merge(&Layers {
            flags: &flags,
            goal: Some(&g),
            env: &Settings::default(),
            user: &user,
        })
        .unwrap();
        assert_eq!(e.settings.approval_rules.allow, ["a", "b", "c"]);
        assert_eq!(
            e.provenance
                .iter()
                .find(|(k, _)| *k == "approval_rules")
                .unwrap()
                .1
                .len(),
            3
        );
    }

    #[test]
    fn enums_and_durations_say_what_is_wrong() {
        let e = parse_enum::<Mode>("sometimes").unwrap_err();
        assert!(e.contains("sometimes") && e.contains("never"), "{e}");
        let e = GoalFile::parse(
            Path::new("g.toml"),
            "prompt = \"p\"\n\noverlap = \"later\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("g.toml:3:") && e.contains("overlap") && e.contains("skip"),
            "{e}"
        );
        let e = GoalFile::parse(
            Path::new("g.toml"),
            "output_cap = 1\ncheck_timeout = \"x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("g.toml:2:") && e.contains("check_timeout"),
            "{e}"
        );
    }

    #[test]
    fn the_user_config_holds_no_goal() {
        let e = UserConfig::parse(Path::new("/u.toml"), "prompt = \"p\"\n").unwrap_err();
        assert!(e.to_string().contains("`prompt`"), "{e}");
    }

    #[test]
    fn validation_names_the_problem() {
        let flags = Settings {
            prompt: Some("p".into()),
            model: Some("m:x".into()),
            max_steps: Some(0),
            ..Settings::default()
        };
        let e = merge(&Layers {
            flags: &flags,
            goal: None,
            env: &Settings::default(),
            user: &UserConfig::default(),
        })
        .unwrap_err();
        assert!(e.to_string().contains("max-steps"), "{e}");
    }
}

//! The command line: clap definitions, the commands, and the one place that knows about the
//! terminal, signals and exit codes.

mod manage;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Exit statuses (DESIGN: "Exit status").
pub mod exit {
    pub const ACHIEVED: u8 = 0;
    pub const CHECKS_FAILED: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const LIMIT: u8 = 3;
    pub const MODEL: u8 = 4;
    pub const INTERRUPTED: u8 = 130;
}

/// An error that ends the command with an exit status.
#[derive(Debug)]
pub struct Fail {
    pub code: u8,
    pub error: anyhow::Error,
}

impl Fail {
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Fail {
            code: exit::USAGE,
            error: error.into(),
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "sup",
    version,
    about = "Supervise LLM agent loops: work, verify, schedule.",
    after_help = "Exit status: 0 achieved, 1 checks still failing, 2 bad usage or config, \
                  3 stopped by a limit, 4 model or provider error, 130 interrupted."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the work loop on a prompt; the final answer goes to stdout.
    Run(RunArgs),
    /// Run a goal: the work loop, then checks, retried up to --tries times.
    Goal(GoalArgs),
    /// Run the goals of a folder on their schedules until SIGTERM.
    Daemon {
        /// The folder of goal files.
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
        /// Goals running at once at most; more wait.
        #[arg(long, default_value_t = 4)]
        max_concurrent: usize,
        /// At shutdown, how long running goals get to finish before they are cancelled.
        #[arg(long, default_value = "30s", value_parser = duration)]
        grace: Duration,
    },
    /// The goals of a folder: schedules, next occurrences, last results, file errors.
    Goals {
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// The run history, newest first.
    Runs {
        #[arg(long)]
        goal: Option<String>,
        /// achieved, failed, unfinished, error, interrupted or running.
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// One run: its transcript rendered like the trace, its checks, its outcome.
    Show { run_id: String },
    /// Run a goal of the folder now, recorded as manual.
    Trigger {
        name: String,
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Pause a goal: the daemon skips its occurrences until it is resumed.
    Pause {
        name: String,
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
    },
    /// Resume a paused goal.
    Resume {
        name: String,
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
    },
    /// Approval requests waiting for a person.
    Approvals {
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting request (a tool call, or a human check).
    Approve {
        id: String,
        /// Allow the same tool and argument for the rest of that run.
        #[arg(long)]
        always: bool,
    },
    /// Deny a waiting request; the reason goes back to the model.
    Deny {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

fn duration(s: &str) -> Result<Duration, String> {
    crate::verify::file::parse_duration(s)
}

/// Options every running command takes.
#[derive(Args, Debug, Clone, Default)]
pub struct Common {
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
    #[arg(long, value_parser = duration)]
    pub tool_timeout: Option<Duration>,
    /// Bytes of a tool result the model sees (default 16384); the rest is kept on disk.
    #[arg(long)]
    pub output_cap: Option<usize>,
    /// One JSON object per event on stdout instead of the human trace.
    #[arg(long)]
    pub json: bool,
    /// The provider's base URL (overrides OPENAI_BASE_URL, ANTHROPIC_BASE_URL, …).
    #[arg(long)]
    pub base_url: Option<String>,
    /// Ask for whole answers instead of streams.
    #[arg(long)]
    pub no_stream: bool,
    /// The model's output token limit per turn (Anthropic default 8192).
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// How long to wait for a provider's response to start (default 600s).
    #[arg(long, value_parser = duration)]
    pub request_timeout: Option<Duration>,
    /// How long a stream may stay silent before it counts as broken (default 120s).
    #[arg(long, value_parser = duration)]
    pub idle_timeout: Option<Duration>,
    /// Attempts at most for one model request (default 5).
    #[arg(long)]
    pub retries: Option<u32>,
    /// Write every model turn to FILE as a `script:` file that replays the run.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// ask (prompt at the terminal), queue (wait for `sup approve`), auto (allow what no
    /// rule denies) or never (deny what no rule allows). Wins over a goal file's `approval`,
    /// which wins over $SUP_APPROVAL; without any: ask at a terminal, never without one.
    #[arg(long, value_parser = approval_mode)]
    pub approval: Option<crate::approval::Mode>,
    /// Allow calls matching `tool` or `tool(pattern)`, e.g. `run_command(cargo test*)`.
    #[arg(long)]
    pub allow: Vec<String>,
    /// Always ask a person for calls matching this rule.
    #[arg(long)]
    pub ask: Vec<String>,
    /// Deny calls matching this rule.
    #[arg(long)]
    pub deny: Vec<String>,
    /// How long a queued approval waits before it counts as a denial (default 1h).
    #[arg(long, value_parser = duration)]
    pub approval_timeout: Option<Duration>,
    /// An MCP server over stdio: NAME=COMMAND (split at spaces); its tools are NAME__TOOL.
    #[arg(long, value_parser = mcp_server)]
    pub mcp: Vec<crate::tools::mcp::ServerSpec>,
    /// The sandbox of commands, checks and MCP servers: workspace-write (default), read-only
    /// or off. Wins over a goal file's `sandbox`, which wins over $SUP_SANDBOX.
    #[arg(long, value_parser = crate::tools::sandbox::Policy::parse)]
    pub sandbox: Option<crate::tools::sandbox::Policy>,
    /// Refuse to run (exit 2) where the kernel lacks part of the sandbox.
    #[arg(long)]
    pub sandbox_required: bool,
    /// Pass this secret-named variable (…KEY, …TOKEN, …) to commands, checks and MCP servers.
    #[arg(long, value_parser = env_pass_name)]
    pub env_pass: Vec<String>,
}

fn env_pass_name(s: &str) -> Result<String, String> {
    crate::tools::sandbox::check_env_pass(s).map(|()| s.to_string())
}

fn mcp_server(s: &str) -> Result<crate::tools::mcp::ServerSpec, String> {
    let (name, command) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: write NAME=COMMAND, e.g. git=uvx mcp-server-git"))?;
    let command: Vec<String> = command.split_whitespace().map(str::to_string).collect();
    if name.trim().is_empty() || command.is_empty() {
        return Err(format!(
            "`{s}`: write NAME=COMMAND, e.g. git=uvx mcp-server-git"
        ));
    }
    Ok(crate::tools::mcp::ServerSpec {
        name: name.trim().to_string(),
        command,
        args: Vec::new(),
        env: Default::default(),
        sandbox: None,
        env_pass: Vec::new(),
    })
}

/// A default from the environment; an unusable value is a usage error that names it.
pub fn env_default<T>(var: &str, parse: fn(&str) -> Result<T, String>) -> Result<Option<T>, Fail> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => parse(v.trim())
            .map(Some)
            .map_err(|e| Fail::usage(anyhow::anyhow!("{var}: {e}"))),
        _ => Ok(None),
    }
}

pub fn approval_mode(s: &str) -> Result<crate::approval::Mode, String> {
    crate::approval::Mode::parse(s)
        .ok_or_else(|| format!("`{s}` is not an approval mode: use ask, queue, auto or never"))
}

impl Common {
    /// The provider settings these options give.
    pub fn provider_options(&self) -> crate::model::ProviderOptions {
        let mut http = crate::model::http::HttpOptions {
            stream: !self.no_stream,
            ..Default::default()
        };
        if let Some(t) = self.request_timeout {
            http.request_timeout = t;
        }
        if let Some(t) = self.idle_timeout {
            http.idle_timeout = t;
        }
        if let Some(n) = self.retries {
            http.max_attempts = n.max(1);
        }
        crate::model::ProviderOptions {
            base_url: self.base_url.clone(),
            http,
            max_tokens: self.max_tokens,
        }
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// What the agent should do.
    pub prompt: String,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args, Debug)]
pub struct GoalArgs {
    /// What the agent should achieve (or `prompt` in the goal file).
    pub prompt: Option<String>,
    /// A goal file (`goals/NAME.toml`); flags override it.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// A check script, run by extension (.js/.mjs node, .py python3, .sh bash, else directly).
    #[arg(long = "check")]
    pub checks: Vec<PathBuf>,
    /// A check as a shell command line (`cargo test`).
    #[arg(long = "check-cmd")]
    pub check_cmds: Vec<String>,
    /// Work-and-check rounds at most (default 3).
    #[arg(long)]
    pub tries: Option<u32>,
    /// Start each try again from the prompt plus the latest failure report.
    #[arg(long)]
    pub fresh: bool,
    /// Timeout of each check (default 300s).
    #[arg(long, value_parser = duration)]
    pub check_timeout: Option<Duration>,
    /// The goal's name (default: the goal file's stem, or `goal`).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    // The daemon logs each occurrence fired and finished; other commands only trouble.
    let default_level = if matches!(cli.command, Command::Daemon { .. }) {
        "info"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sup: cannot start the async runtime: {e}");
            return ExitCode::from(exit::MODEL);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Goal(args) => run::goal(args).await,
            Command::Daemon {
                goals,
                max_concurrent,
                grace,
            } => manage::daemon(goals, max_concurrent, grace).await,
            Command::Goals { goals, json } => manage::goals(&goals, json),
            Command::Runs {
                goal,
                status,
                limit,
                json,
            } => manage::runs(goal.as_deref(), status.as_deref(), limit, json),
            Command::Show { run_id } => manage::show(&run_id),
            Command::Trigger { name, goals, json } => manage::trigger(&goals, &name, json).await,
            Command::Pause { name, goals } => manage::pause(&goals, &name, true),
            Command::Resume { name, goals } => manage::pause(&goals, &name, false),
            Command::Approvals { json } => manage::approvals(json),
            Command::Approve { id, always } => manage::answer(&id, true, always, None),
            Command::Deny { id, reason } => manage::answer(&id, false, false, reason),
        }
    });
    // Tool processes are killed by their own guards; do not wait on stragglers.
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(fail) => {
            eprintln!("sup: error: {:#}", fail.error);
            ExitCode::from(fail.code)
        }
    }
}

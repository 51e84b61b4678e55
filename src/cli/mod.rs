//! The command line: clap definitions, the commands, and the one place that knows about the
//! terminal, signals and exit codes.

mod continued;
mod fleet;
mod manage;
mod run;
mod serve;
mod service;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::store::history::{History, HistoryError};

/// How a command ended, one kind per class of outcome or failure. `code` is the one place
/// that maps them to exit statuses (DESIGN: "Exit status").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Every check passed, or a final answer (`sup run`), or a command that did its job.
    Achieved,
    /// Checks still failing after every try.
    ChecksFailed,
    /// The command line, a goal file or the configuration is wrong.
    Usage,
    /// A limit stopped the work (`max_steps`, `budget`, `repeated_calls`, `length`).
    Limit,
    /// The model or the provider failed.
    Model,
    /// The store or the machine failed (a locked or full database, a folder that cannot be
    /// made): the run could not go on, and it is not the user's input.
    Store,
    Interrupted,
}

impl Ending {
    pub(crate) fn code(self) -> u8 {
        match self {
            Ending::Achieved => 0,
            Ending::ChecksFailed => 1,
            Ending::Usage => 2,
            Ending::Limit => 3,
            Ending::Model | Ending::Store => 4,
            Ending::Interrupted => 130,
        }
    }

    /// The ending of a run's outcome.
    pub(crate) fn of(status: crate::trace::Status) -> Ending {
        use crate::trace::Status;
        match status {
            Status::Achieved => Ending::Achieved,
            Status::Failed => Ending::ChecksFailed,
            Status::Unfinished => Ending::Limit,
            Status::Error => Ending::Model,
            Status::Interrupted => Ending::Interrupted,
        }
    }
}

/// An error that ends the command, with its class.
#[derive(Debug)]
pub(crate) struct Fail {
    ending: Ending,
    error: anyhow::Error,
}

impl Fail {
    pub(crate) fn usage(error: impl Into<anyhow::Error>) -> Self {
        Fail {
            ending: Ending::Usage,
            error: error.into(),
        }
    }

    pub(crate) fn store(error: impl Into<anyhow::Error>) -> Self {
        Fail {
            ending: Ending::Store,
            error: error.into(),
        }
    }
}

impl From<crate::store::db::DbError> for Fail {
    fn from(e: crate::store::db::DbError) -> Self {
        match e {
            crate::store::db::DbError::NoRun(_) => Fail::usage(e),
            _ => Fail::store(e),
        }
    }
}

impl From<HistoryError> for Fail {
    fn from(e: HistoryError) -> Self {
        match e {
            HistoryError::Db(e) => Fail::from(e),
            HistoryError::Pg(e) => Fail::usage(e),
            e @ HistoryError::Task(_) => Fail::store(e),
        }
    }
}

impl From<crate::run::RunError> for Fail {
    fn from(e: crate::run::RunError) -> Self {
        use crate::run::RunError;
        let ending = match &e {
            RunError::Config(_)
            | RunError::Setup(_)
            | RunError::Tools(_)
            | RunError::Mcp(_)
            | RunError::Sandbox(_) => Ending::Usage,
            RunError::Model(m) if m.is_config() => Ending::Usage,
            RunError::Model(_) => Ending::Model,
            RunError::Store(_) | RunError::Db(_) | RunError::Pg(_) => Ending::Store,
            RunError::Worktree(w) if w.is_usage() => Ending::Usage,
            RunError::Worktree(_) => Ending::Store,
        };
        Fail {
            ending,
            error: e.into(),
        }
    }
}

/// The end of `sup --help`: exit statuses and the environment `sup` reads.
const AFTER_HELP: &str = "\
Exit status: 0 achieved, 1 checks still failing (or a judge said impossible), 2 bad usage or
config, 3 stopped by a limit, 4 model or provider error, 130 interrupted.

Environment:
  SUP_HOME            the store, runs and kept outputs (default ~/.local/state/sup)
  SUP_MODEL           PROVIDER:MODEL when neither --model nor the goal file names one
  SUP_APPROVAL        approval mode below --approval and the goal file's `approval`
  SUP_SANDBOX         sandbox policy below --sandbox and the goal file's `sandbox`
  SUP_CONFIG          the user config (default ~/.config/sup/config.toml)
  SUP_STORE           a fleet's PostgreSQL store (as --store)
  SUP_STORE_RETRY     how often a fleet daemon retries an unreachable store
  SUP_HOST            this machine's name in a fleet (default the host name)
  SUP_SERVE_TOKEN     the console's sign-in secret; required off loopback
  OPENAI_API_KEY, OPENAI_BASE_URL, ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL,
  DEEPSEEK_API_KEY, DEEPSEEK_BASE_URL, OLLAMA_BASE_URL
                      provider keys and servers
  RUST_LOG            log level (default warn; info for daemon and serve)
Checks get SUP_WORKSPACE, SUP_TRY, SUP_GOAL, SUP_RUN_ID, SUP_ANSWER and SUP_CHECK_DIR.";

#[derive(Parser, Debug)]
#[command(
    name = "sup",
    version,
    about = "Supervise LLM agent loops: work, verify, schedule.",
    after_help = AFTER_HELP
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The shared store: postgres://USER@HOST:PORT/DATABASE puts runs, claims and approvals
    /// in PostgreSQL for a fleet of daemons (default: SQLite under SUP_HOME).
    #[arg(long, global = true, env = "SUP_STORE")]
    store: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the work loop on a prompt; the final answer goes to stdout.
    Run(RunArgs),
    /// Run a goal: the work loop, then checks (scripts, commands, people, then judges),
    /// retried up to --tries times.
    Goal(GoalArgs),
    /// Run the goals of a folder on their schedules until SIGTERM.
    Daemon(DaemonArgs),
    /// The fleet sharing a --store: each daemon, its last renewal and what it runs.
    Daemons {
        /// One JSON document on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// The web console: runs, live transcripts, approvals and goals in a browser. Off
    /// loopback it needs SUP_SERVE_TOKEN.
    Serve {
        /// IP:PORT to listen on.
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: std::net::SocketAddr,
        /// The folder of goal files.
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
    },
    /// The goals of a folder: schedules, next occurrences, last results, file errors.
    Goals {
        /// The folder of goal files.
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
        /// One JSON document on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// The run history, newest first.
    Runs {
        /// Only the runs of this goal (by name; `run` for `sup run`).
        #[arg(long)]
        goal: Option<String>,
        /// achieved, failed, unfinished, error, interrupted or running.
        #[arg(long)]
        status: Option<crate::store::RunStatus>,
        /// The newest runs, this many at most.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// One JSON document on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// One run: its transcript rendered like the trace with every tool result, its checks,
    /// its outcome.
    Show {
        /// The run's id (as `sup runs` lists it).
        run_id: String,
        /// Also print the whole kept outputs: tool outputs cut for the model, and each
        /// check's whole output rather than its last part.
        #[arg(long)]
        full: bool,
        /// Print the diff of the run's worktree commit instead.
        #[arg(long)]
        diff: bool,
    },
    /// Continue a run that was interrupted, stopped by a limit or by a provider error, from
    /// its transcript, with its recorded settings (these flags excepted).
    Continue {
        /// The run's id (as `sup runs` lists it).
        run_id: String,
        /// Model turns this continuation may take (default: the recorded limit).
        #[arg(long)]
        max_steps: Option<u32>,
        /// Tries of the verify loop this continuation may take.
        #[arg(long)]
        tries: Option<u32>,
        /// US dollars this continuation may spend at most.
        #[arg(long, value_name = "USD")]
        max_cost: Option<f64>,
        /// One JSON object per event on stdout instead of the human trace.
        #[arg(long)]
        json: bool,
    },
    /// Run a goal of the folder now, recorded as manual.
    Trigger {
        /// The goal's name (its file's stem in --goals).
        name: String,
        /// The folder of goal files.
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
        /// One JSON object per event on stdout instead of the human trace.
        #[arg(long)]
        json: bool,
        /// ask, queue, auto or never; wins over the goal file's `approval` and
        /// $SUP_APPROVAL. Without any: ask at a terminal, else queue (answer with `sup
        /// approve` or on the console).
        #[arg(long, value_parser = crate::config::parse_enum::<crate::approval::Mode>)]
        approval: Option<crate::approval::Mode>,
        /// Started by the console for a webhook delivery: recorded as `webhook`, its body
        /// (JSON) on stdin.
        #[arg(long, hide = true)]
        webhook: bool,
    },
    /// Pause a goal: the daemon skips its occurrences until it is resumed.
    Pause {
        /// The goal's name (its file's stem in --goals).
        name: String,
        /// The folder of goal files.
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
    },
    /// Resume a paused goal.
    Resume {
        /// The goal's name (its file's stem in --goals).
        name: String,
        /// The folder of goal files.
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
    },
    /// Approval requests waiting for a person.
    Approvals {
        /// One JSON document on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting request (a tool call, or a human check).
    Approve {
        /// The request's id (as `sup approvals` lists it).
        id: String,
        /// Allow the same tool and argument for the rest of that run.
        #[arg(long)]
        always: bool,
    },
    /// Deny a waiting request; the reason goes back to the model.
    Deny {
        /// The request's id (as `sup approvals` lists it).
        id: String,
        /// Why, for the model (it reads it as the call's result) or the check's report.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Health for monitors: per goal the last and next occurrence, the last verdict, and
    /// whether it is overdue; exit 0 when every goal is healthy, 1 otherwise.
    Status {
        /// The folder of goal files.
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
        /// One JSON document on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Run the daemon as a service: a systemd unit (a launchd agent on macOS).
    Service {
        #[command(subcommand)]
        action: service::Action,
    },
}

fn duration(s: &str) -> Result<Duration, String> {
    crate::config::parse_duration(s)
}

#[derive(Args, Debug)]
pub(crate) struct DaemonArgs {
    /// The folder of goal files.
    #[arg(long, default_value = "goals")]
    goals: PathBuf,
    /// Goals running at once at most; more wait.
    #[arg(long, default_value_t = 4)]
    max_concurrent: usize,
    /// At shutdown, how long running goals get to finish before they are cancelled.
    #[arg(long, default_value = "30s", value_parser = duration)]
    grace: Duration,
    /// With --store: how long this daemon's runs stay its own after it stops renewing
    /// (it renews every third of it); then another daemon marks them interrupted.
    #[arg(long, default_value = "15s", value_parser = duration)]
    lease: Duration,
    /// With --store: what this machine has (`gpu,docker`); goals with `tags` run only
    /// on daemons that have all of them.
    #[arg(long, value_delimiter = ',')]
    tags: Vec<String>,
    /// Also serve the web console on this address (as `sup serve --listen`).
    #[arg(long, value_name = "ADDR")]
    serve: Option<std::net::SocketAddr>,
}

/// What `sup run` and `sup goal` share: how the run is shown, and every setting.
#[derive(Args, Debug)]
pub(crate) struct CommonArgs {
    /// One JSON object per event on stdout instead of the human trace.
    #[arg(long)]
    json: bool,
    /// Show no tool results in the trace, only a line per call and result (`sup show
    /// RUN_ID` shows them afterwards).
    #[arg(long, short)]
    quiet: bool,
    /// Print the effective settings and where each came from, then exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    settings: crate::config::Settings,
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// What the agent should do.
    prompt: String,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args, Debug)]
pub(crate) struct GoalArgs {
    /// What the agent should achieve (or `prompt` in the goal file).
    prompt: Option<String>,
    /// A goal file (`goals/NAME.toml`); flags override it.
    #[arg(long)]
    file: Option<PathBuf>,
    /// A check script, run by extension (.js/.mjs node, .py python3, .sh bash, else directly);
    /// `--check human` asks a person to accept or reject the work.
    #[arg(long = "check")]
    checks: Vec<PathBuf>,
    /// A check as a shell command line (`cargo test`).
    #[arg(long = "check-cmd")]
    check_cmds: Vec<String>,
    /// A judge check: a model reads the goal, these criteria and the evidence (the workspace's
    /// changes, the other checks) and says yes or no; it runs only when every other check
    /// passed. Repeatable.
    #[arg(long = "check-judge", value_name = "CRITERIA")]
    check_judges: Vec<String>,
    /// The model of judge checks that name none (default: the run's --model).
    #[arg(long, value_name = "PROVIDER:MODEL")]
    judge_model: Option<String>,
    /// Work-and-check rounds at most (default 3).
    #[arg(long)]
    tries: Option<u32>,
    /// Start each try again from the prompt plus the latest failure report.
    #[arg(long)]
    fresh: bool,
    /// Timeout of each check (default 300s).
    #[arg(long, value_parser = crate::config::parse_timeout)]
    check_timeout: Option<Duration>,
    /// The goal's name (default: the goal file's stem, or `goal`).
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    common: CommonArgs,
}

/// `sup trigger --webhook`: the delivery's body, JSON on stdin (the console checked it).
fn payload(webhook: bool) -> Result<Option<serde_json::Value>, Fail> {
    if !webhook {
        return Ok(None);
    }
    let mut body = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::io::stdin(), crate::serve::MAX_HOOK_BODY as u64 + 1),
        &mut body,
    )
    .map_err(Fail::usage)?;
    if body.len() > crate::serve::MAX_HOOK_BODY {
        return Err(Fail::usage(anyhow::anyhow!(
            "the webhook's body is over {} bytes",
            crate::serve::MAX_HOOK_BODY
        )));
    }
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| Fail::usage(anyhow::anyhow!("the webhook's body is not JSON: {e}")))
}

/// The local store, with runs whose process is gone marked as no longer running.
pub(super) fn db() -> Result<crate::store::db::Db, Fail> {
    let db = crate::store::db::Db::open(&crate::store::home())?;
    // A run whose process is gone is no longer running, whoever asks.
    db.mark_orphans()?;
    Ok(db)
}

pub fn main() -> ExitCode {
    // reqwest is built without a default TLS provider; ring is ours, for every client (model
    // calls, notifications). Installing twice is refused harmlessly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                Ending::Usage.code()
            } else {
                Ending::Achieved.code()
            });
        }
    };
    // A store password given on the command line is no longer readable there by others
    // (the agent's commands among them).
    if let Some(url) = &cli.store
        && let Some(blotted) = crate::store::pg::password_blotted(url)
    {
        crate::tools::sandbox::hide_in_cmdline(url.as_bytes(), &blotted);
    }
    // Nor in the environment: nothing `sup` starts (a service manager, a console's `sup
    // trigger` gets it back on purpose) inherits it. The start-up copy keeps it.
    // SAFETY: no other thread exists yet (the runtime starts below).
    unsafe { std::env::remove_var("SUP_STORE") };
    // The daemon logs each occurrence fired and finished; other commands only trouble.
    let default_level = if matches!(cli.command, Command::Daemon { .. } | Command::Serve { .. }) {
        "info"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(|| crate::redact::Writer(std::io::stderr()))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Before the runtime: the exporter's HTTP client runs on a thread of its own.
    if let Err(e) = crate::trace::otel::init() {
        eprintln!("sup: error: {e}");
        return ExitCode::from(Ending::Usage.code());
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sup: cannot start the async runtime: {e}");
            return ExitCode::from(Ending::Store.code());
        }
    };
    let store = cli.store.clone().filter(|s| !s.trim().is_empty());
    let result = runtime.block_on(command(store.as_deref(), cli.command));
    // Tool processes are killed by their own guards; do not wait on stragglers.
    runtime.shutdown_timeout(Duration::from_millis(200));
    crate::trace::otel::shutdown();
    match result {
        Ok(ending) => ExitCode::from(ending.code()),
        Err(fail) => {
            let message = message(&fail.error);
            eprintln!("sup: error: {}", crate::redact::text(&message));
            ExitCode::from(fail.ending.code())
        }
    }
}

/// An error and its causes, `: `-joined as `{:#}` writes them, but without a cause that the
/// message so far already says (an error that writes its source into its own text, as
/// `cannot read F: No such file or directory (os error 2)`, would say it twice).
fn message(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.is_empty() {
            out = text;
        } else if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

/// The history of the store at `store` (`--store`, `SUP_STORE`), or this machine's
/// (`SUP_HOME`).
async fn history(store: Option<&str>) -> Result<History, Fail> {
    Ok(match store {
        Some(url) => History::Fleet(Box::new(fleet::open(url).await?)),
        None => History::Local(crate::store::home()),
    })
}

/// A command against this machine's store, or with `store` against a fleet's PostgreSQL
/// store (`--store`, `SUP_STORE`).
async fn command(store: Option<&str>, command: Command) -> Result<Ending, Fail> {
    match command {
        // A single run is recorded where it runs; the fleet's history is the daemons' runs
        // and triggers.
        Command::Run(args) => {
            if let Some(url) = store {
                fleet::open(url).await?;
            }
            run::run(args).await
        }
        Command::Goal(args) => {
            if let Some(url) = store {
                fleet::open(url).await?;
            }
            run::goal(args).await
        }
        Command::Daemon(a) => match store {
            Some(url) => fleet::daemon(url, a).await,
            None => manage::daemon(a.goals, a.max_concurrent, a.grace, a.serve).await,
        },
        Command::Daemons { json } => match store {
            Some(url) => fleet::daemons(url, json).await,
            None => Err(Fail::usage(anyhow::anyhow!(
                "`sup daemons` lists a fleet: pass --store postgres://… or set SUP_STORE"
            ))),
        },
        Command::Status { goals, json } => match store {
            Some(url) => {
                let source = status::Source::Fleet(fleet::open(url).await?);
                status::status_in(&source, &goals, json).await
            }
            None => status::status(&goals, json).await,
        },
        Command::Serve { listen, goals } => {
            let fleet = match store {
                Some(url) => Some((fleet::open(url).await?, url.to_string())),
                None => None,
            };
            serve::serve(listen, goals, fleet).await
        }
        Command::Service { action } => {
            if let Some(url) = store
                && !crate::store::pg::is_pg_url(url)
            {
                let url = crate::store::pg::without_password(url);
                return Err(Fail::usage(anyhow::anyhow!(
                    "--store `{url}` is not a PostgreSQL URL: write \
                     postgres://USER@HOST:PORT/DATABASE"
                )));
            }
            service::service(action, store)
        }
        Command::Goals { goals, json } => manage::goals(&history(store).await?, &goals, json).await,
        Command::Runs {
            goal,
            status,
            limit,
            json,
        } => manage::runs(&history(store).await?, goal.as_deref(), status, limit, json).await,
        Command::Show {
            run_id, diff: true, ..
        } if store.is_none() => continued::diff(&run_id),
        Command::Show { run_id, full, .. } => {
            manage::show(&history(store).await?, &run_id, full).await
        }
        Command::Continue {
            run_id,
            max_steps,
            tries,
            max_cost,
            json,
        } => {
            if store.is_some() {
                return Err(Fail::usage(anyhow::anyhow!(
                    "`sup continue` continues a run of this machine's store; run it without \
                     --store"
                )));
            }
            let o = crate::run::resume::Overrides {
                max_steps,
                tries,
                max_cost,
            };
            continued::continue_run(&run_id, o, json).await
        }
        Command::Trigger {
            name,
            goals,
            json,
            approval,
            webhook,
        } => {
            let history = history(store).await?;
            manage::trigger(&history, &goals, &name, json, approval, payload(webhook)?).await
        }
        Command::Pause { name, goals } => {
            manage::pause(&history(store).await?, &goals, &name, true).await
        }
        Command::Resume { name, goals } => {
            manage::pause(&history(store).await?, &goals, &name, false).await
        }
        Command::Approvals { json } => manage::approvals(&history(store).await?, json).await,
        Command::Approve { id, always } => {
            manage::answer(&history(store).await?, &id, true, always, None).await
        }
        Command::Deny { id, reason } => {
            manage::answer(&history(store).await?, &id, false, false, reason).await
        }
    }
}

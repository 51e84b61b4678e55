//! Assembling one run, the same way from every entry point (`sup run`, `sup goal`, the daemon,
//! `sup trigger`): the layers of settings merged (`crate::config`) and resolved into a
//! `RunSpec` (the workspace made and found, checks and rules settled); then the model, the
//! tools, the MCP servers, the approval gate, the run folder, the transcript and the store
//! record set up around the verify loop. A run that started is always recorded, whatever
//! ends it.

mod launch;
pub(crate) mod parallel;
pub(crate) mod resume;
mod spec;
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
use crate::store::db::{Db, DbError, KeptOutcome, KeptRun, NewRun, PATIENCE};
use crate::store::pg::{self, PgError, PgStore};
use crate::store::{RunDir, StoreError, Transcript, TriggerKind};
use crate::template::{self, Source as Template};
use crate::tools::command::CommandTool;
use crate::tools::mcp::{McpError, ServerSpec, Servers};
use crate::tools::sandbox::{Jail, Sandbox, SandboxError};
use crate::tools::{About, Registry, RegistryError, builtin};
use crate::trace::{CheckReport, Event, EventSink, Events};
use crate::verify::{Check, Goal, Outcome, Runtime, default_system};
use crate::work::{Agent, Limits};
use std::collections::BTreeMap;

pub(crate) use launch::*;
pub(crate) use spec::*;

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

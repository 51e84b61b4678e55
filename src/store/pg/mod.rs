//! The PostgreSQL store that a fleet of daemons shares (`--store postgres://…`): the schema
//! and its migrations (a version table; an older `sup` refuses a newer schema), daemon
//! leases, occurrence and manual-trigger claims (exactly once, overlap and pause decided under
//! a per-goal lock), the runs with their checks and transcript events, approval requests and
//! goal versions. Connection faults are retried with backoff; errors a user meets carry the
//! server's words and what to check.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls};

use super::db::{Answer, ApprovalRow, GoalStats, RunRow, stamp};
use super::{ApprovalStatus, OccurrenceStatus, TriggerKind};
use crate::model::Usage;
use crate::schedule::policy::{self, Decision};
use crate::trace::{CheckReport, Outcome};

mod approvals;
mod claims;
mod daemons;
mod goals;
mod runs;
mod schema;

pub(crate) use runs::{Finish, FleetRun};

#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error(
        "the store URL `{url}` is not a PostgreSQL URL ({why}); write postgres://USER@HOST:PORT/DATABASE"
    )]
    Url { url: String, why: String },
    #[error("the store {at}: {message}; {hint}")]
    Server {
        at: String,
        message: String,
        hint: String,
        transient: bool,
    },
    #[error(
        "the store {at} has schema version {found}, newer than this sup knows ({known}); \
         upgrade sup on this machine (it is {version})"
    )]
    Newer {
        at: String,
        found: i32,
        known: i32,
        version: &'static str,
    },
    #[error("no run `{0}` in the store; `sup runs` lists them")]
    NoRun(String),
}

impl PgError {
    /// A fault that may pass: the server restarting, a connection cut.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            PgError::Server {
                transient: true,
                ..
            }
        )
    }
}

/// A URL that names PostgreSQL.
pub(crate) fn is_pg_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// Where a store URL as written holds a password: in its user part (what follows the
/// user's `:` up to the last `@`, which may be more than the password) and in `password=`
/// options. In order, apart.
fn password_spans(url: &str) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    if let Some(start) = url.find("://").map(|i| i + 3)
        && let Some(at) = url.rfind('@').filter(|at| *at > start)
        && let Some(colon) = url[start..at].find(':')
    {
        spans.push(start + colon + 1..at);
    }
    let lower = url.to_ascii_lowercase();
    let mut from = 0;
    while let Some(i) = lower[from..].find("password=") {
        let value = from + i + "password=".len();
        let end = url[value..]
            .find(|c: char| c == '&' || c.is_whitespace())
            .map_or(url.len(), |e| value + e);
        if spans.last().is_none_or(|s| s.end <= value) {
            spans.push(value..end);
        }
        from = end;
    }
    spans
}

/// A store URL as given, for an error that cannot parse it: a password is `***`.
pub(crate) fn without_password(url: &str) -> String {
    let mut out = url.to_string();
    for span in password_spans(url).into_iter().rev() {
        out.replace_range(span, "***");
    }
    out
}

/// A store URL of the same length with each byte of a password an `x`; `None` when it holds
/// none.
pub(crate) fn password_blotted(url: &str) -> Option<Vec<u8>> {
    let spans = password_spans(url);
    if spans.iter().all(|s| s.is_empty()) {
        return None;
    }
    let mut out = url.as_bytes().to_vec();
    for span in spans {
        out[span].fill(b'x');
    }
    Some(out)
}

/// Where a URL points, without the password.
fn shown(cfg: &tokio_postgres::Config) -> String {
    let host = cfg
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        cfg.get_user().unwrap_or(""),
        cfg.get_dbname().unwrap_or("")
    )
}

fn server_error(at: &str, e: &tokio_postgres::Error) -> PgError {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        let hint = if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            "check the user and password in the store URL and the server's pg_hba.conf"
        } else if *code == SqlState::INVALID_CATALOG_NAME {
            "check the database name in the store URL, or create it (createdb NAME)"
        } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            "the store's user needs rights to create and write tables in that database \
             (e.g. GRANT CREATE, USAGE ON SCHEMA public TO the user)"
        } else if *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::CRASH_SHUTDOWN
        {
            "the server is restarting; sup retries"
        } else {
            "check the store's server log"
        };
        let transient = *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::CRASH_SHUTDOWN
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED;
        return PgError::Server {
            at: at.to_string(),
            message: format!("{}: {}", db.severity(), db.message()),
            hint: hint.into(),
            transient,
        };
    }
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    PgError::Server {
        at: at.to_string(),
        message,
        hint: "check that PostgreSQL runs there and accepts connections \
               (pg_isready -h HOST -p PORT), and the host and port in the store URL"
            .into(),
        transient: true,
    }
}

/// A daemon's version of a goal: (daemon id, content hash, file modified time).
pub(crate) type GoalVersion = (String, String, DateTime<Utc>);

/// One member of the fleet.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct DaemonRow {
    pub(crate) id: String,
    pub(crate) host: String,
    pub(crate) pid: i32,
    pub(crate) version: String,
    pub(crate) tags: Vec<String>,
    pub(crate) max_concurrent: i32,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) renewed_at: DateTime<Utc>,
    /// `alive`, `stopped` (shut down), `dead` (its lease expired).
    pub(crate) state: String,
    pub(crate) running: Vec<String>,
}

/// Who claims: the daemon's id and host.
#[derive(Clone, Debug)]
pub(crate) struct Claimer {
    pub(crate) id: String,
    pub(crate) host: String,
}

/// A trigger a daemon took: `kind` is `manual`, `retry` or `webhook`; `payload` the
/// webhook's body.
#[derive(Clone, Debug)]
pub(crate) struct Taken {
    pub(crate) id: i64,
    pub(crate) goal: String,
    pub(crate) kind: TriggerKind,
    pub(crate) at: DateTime<Utc>,
    pub(crate) payload: Option<String>,
}

/// One occurrence to claim.
#[derive(Clone, Debug)]
pub(crate) struct Due {
    pub(crate) goal: String,
    pub(crate) at: DateTime<Utc>,
    pub(crate) overlap: crate::config::Overlap,
    pub(crate) retry_interrupted: bool,
}

/// What became of a claimed occurrence. Only occurrences this daemon now owns are reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Start it: the run row exists.
    Run {
        goal: String,
        at: DateTime<Utc>,
        run_id: String,
    },
    /// Not run: skipped, paused, queued or missed.
    Not {
        goal: String,
        at: DateTime<Utc>,
        status: OccurrenceStatus,
    },
}

/// What a lease renewal learned.
#[derive(Clone, Debug)]
pub(crate) struct Renewed {
    /// `false`: the fleet had declared the daemon dead (its runs were closed); it is alive
    /// again from now on.
    pub(crate) was_alive: bool,
    /// Its runs that a newer occurrence replaces.
    pub(crate) cancel: Vec<String>,
    /// The daemons with a live lease (this one too), by id.
    pub(crate) fleet: Vec<String>,
}

/// A dead daemon's run that another daemon closed.
#[derive(Clone, Debug)]
pub(crate) struct Reaped {
    pub(crate) daemon: String,
    pub(crate) run_id: String,
    pub(crate) goal: String,
    pub(crate) retried: bool,
}

/// The shared store.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    cfg: tokio_postgres::Config,
    at: String,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("at", &self.at).finish()
    }
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}

/// This machine's name, as the fleet knows it.
pub(crate) fn this_host() -> String {
    std::env::var("SUP_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(host_name)
}

impl PgStore {
    /// Connect, create or migrate the schema, and refuse a newer one.
    pub async fn open(url: &str) -> Result<PgStore, PgError> {
        let mut cfg: tokio_postgres::Config = url.parse().map_err(|e| PgError::Url {
            url: without_password(url),
            why: format!("{e}"),
        })?;
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(Duration::from_secs(5));
        }
        cfg.application_name("sup");
        let at = shown(&cfg);
        let mgr = Manager::from_config(
            cfg.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(8)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(6)))
            .build()
            .map_err(|e| PgError::Url {
                url: without_password(url),
                why: e.to_string(),
            })?;
        let store = PgStore { pool, cfg, at };
        store.migrate().await?;
        Ok(store)
    }

    /// Where the store is, without the password.
    pub(crate) fn at(&self) -> &str {
        &self.at
    }

    fn err(&self, e: &tokio_postgres::Error) -> PgError {
        server_error(&self.at, e)
    }

    /// Run the statement `sql`.
    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<(), PgError> {
        let c = self.client().await?;
        c.execute(sql, params).await.map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// The rows `sql` selects, each read by `row`.
    async fn rows<T>(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        row: impl FnMut(&tokio_postgres::Row) -> T,
    ) -> Result<Vec<T>, PgError> {
        let c = self.client().await?;
        let rows = c.query(sql, params).await.map_err(|e| self.err(&e))?;
        Ok(rows.iter().map(row).collect())
    }

    /// The row `sql` selects, if there is one, read by `row`.
    async fn row<T>(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        row: impl FnOnce(&tokio_postgres::Row) -> T,
    ) -> Result<Option<T>, PgError> {
        let c = self.client().await?;
        let found = c.query_opt(sql, params).await.map_err(|e| self.err(&e))?;
        Ok(found.as_ref().map(row))
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, PgError> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => self.err(&e),
            other => PgError::Server {
                at: self.at.clone(),
                message: other.to_string(),
                hint: "check that PostgreSQL runs there and accepts connections".into(),
                transient: true,
            },
        })
    }

    /// A connection of its own, for `LISTEN`.
    pub(crate) async fn listener(
        &self,
    ) -> Result<
        (
            Client,
            tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
        ),
        PgError,
    > {
        self.cfg.connect(NoTls).await.map_err(|e| self.err(&e))
    }
}

/// Retry `op` while it fails with a transient fault, with growing waits up to `give_up`.
pub(crate) async fn retry<T, F, Fut>(what: &str, give_up: Duration, mut op: F) -> Result<T, PgError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, PgError>>,
{
    let started = std::time::Instant::now();
    let mut wait = Duration::from_millis(100);
    loop {
        match op().await {
            Err(e) if e.is_transient() && started.elapsed() < give_up => {
                tracing::warn!("{what}: {e}; retrying in {}ms", wait.as_millis());
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

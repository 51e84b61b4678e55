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

use super::db::{ApprovalRow, GoalStats, RunRow, stamp};
use super::{ApprovalStatus, OccurrenceStatus, TriggerKind};
use crate::model::Usage;
use crate::schedule::policy::{self, Decision};
use crate::trace::{CheckReport, Status, StopReason};

/// The schema this `sup` knows; a store with a higher version is refused.
pub(crate) const SCHEMA_VERSION: i32 = 4;

#[derive(Debug, thiserror::Error)]
pub(crate) enum PgError {
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

const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE daemons (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        version TEXT NOT NULL,
        tags TEXT[] NOT NULL DEFAULT '{}',
        max_concurrent INTEGER NOT NULL,
        lease_ms BIGINT NOT NULL,
        started_at TIMESTAMPTZ NOT NULL,
        renewed_at TIMESTAMPTZ NOT NULL,
        stopped_at TIMESTAMPTZ,
        state TEXT NOT NULL DEFAULT 'alive'
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        goal TEXT NOT NULL,
        trigger TEXT NOT NULL,
        scheduled_for TIMESTAMPTZ,
        status TEXT NOT NULL,
        stop_reason TEXT,
        tries INTEGER NOT NULL DEFAULT 0,
        steps INTEGER NOT NULL DEFAULT 0,
        input_tokens BIGINT NOT NULL DEFAULT 0,
        output_tokens BIGINT NOT NULL DEFAULT 0,
        cache_read_tokens BIGINT NOT NULL DEFAULT 0,
        cache_write_tokens BIGINT NOT NULL DEFAULT 0,
        created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
        started_at TIMESTAMPTZ NOT NULL,
        ended_at TIMESTAMPTZ,
        error TEXT,
        daemon_id TEXT,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        workspace TEXT NOT NULL DEFAULT '',
        dir TEXT NOT NULL DEFAULT '',
        local_id TEXT,
        retry_interrupted BOOLEAN NOT NULL DEFAULT false,
        cancel_requested BOOLEAN NOT NULL DEFAULT false
    );
    CREATE INDEX runs_goal ON runs (goal, started_at);
    CREATE INDEX runs_running ON runs (goal) WHERE status = 'running';
    CREATE INDEX runs_daemon ON runs (daemon_id) WHERE status = 'running';
    CREATE TABLE checks (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        try INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        passed BOOLEAN NOT NULL,
        exit_status INTEGER,
        outcome TEXT NOT NULL,
        duration_ms BIGINT NOT NULL,
        output_path TEXT,
        PRIMARY KEY (run_id, try, idx)
    );
    CREATE TABLE events (
        run_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        event JSONB NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE occurrences (
        goal TEXT NOT NULL,
        scheduled_for TIMESTAMPTZ NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        run_id TEXT,
        claimed_by TEXT NOT NULL,
        claimed_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (goal, scheduled_for)
    );
    CREATE INDEX occurrences_queued ON occurrences (goal, scheduled_for) WHERE status = 'queued';
    CREATE TABLE triggers (
        id BIGSERIAL PRIMARY KEY,
        goal TEXT NOT NULL,
        kind TEXT NOT NULL,
        requested_at TIMESTAMPTZ NOT NULL,
        requested_by TEXT NOT NULL,
        status TEXT NOT NULL,
        claimed_by TEXT,
        run_id TEXT
    );
    CREATE INDEX triggers_pending ON triggers (id) WHERE status = 'pending';
    CREATE TABLE goal_state (
        goal TEXT PRIMARY KEY,
        paused BOOLEAN NOT NULL DEFAULT false,
        last_occurrence TIMESTAMPTZ
    );
    CREATE TABLE goal_versions (
        goal TEXT NOT NULL,
        daemon_id TEXT NOT NULL,
        hash TEXT NOT NULL,
        modified_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (goal, daemon_id)
    );
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        goal TEXT NOT NULL,
        kind TEXT NOT NULL,
        tool TEXT NOT NULL,
        input TEXT NOT NULL,
        created_at TEXT NOT NULL,
        deadline TEXT NOT NULL,
        status TEXT NOT NULL,
        always BOOLEAN NOT NULL DEFAULT false,
        reason TEXT,
        decided_at TIMESTAMPTZ,
        decided_by TEXT,
        daemon_id TEXT
    );
    CREATE INDEX approvals_pending ON approvals (created_at) WHERE status = 'pending';",
    // 2: what a run cost and its final answer, for `max_cost_per_day` and `previous.answer`
    // across the fleet.
    "ALTER TABLE runs ADD COLUMN cost DOUBLE PRECISION;
    ALTER TABLE runs ADD COLUMN answer TEXT;",
    // 3: runs tied together and what an isolated run left (as SQLite's migration 5).
    "ALTER TABLE runs ADD COLUMN continued_from TEXT;
    ALTER TABLE runs ADD COLUMN parent TEXT;
    ALTER TABLE runs ADD COLUMN attempt INTEGER;
    ALTER TABLE runs ADD COLUMN branch TEXT;
    ALTER TABLE runs ADD COLUMN base_commit TEXT;
    ALTER TABLE runs ADD COLUMN commit_sha TEXT;
    ALTER TABLE runs ADD COLUMN diff_stat TEXT;
    ALTER TABLE runs ADD COLUMN repo TEXT;",
    // 4: webhook triggers: the delivery's body a trigger carries to its run, and the
    // deliveries a goal took, so that one delivered again runs nothing.
    "ALTER TABLE triggers ADD COLUMN payload TEXT;
    CREATE TABLE webhook_deliveries (
        goal TEXT NOT NULL,
        delivery TEXT NOT NULL,
        received_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (goal, delivery)
    );",
];

// The claim's statements (see `PgStore::claim`).
const CLAIM_LOCK: &str = "SELECT pg_advisory_xact_lock(h) FROM
    (SELECT DISTINCT hashtext(g) AS h FROM unnest($1::text[]) g ORDER BY 1) s";
const CLAIM_INSERT: &str = "WITH ins AS (
        INSERT INTO occurrences (goal, scheduled_for, kind, status, claimed_by, claimed_at)
        SELECT g, t, $3, 'claimed', $4, now() FROM unnest($1::text[], $2::timestamptz[]) AS u(g, t)
        ON CONFLICT DO NOTHING RETURNING goal, scheduled_for),
    last AS (
        INSERT INTO goal_state (goal, last_occurrence)
        SELECT goal, max(scheduled_for) FROM ins WHERE $3::text = 'schedule' GROUP BY goal
        ON CONFLICT (goal) DO UPDATE SET last_occurrence =
            greatest(goal_state.last_occurrence, excluded.last_occurrence))
    SELECT goal, scheduled_for FROM ins";
/// Of each goal that is paused, running or has an occurrence waiting: (goal, paused, running
/// run ids, waiting).
const CLAIM_STATE: &str = "SELECT * FROM (
        SELECT g.goal,
            coalesce((SELECT s.paused FROM goal_state s WHERE s.goal = g.goal), false) AS p,
            coalesce((SELECT array_agg(r.id ORDER BY r.id) FROM runs r
                      WHERE r.goal = g.goal AND r.status = 'running'), '{}') AS r,
            EXISTS (SELECT 1 FROM occurrences o WHERE o.goal = g.goal AND o.status = 'queued') AS q
        FROM (SELECT DISTINCT unnest($1::text[]) AS goal) g) x
    WHERE p OR q OR cardinality(r) > 0";
const CLAIM_START: &str = "WITH made AS (
        INSERT INTO runs (id, goal, trigger, scheduled_for, status, started_at, daemon_id, host,
            pid, retry_interrupted)
        SELECT i, g, $4::text, CASE WHEN $4::text = 'schedule' THEN t END, 'running',
            clock_timestamp(), $5, $6, $7, r
        FROM unnest($1::text[], $2::text[], $3::timestamptz[], $8::bool[]) AS u(i, g, t, r))
    UPDATE occurrences o SET status = 'running', run_id = u.i
    FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS u(i, g, t)
    WHERE o.goal = u.g AND o.scheduled_for = u.t";
const CLAIM_SETTLE: &str = "UPDATE occurrences o SET status = u.s
    FROM unnest($1::text[], $2::timestamptz[], $3::text[]) AS u(g, t, s)
    WHERE o.goal = u.g AND o.scheduled_for = u.t";
const CLAIM_REPLACE: &str = "WITH asked AS (
        UPDATE runs r SET cancel_requested = true,
            error = coalesce(r.error, 'replaced by run ' || u.n || ' (overlap replace)')
        FROM unnest($1::text[], $2::text[]) AS u(o, n) WHERE r.id = u.o AND r.status = 'running'
        RETURNING r.id)
    SELECT pg_notify('sup_cancel', id) FROM asked";
const CLAIM_OWNED: &str = "SELECT o.goal, o.scheduled_for, o.status, o.run_id FROM occurrences o
    JOIN unnest($1::text[], $2::timestamptz[]) AS u(g, t)
        ON o.goal = u.g AND o.scheduled_for = u.t
    WHERE o.claimed_by = $3";

/// A key for `pg_advisory_xact_lock` that serializes migrations.
const MIGRATION_LOCK: i64 = 0x0053_7570_5f6d_6967;

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

/// Who claims: the daemon's id, host and pid.
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
    pub(crate) kind: String,
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
pub(crate) struct PgStore {
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
    pub(crate) async fn open(url: &str) -> Result<PgStore, PgError> {
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

    async fn migrate(&self) -> Result<(), PgError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(&e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(|e| self.err(&e))?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS sup_schema (
                 id INTEGER PRIMARY KEY DEFAULT 1 CHECK (id = 1),
                 version INTEGER NOT NULL,
                 migrated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                 migrated_by TEXT NOT NULL DEFAULT ''
             )",
        )
        .await
        .map_err(|e| self.err(&e))?;
        let found: i32 = tx
            .query_opt("SELECT version FROM sup_schema", &[])
            .await
            .map_err(|e| self.err(&e))?
            .map_or(0, |r| r.get(0));
        if found > SCHEMA_VERSION {
            return Err(PgError::Newer {
                at: self.at.clone(),
                found,
                known: SCHEMA_VERSION,
                version: env!("CARGO_PKG_VERSION"),
            });
        }
        for sql in MIGRATIONS.iter().skip(found.max(0) as usize) {
            tx.batch_execute(sql).await.map_err(|e| self.err(&e))?;
        }
        if found < SCHEMA_VERSION {
            tx.execute(
                "INSERT INTO sup_schema (id, version, migrated_by) VALUES (1, $1, $2)
                 ON CONFLICT (id) DO UPDATE SET version = excluded.version,
                     migrated_at = now(), migrated_by = excluded.migrated_by",
                &[
                    &SCHEMA_VERSION,
                    &format!("sup {}", env!("CARGO_PKG_VERSION")),
                ],
            )
            .await
            .map_err(|e| self.err(&e))?;
        }
        tx.commit().await.map_err(|e| self.err(&e))
    }

    // ----- the fleet -----

    /// Register a daemon; returns its id.
    pub(crate) async fn register(
        &self,
        host: &str,
        tags: &[String],
        max_concurrent: usize,
        lease: Duration,
    ) -> Result<String, PgError> {
        let id = format!(
            "{host}-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        );
        let c = self.client().await?;
        c.execute(
            "INSERT INTO daemons (id, host, pid, version, tags, max_concurrent, lease_ms,
                 started_at, renewed_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, now(), now())",
            &[
                &id,
                &host,
                &(std::process::id() as i32),
                &env!("CARGO_PKG_VERSION"),
                &tags,
                &(max_concurrent as i32),
                &(lease.as_millis() as i64),
            ],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(id)
    }

    /// Renew a daemon's lease, and learn which of its runs the fleet asked to cancel (overlap
    /// `replace`; `NOTIFY sup_cancel` says it sooner, this when a notification was lost).
    pub(crate) async fn renew(&self, id: &str) -> Result<Renewed, PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "WITH old AS (SELECT state FROM daemons WHERE id = $1)
                 UPDATE daemons SET renewed_at = now(), state = 'alive', stopped_at = NULL
                 WHERE id = $1 RETURNING (SELECT state FROM old),
                     (SELECT coalesce(array_agg(r.id), '{}') FROM runs r
                      WHERE r.daemon_id = $1 AND r.status = 'running' AND r.cancel_requested),
                     (SELECT coalesce(array_agg(d.id ORDER BY d.id), '{}') FROM daemons d
                      WHERE d.state = 'alive'
                        AND d.renewed_at >= now() - d.lease_ms * interval '1 millisecond')",
                &[&id],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(Renewed {
            was_alive: row.get::<_, Option<String>>(0).as_deref() == Some("alive"),
            cancel: row.get(1),
            fleet: row.get(2),
        })
    }

    pub(crate) async fn stop_daemon(&self, id: &str) -> Result<(), PgError> {
        let c = self.client().await?;
        c.execute(
            "UPDATE daemons SET state = 'stopped', stopped_at = now() WHERE id = $1",
            &[&id],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// Daemons whose lease ran out become `dead`; their runs `interrupted`, their occurrences
    /// closed, and runs that ask for it get a retry trigger, unless a newer run replaced
    /// them (the retry would replace that one).
    pub(crate) async fn reap(&self, by: &str) -> Result<Vec<Reaped>, PgError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(&e))?;
        let dead: Vec<String> = tx
            .query(
                "SELECT id FROM daemons WHERE state = 'alive' AND id <> $1
                     AND renewed_at < now() - lease_ms * interval '1 millisecond'
                 FOR UPDATE SKIP LOCKED",
                &[&by],
            )
            .await
            .map_err(|e| self.err(&e))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut out = Vec::new();
        for d in dead {
            tx.execute(
                "UPDATE daemons SET state = 'dead', stopped_at = now() WHERE id = $1",
                &[&d],
            )
            .await
            .map_err(|e| self.err(&e))?;
            let rows = tx
                .query(
                    "UPDATE runs SET status = 'interrupted', stop_reason = 'cancelled',
                         ended_at = now(),
                         error = 'its daemon ' || $1 || ' stopped renewing its lease (killed, machine gone or cut off); marked by ' || $2
                     WHERE daemon_id = $1 AND status = 'running'
                     RETURNING id, goal, retry_interrupted AND NOT cancel_requested",
                    &[&d, &by],
                )
                .await
                .map_err(|e| self.err(&e))?;
            for r in rows {
                let run_id: String = r.get(0);
                let goal: String = r.get(1);
                let retry: bool = r.get(2);
                tx.execute(
                    "UPDATE occurrences SET status = 'interrupted' WHERE run_id = $1",
                    &[&run_id],
                )
                .await
                .map_err(|e| self.err(&e))?;
                if retry {
                    tx.execute(
                        "INSERT INTO triggers (goal, kind, requested_at, requested_by, status)
                         VALUES ($1, 'retry', clock_timestamp(), $2, 'pending')",
                        &[&goal, &format!("retry of {run_id}")],
                    )
                    .await
                    .map_err(|e| self.err(&e))?;
                }
                out.push(Reaped {
                    daemon: d.clone(),
                    run_id,
                    goal,
                    retried: retry,
                });
            }
        }
        if out.iter().any(|r| r.retried) {
            tx.execute("NOTIFY sup_trigger", &[])
                .await
                .map_err(|e| self.err(&e))?;
        }
        tx.commit().await.map_err(|e| self.err(&e))?;
        Ok(out)
    }

    /// The fleet, newest first; dead and stopped members of the last day too.
    pub(crate) async fn daemons(&self) -> Result<Vec<DaemonRow>, PgError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT d.id, d.host, d.pid, d.version, d.tags, d.max_concurrent, d.started_at,
                     d.renewed_at,
                     CASE WHEN d.state = 'alive'
                          AND d.renewed_at < now() - d.lease_ms * interval '1 millisecond'
                          THEN 'overdue' ELSE d.state END,
                     coalesce((SELECT array_agg(r.goal || ' (' || r.id || ')' ORDER BY r.id)
                               FROM runs r WHERE r.daemon_id = d.id AND r.status = 'running'),
                              '{}')
                 FROM daemons d
                 WHERE d.state = 'alive' OR d.stopped_at > now() - interval '1 day'
                 ORDER BY d.started_at DESC",
                &[],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(rows
            .iter()
            .map(|r| DaemonRow {
                id: r.get(0),
                host: r.get(1),
                pid: r.get(2),
                version: r.get(3),
                tags: r.get(4),
                max_concurrent: r.get(5),
                started_at: r.get(6),
                renewed_at: r.get(7),
                state: r.get(8),
                running: r.get(9),
            })
            .collect())
    }

    /// Whether a daemon with a live lease serves `goal` (it published a version of it).
    pub(crate) async fn live_daemon_for(&self, goal: &str) -> Result<bool, PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM daemons d JOIN goal_versions v ON v.daemon_id = d.id
                     WHERE v.goal = $1 AND d.state = 'alive'
                       AND d.renewed_at >= now() - d.lease_ms * interval '1 millisecond')",
                &[&goal],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(row.get(0))
    }

    // ----- claims -----

    /// Claim occurrences in one transaction: each is inserted once (unique on goal and time);
    /// under a per-goal lock, pause and overlap are decided from the store; a run row is made
    /// for each that starts. Safe to call again after a failed commit: what this daemon
    /// already owns is reported again. Four round trips whatever the batch's size: the
    /// statements are prepared once per connection and sent in two pipelines.
    pub(crate) async fn claim(
        &self,
        me: &Claimer,
        kind: TriggerKind,
        due: &[Due],
    ) -> Result<Vec<Claimed>, PgError> {
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let err = |e: tokio_postgres::Error| self.err(&e);
        // The store keeps microseconds: compare what it will give back.
        let due: Vec<Due> = due
            .iter()
            .cloned()
            .map(|mut d| {
                d.at = d.at.trunc_subsecs(6);
                d
            })
            .collect();
        let goals: Vec<&str> = due.iter().map(|d| d.goal.as_str()).collect();
        let ats: Vec<DateTime<Utc>> = due.iter().map(|d| d.at).collect();
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(err)?;
        let (lock, insert, state, start, settle, ask, owned) = futures::try_join!(
            tx.prepare_cached(CLAIM_LOCK),
            tx.prepare_cached(CLAIM_INSERT),
            tx.prepare_cached(CLAIM_STATE),
            tx.prepare_cached(CLAIM_START),
            tx.prepare_cached(CLAIM_SETTLE),
            tx.prepare_cached(CLAIM_REPLACE),
            tx.prepare_cached(CLAIM_OWNED),
        )
        .map_err(err)?;
        // One pipeline: the per-goal locks (in a fixed order, so daemons never deadlock),
        // the occurrences inserted once, and what the store says of each goal.
        let by_goal: [&(dyn ToSql + Sync); 1] = [&goals];
        let insert_params: [&(dyn ToSql + Sync); 4] = [&goals, &ats, &kind, &me.id];
        let (_, fresh, state) = futures::try_join!(
            tx.execute(&lock, &by_goal),
            tx.query(&insert, &insert_params),
            tx.query(&state, &by_goal),
        )
        .map_err(err)?;
        let fresh: HashSet<(String, DateTime<Utc>)> =
            fresh.iter().map(|r| (r.get(0), r.get(1))).collect();
        let mut paused: HashSet<String> = HashSet::new();
        let mut running: HashMap<String, Vec<String>> = HashMap::new();
        let mut waiting: HashSet<String> = HashSet::new();
        for r in &state {
            let goal: String = r.get(0);
            if r.get(1) {
                paused.insert(goal.clone());
            }
            if r.get(3) {
                waiting.insert(goal.clone());
            }
            running.insert(goal, r.get(2));
        }
        let mut starts: Vec<(&Due, String)> = Vec::new();
        let mut nots: Vec<(&Due, OccurrenceStatus)> = Vec::new();
        // Runs a newer occurrence replaces (overlap `replace`), each with its replacement.
        let mut replace: Vec<(String, String)> = Vec::new();
        for d in due
            .iter()
            .filter(|d| fresh.contains(&(d.goal.clone(), d.at)))
        {
            if paused.contains(&d.goal) {
                nots.push((d, OccurrenceStatus::Paused));
                continue;
            }
            let busy = running.get(&d.goal).is_some_and(|r| !r.is_empty());
            let replaced = match policy::overlap(d.overlap, busy, waiting.contains(&d.goal)) {
                Decision::Start => Vec::new(),
                Decision::Replace => running.remove(&d.goal).unwrap_or_default(),
                Decision::Queue => {
                    waiting.insert(d.goal.clone());
                    nots.push((d, OccurrenceStatus::Queued));
                    continue;
                }
                Decision::Skip => {
                    nots.push((d, OccurrenceStatus::Skipped));
                    continue;
                }
            };
            let id = super::new_run_id();
            replace.extend(replaced.into_iter().map(|old| (old, id.clone())));
            running.entry(d.goal.clone()).or_default().push(id.clone());
            starts.push((d, id));
        }
        let ids: Vec<&str> = starts.iter().map(|(_, id)| id.as_str()).collect();
        let start_goals: Vec<&str> = starts.iter().map(|(d, _)| d.goal.as_str()).collect();
        let start_ats: Vec<DateTime<Utc>> = starts.iter().map(|(d, _)| d.at).collect();
        let retry: Vec<bool> = starts.iter().map(|(d, _)| d.retry_interrupted).collect();
        let not_goals: Vec<&str> = nots.iter().map(|(d, _)| d.goal.as_str()).collect();
        let not_ats: Vec<DateTime<Utc>> = nots.iter().map(|(d, _)| d.at).collect();
        let not_status: Vec<OccurrenceStatus> = nots.iter().map(|(_, s)| *s).collect();
        let (old, new): (Vec<&str>, Vec<&str>) = replace
            .iter()
            .map(|(o, n)| (o.as_str(), n.as_str()))
            .unzip();
        let pid = std::process::id() as i32;
        // The other pipeline: run rows for what starts, the others' statuses, the replaced
        // runs told (at once by `NOTIFY`, or at their daemon's next renewal), and what this
        // daemon owns of the batch (with what an earlier attempt whose commit went unanswered
        // claimed).
        let start_params: [&(dyn ToSql + Sync); 8] = [
            &ids,
            &start_goals,
            &start_ats,
            &kind,
            &me.id,
            &me.host,
            &pid,
            &retry,
        ];
        let settle_params: [&(dyn ToSql + Sync); 3] = [&not_goals, &not_ats, &not_status];
        let ask_params: [&(dyn ToSql + Sync); 2] = [&old, &new];
        let owned_params: [&(dyn ToSql + Sync); 3] = [&goals, &ats, &me.id];
        let (_, _, _, owned) = futures::try_join!(
            tx.execute(&start, &start_params),
            tx.execute(&settle, &settle_params),
            tx.execute(&ask, &ask_params),
            tx.query(&owned, &owned_params),
        )
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(owned
            .iter()
            .map(|r| {
                let goal: String = r.get(0);
                let at: DateTime<Utc> = r.get(1);
                let status: OccurrenceStatus = r.get(2);
                match (status, r.get::<_, Option<String>>(3)) {
                    (OccurrenceStatus::Running, Some(run_id)) => Claimed::Run { goal, at, run_id },
                    _ => Claimed::Not { goal, at, status },
                }
            })
            .collect())
    }

    /// Record occurrences that no one will run (missed while no daemon ran).
    pub(crate) async fn missed(
        &self,
        me: &Claimer,
        goal: &str,
        ats: &[DateTime<Utc>],
    ) -> Result<(), PgError> {
        if ats.is_empty() {
            return Ok(());
        }
        let c = self.client().await?;
        c.execute(
            "INSERT INTO occurrences (goal, scheduled_for, kind, status, claimed_by, claimed_at)
             SELECT $1, t, 'schedule', 'missed', $3, now() FROM unnest($2::timestamptz[]) t
             ON CONFLICT DO NOTHING",
            &[&goal, &ats, &me.id],
        )
        .await
        .map_err(|e| self.err(&e))?;
        c.execute(
            "INSERT INTO goal_state (goal, last_occurrence) VALUES ($1, $2)
             ON CONFLICT (goal) DO UPDATE SET last_occurrence =
                 greatest(goal_state.last_occurrence, excluded.last_occurrence)",
            &[&goal, &ats.iter().max()],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// The latest claimed occurrence of each goal.
    pub(crate) async fn last_occurrences(&self) -> Result<HashMap<String, DateTime<Utc>>, PgError> {
        let c = self.client().await?;
        Ok(c.query(
            "SELECT goal, last_occurrence FROM goal_state WHERE last_occurrence IS NOT NULL",
            &[],
        )
        .await
        .map_err(|e| self.err(&e))?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
    }

    /// After a run of `goal` ended: the oldest queued occurrence starts when nothing else of
    /// the goal runs.
    pub(crate) async fn take_queued(
        &self,
        me: &Claimer,
        goal: &str,
        retry_interrupted: bool,
    ) -> Result<Option<(DateTime<Utc>, String)>, PgError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(&e))?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&goal])
            .await
            .map_err(|e| self.err(&e))?;
        let busy: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM runs WHERE goal = $1 AND status = 'running')",
                &[&goal],
            )
            .await
            .map_err(|e| self.err(&e))?
            .get(0);
        if busy {
            return Ok(None);
        }
        let Some(row) = tx
            .query_opt(
                "SELECT scheduled_for, kind FROM occurrences WHERE goal = $1 AND status = 'queued'
                 ORDER BY scheduled_for LIMIT 1 FOR UPDATE SKIP LOCKED",
                &[&goal],
            )
            .await
            .map_err(|e| self.err(&e))?
        else {
            return Ok(None);
        };
        let at: DateTime<Utc> = row.get(0);
        let kind: String = row.get(1);
        let id = super::new_run_id();
        tx.execute(
            "INSERT INTO runs (id, goal, trigger, scheduled_for, status, started_at, daemon_id, host,
                 pid, retry_interrupted)
             VALUES ($1, $2, $3, CASE WHEN $3 = 'schedule' THEN $4::timestamptz END, 'running',
                 clock_timestamp(), $5, $6, $7, $8)",
            &[
                &id,
                &goal,
                &kind,
                &at,
                &me.id,
                &me.host,
                &(std::process::id() as i32),
                &retry_interrupted,
            ],
        )
        .await
        .map_err(|e| self.err(&e))?;
        tx.execute(
            "UPDATE occurrences SET status = 'running', run_id = $3, claimed_by = $4
             WHERE goal = $1 AND scheduled_for = $2",
            &[&goal, &at, &id, &me.id],
        )
        .await
        .map_err(|e| self.err(&e))?;
        tx.commit().await.map_err(|e| self.err(&e))?;
        Ok(Some((at, id)))
    }

    /// Ask for a run of `goal` (manual, or a webhook's with its body); a daemon that serves
    /// it picks it up.
    pub(crate) async fn request_trigger(
        &self,
        goal: &str,
        by: &str,
        kind: TriggerKind,
        payload: Option<&str>,
    ) -> Result<i64, PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "INSERT INTO triggers (goal, kind, requested_at, requested_by, status, payload)
                 VALUES ($1, $3, clock_timestamp(), $2, 'pending', $4) RETURNING id",
                &[&goal, &by, &kind, &payload],
            )
            .await
            .map_err(|e| self.err(&e))?;
        c.execute("NOTIFY sup_trigger", &[])
            .await
            .map_err(|e| self.err(&e))?;
        Ok(row.get(0))
    }

    /// Take up to `limit` pending triggers of the goals this daemon serves.
    pub(crate) async fn take_triggers(
        &self,
        me: &Claimer,
        goals: &[String],
        limit: i64,
    ) -> Result<Vec<Taken>, PgError> {
        let c = self.client().await?;
        Ok(c.query(
            "UPDATE triggers SET status = 'claimed', claimed_by = $3 WHERE id IN
                 (SELECT id FROM triggers WHERE status = 'pending' AND goal = ANY($1)
                  ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
             RETURNING id, goal, kind, requested_at, payload",
            &[&goals, &limit, &me.id],
        )
        .await
        .map_err(|e| self.err(&e))?
        .iter()
        .map(|r| Taken {
            id: r.get(0),
            goal: r.get(1),
            kind: r.get(2),
            at: r.get(3),
            payload: r.get(4),
        })
        .collect())
    }

    /// Record a webhook delivery of `goal`: whether it is new (one seen before, by any
    /// console of the fleet, runs nothing).
    pub(crate) async fn new_delivery(&self, goal: &str, delivery: &str) -> Result<bool, PgError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "INSERT INTO webhook_deliveries (goal, delivery, received_at)
                 VALUES ($1, $2, clock_timestamp()) ON CONFLICT DO NOTHING",
                &[&goal, &delivery],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(n == 1)
    }

    /// Forget a delivery whose run could not start, so that it may be delivered again.
    pub(crate) async fn forget_delivery(&self, goal: &str, delivery: &str) -> Result<(), PgError> {
        let c = self.client().await?;
        c.execute(
            "DELETE FROM webhook_deliveries WHERE goal = $1 AND delivery = $2",
            &[&goal, &delivery],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// What became of a trigger: its occurrence's status and run.
    pub(crate) async fn settle_trigger(
        &self,
        id: i64,
        status: &str,
        run_id: Option<&str>,
    ) -> Result<(), PgError> {
        let c = self.client().await?;
        c.execute(
            "UPDATE triggers SET status = $2, run_id = $3 WHERE id = $1",
            &[&id, &status, &run_id],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// A trigger's state: (status, run id).
    pub(crate) async fn trigger_state(&self, id: i64) -> Result<(String, Option<String>), PgError> {
        let c = self.client().await?;
        let r = c
            .query_one("SELECT status, run_id FROM triggers WHERE id = $1", &[&id])
            .await
            .map_err(|e| self.err(&e))?;
        Ok((r.get(0), r.get(1)))
    }

    // ----- runs -----

    /// What the run's own process says once it started: its local id, model, folders.
    pub(crate) async fn run_started(
        &self,
        id: &str,
        local_id: &str,
        model: &str,
        workspace: &str,
        dir: &str,
    ) -> Result<(), PgError> {
        let c = self.client().await?;
        c.execute(
            "UPDATE runs SET local_id = $2, model = $3, workspace = $4, dir = $5 WHERE id = $1",
            &[&id, &local_id, &model, &workspace, &dir],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// The cost of a running run so far, so that the day's spending counts it while it
    /// runs and after its daemon is killed.
    pub(crate) async fn set_run_cost(&self, id: &str, cost: f64) -> Result<(), PgError> {
        let c = self.client().await?;
        c.execute(
            "UPDATE runs SET cost = $2 WHERE id = $1 AND status = 'running'",
            &[&id, &cost],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// Append transcript events (seq, event).
    pub(crate) async fn events(
        &self,
        id: &str,
        events: &[(i64, serde_json::Value)],
    ) -> Result<(), PgError> {
        if events.is_empty() {
            return Ok(());
        }
        let seqs: Vec<i64> = events.iter().map(|(s, _)| *s).collect();
        let values: Vec<&serde_json::Value> = events.iter().map(|(_, v)| v).collect();
        let c = self.client().await?;
        c.execute(
            "INSERT INTO events (run_id, seq, event)
             SELECT $1, s, e FROM unnest($2::bigint[], $3::jsonb[]) AS u(s, e)
             ON CONFLICT DO NOTHING",
            &[&id, &seqs, &values],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// Record how a run ended, and close its occurrence. A run the fleet had declared
    /// interrupted keeps that status; its outcome is still recorded in the error text.
    pub(crate) async fn finish_run(&self, id: &str, end: &Finish) -> Result<(), PgError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(&e))?;
        tx.execute(
            "UPDATE runs SET status = CASE WHEN status = 'interrupted' THEN status ELSE $2 END,
                 stop_reason = $3, tries = $4, steps = $5, input_tokens = $6,
                 output_tokens = $7, cache_read_tokens = $8, cache_write_tokens = $9,
                 ended_at = now(), error = coalesce($10, error), cost = $11, answer = $12
             WHERE id = $1",
            &[
                &id,
                &end.status.as_str(),
                &end.stop_reason.as_str(),
                &(end.tries as i32),
                &(end.steps as i32),
                &(end.usage.input_tokens as i64),
                &(end.usage.output_tokens as i64),
                &(end.usage.cache_read_tokens as i64),
                &(end.usage.cache_write_tokens as i64),
                &end.error,
                &end.cost,
                &end.answer,
            ],
        )
        .await
        .map_err(|e| self.err(&e))?;
        for (t, reports) in end.checks.iter().enumerate() {
            for (i, r) in reports.iter().enumerate() {
                tx.execute(
                    "INSERT INTO checks (run_id, try, idx, name, passed, exit_status, outcome,
                         duration_ms, output_path)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     ON CONFLICT (run_id, try, idx) DO NOTHING",
                    &[
                        &id,
                        &(t as i32 + 1),
                        &(i as i32),
                        &r.name,
                        &r.passed,
                        &r.exit_status,
                        &r.outcome,
                        &(r.duration_ms as i64),
                        &r.output_path,
                    ],
                )
                .await
                .map_err(|e| self.err(&e))?;
            }
        }
        tx.execute(
            "UPDATE occurrences SET status = CASE WHEN status = 'interrupted' THEN status
                 ELSE 'done' END WHERE run_id = $1",
            &[&id],
        )
        .await
        .map_err(|e| self.err(&e))?;
        tx.commit().await.map_err(|e| self.err(&e))
    }

    /// Runs, newest first.
    pub(crate) async fn runs(
        &self,
        goal: Option<&str>,
        status: Option<&str>,
        limit: u32,
    ) -> Result<Vec<FleetRun>, PgError> {
        let c = self.client().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs
                     WHERE ($1::text IS NULL OR goal = $1) AND ($2::text IS NULL OR status = $2)
                     ORDER BY started_at DESC, id DESC LIMIT $3"
                ),
                &[&goal, &status, &i64::from(limit)],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(rows.iter().map(run_of).collect())
    }

    /// One run by its fleet id or its local id.
    pub(crate) async fn run(&self, id: &str) -> Result<FleetRun, PgError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1 OR local_id = $1 LIMIT 1"),
                &[&id],
            )
            .await
            .map_err(|e| self.err(&e))?
            .ok_or_else(|| PgError::NoRun(id.to_string()))?;
        Ok(run_of(&row))
    }

    pub(crate) async fn checks(&self, id: &str) -> Result<Vec<(u32, CheckReport)>, PgError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT try, name, passed, exit_status, outcome, duration_ms, output_path
                 FROM checks WHERE run_id = $1 ORDER BY try, idx",
                &[&id],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<_, i32>(0) as u32,
                    CheckReport {
                        kind: crate::trace::CheckKind::of_name(r.get(1)),
                        model: None,
                        name: r.get(1),
                        passed: r.get(2),
                        exit_status: r.get(3),
                        outcome: r.get(4),
                        duration_ms: r.get::<_, i64>(5) as u64,
                        output_tail: String::new(),
                        output_path: r.get(6),
                    },
                )
            })
            .collect())
    }

    /// A run's transcript events, in order.
    pub(crate) async fn transcript(&self, id: &str) -> Result<Vec<serde_json::Value>, PgError> {
        let c = self.client().await?;
        Ok(c.query(
            "SELECT event FROM events WHERE run_id = $1 ORDER BY seq",
            &[&id],
        )
        .await
        .map_err(|e| self.err(&e))?
        .iter()
        .map(|r| r.get(0))
        .collect())
    }

    /// The last run of `goal` that ended, other than `except`: what `previous.*` in a
    /// template sees, whichever daemon ran it.
    pub(crate) async fn previous_run(
        &self,
        goal: &str,
        except: &str,
    ) -> Result<Option<FleetRun>, PgError> {
        let c = self.client().await?;
        Ok(c.query_opt(
            &format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE goal = $1 AND id <> $2
                     AND status <> 'running'
                 ORDER BY started_at DESC, id DESC LIMIT 1"
            ),
            &[&goal, &except],
        )
        .await
        .map_err(|e| self.err(&e))?
        .as_ref()
        .map(run_of))
    }

    /// Whether `goal` is paused, and its last occurrence.
    pub(crate) async fn goal_state(
        &self,
        goal: &str,
    ) -> Result<(bool, Option<DateTime<Utc>>), PgError> {
        let c = self.client().await?;
        Ok(c.query_opt(
            "SELECT paused, last_occurrence FROM goal_state WHERE goal = $1",
            &[&goal],
        )
        .await
        .map_err(|e| self.err(&e))?
        .map_or((false, None), |r| (r.get(0), r.get(1))))
    }

    /// The status of the occurrence of `goal` at `at`, if the fleet recorded one.
    pub(crate) async fn occurrence_status(
        &self,
        goal: &str,
        at: DateTime<Utc>,
    ) -> Result<Option<String>, PgError> {
        let c = self.client().await?;
        Ok(c.query_opt(
            "SELECT status FROM occurrences WHERE goal = $1 AND scheduled_for = $2",
            &[&goal, &at],
        )
        .await
        .map_err(|e| self.err(&e))?
        .map(|r| r.get(0)))
    }

    /// US dollars spent by the runs of `goal` started at or after `since`, on any daemon.
    pub(crate) async fn cost_since(
        &self,
        goal: &str,
        since: DateTime<Utc>,
    ) -> Result<f64, PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT coalesce(sum(cost), 0)::float8 FROM runs
                 WHERE goal = $1 AND started_at >= $2",
                &[&goal, &since],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(row.get(0))
    }

    /// One page of runs (`offset`, `limit`), newest first, and how many match in all: the web
    /// console's list.
    pub(crate) async fn runs_page(
        &self,
        goal: Option<&str>,
        status: Option<&str>,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<FleetRun>, u64), PgError> {
        let c = self.client().await?;
        let total: i64 = c
            .query_one(
                "SELECT count(*) FROM runs
                 WHERE ($1::text IS NULL OR goal = $1) AND ($2::text IS NULL OR status = $2)",
                &[&goal, &status],
            )
            .await
            .map_err(|e| self.err(&e))?
            .get(0);
        let rows = c
            .query(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs
                     WHERE ($1::text IS NULL OR goal = $1) AND ($2::text IS NULL OR status = $2)
                     ORDER BY started_at DESC, id DESC LIMIT $3 OFFSET $4"
                ),
                &[&goal, &status, &i64::from(limit), &i64::from(offset)],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok((rows.iter().map(run_of).collect(), total.max(0) as u64))
    }

    /// The names of goals that have runs, sorted.
    pub(crate) async fn goal_names(&self) -> Result<Vec<String>, PgError> {
        let c = self.client().await?;
        Ok(c.query("SELECT DISTINCT goal FROM runs ORDER BY goal", &[])
            .await
            .map_err(|e| self.err(&e))?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// A run's transcript events from sequence number `from` on, each with its number.
    pub(crate) async fn events_from(
        &self,
        id: &str,
        from: i64,
    ) -> Result<Vec<(i64, serde_json::Value)>, PgError> {
        let c = self.client().await?;
        Ok(c.query(
            "SELECT seq, event FROM events WHERE run_id = $1 AND seq >= $2 ORDER BY seq",
            &[&id, &from],
        )
        .await
        .map_err(|e| self.err(&e))?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
    }

    /// What the goals page shows of a goal: paused, skipped and missed occurrences, the last
    /// run, and occurrences skipped while paused.
    pub(crate) async fn goal_stats(&self, goal: &str) -> Result<(GoalStats, u64), PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT coalesce((SELECT paused FROM goal_state WHERE goal = $1), false),
                     count(*) FILTER (WHERE status = 'skipped'),
                     count(*) FILTER (WHERE status = 'missed'),
                     count(*) FILTER (WHERE status = 'paused')
                 FROM occurrences WHERE goal = $1",
                &[&goal],
            )
            .await
            .map_err(|e| self.err(&e))?;
        let n = |i: usize| row.get::<_, i64>(i).max(0) as u64;
        let last = self.previous_run(goal, "").await?.map(|f| f.run);
        Ok((
            GoalStats {
                paused: row.get(0),
                skipped: n(1),
                missed: n(2),
                last,
            },
            n(3),
        ))
    }

    // ----- goals -----

    pub(crate) async fn set_paused(&self, goal: &str, paused: bool) -> Result<(), PgError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO goal_state (goal, paused) VALUES ($1, $2)
             ON CONFLICT (goal) DO UPDATE SET paused = excluded.paused",
            &[&goal, &paused],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// Publish this daemon's goal versions: (name, content hash, file modified time).
    pub(crate) async fn publish_goals(
        &self,
        daemon: &str,
        goals: &[(String, String, DateTime<Utc>)],
    ) -> Result<(), PgError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(&e))?;
        tx.execute("DELETE FROM goal_versions WHERE daemon_id = $1", &[&daemon])
            .await
            .map_err(|e| self.err(&e))?;
        let n: Vec<&str> = goals.iter().map(|g| g.0.as_str()).collect();
        let h: Vec<&str> = goals.iter().map(|g| g.1.as_str()).collect();
        let m: Vec<DateTime<Utc>> = goals.iter().map(|g| g.2).collect();
        tx.execute(
            "INSERT INTO goal_versions (goal, daemon_id, hash, modified_at)
             SELECT n, $4, h, m FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS u(n, h, m)",
            &[&n, &h, &m, &daemon],
        )
        .await
        .map_err(|e| self.err(&e))?;
        tx.commit().await.map_err(|e| self.err(&e))
    }

    /// Goals whose live daemons hold different versions: (goal, [(daemon, hash, modified)]),
    /// the newest first.
    pub(crate) async fn goal_versions(&self) -> Result<Vec<(String, Vec<GoalVersion>)>, PgError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT v.goal, v.daemon_id, v.hash, v.modified_at FROM goal_versions v
                 JOIN daemons d ON d.id = v.daemon_id
                 WHERE d.state = 'alive'
                   AND d.renewed_at >= now() - d.lease_ms * interval '1 millisecond'
                   AND v.goal IN (SELECT goal FROM goal_versions vv JOIN daemons dd ON dd.id = vv.daemon_id
                                  WHERE dd.state = 'alive' GROUP BY goal HAVING count(DISTINCT hash) > 1)
                 ORDER BY v.goal, v.modified_at DESC",
                &[],
            )
            .await
            .map_err(|e| self.err(&e))?;
        let mut out: Vec<(String, Vec<GoalVersion>)> = Vec::new();
        for r in rows {
            let goal: String = r.get(0);
            let v = (r.get(1), r.get(2), r.get(3));
            match out.last_mut() {
                Some((g, vs)) if *g == goal => vs.push(v),
                _ => out.push((goal, vec![v])),
            }
        }
        Ok(out)
    }

    // ----- approvals -----

    /// Mirror a local approval request into the store (once).
    pub(crate) async fn put_approval(&self, a: &ApprovalRow, daemon: &str) -> Result<(), PgError> {
        self.insert_approval(a, Some(daemon)).await
    }

    /// Put a run's request in the store as it is made (once), under the daemon that runs
    /// the fleet's run `fleet_run`.
    pub(crate) async fn request_approval(
        &self,
        a: &ApprovalRow,
        fleet_run: &str,
    ) -> Result<(), PgError> {
        let c = self.client().await?;
        let daemon: Option<String> = c
            .query_opt("SELECT daemon_id FROM runs WHERE id = $1", &[&fleet_run])
            .await
            .map_err(|e| self.err(&e))?
            .and_then(|r| r.get(0));
        self.insert_approval(a, daemon.as_deref()).await
    }

    async fn insert_approval(&self, a: &ApprovalRow, daemon: Option<&str>) -> Result<(), PgError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO approvals (id, run_id, goal, kind, tool, input, created_at, deadline,
                 status, daemon_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', $9) ON CONFLICT (id) DO NOTHING",
            &[
                &a.id,
                &a.run_id,
                &a.goal,
                &a.kind,
                &a.tool,
                &a.input,
                &a.created_at,
                &a.deadline,
                &daemon,
            ],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    pub(crate) async fn approval(&self, id: &str) -> Result<Option<ApprovalRow>, PgError> {
        let c = self.client().await?;
        Ok(c.query_opt(
            "SELECT id, run_id, goal, kind, tool, input, created_at, deadline, status, always,
                 reason, decided_by FROM approvals WHERE id = $1",
            &[&id],
        )
        .await
        .map_err(|e| self.err(&e))?
        .as_ref()
        .map(approval_of))
    }

    /// Requests of one status (`pending`: waiting), oldest first.
    pub(crate) async fn approvals(
        &self,
        status: ApprovalStatus,
    ) -> Result<Vec<ApprovalRow>, PgError> {
        let c = self.client().await?;
        Ok(c.query(
            "SELECT id, run_id, goal, kind, tool, input, created_at, deadline, status, always,
                 reason, decided_by FROM approvals WHERE status = $1 ORDER BY created_at, id",
            &[&status],
        )
        .await
        .map_err(|e| self.err(&e))?
        .iter()
        .map(approval_of)
        .collect())
    }

    /// Answered (or expired) requests, newest answer first, with when they were answered.
    pub(crate) async fn answered_approvals(
        &self,
        limit: u32,
    ) -> Result<Vec<(ApprovalRow, Option<String>)>, PgError> {
        let c = self.client().await?;
        Ok(c.query(
            "SELECT id, run_id, goal, kind, tool, input, created_at, deadline, status, always,
                 reason, decided_by, decided_at FROM approvals WHERE status <> 'pending'
             ORDER BY decided_at DESC NULLS LAST, id LIMIT $1",
            &[&i64::from(limit)],
        )
        .await
        .map_err(|e| self.err(&e))?
        .iter()
        .map(|r| {
            let at: Option<DateTime<Utc>> = r.get(12);
            (approval_of(r), at.map(stamp))
        })
        .collect())
    }

    /// Answer a pending request and wake the daemon whose run waits; `false` when it is not
    /// pending.
    pub(crate) async fn decide_approval(
        &self,
        id: &str,
        status: ApprovalStatus,
        always: bool,
        reason: Option<&str>,
        by: &str,
    ) -> Result<bool, PgError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "UPDATE approvals SET status = $2, always = $3, reason = $4, decided_at = now(),
                     decided_by = $5 WHERE id = $1 AND status = 'pending'",
                &[&id, &status, &always, &reason, &by],
            )
            .await
            .map_err(|e| self.err(&e))?;
        if n == 1 {
            c.execute("SELECT pg_notify('sup_approval', $1)", &[&id])
                .await
                .map_err(|e| self.err(&e))?;
        }
        Ok(n == 1)
    }

    /// A request that ended where its run waits (timed out, cancelled) ends here too.
    pub(crate) async fn close_approval(
        &self,
        id: &str,
        status: ApprovalStatus,
    ) -> Result<(), PgError> {
        let c = self.client().await?;
        c.execute(
            "UPDATE approvals SET status = $2, decided_at = now() WHERE id = $1 AND status = 'pending'",
            &[&id, &status],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }
}

/// How a run ended, owned so that it can wait on disk while the store is away.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Finish {
    pub(crate) status: Status,
    pub(crate) stop_reason: StopReason,
    pub(crate) tries: u32,
    pub(crate) steps: u32,
    pub(crate) usage: Usage,
    pub(crate) error: Option<String>,
    pub(crate) checks: Vec<Vec<CheckReport>>,
    /// US dollars, when the price is known; absent in outcomes kept by an older `sup`.
    #[serde(default)]
    pub(crate) cost: Option<f64>,
    #[serde(default)]
    pub(crate) answer: Option<String>,
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

const RUN_COLUMNS: &str = "id, goal, trigger, scheduled_for, status, stop_reason, tries, steps,
    input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, started_at, ended_at,
    error, pid, model, workspace, dir, host, daemon_id, local_id, created_at, cost, answer";

/// A run as the fleet keeps it: the SQLite row plus where it ran.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct FleetRun {
    #[serde(flatten)]
    pub(crate) run: RunRow,
    pub(crate) host: String,
    pub(crate) daemon_id: Option<String>,
    pub(crate) local_id: Option<String>,
}

fn run_of(r: &tokio_postgres::Row) -> FleetRun {
    let t = |i: usize| r.get::<_, Option<DateTime<Utc>>>(i).map(stamp);
    FleetRun {
        run: RunRow {
            id: r.get(0),
            goal: r.get(1),
            trigger: r.get(2),
            scheduled_for: t(3),
            status: r.get(4),
            stop_reason: r.get(5),
            tries: r.get::<_, i32>(6) as u32,
            steps: r.get::<_, i32>(7) as u32,
            usage: Usage {
                input_tokens: r.get::<_, i64>(8) as u64,
                output_tokens: r.get::<_, i64>(9) as u64,
                cache_read_tokens: r.get::<_, i64>(10) as u64,
                cache_write_tokens: r.get::<_, i64>(11) as u64,
            },
            started_at: t(12).unwrap_or_default(),
            ended_at: t(13),
            error: r.get(14),
            pid: r.get::<_, i32>(15) as u32,
            model: r.get(16),
            workspace: r.get(17),
            dir: r.get(18),
            cost: r.get(23),
            answer: r.get(24),
        },
        host: r.get(19),
        daemon_id: r.get(20),
        local_id: r.get(21),
    }
}

fn approval_of(r: &tokio_postgres::Row) -> ApprovalRow {
    ApprovalRow {
        id: r.get(0),
        run_id: r.get(1),
        goal: r.get(2),
        kind: r.get(3),
        tool: r.get(4),
        input: r.get(5),
        created_at: r.get(6),
        deadline: r.get(7),
        status: r.get(8),
        always: r.get(9),
        reason: r.get(10),
        decided_by: r.get(11),
    }
}

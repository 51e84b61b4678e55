//! The PostgreSQL schema: its migrations, in order, under an advisory lock; a store of a
//! newer schema is refused.

use super::*;

/// The schema this `sup` knows; a store with a higher version is refused.
pub(crate) const SCHEMA_VERSION: i32 = 4;

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
    lineage_ddl!(),
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

/// A key for `pg_advisory_xact_lock` that serializes migrations.
const MIGRATION_LOCK: i64 = 0x0053_7570_5f6d_6967;

impl PgStore {
    pub(super) async fn migrate(&self) -> Result<(), PgError> {
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
}
